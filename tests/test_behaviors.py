"""Temporal behaviors (`windowby(..., behavior=...)`, `txstream.engine.operators.behavior`):
when a window's rows reach the reduce and when a closed window leaves its state.

* Pathway's own update streams under each behavior, ported exactly (its tutorial's sliding
  windows, a tumbling window with a deletion), one Pathway time per transaction; where
  `keep_results=False` retracts a window, in the transaction whose rows close it (DESIGN
  section 10), where Pathway waits for its next row that is not late;
* random transactions (inserts, updates, deletes, event times mostly rising, some late) against
  the clock rule's from-scratch recompute (`tests/support/temporal_model.py`, itself checked
  against Pathway) after every transaction, at batch sizes 1, 7 and all and at parallelism 1
  and 2: the same update streams, and the same late rows;
* the same random transactions through Pathway 0.33 itself (its own virtualenv), one Pathway
  time per transaction, under every behavior that keeps its results: the same update streams;
* a closed window's state leaves the engine: after a stream of windows, the states hold only
  what open windows need;
* definition errors that name what to fix.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from support import pathway_streams as printed
from support.pathway_peer import pathway_spec, windows_streams
from support.temporal_model import (
    Behavior,
    Change,
    Windows,
    exactly_once,
    late_entries,
    rising_changes,
    update_stream,
)

from txstream import Pipeline, PipelineDefinitionError, Table, TableSchema
from txstream import reducers as r
from txstream import temporal as t
from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine

EVENTS = TableSchema.of({"id": "bigint", "user_id": "bigint", "ts": "bigint", "v": "bigint"},
                        primary_key=["id"])


def _as_txstream(windows: Windows, behavior: Behavior | None) -> tuple[t.Sliding,
                                                                          t.CommonBehavior | None]:
    window = t.sliding(windows.hop, windows.duration, windows.origin)
    if behavior is None:
        return window, None
    return window, t.common_behavior(behavior.delay, behavior.cutoff, behavior.keep_results)


def _pipeline(cases: dict[str, tuple[Windows, Behavior | None, bool]], late: bool = False
              ) -> Pipeline:
    """Each case's windowed count and sum of `v` as an output; with `late`, the late rows of
    each case with a cutoff too (output `<case>_late`)."""
    p = Pipeline()
    events = p.source("s", EVENTS)
    for name, (windows, behavior, instance) in cases.items():
        window, shown = _as_txstream(windows, behavior)
        grouped = events.windowby("ts", window=window, behavior=shown,
                                  instance="user_id" if instance else ())
        p.output(name, grouped.reduce(n=r.count(), s=r.sum("v")))
        if late and behavior is not None and behavior.cutoff is not None:
            p.output(f"{name}_late", grouped.late_rows())
    return p


def _streams(spark: SparkSession, pipeline: Pipeline, changes: list[Change], size: int | None,
             parallelism: int = 1, engine: Engine | None = None) -> dict[str, list[tuple]]:
    """Every output's changes as (*row, transaction, diff) in stream order, the source's
    `changes` given in batches of `size` transactions (None: one batch)."""
    engine = engine or Engine(pipeline, spark, parallelism=parallelism)
    times = sorted({number for _, number, _ in changes})
    size = size or len(times)
    got: dict[str, list[tuple]] = {name: [] for name in pipeline.outputs}
    for i in range(0, len(times), size):
        group = set(times[i:i + size])
        batch = [c for c in changes if c[1] in group]
        data = {n: [row[j] for row, _, _ in batch] for j, n in enumerate(EVENTS.names)}
        data |= {TIME: [number for _, number, _ in batch], DIFF: [diff for _, _, diff in batch]}
        out = engine.process({"s": Changes(pa.table(
            data, schema=EVENTS.arrow_schema(with_changes=True)))})
        for name in got:
            got[name] += [tuple(row.values()) for row in out[name].table.to_pylist()]
    return {name: printed.in_stream_order(rows) for name, rows in got.items()}


# --- Pathway's streams -------------------------------------------------------------------------

SLIDING = Windows(hop=4, duration=10)
FROM_360 = Windows(hop=4, duration=10, origin=360)
TUTORIAL_CASES = {
    "common_behavior(delay=4)": (SLIDING, Behavior(delay=4), False),
    "common_behavior(cutoff=4)": (SLIDING, Behavior(cutoff=4), False),
    "exactly_once_behavior(shift=2)": (FROM_360, exactly_once(FROM_360, shift=2), False),
}


def _tutorial() -> list[Change]:
    return [((i, 0, event, 1), printed.TUTORIAL_TIMES.index(arrived) + 1, 1)
            for i, (event, arrived) in enumerate(printed.TUTORIAL)]


def _count_only(stream: list[tuple]) -> list[tuple]:
    """(start, end, n, transaction, diff): the tutorial's windows count rows only."""
    return [(*row[:3], *row[4:]) for row in stream]


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 1), (3, 2)])
def test_pathways_tutorial_streams_under_each_behavior(spark: SparkSession, size: int | None,
                                                       parallelism: int) -> None:
    got = _streams(spark, _pipeline(TUTORIAL_CASES), _tutorial(), size, parallelism)
    for name in TUTORIAL_CASES:
        assert _count_only(got[name]) == printed.parse(printed.TUTORIAL_STREAMS[name],
                                                       printed.TUTORIAL_TIMES), name


