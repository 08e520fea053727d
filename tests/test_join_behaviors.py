"""Joins by time under a temporal behavior (`asof_join(..., behavior=...)`,
`interval_join(..., behavior=...)`): each side delayed, judged late and forgotten by its own
clock, as Pathway's `apply_temporal_behavior` does to each side.

* Pathway's docstring examples of `interval_join` and `asof_join` with a cutoff, their exact
  update streams, one Pathway time per transaction, at batch sizes 1, 2 and all and parallelism
  1 and 2; and their late rows;
* random transactions (inserts, updates, deletes; times mostly rising, some late) against a
  from-scratch model of the rule, transaction by transaction, and through Pathway 0.33 itself
  (its own virtualenv), the interval join padded on either side or both too;
* the state stays bounded: after a stream the join holds only rows a later row can reach
  (timestamps, no `on` columns), where without a behavior it holds every row; so do the
  counts of an outer interval join's unmatched rows;
* definition errors that name what to fix.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import RandomSource, Row, Transaction, random_transactions
from support.join_behavior_model import (
    NEVER,
    Rules,
    asof_output,
    interval_output,
    shown,
    side_fates,
    unmatched,
)
from support.pathway_peer import joins_streams
from test_asof_join import PEER_ORDERS, PRICES, _joined, _outputs

from txstream import Pipeline, PipelineDefinitionError, TableSchema
from txstream import temporal as t
from txstream.engine import Engine

VALUES = TableSchema.of({"value": "bigint", "instance": "bigint", "event_time": "bigint"},
                        primary_key=["value"])
OTHERS = TableSchema.of({"other": "bigint", "instance": "bigint", "other_time": "bigint"},
                        primary_key=["other"])
SIZES = [(1, 1), (None, 1), (2, 2)]


def _at(times: list[int], rows: list[tuple[int, ...]]) -> list[tuple[tuple[int, ...], int, int]]:
    """Pathway's `table_from_markdown` rows (their `__time__` last) as (row, transaction, diff),
    transaction N for the N-th of the example's Pathway `times`."""
    return [(row[:-1], times.index(row[-1]) + 1, 1) for row in rows]


INTERVAL_TIMES = [2, 4, 8, 10, 14, 30]
INTERVAL_SIDES = {
    "t1": _at(INTERVAL_TIMES, [(1, 1, 0, 2), (2, 2, 2, 4), (3, 1, 4, 4), (4, 2, 8, 8),
                               (5, 1, 0, 10), (6, 1, 4, 10)]),
    "t2": _at(INTERVAL_TIMES, [(42, 1, 2, 2), (8, 2, 10, 14), (10, 2, 4, 30)]),
}


def _interval(cutoff: int | None) -> Pipeline:
    p = Pipeline()
    t1, t2 = p.source("t1", VALUES), p.source("t2", OTHERS)
    behavior = t.common_behavior(cutoff=cutoff) if cutoff is not None else None
    joined = t1.interval_join(t2, "event_time", "other_time", t.interval(-2, 2), on="instance",
                              behavior=behavior)
    p.output("o", joined.select("value", "other", "instance", "event_time", "other_time"))
    if cutoff is not None:
        p.output("late_t1", joined.late_rows("left"))
        p.output("late_t2", joined.late_rows("right"))
    return p


@pytest.mark.parametrize(("size", "parallelism"), SIZES)
def test_pathways_interval_join_docstring_with_and_without_cutoff(
        spark: SparkSession, size: int | None, parallelism: int) -> None:
    """Pathway's `interval_join` docstring: without a cutoff every pair; with `cutoff=6`, t1's
    row 5 (time 0 at Pathway time 10, t1's clock 8) and t2's row 10 (time 4 at 30, t2's clock
    10) are late, and row 1 (time 0) is forgotten before row 5 could pair with 42."""
    without = _joined(spark, _interval(None), INTERVAL_SIDES, size, parallelism)
    # value | right value | instance | left time | right time | transaction | diff
    assert without == [(1, 42, 1, 0, 2, 1, 1), (3, 42, 1, 4, 2, 2, 1), (5, 42, 1, 0, 2, 4, 1),
                       (6, 42, 1, 4, 2, 4, 1), (4, 8, 2, 8, 10, 5, 1), (2, 10, 2, 2, 4, 6, 1)]
    got = _outputs(spark, _interval(6), INTERVAL_SIDES, size, parallelism)
    assert got["o"] == [(1, 42, 1, 0, 2, 1, 1), (3, 42, 1, 4, 2, 2, 1), (6, 42, 1, 4, 2, 4, 1),
                        (4, 8, 2, 8, 10, 5, 1)]
    label = "left side of interval_join of source t1 and source t2 on instance"
    assert got["late_t1"] == [(5, 1, 0, 8, label, 4, 1)]
    assert got["late_t2"] == [(10, 2, 4, 10, label.replace("left", "right", 1), 6, 1)]


