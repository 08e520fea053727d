"""Behaviors on session windows, which Pathway ignores and DESIGN section 10 asks txstream to
honour (`txstream.engine.operators.session`): rows late by the clock and the cutoff, sessions
closed once no row on time can join them (kept, retracted, or shown only then), their rows out
of the state.

* a step-by-step stream under each behavior, and its late rows;
* random inserts, updates and deletes against the rule's from-scratch recompute
  (`tests/support/temporal_model.session_results`) after every transaction, at batch sizes 1, 7
  and all and parallelism 1 and 2, the late rows' table and count included;
* closed sessions leave the state; definition errors.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from pyspark.sql import SparkSession
from support.pathway_streams import in_stream_order
from support.temporal_model import Change, rising_changes, session_results
from test_behaviors import _streams

from txstream import Pipeline, PipelineDefinitionError, TableSchema
from txstream import reducers as r
from txstream import temporal as t
from txstream.engine import Engine
from txstream.engine.temporal import Behavior

EVENTS = TableSchema.of({"id": "bigint", "user_id": "bigint", "ts": "bigint", "v": "bigint"},
                        primary_key=["id"])
GAP = 3


def _pipeline(behaviors: dict[str, Behavior], instance: bool = True) -> Pipeline:
    """Per name, sessions of `GAP` under the behavior, counted and summed; and their late rows
    (`<name>_late`)."""
    p = Pipeline()
    events = p.source("s", EVENTS)
    for name, behavior in behaviors.items():
        grouped = events.windowby("ts", window=t.session(max_gap=GAP), behavior=behavior,
                                  instance="user_id" if instance else ())
        p.output(name, grouped.reduce(n=r.count(), s=r.sum("v")))
        p.output(f"{name}_late", grouped.late_rows())
    return p


STEPS: list[Change] = [((1, 0, 1, 1), 1, 1), ((2, 0, 2, 2), 2, 1), ((3, 0, 10, 4), 3, 1),
                       ((4, 0, 0, 8), 4, 1)]


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 1), (2, 2)])
def test_sessions_close_and_rows_come_late_step_by_step(spark: SparkSession, size: int | None,
                                                        parallelism: int) -> None:
    """t=1, 2 form one session; t=10 brings the clock to 10 >= 2 + 3 + 2, which closes it; t=0
    then comes late (0 + 2 <= 10)."""
    behaviors = {"kept": t.common_behavior(cutoff=2),
                 "retracted": t.common_behavior(cutoff=2, keep_results=False),
                 "once": t.exactly_once_behavior(shift=2)}
    got = _streams(spark, _pipeline(behaviors, instance=False), STEPS, size, parallelism)
    # window_start | window_end | n | s | transaction | diff
    opened = [(1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 2, -1), (1, 2, 2, 3, 2, 1), (10, 10, 1, 4, 3, 1)]
    assert got["kept"] == in_stream_order(opened)
    assert got["retracted"] == in_stream_order([*opened, (1, 2, 2, 3, 3, -1)])
    assert got["once"] == [(1, 2, 2, 3, 3, 1)], "shown once, when closed"
    # The late row, no session, the clock then, the operator: at its transaction.
    for name in behaviors:
        ((*row, start, end, clock, _operator, number, diff),) = got[f"{name}_late"]
        assert (tuple(row), start, end, clock, number, diff) == ((4, 0, 0, 8), None, None, 10,
                                                                 4, 1)


def _model_stream(changes: list[Change], cutoff: int, keep: bool, at_close: bool,
                  transactions: int) -> tuple[list[tuple], list[tuple]]:
    """The recompute's update stream and late rows."""
    stream = []
    before: Counter = Counter()
    late: list[tuple] = []
    for number in range(1, transactions + 1):
        after, late = session_results(changes, GAP, cutoff, keep, at_close, number)
        stream += [(*row, number, after[row] - before[row]) for row in set(before) | set(after)
                   if after[row] != before[row]]
        before = after
    return in_stream_order(stream), late


CASES = {
    "kept": (t.common_behavior(cutoff=4), 4, True, False),
    "retracted": (t.common_behavior(cutoff=1, keep_results=False), 1, False, False),
    "once": (t.exactly_once_behavior(shift=2), 2, True, True),
}


@pytest.mark.parametrize(("seed", "transactions", "sizes", "parallelism"),
                         [(1, 25, (1, 7, None), 1), (2, 40, (7, None), 2)])
def test_session_behaviors_follow_the_rule_at_every_batch_size(
        spark: SparkSession, seed: int, transactions: int, sizes: tuple[int | None, ...],
        parallelism: int) -> None:
    changes = rising_changes(random.Random(seed), transactions)
    pipeline = _pipeline({name: case[0] for name, case in CASES.items()})
    want = {name: _model_stream(changes, cutoff, keep, once, transactions)
            for name, (_, cutoff, keep, once) in CASES.items()}
    assert all(stream for stream, _ in want.values()), "every case emits"
    assert sum(len(late) for _, late in want.values()) > 5, "rows come late"
    assert any(row[-1] < 0 for row in want["retracted"][0]), "sessions retracted"
    for size in sizes:
        engine = Engine(pipeline, spark, parallelism=parallelism)
        got = _streams(spark, pipeline, changes, size, engine=engine)
        for name, (stream, late) in want.items():
            assert got[name] == stream, f"{name}: seed {seed}, batches of {size}"
            assert [(*row[:4], row[-4], *row[-2:]) for row in got[f"{name}_late"]] == late
        assert sum(engine.late_rows.values()) == sum(
            abs(row[-1]) for _, late in want.values() for row in late)


def test_closed_sessions_leave_the_state(spark: SparkSession) -> None:
    changes = rising_changes(random.Random(5), 60)
    p = Pipeline()
    events = p.source("s", EVENTS)
    for name, behavior in (("kept", t.common_behavior(cutoff=2)), ("none", None)):
        p.output(name, events.windowby("ts", window=t.session(max_gap=GAP), instance="user_id",
                                       behavior=behavior).reduce(n=r.count()))
    engine = Engine(p, spark)
    _streams(spark, p, changes, None, engine=engine)
    # States are named in DAG order: the first sessions' (with a cutoff) before the second's.
    sessions = sorted((name, n) for name, n in engine.state_rows().items()
                      if name.endswith("SessionOp-state"))
    (_, kept), (_, every) = sessions
    assert kept < 20 < every, f"{sessions}: with a cutoff, only open sessions' rows stay"


@pytest.mark.parametrize(("behavior", "says"), [
    (t.common_behavior(delay=2, cutoff=2), "session windows take no delay"),
    (t.common_behavior(keep_results=False), "needs a cutoff"),
    (t.common_behavior(cutoff=timedelta(seconds=1)), "a timedelta for timestamp windows"),
])
def test_a_session_behavior_that_cannot_be_says_why(behavior: Behavior, says: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=says):
        Pipeline().source("s", EVENTS).windowby("ts", window=t.session(max_gap=GAP),
                                                behavior=behavior)
