"""Warming an engine up with synthetic changes (`warming_up`, `warm_up`): made-up batches run
through a fresh engine and forgotten, so that Spark plans and compiles the pipeline's plans at
start, not on the first real transactions.

A fresh JVM plans, compiles and JIT-compiles a pipeline's Spark plans on its first batches,
which take several times as long as the same batches on a warm JVM. Warming up runs
batches of made-up rows through the pipeline before the first real one, so the service pays
that at start, not on its first transactions. The rows only need the sources' column types:
row `i` holds `i` in every column (as text, a number, a day, a decimal's last digits), so
equal-typed columns of different sources hold the same values and joins on them match one to
one. Booleans alternate: a join on a boolean column matches half the rows with half.

The made-up batches come in `WARM_UP_ROUNDS` rounds of three, the engine emptied between two:
the first round's batches plan and record the pipeline's plans (one per shape: changes into
empty state, into state, a lone transaction's), and later rounds reuse them, as real batches
do. The JIT compiles Spark's per-batch code (planning, scheduling,
the plan's operators) over many batches, not one: after the group-by example's first two real
batches the C2 compiler thread still took about a third of the CPU that the next million
events cost, and each further round of warm-up made the next batches faster, by less each
time, for a fraction of a second per round (the measurements: docs/benchmarks.md, "History").
"""

from __future__ import annotations

import itertools
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator

import numpy as np
import pyarrow as pa

from txstream.changes import Changes, consolidate
from txstream.engine import codegen
from txstream.engine.engine import Engine
from txstream.engine.errors import EngineStateError, ExpressionError
from txstream.engine.operators.base import first_line
from txstream.schemas.tables import ColumnType, TableSchema

log = logging.getLogger(__name__)

WARM_UP_ROUNDS = 5
_ROUND = 3  # made-up batches per round (see `_steps`)
WARM_UP_BATCHES = _ROUND * WARM_UP_ROUNDS  # the steps of a `WarmUp`
_tags = itertools.count(1)  # a job tag per warm-up, unique in the process

_MAKERS: dict[str, Callable[[np.ndarray], pa.Array]] = {
    "bigint": lambda ids: pa.array(ids, pa.int64()),
    "int": lambda ids: pa.array(ids % 2**31, pa.int64()).cast(pa.int32()),
    "double": lambda ids: pa.array(ids * 0.5, pa.float64()),
    "text": lambda ids: pa.array(ids, pa.int64()).cast(pa.string()),
    "boolean": lambda ids: pa.array(ids % 2 == 0, pa.bool_()),
    "timestamp": lambda ids: pa.array(ids * 1_000_000, pa.int64()),
    "date": lambda ids: pa.array((ids % 100_000).astype(np.int32), pa.int32()),
}


def _column(ctype: ColumnType, ids: np.ndarray) -> pa.Array:
    if ctype.is_decimal:
        assert ctype.precision is not None and ctype.scale is not None
        # `i` as the decimal's digits (its last `precision` ones): distinct for distinct rows.
        digits = ids % 10 ** min(ctype.precision, 18)
        whole, fraction = np.divmod(digits, 10**ctype.scale)
        text = whole.astype(str)
        if ctype.scale:
            text = np.char.add(np.char.add(text, "."),
                               np.char.zfill(fraction.astype(str), ctype.scale))
        values = pa.array(text, pa.string())
    else:
        values = _MAKERS[ctype.value](ids)
    return values.cast(ctype.arrow)


def synthetic_changes(schema: TableSchema, ids: np.ndarray, times: tuple[int, int], diff: int
                      ) -> Changes:
    """Rows `ids` (distinct, ascending) of `schema` as changes of weight `diff`, spread evenly
    over the transactions `times[0]` to `times[1]`: in time order, and consolidated as long as
    distinct ids make distinct rows (see the module doc)."""
    first, last = times
    spread = first + (np.arange(len(ids)) * (last - first + 1)) // max(len(ids), 1)
    columns = [_column(c.type, ids) for c in schema.columns]
    columns += [pa.array(spread, pa.int64()), pa.array(np.full(len(ids), diff), pa.int64())]
    return Changes(pa.Table.from_arrays(columns, schema=schema.arrow_schema(with_changes=True)))


def warming_up(engine: Engine, rows: int) -> WarmUp:
    """Run made-up changes through `engine`'s pipeline, one batch per step, then forget them:
    Spark plans, compiles and JIT-compiles the pipeline's plans now, not on the first real
    batches (see the module doc). `WARM_UP_ROUNDS` rounds of three batches of every source,
    the state emptied between two: `rows` insertions into empty state; half of them deleted
    and as many inserted; then ten insertions (a lone transaction's path). Yields the number of
    batches done after each.
    Only for a fresh engine, which nothing else may use until the warm-up is run through or
    closed: both empty its state again. The plans it recorded (for batches with changes of
    every source, into empty and non-empty state) stay until `Engine.load_state` replaces the
    state; the compiled code stays in any case, for every engine of the JVM. It never fails:
    it is only an optimization, and what went wrong is logged. Another thread may cut a step
    short (`WarmUp.cancel`)."""
    if not engine.fresh:
        raise EngineStateError("warm_up: only a fresh engine warms up, before it loads "
                               "state or processes a batch")
    return WarmUp(engine, rows)