ASOF_TIMES = [2, 4, 6, 8, 10, 14]
ASOF_SIDES = {
    "t1": _at(ASOF_TIMES, [(2, 0, 2, 4), (3, 0, 5, 6), (4, 0, 1, 8), (5, 0, 7, 14)]),
    "t2": _at(ASOF_TIMES, [(42, 0, 1, 2), (8, 0, 4, 10)]),
}


def _asof(cutoff: int | None) -> Pipeline:
    p = Pipeline()
    t1, t2 = p.source("t1", VALUES), p.source("t2", OTHERS)
    behavior = t.common_behavior(cutoff=cutoff) if cutoff is not None else None
    joined = t1.asof_join(t2, "event_time", "other_time", on="instance", how="left",
                          behavior=behavior)
    p.output("o", joined.select("value", "other", "event_time", "other_time"))
    if cutoff is not None:
        p.output("late_t1", joined.late_rows("left"))
    return p


@pytest.mark.parametrize(("size", "parallelism"), SIZES)
def test_pathways_asof_join_docstring_with_and_without_cutoff(
        spark: SparkSession, size: int | None, parallelism: int) -> None:
    """Pathway's `asof_join` docstring (a constant `instance` added: txstream joins on
    columns): with `cutoff=2`, t1's row 4 (time 1 at Pathway time 8, t1's clock 5) is late;
    row 3 moves from 42 to 8 when 8 arrives."""
    assert _joined(spark, _asof(None), ASOF_SIDES, size, parallelism) == [
        (2, 42, 2, 1, 2, 1), (3, 42, 5, 1, 3, 1), (4, 42, 1, 1, 4, 1), (3, 8, 5, 4, 5, 1),
        (3, 42, 5, 1, 5, -1), (5, 8, 7, 4, 6, 1)]
    got = _outputs(spark, _asof(2), ASOF_SIDES, size, parallelism)
    assert got["o"] == [(2, 42, 2, 1, 2, 1), (3, 42, 5, 1, 3, 1), (3, 8, 5, 4, 5, 1),
                        (3, 42, 5, 1, 5, -1), (5, 8, 7, 4, 6, 1)]
    label = "left side of left backward asof_join of source t1 and source t2 by event_time, " \
        "other_time on instance"
    assert got["late_t1"] == [(4, 0, 1, 5, label, 4, 1)]


# --- Pathway itself on the same changes --------------------------------------------------------

PEER_PRICES = RandomSource(
    "prices", PRICES.schema,
    {"pid": range(6), "product_id": (1, 2), "valid_from": range(0, 60), "price": (10, 20)})
# name -> the join in `tests/support/pathway_joins.py`'s terms, with its behavior; times rise
# by about 20 a transaction (`_rising`).
INTERVAL_JOINS: dict[str, dict[str, Any]] = {
    "interval_cutoff": {"kind": "interval", "lower": -30, "upper": 10,
                        "behavior": {"cutoff": 40}},
    "interval_delay_cutoff": {"kind": "interval", "lower": -20, "upper": 20,
                              "behavior": {"delay": 16, "cutoff": 50}},
    "interval_retracted": {"kind": "interval", "lower": -30, "upper": 10,
                           "behavior": {"cutoff": 40, "keep_results": False}},
    "interval_left_retracted": {"kind": "interval", "lower": -30, "upper": 10, "how": "left",
                                "behavior": {"cutoff": 40, "keep_results": False}},
    "interval_outer_retracted": {"kind": "interval", "lower": -20, "upper": 20, "how": "outer",
                                 "behavior": {"delay": 16, "cutoff": 50, "keep_results": False}},
    "interval_right_retracted": {"kind": "interval", "lower": -30, "upper": 10, "how": "right",
                                 "behavior": {"cutoff": 40, "keep_results": False}},
}


