"""The engine: compiles a pipeline once into incremental operators, then turns batches of input
changes (many consecutive transactions at once) into the output tables' changes.

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

import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from txstream.changes import Changes
from txstream.engine import codegen, run_index, warmup
from txstream.engine.batch import BatchPlan
from txstream.engine.columns import PART
from txstream.engine.errors import (
    EngineInputError,
    EngineStateError,
    ExpressionError,
    PipelineDefinitionError,
)
from txstream.engine.frames import spread, union_all
from txstream.engine.indexing import StateIndexes
from txstream.engine.operators import OPERATORS, Operator, SourceOp
from txstream.engine.operators.base import Key, first_line, tell_readers
from txstream.engine.replicas import keep_replicated
from txstream.engine.results import ResultLayout
from txstream.engine.spark_internals import materialize, plan_now, rdd_leaf, rdd_of
from txstream.engine.sparkjobs import JobCount, call_site, counted
from txstream.engine.state import Run, Runs, StagedRuns, ZSetState
from txstream.engine.state_files import write_manifest, write_states
from txstream.engine.table import Node, Pipeline
from txstream.engine.templates import Template, instantiate, ready, record
from txstream.schemas.tables import Column, ColumnType, TableSchema

# A state run holding at least this many rows gets an index, so lookups probe it instead of
# streaming it (see `txstream.engine.state`): streaming costs ~0.1 s per million rows per
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


@dataclass(frozen=True)
class OutputTable:
    name: str
    schema: TableSchema
    node: Node


def _table_schema(name: str, schema: StructType, key: tuple[str, ...] | None, inferred: Key
                  ) -> TableSchema:
    """An output's schema: its columns, and its primary key (`key`, else the one the DAG
    shows, else none)."""
    primary_key = key if key is not None else (inferred or ())
    missing = [k for k in primary_key if k not in schema.names]
    if missing:
        raise PipelineDefinitionError(
            f"output {name!r}: primary key column(s) {', '.join(missing)} not in "
            f"{', '.join(schema.names)}"
        )
    # Every column may hold nulls, keys too: a group-by key or a distinct row can be null.
    return TableSchema(
        columns=tuple(
            Column(name=f.name, type=ColumnType.from_spark(f.dataType.simpleString()))
            for f in schema.fields
        ),
        primary_key=tuple(primary_key),
    )


class Engine:
    """Runs one pipeline. Not thread-safe: one batch at a time, in transaction order."""

    def __init__(self, pipeline: Pipeline, spark: SparkSession, *, parallelism: int = 1,
                 interpreted_rows: int = codegen.INTERPRETED_ROWS,
                 cold_interpreted_rows: int = codegen.COLD_INTERPRETED_ROWS,
                 index_rows: int = INDEX_ROWS, spread_rows: int = SPREAD_ROWS,
                 state_replicas: int = 1, index_dir: str | None = None) -> None:
        if not pipeline.outputs:
            raise PipelineDefinitionError("the pipeline has no outputs: call pipeline.output(...)")
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
        self._ops: list[Operator] = []
        by_id: dict[int, Operator] = {}
        keys: dict[int, Key] = {}  # a set of unique columns of each node, where one is known
        for node in pipeline.nodes():
            op_type = OPERATORS[type(node)]
            op = op_type(spark, node, [by_id[i.id].schema for i in node.inputs])
            by_id[node.id] = op
            keys[node.id] = op.key([keys[i.id] for i in node.inputs])
            self._ops.append(op)
        tell_readers(self._ops, {out.node.id for out in pipeline.outputs.values()})
        # A delta read by several operators or outputs is computed once (BatchPlan.shared).
        self._consumers = Counter(i.id for op in self._ops for i in op.node.inputs)
        self._consumers.update(out.node.id for out in pipeline.outputs.values())
        outputs = {out.node.id for out in pipeline.outputs.values()}
        for op in self._ops:  # read by an output alone: as pairs, if it makes them
            op.emit_pairs = (op.pairs() is not None and op.node.id in outputs
                             and self._consumers[op.node.id] == 1)
        self.last_batch: BatchStats | None = None
        self.totals = JobCount(0, 0)  # Spark jobs and stages of every batch so far
        self.outputs = {
            name: OutputTable(name, _table_schema(name, by_id[out.node.id].schema,
                                                  out.primary_key, keys[out.node.id]), out.node)
            for name, out in pipeline.outputs.items()
        }
        self.sources = {op.name: op for op in self._ops if isinstance(op, SourceOp)}
        self._result = ResultLayout({name: (out.schema, by_id[out.node.id].pairs() if
                                            by_id[out.node.id].emit_pairs else None)
                                     for name, out in self.outputs.items()})
        self._templates: dict[tuple[object, ...], Template] = {}
        for state in self._states().values():
            state.partitions = parallelism
            state.replicas = state_replicas
        self.state_replicas = state_replicas
        self.state_replications = 0  # times runs were copied again (`txstream.engine.replicas`)

    def _shape(self, changes: Mapping[str, Changes], planned: int) -> tuple[object, ...]:
        """What decides every plan of a batch planned for `planned` partitions (see
        `txstream.engine.templates`)."""
        return (planned, tuple(sorted(changes)),
                tuple(s.shape() for s in self._states().values()))

    def process(self, changes: Mapping[str, Changes]) -> dict[str, Changes]:
        """Run one batch: `changes` maps source names to their changes (any number of
        transactions, all later than those already processed, their numbers increasing but
        not necessarily consecutive: a netted batch is one, `Changes.net`; a source without
        changes may be left out). Returns every output's changes, consolidated and ordered
        (by time, and within a time the deletions before the insertions)."""
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
        indexes = sum(len(s.indexed()) for s in self._states().values())
        template = self._templates.get(shape)
        recorded: Template | None = None
        if self.parallelism > 1:
            # Read when a plan is made: an aggregate of deltas alone gets P partitions, as the
            # state it meets has (a session setting, so set for every batch, whichever engine).
            self.spark.conf.set("spark.sql.shuffle.partitions", str(self.parallelism))
        with call_site(self.spark.sparkContext, "txstream engine batch"), spread(planned):
            if template is not None and not ready(self.spark, template):
                del self._templates[shape]  # built by the operators, as every batch of its shape
                template = None
            if template is not None:
                rows = {name: self.sources[name].rows(t, planned) for name, t in present.items()}
                final, staged = instantiate(self.spark, template, rows, weight)
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
                self._indexing.stop(self._states().values(), str(exc))
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
        return result

    def _keep_replicated(self) -> None:
        """With `state_replicas` above 1: before a batch reads the state (an executor may have
        been lost since) and after it installs new runs (written while one was missing), copy
        the runs found on fewer executors again, so that the next loss is survived too."""
        if self.state_replicas > 1:
            with call_site(self.spark.sparkContext, "txstream state re-replication"):
                self.state_replications += keep_replicated(
                    self.spark, list(self._states().values()), self.state_replicas)

    @property
    def fresh(self) -> bool:
        """Whether the engine has neither loaded state nor processed a batch."""
        return self.last_batch is None and not any(s.runs for s in self._states().values())

    def warm_up(self, rows: int) -> float:
        """Warm the engine up at once (`warming_up` run through); the seconds it took."""
        started = time.perf_counter()
        for _ in self.warming_up(rows):
            pass
        return time.perf_counter() - started

    def warming_up(self, rows: int) -> warmup.WarmUp:
        """Run made-up changes through the pipeline, one batch per step, then forget them:
        Spark plans, compiles and JIT-compiles the pipeline's plans now, not on the first real
        batches (see `txstream.engine.warmup`). `warmup.WARM_UP_ROUNDS` rounds of three batches
        of every source, the state emptied between two: `rows` insertions into empty state;
        half of them deleted and as many inserted; then ten insertions (a lone transaction's
        path). Yields the number of batches done after each.
        Only for a fresh engine, which nothing else may use until the warm-up is run through or
        closed: both empty its state again. The plans it recorded (for batches with changes of
        every source, into empty and non-empty state) stay until `load_state` replaces the
        state; the compiled code stays in any case, for every engine of the JVM. It never
        fails: it is only an optimization, and what went wrong is logged. Another thread may
        cut a step short (`WarmUp.cancel`)."""
        if not self.fresh:
            raise EngineStateError("warm_up: only a fresh engine warms up, before it loads "
                                   "state or processes a batch")
        return warmup.WarmUp(self, rows)

    def forget(self) -> None:
        """Back to fresh: empty state, no batch run (for the warm-up: the plans it recorded
        stay; see `warming_up`)."""
        for state in self._states().values():
            state.install(())
        self._index(list(self._states().values()))
        self.last_batch = None
        self.totals = JobCount(0, 0)

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
        return sum(s.index_bytes for s in self._states().values())

    def _build(self, changes: Mapping[str, Changes], weight: int, planned: int
               ) -> tuple[DataFrame | None, tuple[str, ...], list[StagedRuns], Template | None]:
        """Plan a batch through the operators, for `planned` partitions: its final frame
        (None: nothing to compute), the outputs it holds, the staged runs, and its template."""
        batch = BatchPlan(self.spark, weight, parallelism=planned)
        deltas: dict[int, DataFrame | None] = {}
        sources: dict[str, DataFrame] = {}
        for op in self._ops:
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
            if delta is not None and self._consumers[op.node.id] > 1:
                delta = batch.shared(delta, clustered_by=batch.clustering_of(delta))
            deltas[op.node.id] = delta
        outputs = {name: deltas[out.node.id] for name, out in self.outputs.items()}
        final, present = self._final_frame(outputs, batch)
        template = None
        if final is not None:
            template = record(self.spark, batch, sources, list(self._states().values()), final,
                              present)
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
        parts = [outputs[name].select(*self._result.columns(name)) for name in present]  # type: ignore[union-attr]
        if batch.frames:
            hidden = union_all([f.select(F.lit(-1).alias(PART)) for f in batch.frames])
            parts.append(hidden.where(F.spark_partition_id() < 0)
                         .select(*self._result.columns(None)))
        final = union_all(parts)
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
            return self._result.read(None, ()), 0.0, JobCount(0, 0)
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
        return self._result.read(table, present), executed, count

    def _expression_error(self, exc: PySparkException) -> ExpressionError:
        """The failure of a batch's data in terms of the pipeline: Spark's query context gives
        the failing fragment of SQL, which is found in the expressions of the tables."""
        fragments = [c.fragment() for c in exc.getQueryContext() if c.fragment()]
        tables = [op.node.label for op in self._ops if any(
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

    def _fingerprint(self) -> list[str]:
        """What a saved state must match: each operator's output schema and states' layout."""
        return [f"{op.node.label} -> {op.schema.simpleString()} {op.state_layout()}".rstrip()
                for op in self._ops]

    def _states(self) -> dict[str, ZSetState]:
        # Operators are numbered in DAG order, which is stable for one pipeline definition.
        return {f"{i:03d}-{type(op).__name__}-{name}": state
                for i, op in enumerate(self._ops) for name, state in op.states().items()}

    def version(self) -> EngineVersion:
        """The state as of the last batch; valid (and saveable) while later batches run."""
        return EngineVersion({name: (state, state.runs) for name, state in self._states().items()})

    def save_state(self, path: str, version: EngineVersion | None = None) -> None:
        """Write every operator's state (as of `version`, by default now) under `path`, a new
        directory (local or any Hadoop-compatible URI). The manifest is written last: a state
        without it is incomplete."""
        version = version or self.version()
        saved = {name: (state, runs) for name, (state, runs) in version.states.items() if runs}
        write_states(path, saved)
        weights = {}
        row_types = {}
        for name, (state, runs) in saved.items():
            weights[name] = sum(run.weight for run in runs)
            assert state.row_type is not None  # fixed by the rows the runs hold
            row_types[name] = state.row_type.jsonValue()
        manifest = json.dumps({"format": 1, "operators": self._fingerprint(),
                               "states": list(saved), "weights": weights, "row_types": row_types})
        write_manifest(self.spark, f"{path}/_manifest", manifest)

    def load_state(self, path: str) -> None:
        """Replace the engine's state with the one `save_state` wrote at `path`."""
        try:
            text = self.spark.read.text(f"{path}/_manifest").first()
        except AnalysisException as exc:
            raise EngineStateError(f"no complete engine state at {path}: {exc}") from exc
        if text is None:
            raise EngineStateError(f"no complete engine state at {path}: empty manifest")
        manifest = json.loads(text[0])
        mine = self._fingerprint()
        if manifest.get("operators") != mine:
            theirs = manifest.get("operators", [])
            diff = next((f"{a!r} vs now {b!r}" for a, b in zip(theirs, mine, strict=False)
                         if a != b), f"{len(theirs)} operators vs now {len(mine)}")
            raise EngineStateError(
                f"the state at {path} was saved by a different pipeline definition or "
                f"engine version (first difference: {diff}); start from empty state instead"
            )
        saved = set(manifest.get("states", []))
        # The runs' weights as saved, where they cannot make the run look large enough for an
        # index (a weight counts input rows, not the rows left): a state written before they
        # were, or one that may be large, is counted (a job).
        weights = {name: weight for name, weight in manifest.get("weights", {}).items()
                   if weight < self.index_rows}
        # The row types, saved since manifests hold them (earlier ones: read from the files).
        row_types = {name: StructType.fromJson(value)
                     for name, value in manifest.get("row_types", {}).items()}
        self._templates.clear()
        states = self._states()
        restored = {}
        for name, state in states.items():
            state.install(())
            if name in saved:
                restored[name] = state.restored(self.spark, f"{path}/{name}", row_types.get(name))
        # One Spark job, not one or two per state (but a state saved without weight: counted).
        materialize(self.spark, [rdd_of(frame) for frame in restored.values()])
        for name, frame in restored.items():
            # Weighed (by its rows, or the input rows it summarizes), so that small batches
            # after a restore do not rewrite it.
            weight = weights.get(name)
            states[name].install((Run(frame, frame.count() if weight is None else weight),))
        self._index(list(states.values()))