def warm_up(engine: Engine, rows: int) -> float:
    """Warm `engine` up at once (`warming_up` run through); the seconds it took."""
    started = time.perf_counter()
    for _ in warming_up(engine, rows):
        pass
    return time.perf_counter() - started


class WarmUp(Iterator[int]):
    """The steps of `warming_up`: an iterator of the made-up batches done, one per step,
    which `close` ends between two steps and `cancel`, from another thread, during one. A step
    on a cold JVM takes seconds (planning, then a Spark job), which a real batch arriving
    meanwhile would otherwise wait out: `cancel` cancels the step's Spark jobs (its own job
    tag), the step ends, and the warm-up with it (`cut_short`). A step still planning submits
    its job afterwards: the caller cancels again until the step has returned."""

    def __init__(self, engine: Engine, rows: int) -> None:
        self._spark = engine.spark
        self._tag = f"txstream-warm-up-{next(_tags)}"
        self._cancelled = threading.Event()
        self._steps = _steps(engine, rows, self._tag, self._cancelled)

    def __next__(self) -> int:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()

    def cancel(self) -> None:
        self._cancelled.set()
        self._spark.sparkContext.cancelJobsWithTag(self._tag)

    @property
    def cut_short(self) -> bool:
        """Whether `cancel` was called."""
        return self._cancelled.is_set()


def _steps(engine: Engine, rows: int, tag: str, cancelled: threading.Event
           ) -> Generator[int, None, None]:
    """The `WARM_UP_BATCHES` batches of `warming_up` (see there), one per step, their
    Spark jobs tagged `tag`, with `engine.forget()` after each round, also when the steps are
    closed early, a batch fails or `cancelled` is set. Nothing at all for an engine no longer
    fresh when the first step is taken (its state is real)."""
    if not engine.fresh:
        log.warning("warm-up skipped: the engine took real state before its first step")
        return
    codegen.compile_now(engine.spark)
    half = rows // 2
    batches = [(np.arange(rows), (1, 5), 1),
               (np.arange(half), (6, 10), -1), (np.arange(rows, rows + half), (6, 10), 1),
               (np.arange(rows + half, rows + half + 10), (11, 11), 1)]
    schemas = {name: op.table_schema for name, op in engine.sources.items()}

    def changes(parts: list[tuple[np.ndarray, tuple[int, int], int]]) -> dict[str, Changes]:
        return {name: consolidate(pa.concat_tables(
            [synthetic_changes(schema, *part).table for part in parts]), schema.names)
            for name, schema in schemas.items()}

    context = engine.spark.sparkContext
    round_ = (batches[:1], batches[1:3], batches[3:])
    assert len(round_) == _ROUND
    try:
        for done, parts in enumerate(round_ * WARM_UP_ROUNDS, start=1):
            if cancelled.is_set():
                return
            if done > 1 and done % _ROUND == 1:
                engine.forget()  # a round begins with empty state
            # A thread's tags mark the jobs it submits (PySpark pins each Python thread to a
            # JVM thread of its own).
            context.addJobTag(tag)
            try:
                engine.process(changes(parts))
                if done == WARM_UP_BATCHES:
                    _save_made_up_state(engine)
            finally:
                context.removeJobTag(tag)
            yield done
    except ExpressionError as exc:
        # Made-up values may fail an expression real data never fails (a cast of text): what
        # ran so far is warm, and the real batches plan the rest.
        log.info("warm-up stopped early: %s", first_line(exc))
    except Exception as exc:  # an optimization must not stop the start
        if cancelled.is_set():
            log.info("warm-up cut short: its made-up batch's job was cancelled (%s)",
                     first_line(exc))
        else:
            log.warning("warm-up failed, the service starts without it (the first batches "
                        "plan and compile their code): %s", first_line(exc))
    finally:
        engine.forget()


def _save_made_up_state(engine: Engine) -> None:
    """Save the made-up state into a scratch directory, deleted at once: the first Parquet
    write of a JVM loads and compiles its writer, which a stop's final checkpoint
    (`Engine.save_state`) otherwise waits out: most of that checkpoint for a small state. Only
    where the driver's directory is the executors' too (a local master)."""
    if not engine.spark.sparkContext.master.startswith("local"):
        return
    with tempfile.TemporaryDirectory(prefix="txstream-warm-up-") as scratch:
        engine.save_state(f"{scratch}/state")