def _rising(rng: random.Random, transactions: list[Transaction]) -> list[Transaction]:
    """The transactions with each row's time given when it is first inserted, at transaction N
    about 20 N: orders within [20 N - 30, 20 N + 10), prices at 20 N + 2 pid; one row in ten 80
    earlier (late, or reaching rows soon forgotten), a price 81 (never two prices of a product
    at one time: Pathway breaks such ties by its hashed ids)."""
    given: dict[tuple[str, Row], Row] = {}
    rising: list[Transaction] = []
    for number, tx in enumerate(transactions, 1):
        out: Transaction = {}
        for name, changes in tx.items():
            for row, diff in changes:
                if (name, row) not in given:
                    prices = name == "prices"
                    at = 20 * number + (2 * int(row[0]) if prices else rng.randrange(-30, 10))  # type: ignore[call-overload]
                    at -= (81 if prices else 80) if rng.random() < 0.1 else 0
                    given[name, row] = (*row[:2], at, *row[3:])
                out.setdefault(name, []).append((given[name, row], diff))
        rising.append(out)
    return rising


@pytest.mark.parametrize(("seed", "size", "parallelism"), [(41, 1, 1), (42, 7, 2)])
def test_interval_join_behaviors_give_pathways_update_streams(
        spark: SparkSession, tmp_path: Path, seed: int, size: int, parallelism: int) -> None:
    """Interval joins on changes with updates and deletes under behaviors with and without a
    delay: inner ones with results kept and retracted, left, right and outer ones retracted.
    Pathway forgets a row its side's clock passed only when that side's next row comes, where
    txstream forgets it in the transaction that passed it: Pathway gets a nudge after each
    transaction (`tests/support/pathway_joins.py`), so that the two forget alike. (With results
    kept, Pathway's padding goes negative where a row is deleted while a pair of it stays, as
    seed 41 shows with an outer join under `delay=16, cutoff=50`: the model below is the padded
    joins' oracle then.) (Pathway's `asof_join` under a behavior panics on a deletion
    on either side, "key ... exists in the universe ... but not in the table restricted to it",
    and forgets a right row still in force: the model below is its oracle.)"""
    rng = random.Random(seed)
    transactions = _rising(rng, random_transactions(rng, (PEER_ORDERS, PEER_PRICES), 40))
    p = Pipeline()
    orders, prices = p.source("orders", PEER_ORDERS.schema), p.source("prices", PRICES.schema)
    for name, join in INTERVAL_JOINS.items():
        p.output(name, orders.interval_join(
            prices, "ordered_at", "valid_from", t.interval(join["lower"], join["upper"]),
            on="product_id", how=join.get("how", "inner"),
            behavior=t.common_behavior(**join["behavior"])))
    sides = _sides(transactions)
    want = joins_streams(sides, INTERVAL_JOINS, tmp_path, nudged=True)
    got = _outputs(spark, p, sides, size, parallelism)
    for name in INTERVAL_JOINS:
        assert got[name] == [tuple(row) for row in want[name]], f"{name}: seed {seed}"


def _sides(transactions: list[Transaction]) -> dict[str, list[tuple[Row, int, int]]]:
    return {name: [(row, number, diff) for number, tx in enumerate(transactions, 1)
                   for row, diff in tx.get(name, [])] for name in ("orders", "prices")}


# --- the model, on changes with updates and deletes --------------------------------------------