def test_without_keeping_results_a_window_leaves_when_its_rows_close_it(
        spark: SparkSession) -> None:
    """Pathway's stream for `common_behavior(cutoff=4, keep_results=False)`, but the windows the
    clock closes in transaction 6 retracted there, not at Pathway's next row that is not late."""
    case = {"o": (FROM_360, Behavior(cutoff=4, keep_results=False), False)}
    got = _streams(spark, _pipeline(case), _tutorial(), 1)["o"]
    pathway = printed.parse(
        printed.TUTORIAL_STREAMS["common_behavior(cutoff=4, keep_results=False)"],
        printed.TUTORIAL_TIMES)
    lazy = {(360, 370, 3, 7, -1), (364, 374, 4, 7, -1), (368, 378, 3, 7, -1)}
    assert lazy <= set(pathway)
    assert _count_only(got) == printed.in_stream_order(
        [row for row in pathway if row not in lazy] + [(*row[:3], 6, -1) for row in lazy])


TUMBLING = Windows(hop=10, duration=10)


@pytest.mark.parametrize("size", [1, None])
def test_pathways_tumbling_streams_with_a_deletion(spark: SparkSession, size: int | None
                                                   ) -> None:
    cases = {"common_behavior(cutoff=0)": (TUMBLING, Behavior(cutoff=0), False),
             "exactly_once_behavior()": (TUMBLING, exactly_once(TUMBLING), False)}
    changes = [((i, 0, ts, v), printed.TUMBLING_TIMES.index(time) + 1, diff)
               for (i, ts, v), time, diff in printed.TUMBLING_ROWS]
    got = _streams(spark, _pipeline(cases), changes, size)
    for name in cases:
        assert got[name] == printed.parse(printed.TUMBLING_STREAMS[name],
                                          printed.TUMBLING_TIMES), name


# --- against the clock rule's recompute ---------------------------------------------------------

RANDOM_CASES: dict[str, tuple[Windows, Behavior | None, bool]] = {
    "delay": (Windows(5, 5), Behavior(delay=3), True),
    "cutoff": (Windows(3, 7), Behavior(cutoff=2), False),
    "delay_cutoff": (Windows(4, 4), Behavior(delay=6, cutoff=1), True),
    "retract": (Windows(5, 5), Behavior(cutoff=3, keep_results=False), True),
    "retract_delayed": (Windows(4, 8), Behavior(delay=5, cutoff=2, keep_results=False), False),
    # Released after the clock closed the window: emitted once, and forgotten at once.
    "release_after_close": (Windows(4, 8), Behavior(delay=14, cutoff=2), True),
    "exactly_once": (Windows(5, 5), exactly_once(Windows(5, 5), shift=1), True),
    "exactly_once_sliding": (Windows(2, 6), exactly_once(Windows(2, 6)), False),
}


@pytest.mark.parametrize(("seed", "transactions", "sizes", "parallelism"),
                         [(1, 20, (1, 7, None), 1), (2, 40, (7, None), 2), (3, 12, (1,), 2)])
