"""The engine: runs a pipeline compiled once into incremental operators
(`txstream.engine.compiled`), turning batches of input changes (many consecutive transactions
at once) into the output tables' changes.

A batch runs in two phases. First every operator builds its delta plan and stages its state's
next version (`BatchPlan`), running nothing. Then the engine computes it all with one Spark
action: the outputs, tagged and unioned, are collected as Arrow, and the same job computes the
staged state runs (lazy local checkpoints it reads but filters out). Only then are the new state
versions installed, so a failed batch leaves the engine as it was. The first phase runs the
operators only for the first batch of each shape; later batches of that shape rebind its
recorded physical plans to their own inputs and state (`txstream.engine.templates`).

A pipeline runs at a parallelism P. At P = 1 every frame of a batch lives in a single Spark
partition: deltas enter through a narrow `coalesce(1)` and state runs are built from them, so
no join, aggregate or window needs an exchange and a batch is one Spark job of a single stage,
whatever the DAG (see `txstream.engine.frames.join` for what keeps Spark from adding
exchanges); the price is that one batch uses one core. At P > 1 every state is hash-partitioned
into P partitions by its lookup key (`txstream.engine.state`), and Spark's planner exchanges
each delta to the partitioning the operator reading it needs (`BatchPlan.clustered`); a
source's changes enter already split so (`SourceOp.rows`). A batch is still one job, of a stage
per exchange, whose tasks spread over every core and executor, each reading its own partition
of state where it lives. A batch of fewer than `spread_rows`
input rows is planned as at P = 1 over the partitioned state (read through a narrow coalesce),
only its new state runs exchanged into P partitions: a lone transaction gains nothing from
spreading and would pay a stage per exchange.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import pyarrow.compute as pc
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txstream.changes import DIFF, Changes
from txstream.engine import codegen, persistence, run_index
from txstream.engine.batch import BatchPlan
from txstream.engine.columns import PART
from txstream.engine.compiled import CompiledPipeline
from txstream.engine.errors import (
    EngineInputError,
    ExpressionError,
    PipelineDefinitionError,
)
from txstream.engine.frames import union_all
from txstream.engine.indexing import StateIndexes
from txstream.engine.java_garbage import JavaGarbage
from txstream.engine.nodes import CLOCK_SOURCE
from txstream.engine.operators import SourceOp
from txstream.engine.operators.base import first_line
from txstream.engine.replicas import keep_replicated
from txstream.engine.runs import Runs
from txstream.engine.spark_internals import plan_now, rdd_leaf
from txstream.engine.sparkjobs import JobCount, call_site, counted
from txstream.engine.state import StagedRuns, StatePlacement, ZSetState
from txstream.engine.table import Pipeline
from txstream.engine.templates import Template, instantiate, ready, record
from txstream.engine.wall_clock import clock_changes

# A state run holding at least this many rows gets an index, so lookups probe it instead of
# streaming it (see `txstream.engine.indexed_runs`): streaming costs ~0.1 s per million rows per
# lookup, an index one job when the run is made (its partitions sorted and written as files by
# the executors) and a Python task in every batch that probes it.
INDEX_ROWS = 1_000_000
# At parallelism P > 1, a batch of fewer input rows than this is planned as at parallelism 1,
# in one task reading every partition of state (a narrow coalesce), its new state runs only
# exchanged into P partitions: a job of a few stages instead of one per exchange of every
# delta, which costs a lone transaction more than spreading a small batch saves.
SPREAD_ROWS = 20_000
# Plan templates kept (one per batch shape seen; the oldest goes first).
_TEMPLATES = 64
# SQLSTATE class 22: the data made an expression fail (division by zero, invalid cast, overflow).
_DATA_EXCEPTION = "22"


@dataclass(frozen=True)
class BatchStats:
    """What the last batch cost: driver time building and planning its Spark plans, time
    executing them, time indexing the state runs it made (see INDEX_ROWS; the jobs and stages
    include the indexes'), and the Spark jobs and stages that ran; `rebound` when its plans
    came from the template of an earlier batch of the same shape (see
    `txstream.engine.templates`); `interpreted` when its expressions were (see
    `txstream.engine.codegen`)."""

    planning_s: float
    execution_s: float
    jobs: int
    stages: int
    rebound: bool = False
    interpreted: bool = False
    indexing_s: float = 0.0
    indexes: int = 0  # indexed state runs its lookups probed


@dataclass(frozen=True)
class EngineVersion:
    """The engine's state as of a batch: immutable, so it can be saved while later batches run.
    """

    states: Mapping[str, tuple[ZSetState, Runs]]


class Engine:
    """Runs one pipeline. Not thread-safe: one batch at a time, in transaction order."""

    def __init__(self, pipeline: Pipeline, spark: SparkSession, *, parallelism: int = 1,
                 interpreted_rows: int = codegen.INTERPRETED_ROWS,
                 cold_interpreted_rows: int = codegen.COLD_INTERPRETED_ROWS,
                 index_rows: int = INDEX_ROWS, spread_rows: int = SPREAD_ROWS,
                 state_replicas: int = 1, index_dir: str | None = None) -> None:
        if parallelism < 1:
            raise PipelineDefinitionError(f"parallelism must be at least 1, not {parallelism}")
        self.spark = spark
        # The partitions of every state and of a batch's exchanged deltas (see the module doc).
        self.parallelism = parallelism
        self.spread_rows = spread_rows
        self.interpreted_rows = interpreted_rows
        self.cold_interpreted_rows = cold_interpreted_rows
        # Files under `index_dir` (TXSTREAM_INDEX_DIR, else the system's temporary directory).
        self._indexing = StateIndexes(
            index_rows, index_dir or os.environ.get("TXSTREAM_INDEX_DIR") or None)
        # Every state is made in the engine's P partitions (see the module doc).
        self.compiled = CompiledPipeline(
            pipeline, spark, StatePlacement(partitions=parallelism, replicas=state_replicas))
        self.outputs = self.compiled.outputs
        self.sources = self.compiled.sources
        self.last_batch: BatchStats | None = None
        self.totals = JobCount(0, 0)  # Spark jobs and stages of every batch so far
        # Late changes (inserted or deleted rows) each temporal behavior ignored so far, by its
        # label; its late rows' table shows them (`GroupedTable.late_rows`).
        self.late_rows: Counter[str] = Counter()
        self._java_garbage = JavaGarbage()
        self._templates: dict[tuple[object, ...], Template] = {}
        self.state_replicas = state_replicas
        self.state_replications = 0  # times runs were copied again (`txstream.engine.replicas`)

    def _shape(self, changes: Mapping[str, Changes], planned: int) -> tuple[object, ...]:
        """What decides every plan of a batch planned for `planned` partitions (see
        `txstream.engine.templates`)."""
        return (planned, tuple(sorted(changes)),
                tuple(s.shape() for s in self.compiled.states.values()))

    def process(self, changes: Mapping[str, Changes],
                wall_times: Mapping[int, datetime] | None = None) -> dict[str, Changes]:
        """Run one batch: `changes` maps source names to their changes (any number of
        transactions, all later than those already processed, their numbers increasing but
        not necessarily consecutive: a netted batch is one, `Changes.net`; a source without
        changes may be left out). A pipeline that calls now() needs `wall_times`, each
        transaction's wall time (aware), for every transaction with changes, and may have more
        (ticks: `txstream.engine.wall_clock`); others ignore them. Returns every output's
        changes, consolidated and ordered (by time, and within a time the deletions before the
        insertions)."""
        clock = self.sources.get(CLOCK_SOURCE)
        if clock is not None and CLOCK_SOURCE not in changes:
            changes = {**changes, CLOCK_SOURCE: clock_changes(clock.table_schema, wall_times,
                                                              changes)}
        unknown = sorted(set(changes) - set(self.sources))
        if unknown:
            raise EngineInputError(
                f"unknown source(s) {', '.join(unknown)}; the pipeline has "
                f"{', '.join(sorted(self.sources))}"
            )
        wrong = sorted(name for name, c in changes.items() if not isinstance(c, Changes))
        if wrong:
            raise EngineInputError(f"source(s) {', '.join(wrong)}: changes must be "
                                   "txstream.changes.Changes (Changes.of(table) wraps a table)")
        started = time.perf_counter()
        self._keep_replicated()
        present = {name: t for name, t in changes.items() if t.num_rows}
        weight = sum(t.num_rows for t in present.values())
        planned = self.parallelism if weight >= self.spread_rows else 1
        shape = self._shape(present, planned)
        indexes = sum(len(s.indexed()) for s in self.compiled.states.values())
        template = self._templates.get(shape)
        recorded: Template | None = None
        if self.parallelism > 1:
            # Read when a plan is made: an aggregate of deltas alone gets P partitions, as the
            # state it meets has (a session setting, so set for every batch, whichever engine).
            self.spark.conf.set("spark.sql.shuffle.partitions", str(self.parallelism))
        with call_site(self.spark.sparkContext, "txstream engine batch"):
            if template is not None and not ready(self.spark, template):
                del self._templates[shape]  # built by the operators, as every batch of its shape
                template = None
            if template is not None:
                rows = {name: self.sources[name].rows(t, planned) for name, t in present.items()}
                final, staged = instantiate(self.spark, template, rows, weight, planned)
                outputs: tuple[str, ...] = template.outputs
            else:
                final, outputs, staged, recorded = self._build(present, weight, planned)
            rewritten = max([weight, *(s.runs[-1].weight for s in staged)])
            interpreted = codegen.interpreted(self.spark, rewritten, self.interpreted_rows,
                                              self.cold_interpreted_rows)
            try:
                result, execution_s, count = self._execute(final, outputs, interpreted)
                codegen.ran(self.spark, rewritten, self.interpreted_rows)
            except PySparkException as exc:
                if run_index.UNREADABLE not in str(exc):
                    raise
                # The batch changed nothing: run it again, streaming every run.
                self._indexing.stop(self.compiled.states.values(), str(exc))
                return self.process(changes)
        for staged_runs in staged:
            staged_runs.state.install(staged_runs.runs)
        self._keep_replicated()
        indexing_started = time.perf_counter()
        _, indexing = counted(self.spark.sparkContext, lambda: self._index(
            [s.state for s in staged]))
        indexing_s = time.perf_counter() - indexing_started
        count = JobCount(count.jobs + indexing.jobs, count.stages + indexing.stages)
        if recorded is not None:
            if len(self._templates) >= _TEMPLATES:
                del self._templates[next(iter(self._templates))]
            self._templates[shape] = recorded
        self.last_batch = BatchStats(
            planning_s=round(time.perf_counter() - started - execution_s - indexing_s, 4),
            execution_s=round(execution_s, 4), jobs=count.jobs, stages=count.stages,
            rebound=template is not None, interpreted=interpreted,
            indexing_s=round(indexing_s, 4), indexes=indexes)
        self.totals = JobCount(self.totals.jobs + count.jobs, self.totals.stages + count.stages)
        for name, node in self.compiled.late.items():
            late = result.pop(name)
            if late.num_rows:
                self.late_rows[node.inputs[0].label] += pc.sum(pc.abs(late.table[DIFF])).as_py()
        self._java_garbage.after_batch()
        return result

    def _keep_replicated(self) -> None:
        """With `state_replicas` above 1: before a batch reads the state (an executor may have
        been lost since) and after it installs new runs (written while one was missing), copy
        the runs found on fewer executors again, so that the next loss is survived too."""
        if self.state_replicas > 1:
            with call_site(self.spark.sparkContext, "txstream state re-replication"):
                self.state_replications += keep_replicated(
                    self.spark, list(self.compiled.states.values()), self.state_replicas)

    @property
    def fresh(self) -> bool:
        """Whether the engine has neither loaded state nor processed a batch."""
        return self.last_batch is None and not any(s.runs for s in self.compiled.states.values())

    @property
    def uses_wall_clock(self) -> bool:
        """Whether the pipeline calls now(): every transaction then needs its wall time
        (`process`), and the service ticks while its input is idle."""
        return CLOCK_SOURCE in self.sources

    @property
    def nets_exactly(self) -> bool:
        """Whether a batch's transactions computed as one, their net change (`Changes.net`),
        give the outputs at the batch's end that computing them one by one gives: not with a
        temporal behavior, whose clock moves transaction by transaction."""
        return self.compiled.nets_exactly

    def state_rows(self) -> dict[str, int]:
        """The rows each state holds now, by its name (`CompiledPipeline.states`): a Spark job
        per state, for tests and samples, never run by a batch."""
        with call_site(self.spark.sparkContext, "txstream state rows"):
            return {name: (0 if frame is None else frame.count())
                    for name, state in self.compiled.states.items()
                    for frame in [state.consolidated(state.runs, state.partitions)]}

    def forget(self) -> None:
        """Back to fresh: empty state, no batch run (for the warm-up: the plans it recorded
        stay; see `txstream.engine.warmup.warming_up`)."""
        for state in self.compiled.states.values():
            state.install(())
        self._index(list(self.compiled.states.values()))
        self.last_batch = None
        self.totals = JobCount(0, 0)
        self.late_rows.clear()

    def _index(self, states: list[ZSetState]) -> None:
        """Index the states' large runs, and drop the indexes of runs merged away."""
        with call_site(self.spark.sparkContext, "txstream state index"):
            self._indexing.refresh(states)

    @property
    def index_rows(self) -> int:
        return self._indexing.rows

    @property
    def index_bytes(self) -> int:
        """What the state indexes' files hold."""
        return sum(s.indexes.bytes(s.runs) for s in self.compiled.states.values())

    def _build(self, changes: Mapping[str, Changes], weight: int, planned: int
               ) -> tuple[DataFrame | None, tuple[str, ...], list[StagedRuns], Template | None]:
        """Plan a batch through the operators, for `planned` partitions: its final frame
        (None: nothing to compute), the outputs it holds, the staged runs, and its template."""
        batch = BatchPlan(self.spark, weight, parallelism=planned)
        deltas: dict[int, DataFrame | None] = {}
        sources: dict[str, DataFrame] = {}
        for op in self.compiled.operators:
            if isinstance(op, SourceOp):
                delta = None
                if op.name in changes:
                    rows = op.rows(changes[op.name], planned)
                    delta = rdd_leaf(self.spark, rows.output, rows.rdd, rows.clustering)
                    sources[op.name] = delta
                    if planned == 1:
                        delta = delta.coalesce(1)
                    elif rows.clustered_by is not None:
                        batch.declared(delta, rows.clustered_by)
            else:
                delta = op.plan([deltas[i.id] for i in op.node.inputs], batch)
            if delta is not None and self.compiled.consumers[op.node.id] > 1:
                delta = batch.shared(delta, clustered_by=batch.clustering_of(delta))
            deltas[op.node.id] = delta
        outputs = {name: deltas[out.node.id] for name, out in self.outputs.items()}
        outputs |= {name: deltas[node.id] for name, node in self.compiled.late.items()}
        final, present = self._final_frame(outputs, batch)
        template = None
        if final is not None:
            template = record(self.spark, batch, sources, list(self.compiled.states.values()),
                              final, present)
        return final, present, batch.staged, template

    def _final_frame(self, outputs: Mapping[str, DataFrame | None], batch: BatchPlan
                     ) -> tuple[DataFrame | None, tuple[str, ...]]:
        """The batch's one frame to compute (`txstream.engine.results`), and the outputs it
        holds. The staged state runs are read by the same job through a filter no row passes,
        which Spark cannot fold away (it depends on the partition), so they are computed and
        kept without reaching the driver."""
        present = tuple(name for name, frame in outputs.items() if frame is not None)
        if not present and not batch.frames:
            return None, present
        parts = [outputs[name].select(*self.compiled.result.columns(name)) for name in present]  # type: ignore[union-attr]
        if batch.frames:
            hidden = union_all([f.select(F.lit(-1).alias(PART)) for f in batch.frames],
                               batch.parallelism)
            parts.append(hidden.where(F.spark_partition_id() < 0)
                         .select(*self.compiled.result.columns(None)))
        final = union_all(parts, batch.parallelism)
        if batch.parallelism > 1:
            # The union has every partition of every part (P per output and per hidden frame),
            # each a task that deserializes the job's plan: 30 tasks at P = 2 for the example
            # pipeline, about a seventh of its executors' time. Nothing reads the result's
            # partitioning, so a narrow coalesce makes them P; a task then computes several
            # parts, as at P = 1 its one task computes all of them.
            final = final.coalesce(batch.parallelism)
        return final, present

    def _execute(self, final: DataFrame | None, present: tuple[str, ...], interpreted: bool
                 ) -> tuple[dict[str, Changes], float, JobCount]:
        """Compute the batch's frame with one Spark action (its expressions `interpreted`, see
        `txstream.engine.codegen`); every output's changes."""
        if final is None:
            return self.compiled.result.read(None, ()), 0.0, JobCount(0, 0)
        plan_now(final)  # so that the execution is timed alone
        codegen.evaluate(self.spark, interpreted)
        # Spark cuts the lineage of the first checkpointed frames it meets, not of the runs
        # below them: those would drag every earlier batch's lineage along.
        self.spark.sparkContext.setLocalProperty(
            "spark.checkpoint.checkpointAllMarkedAncestors", "true")
        started = time.perf_counter()
        try:
            table, count = counted(self.spark.sparkContext, final.toArrow)
        except PySparkException as exc:
            if not (exc.getSqlState() or "").startswith(_DATA_EXCEPTION):
                raise
            raise self._expression_error(exc) from exc
        executed = time.perf_counter() - started
        return self.compiled.result.read(table, present), executed, count

    def _expression_error(self, exc: PySparkException) -> ExpressionError:
        """The failure of a batch's data in terms of the pipeline: Spark's query context gives
        the failing fragment of SQL, which is found in the expressions of the tables."""
        fragments = [c.fragment() for c in exc.getQueryContext() if c.fragment()]
        tables = [op.node.label for op in self.compiled.operators if any(
            f in text for f in fragments for text in op.expressions())]
        where = f"table {' / '.join(tables)}" if tables else "an expression of the pipeline"
        failing = f" (expression `{fragments[0]}`)" if fragments else ""
        return ExpressionError(
            f"{where}{failing} failed on this batch's data: "
            f"{first_line(exc)}. Spark evaluates with ANSI SQL semantics, so the same input "
            "fails again on every retry: make the expression total with the same result type "
            "(CASE WHEN <divisor> = 0 THEN NULL ELSE ... END, try_cast, try_add) or keep such "
            "records out upstream, then redeploy; processing resumes at this batch (a new "
            "table or a changed type changes the pipeline, whose saved state then no longer "
            "fits: that needs a start from scratch)")

    def version(self) -> EngineVersion:
        """The state as of the last batch; valid (and saveable) while later batches run."""
        return EngineVersion({name: (state, state.runs)
                              for name, state in self.compiled.states.items()})

    def save_state(self, path: str, version: EngineVersion | None = None) -> None:
        """Write every operator's state (as of `version`, by default now) under `path`, a new
        directory (local or any Hadoop-compatible URI; see `txstream.engine.persistence`)."""
        persistence.save(self.spark, path, self.compiled.fingerprint(),
                         (version or self.version()).states)

    def load_state(self, path: str) -> None:
        """Replace the engine's state with the one `save_state` wrote at `path`, and drop the
        plans recorded for the old one."""
        states = self.compiled.states
        runs = persistence.load(self.spark, path, self.compiled.fingerprint(), states,
                                self.index_rows)
        self._templates.clear()
        for name, state in states.items():
            state.install(runs.get(name, ()))
        self._index(list(states.values()))