# name -> join, direction or interval, how, rules.
MODEL_JOINS: dict[str, tuple[str, Any, str, Rules]] = {
    "asof_backward": ("asof", "backward", "left", Rules(cutoff=40)),
    "asof_nearest_retracted": ("asof", "nearest", "inner", Rules(cutoff=40, keep_results=False)),
    "asof_forward_delayed": ("asof", "forward", "left", Rules(delay=12, cutoff=60)),
    "asof_delay_only": ("asof", "backward", "left", Rules(delay=12)),
    "interval_delayed": ("interval", (-20, 20), "inner", Rules(delay=16, cutoff=50)),
    "interval_retracted": ("interval", (-30, 10), "inner",
                           Rules(delay=6, cutoff=40, keep_results=False)),
    "interval_left": ("interval", (-20, 20), "left", Rules(cutoff=50)),
    "interval_right_delayed": ("interval", (-20, 20), "right", Rules(delay=16, cutoff=50)),
    "interval_outer_retracted": ("interval", (-30, 10), "outer",
                                 Rules(delay=6, cutoff=40, keep_results=False)),
    "interval_outer": ("interval", (-20, 20), "outer", Rules()),
}


def _match(direction: str) -> Any:
    """A left order's as-of partner among the prices present (their multiplicities)."""
    def match(order: Row, prices: Counter[Row]) -> Row | None:
        at = order[2]
        found = [r for r in prices if r[1] == order[1] and r[2] is not None and at is not None
                 and {"backward": r[2] <= at, "forward": r[2] >= at,
                      "nearest": True}[direction]]
        ranked = sorted(found, key=lambda r: ({"backward": -r[2], "forward": r[2],
                                               "nearest": (abs(r[2] - at), -r[2])}[direction],
                                              r[0], r[3]))
        return ranked[0] if ranked else None
    return match


def _model(transactions: list[Transaction]) -> list[dict[str, Counter[tuple]]]:
    """Each join's integrated output after each transaction, in the engine's columns."""
    sides = _sides(transactions)
    last = len(transactions)
    wanted: list[dict[str, Counter[tuple]]] = [{} for _ in transactions]
    for name, (kind, shape, how, rules) in MODEL_JOINS.items():
        left = side_fates(sides["orders"], 2, rules, last)
        right = side_fates(sides["prices"], 2, rules, last)
        for number in range(1, last + 1):
            if kind == "asof":
                # The right side never forgets: its rows count from release, whatever the cutoff.
                kept = [dataclasses.replace(f, closed=NEVER) for f in right]
                pairs = asof_output(left, kept, number, rules.keep_results, _match(shape), how)
            else:
                pairs = interval_output(left, right, number, rules.keep_results,
                                        lambda o, r, bounds=shape: (
                                            o[1] == r[1]
                                            and bounds[0] <= r[2] - o[2] <= bounds[1]))
                for position, fates in (("left", left), ("right", right)):
                    if how in (position, "outer"):
                        paired: Counter[Row] = Counter()
                        for (o, r), n in pairs.items():
                            paired[o if position == "left" else r] += n
                        rows = unmatched(shown(fates, number, rules.keep_results), paired)
                        pairs.update({((row, None) if position == "left" else (None, row)): n
                                      for row, n in rows.items()})
            wanted[number - 1][name] = Counter({_laid_out(o, r): n
                                                for (o, r), n in pairs.items()})
    return wanted


def _laid_out(order: Row | None, price: Row | None) -> tuple:
    """A pair (or a padded row) in the join's columns: the key, the order's, the price's."""
    key = (order or price)[1]  # type: ignore[index]
    return (key, *((order[0], *order[2:]) if order is not None else (None, None, None)),
            *((price[0], *price[2:]) if price is not None else (None, None, None)))