def test_behaviors_follow_the_clock_rule_at_every_batch_size(
        spark: SparkSession, seed: int, transactions: int, sizes: tuple[int | None, ...],
        parallelism: int) -> None:
    changes = rising_changes(random.Random(seed), transactions)
    pipeline = _pipeline(RANDOM_CASES, late=True)
    want = {name: update_stream(changes, windows, behavior, instance, transactions)
            for name, (windows, behavior, instance) in RANDOM_CASES.items()}
    assert all(want.values()), "every case emits"
    assert sum(row[-1] < 0 for stream in want.values() for row in stream) > 10, \
        "the recompute retracts windows"
    late = {f"{name}_late": late_entries(changes, windows, behavior, transactions)
            for name, (windows, behavior, _) in RANDOM_CASES.items()
            if behavior is not None and behavior.cutoff is not None}
    assert sum(map(len, late.values())) > 10, "rows come late"
    for size in sizes:
        engine = Engine(pipeline, spark, parallelism=parallelism)
        got = _streams(spark, pipeline, changes, size, engine=engine)
        for name in RANDOM_CASES:
            assert got[name] == want[name], f"{name}: seed {seed}, batches of {size}"
        for name, rows in late.items():
            # The late rows' table: the row, its window, the clock then, the behavior's label.
            assert {row[-3] for row in got[name]} == {pipeline.outputs[name].node.inputs[0].label}
            assert [(*row[:-3], *row[-2:]) for row in got[name]] == rows, name
        assert sum(engine.late_rows.values()) == sum(abs(row[-1]) for rows in late.values()
                                                     for row in rows)


# --- Pathway itself on the same changes --------------------------------------------------------

def test_behaviors_give_pathways_update_streams(spark: SparkSession, tmp_path: Path) -> None:
    """Every case that keeps its results (Pathway retracts a closed window later than the
    clock rule: see test_without_keeping_results_...), through Pathway 0.33's windowby in its
    own virtualenv and through txstream in batches of 7 transactions."""
    cases = {name: case for name, case in RANDOM_CASES.items()
             if case[1] is not None and case[1].keep_results}
    changes = rising_changes(random.Random(21), 40)
    want = windows_streams([(*row, number, diff) for row, number, diff in changes],
                           {name: pathway_spec(*case) for name, case in cases.items()}, tmp_path)
    got = _streams(spark, _pipeline(cases), changes, 7)
    for name in cases:
        assert len(want[name]) > 5, f"{name}: Pathway emitted little"
        assert got[name] == [tuple(row) for row in want[name]], name


# --- closed windows leave the state ------------------------------------------------------------

def _open_entries(changes: list[Change], windows: Windows, shift: int) -> int:
    """The (row, window) pairs an exactly-once buffer holds after `changes`: rows present
    (net of their deletions) in the windows the clock has not reached the end plus `shift` of."""
    clock = max(row[2] for row, _, _ in changes)
    net: dict[tuple[tuple[int, ...], tuple[int, int]], int] = {}
    for row, _, diff in changes:
        for window in windows.of(row[2]):
            if window[1] + shift > clock:
                net[(row, window)] = net.get((row, window), 0) + diff
    return sum(1 for n in net.values() if n)


def test_closed_windows_leave_the_state(spark: SparkSession) -> None:
    """60 transactions over 40 windows: without a behavior the reduce keeps a group per window
    and user; exactly once, it keeps none (each window is forgotten as it is emitted) and the
    buffer only the rows of the windows still open; with a cutoff, the reduce keeps the
    windows not yet closed, its released rows no more."""
    windows = Windows(5, 5)
    rng = random.Random(7)
    changes: list[Change] = []
    for number in range(1, 61):  # new page views for ever, now and then one taken back
        for i in range(3):
            changes.append(((3 * number + i, rng.randint(1, 2), 3 * number + rng.randint(-2, 2),
                             rng.randint(1, 9)), number, 1))
        if rng.random() < 0.3:
            changes.append((changes[-4][0], number, -1))
    cases = {"kept": (windows, None, True),
             "exactly_once": (windows, exactly_once(windows, shift=1), True),
             "cutoff": (windows, Behavior(cutoff=2), True)}
    pipeline = _pipeline(cases)
    engine = Engine(pipeline, spark)
    got = _streams(spark, pipeline, changes, 10, engine=engine)
    assert all(got.values())
    rows = engine.state_rows()

    def of(operator: str, state: str) -> list[int]:
        return [n for name, n in rows.items() if operator in name and name.endswith(state)]

    groups = of("ReduceOp", "acc_state")  # in the order of the outputs
    clock = max(row[2] for row, _, _ in changes)
    assert groups[0] > 60, "without a behavior every window stays"
    assert groups[1] == 0, "exactly once: a window leaves the state as it is emitted"
    open_groups = {(row[1], w) for row, _, _ in changes for w in windows.of(row[2])
                   if w[1] + 2 > clock}
    assert 0 < groups[2] <= len(open_groups)
    assert of("BehaviorOp", "buffer") == [_open_entries(changes, windows, 1)]
    assert of("BehaviorOp", "released")[-1] <= 4 * len(open_groups)
    assert of("BehaviorOp", "clock") == [1, 1]