@pytest.mark.parametrize(("seed", "sizes", "parallelism"), [(51, (1, 0), 1), (52, (7, 0), 2)])
def test_join_behaviors_against_the_model_at_every_batch_size(
        spark: SparkSession, seed: int, sizes: tuple[int, ...], parallelism: int) -> None:
    """After every transaction, each join's integrated output is the model's, at each batch
    size (0: one batch), and the update streams are the same at every size."""
    rng = random.Random(seed)
    transactions = _rising(rng, random_transactions(rng, (PEER_ORDERS, PEER_PRICES), 30))
    p = Pipeline()
    orders, prices = p.source("orders", PEER_ORDERS.schema), p.source("prices", PRICES.schema)
    for name, (kind, shape, how, rules) in MODEL_JOINS.items():
        behavior = t.common_behavior(rules.delay, rules.cutoff, rules.keep_results)
        if kind == "asof":
            joined = orders.asof_join(prices, "ordered_at", "valid_from", on="product_id",
                                      how=how, direction=shape, behavior=behavior)
        else:
            joined = orders.interval_join(prices, "ordered_at", "valid_from",
                                          t.interval(*shape), on="product_id", how=how,
                                          behavior=behavior)
        p.output(name, joined)
    sides = _sides(transactions)
    wanted = _model(transactions)
    # The changes exercise each part of the rule: late rows, forgotten rows, delayed rows.
    fates = side_fates(sides["orders"], 2, Rules(delay=12, cutoff=40), len(transactions))
    assert any(f.late_clock is not None for f in fates)
    assert any(f.closed < len(transactions) for f in fates)
    streams: dict[str, list[tuple]] = {}
    for size in sizes:
        got = _outputs(spark, p, sides, size or None, parallelism)
        for name in MODEL_JOINS:
            stream = got[name]
            integrated: Counter[tuple] = Counter()
            for number, want in enumerate(wanted, 1):
                for *row, at, diff in stream:
                    if at == number:
                        integrated[tuple(row)] += diff
                assert +integrated == want[name] and not -integrated, (
                    f"{name} after {number}: seed {seed}")
            streams.setdefault(name, stream)
            assert stream == streams[name], f"{name}: size {size} differs, seed {seed}"


# --- bounded state ------------------------------------------------------------------------------

STAMPED_QUERIES = TableSchema.of({"a": "bigint", "tl": "timestamp"}, primary_key=["a"])
STAMPED_DATA = TableSchema.of({"b": "bigint", "tr": "timestamp"}, primary_key=["b"])


def test_a_join_under_a_cutoff_holds_only_what_later_rows_can_reach(spark: SparkSession
                                                                   ) -> None:
    """Timestamps, no `on` columns: a second of time per transaction, two left rows and one
    right row each, under `cutoff=5 s`. After 60 transactions each side's state holds about
    the last five seconds (without a behavior: every row); every left row is priced by the
    latest right row at or before it, as without a behavior."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    sides: dict[str, list[tuple[Row, int, int]]] = {"queries": [], "data": []}
    for number in range(1, 61):
        at = start + timedelta(seconds=number)
        sides["queries"] += [((2 * number, at - timedelta(milliseconds=300)), number, 1),
                             ((2 * number + 1, at + timedelta(milliseconds=300)), number, 1)]
        sides["data"].append(((number, at), number, 1))
    p = Pipeline()
    queries, data = p.source("queries", STAMPED_QUERIES), p.source("data", STAMPED_DATA)
    for name, behavior in (("bounded", t.common_behavior(cutoff=timedelta(seconds=5))),
                           ("unbounded", None)):
        p.output(name, queries.asof_join(data, "tl", "tr", how="left", behavior=behavior))
    engine = Engine(p, spark)
    got = _outputs(spark, p, sides, 10, engine=engine)
    assert got["bounded"] == got["unbounded"]
    assert [row[2] for row in got["bounded"] if row[0] == 21] == [10]  # 10.3 s: the 10 s row
    joins: dict[str, dict[str, int]] = {}
    for name, rows in engine.state_rows().items():
        number, kind, state = name.split("-", 2)
        if kind == "AsofJoinOp":
            joins.setdefault(number, {})[state] = rows
    bounded, unbounded = sorted(joins.values(), key=len, reverse=True)  # with clocks first
    assert unbounded == {"left_state": 120, "right_state": 60}
    # Left rows after 55.3 s (the left clock 60.3 s minus 5 s), right rows from 55 s on.
    assert bounded["left_state"] == 10 and bounded["right_state"] == 6, bounded


KEYED_QUERIES = TableSchema.of({"a": "bigint", "k": "bigint", "tl": "timestamp"},
                              primary_key=["a"])
KEYED_DATA = TableSchema.of({"b": "bigint", "k": "bigint", "tr": "timestamp"}, primary_key=["b"])


def test_an_outer_interval_join_under_a_cutoff_forgets_its_unmatched_rows(
        spark: SparkSession) -> None:
    """A second of time per transaction: left rows 2n (key n % 3, 0.3 s before n s) pair with
    right row n (key n % 3, at n s); left rows 2n + 1 (key 9) pair with nothing and are padded.
    Under `cutoff=5 s` the rows counted for padding are forgotten with their side's: after 60
    transactions 10 left and 5 right (without a behavior 120 and 60), with the same output."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    sides: dict[str, list[tuple[Row, int, int]]] = {"queries": [], "data": []}
    for number in range(1, 61):
        at = start + timedelta(seconds=number)
        sides["queries"] += [((2 * number, number % 3, at - timedelta(milliseconds=300)),
                              number, 1),
                             ((2 * number + 1, 9, at + timedelta(milliseconds=300)), number, 1)]
        sides["data"].append(((number, number % 3, at), number, 1))
    p = Pipeline()
    queries, data = p.source("queries", KEYED_QUERIES), p.source("data", KEYED_DATA)
    second = timedelta(seconds=1)
    for name, behavior in (("bounded", t.common_behavior(cutoff=5 * second)),
                           ("unbounded", None)):
        p.output(name, queries.interval_join(data, "tl", "tr", t.interval(-second, second),
                                             on="k", how="outer", behavior=behavior))
    engine = Engine(p, spark)
    got = _outputs(spark, p, sides, 10, engine=engine)
    assert got["bounded"] == got["unbounded"]
    padded = [row for row in got["bounded"] if row[-3] is None]
    assert len(padded) == 60 and len(got["bounded"]) == 120
    counted = sorted(rows for name, rows in engine.state_rows().items()
                     if "-UnmatchedOp-state" in name)
    assert counted == [5, 10, 60, 120], counted


def test_a_row_deleted_while_its_pair_stays_is_forgotten_at_its_close(
        spark: SparkSession) -> None:
    """Left rows 2n (key n % 3, n - 0.3 s) pair with right rows n (the same key and time); right
    rows 100 + n (key 7, n + 3 s) move the right clock ahead, so right row n is forgotten two
    transactions later, its pair kept; then left row 2n is deleted, in transaction n + 3, before
    its own close at n + 5. Left rows 2n + 1 (key 9, n + 0.3 s) are padded. Under `cutoff=5 s`
    the pairs stay, the deleted rows are never padded, and the counts of rows closed leave the
    state, the deleted ones' (V = 0, c = 1) too: 10 rows after 60 transactions."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    sides: dict[str, list[tuple[Row, int, int]]] = {"queries": [], "data": []}
    second = timedelta(seconds=1)
    for number in range(1, 61):
        at = start + number * second
        paired = (2 * number, number % 3, at - 0.3 * second)
        sides["queries"] += [(paired, number, 1),
                             ((2 * number + 1, 9, at + 0.3 * second), number, 1)]
        if number + 3 <= 60:
            sides["queries"].append((paired, number + 3, -1))
        sides["data"] += [((number, number % 3, at - 0.3 * second), number, 1),
                          ((100 + number, 7, at + 3 * second), number, 1)]
    p = Pipeline()
    queries, data = p.source("queries", KEYED_QUERIES), p.source("data", KEYED_DATA)
    p.output("o", queries.interval_join(data, "tl", "tr", t.interval(-second, second), on="k",
                                        how="left", behavior=t.common_behavior(cutoff=5 * second)))
    engine = Engine(p, spark)
    integrated: Counter[tuple] = Counter()
    for *row, _, diff in _outputs(spark, p, sides, 7, engine=engine)["o"]:
        integrated[tuple(row)] += diff
    assert all(n == 1 for n in (+integrated).values()) and not -integrated
    padded = [row for row in +integrated if row[-2] is None]
    assert sorted(row[1] for row in padded) == [2 * n + 1 for n in range(1, 61)]
    assert len(+integrated) == 120  # and every pair stays
    counted = {name: rows for name, rows in engine.state_rows().items()
               if "-UnmatchedOp-state" in name}
    assert list(counted.values()) == [10], counted


def test_rows_without_a_time_under_a_behavior(spark: SparkSession) -> None:
    """A computed time may be null: such a row pairs with nothing, so an inner interval join
    leaves it out before its behavior (where it would never be forgotten), and a left as-of or
    interval join shows it padded, once; the docstring example otherwise gives what it gave."""
    p = Pipeline()
    t1 = p.source("t1", VALUES).select(
        "value", "instance", event_time="CASE WHEN value = 3 THEN NULL ELSE event_time END")
    t2 = p.source("t2", OTHERS)
    behavior = t.common_behavior(cutoff=6)
    p.output("interval", t1.interval_join(t2, "event_time", "other_time", t.interval(-2, 2),
                                          on="instance", behavior=behavior))
    p.output("asof", t1.asof_join(t2, "event_time", "other_time", on="instance", how="left",
                                  behavior=behavior))
    engine = Engine(p, spark)
    got = _outputs(spark, p, INTERVAL_SIDES, 1, engine=engine)
    left = Pipeline()
    t1 = left.source("t1", VALUES).select(
        "value", "instance", event_time="CASE WHEN value = 3 THEN NULL ELSE event_time END")
    left.output("left", t1.interval_join(left.source("t2", OTHERS), "event_time", "other_time",
                                         t.interval(-2, 2), on="instance", how="left",
                                         behavior=behavior))
    padded = _outputs(spark, left, INTERVAL_SIDES, 1)["left"]
    assert [row for row in padded if row[1] == 3] == [(1, 3, None, None, None, 2, 1)]
    assert got["interval"] == [(1, 1, 0, 42, 2, 1, 1), (1, 6, 4, 42, 2, 4, 1),
                               (2, 4, 8, 8, 10, 5, 1)]
    assert [row for row in got["asof"] if row[1] == 3] == [(1, 3, None, None, None, 2, 1)]
    # The rows the behaviors hold until forgotten: the interval join's left side rows 4 and 6
    # (row 3 left out), its right side 8; the as-of join's left side rows 3, 4 and 6.
    held = {name: n for name, n in engine.state_rows().items() if name.endswith("-released")}
    assert sorted(held.values()) == [1, 2, 3], held


# --- definition errors -------------------------------------------------------------------------

@pytest.mark.parametrize(("behavior", "how", "says"), [
    (t.exactly_once_behavior(), "inner", "is not a common_behavior"),
    (t.common_behavior(keep_results=False), "inner", "needs a cutoff"),
    (t.common_behavior(cutoff=-1), "inner", "must not be negative"),
])
def test_interval_join_refuses_a_behavior_it_cannot_apply(behavior: t.CommonBehavior,
                                                          how: str, says: str) -> None:
    p = Pipeline()
    with pytest.raises(PipelineDefinitionError, match=says):
        p.source("t1", VALUES).interval_join(p.source("t2", OTHERS), "event_time", "other_time",
                                             t.interval(-2, 2), on="instance",
                                             how=how, behavior=behavior)  # type: ignore[arg-type]


def test_a_join_behavior_of_timedeltas_needs_timestamps(spark: SparkSession) -> None:
    p = Pipeline()
    p.output("o", p.source("t1", VALUES).asof_join(
        p.source("t2", OTHERS), "event_time", "other_time", on="instance",
        behavior=t.common_behavior(cutoff=timedelta(seconds=1))))
    with pytest.raises(PipelineDefinitionError, match="behavior's lengths are timedeltas"):
        Engine(p, spark)


def test_late_rows_of_a_table_no_behavior_made() -> None:
    p = Pipeline()
    joined = p.source("t1", VALUES).interval_join(p.source("t2", OTHERS), "event_time",
                                                  "other_time", t.interval(-2, 2), on="instance")
    with pytest.raises(PipelineDefinitionError, match="only an asof_join or interval_join"):
        joined.late_rows()
    with pytest.raises(PipelineDefinitionError, match="'left' or 'right'"):
        joined.late_rows("middle")  # type: ignore[arg-type]