def test_a_restored_engine_goes_on_as_if_it_never_stopped(spark: SparkSession,
                                                         tmp_path: Path) -> None:
    """The clock, the buffer and the released rows are state like any other: saved after
    transaction 20 and loaded into a new engine (as a restart from a checkpoint does), the
    rest of the stream is the one an engine that never stopped gives."""
    changes = rising_changes(random.Random(5), 40)
    cases = {name: RANDOM_CASES[name] for name in ("delay_cutoff", "retract", "exactly_once")}
    pipeline = _pipeline(cases, late=True)
    whole = _streams(spark, pipeline, changes, 5)
    first = Engine(pipeline, spark)
    before = _streams(spark, pipeline, [c for c in changes if c[1] <= 20], 5, engine=first)
    first.save_state(str(tmp_path / "state"))
    second = Engine(_pipeline(cases, late=True), spark)
    second.load_state(str(tmp_path / "state"))
    after = _streams(spark, pipeline, [c for c in changes if c[1] > 20], 5, engine=second)
    for name, stream in whole.items():
        assert any(row[-2] > 20 for row in stream), name
        assert before[name] + after[name] == stream, name


def test_a_pipeline_with_a_behavior_is_never_netted(spark: SparkSession) -> None:
    """A batch's net change moves a behavior's clock once where its transactions move it one by
    one, so the runner must not net batches (`Engine.nets_exactly`) even when every sink
    would allow it: here netting transactions 1 and 2 would count the row of transaction 1,
    late by the clock of transaction 1."""
    case = {"o": (Windows(5, 5), Behavior(cutoff=0), False)}
    changes: list[Change] = [((1, 1, 20, 1), 1, 1), ((2, 1, 3, 1), 2, 1)]
    by_one = _streams(spark, _pipeline(case), changes, 1)["o"]
    netted = _streams(spark, _pipeline(case), [(row, 2, diff) for row, _, diff in changes],
                      1)["o"]
    assert [row[:-2] for row in by_one] != [row[:-2] for row in netted]
    assert not Engine(_pipeline(case), spark).nets_exactly
    assert Engine(_pipeline({"o": (Windows(5, 5), None, False)}), spark).nets_exactly


# --- definition errors -------------------------------------------------------------------------

def _source() -> Table:
    return Pipeline().source("s", TableSchema.of({"id": "bigint", "ts": "timestamp"},
                                                 primary_key=["id"]))


MINUTE = t.tumbling(timedelta(minutes=1))


@pytest.mark.parametrize(("build", "says"), [
    (lambda s: s.windowby("ts", window=MINUTE,
                          behavior=t.common_behavior(keep_results=False)),
     "keep_results=False .* needs a cutoff"),
    (lambda s: s.windowby("ts", window=MINUTE, behavior=t.common_behavior(delay=5)),
     "a timedelta for timestamp windows"),
    (lambda s: s.windowby("ts", window=t.tumbling(5),
                          behavior=t.exactly_once_behavior(timedelta(seconds=1))),
     "a number for numeric ones"),
    (lambda s: s.windowby("ts", window=MINUTE,
                          behavior=t.common_behavior(cutoff=timedelta(seconds=-1))),
     "must not be negative"),
    (lambda s: s.windowby("ts", window=MINUTE, behavior="exactly once"),  # type: ignore[arg-type]
     "is not a behavior"),
])
def test_a_behavior_that_cannot_be_says_why(build: Callable[[Table], object], says: str
                                            ) -> None:
    with pytest.raises(PipelineDefinitionError, match=says) as raised:
        build(_source())
    assert "source s" in str(raised.value), "the message names the table"
