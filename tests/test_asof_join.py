"""As-of joins (`Table.asof_join`):

* Pathway's own update stream of `asof_join_left` (its `test_asof_joins_stream.py`, no
  behavior), as Pathway 0.33.0 printed it, at batch sizes 1 and all, parallelism 1 and 2;
* random transactions on both sides (inserts, updates, deletes, null keys and times, right
  rows of equal time) against DuckDB recomputing every pair from scratch after every
  transaction, backward, forward and nearest, inner and left, numeric and timestamp times, with
  and without `on` columns, at batch sizes 1, 7 and all and parallelism 1 and 2;
* the same random transactions (right times never tied, which Pathway breaks by hashed row ids)
  through Pathway 0.33 itself: the same update streams;
* definition errors that name what to fix.
"""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import Columns, RandomSource, check_at_every_size, random_transactions
from support.pathway_peer import joins_streams
from support.pathway_streams import in_stream_order
from test_windows import DAY

from txstream import Pipeline, PipelineDefinitionError, TableSchema
from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine

QUERIES = TableSchema.of({"a": "bigint", "tl": "bigint"}, primary_key=["a"])
DATA = TableSchema.of({"b": "bigint", "tr": "bigint"}, primary_key=["b"])


def _changes(schema: TableSchema, changes: list[tuple[tuple, int, int]]) -> Changes:
    data = {n: [row[i] for row, _, _ in changes] for i, n in enumerate(schema.names)}
    data |= {TIME: [time for _, time, _ in changes], DIFF: [diff for _, _, diff in changes]}
    return Changes(pa.table(data, schema=schema.arrow_schema(with_changes=True)))


def _joined(spark: SparkSession, pipeline: Pipeline, sides: dict[str, list[tuple[tuple, int, int]]],
            size: int | None, parallelism: int = 1, output: str = "o") -> list[tuple]:
    """The output's changes as (*row, transaction, diff) in stream order, over each source's
    (row, transaction, diff) changes given in batches of `size` transactions (None: one)."""
    return _outputs(spark, pipeline, sides, size, parallelism)[output]


def _outputs(spark: SparkSession, pipeline: Pipeline,
             sides: dict[str, list[tuple[tuple, int, int]]], size: int | None,
             parallelism: int = 1, engine: Engine | None = None) -> dict[str, list[tuple]]:
    """Every output's changes (as `_joined` gives one's), from one run of the engine (a new
    one, or `engine`)."""
    engine = engine or Engine(pipeline, spark, parallelism=parallelism)
    times = sorted({time for changes in sides.values() for _, time, _ in changes})
    size = size or len(times)
    got: dict[str, list[tuple]] = {name: [] for name in pipeline.outputs}
    for i in range(0, len(times), size):
        batch = set(times[i:i + size])
        inputs = {}
        for name, changes in sides.items():
            schema = pipeline.sources[name].schema
            assert schema is not None
            inputs[name] = _changes(schema, [c for c in changes if c[1] in batch])
        out = engine.process(inputs)
        for name in got:
            got[name] += [tuple(row.values()) for row in out[name].table.to_pylist()]
    return {name: in_stream_order(rows) for name, rows in got.items()}


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (None, 1), (2, 2)])
def test_pathways_asof_join_left_stream(spark: SparkSession, size: int | None,
                                        parallelism: int) -> None:
    """Pathway's `test_asof_joins_stream.py` without a behavior: left rows (a, t) and right rows
    (b, t) at Pathway times 2, 4, 6, 8 (transactions 1-4), no `on` columns."""
    p = Pipeline()
    queries, data = p.source("queries", QUERIES), p.source("data", DATA)
    p.output("o", queries.asof_join(data, "tl", "tr", how="left"))
    sides = {
        "queries": [((1, 2), 1, 1), ((2, 3), 1, 1), ((3, 3), 2, 1), ((4, 5), 2, 1),
                    ((6, 2), 3, 1), ((7, 6), 4, 1)],
        "data": [((1, 1), 2, 1), ((2, 4), 3, 1), ((3, 2), 4, 1)],
    }
    n = None
    # a | tl | b | tr | transaction | diff, as Pathway printed them.
    assert _joined(spark, p, sides, size, parallelism) == in_stream_order([
        (1, 2, n, n, 1, 1), (2, 3, n, n, 1, 1),
        (1, 2, n, n, 2, -1), (2, 3, n, n, 2, -1), (1, 2, 1, 1, 2, 1), (2, 3, 1, 1, 2, 1),
        (3, 3, 1, 1, 2, 1), (4, 5, 1, 1, 2, 1),
        (6, 2, 1, 1, 3, 1), (4, 5, 1, 1, 3, -1), (4, 5, 2, 4, 3, 1),
        (7, 6, 2, 4, 4, 1), (1, 2, 1, 1, 4, -1), (2, 3, 1, 1, 4, -1), (3, 3, 1, 1, 4, -1),
        (6, 2, 1, 1, 4, -1), (1, 2, 3, 2, 4, 1), (2, 3, 3, 2, 4, 1), (3, 3, 3, 2, 4, 1),
        (6, 2, 3, 2, 4, 1),
    ])


def test_a_right_update_moves_only_the_rows_it_reaches(spark: SparkSession) -> None:
    """Prices of one product valid from 10 and 20; orders at 5, 15, 25. Moving the second price
    to 12 changes no pair (15 and 25 still see it); deleting the first changes the order at 15
    only when the second moved past it."""
    p = Pipeline()
    orders = p.source("orders", TableSchema.of(
        {"id": "bigint", "product": "bigint", "at": "bigint"}, primary_key=["id"]))
    prices = p.source("prices", TableSchema.of(
        {"pid": "bigint", "product": "bigint", "since": "bigint", "price": "bigint"},
        primary_key=["pid"]))
    p.output("o", orders.asof_join(prices, "at", "since", on="product"))
    sides = {
        "orders": [((1, 7, 5), 1, 1), ((2, 7, 15), 1, 1), ((3, 7, 25), 1, 1)],
        "prices": [((1, 7, 10, 100), 1, 1), ((2, 7, 20, 200), 1, 1),
                   ((2, 7, 20, 200), 2, -1), ((2, 7, 12, 210), 2, 1),
                   ((1, 7, 10, 100), 3, -1)],
    }
    # product | id | at | pid | since | price | transaction | diff
    assert _joined(spark, p, sides, None) == in_stream_order([
        (7, 2, 15, 1, 10, 100, 1, 1), (7, 3, 25, 2, 20, 200, 1, 1),
        (7, 2, 15, 1, 10, 100, 2, -1), (7, 2, 15, 2, 12, 210, 2, 1),
        (7, 3, 25, 2, 20, 200, 2, -1), (7, 3, 25, 2, 12, 210, 2, 1),
    ])


# --- against DuckDB ----------------------------------------------------------------------------

ORDERS = RandomSource(
    "orders", TableSchema.of({"id": "bigint", "product_id": "bigint", "ordered_at": "bigint",
                              "qty": "bigint"}, primary_key=["id"]),
    {"id": range(10), "product_id": (1, 2, None), "ordered_at": [*range(0, 30, 2), None],
     "qty": (1, 2)})
PRICES = RandomSource(
    "prices", TableSchema.of({"pid": "bigint", "product_id": "bigint", "valid_from": "bigint",
                              "price": "bigint"}, primary_key=["pid"]),
    {"pid": range(8), "product_id": (1, 2, None), "valid_from": [*range(0, 30, 3), None],
     "price": (10, 20, 30)})
RATES = RandomSource(
    "rates", TableSchema.of({"rid": "bigint", "rate_from": "bigint", "rate": "bigint"},
                            primary_key=["rid"]),
    {"rid": range(5), "rate_from": [*range(0, 30, 4), None], "rate": (1, 2)})
STAMP_ORDERS = RandomSource(
    "stamp_orders", TableSchema.of({"oid": "bigint", "item": "bigint", "placed": "timestamp"},
                                   primary_key=["oid"]),
    {"oid": range(8), "item": (1, 2), "placed": [DAY + timedelta(seconds=s)
                                                 for s in range(0, 300, 20)]})
STAMP_PRICES = RandomSource(
    "stamp_prices", TableSchema.of({"sid": "bigint", "item": "bigint", "since": "timestamp",
                                    "cents": "bigint"}, primary_key=["sid"]),
    {"sid": range(6), "item": (1, 2), "since": [DAY + timedelta(seconds=s)
                                                for s in range(0, 300, 30)],
     "cents": (100, 200)})

# (left, right, left time, right time, on, how, direction)
JOINS = [
    (ORDERS, PRICES, "ordered_at", "valid_from", ("product_id",), "left", "backward"),
    (ORDERS, PRICES, "ordered_at", "valid_from", ("product_id",), "inner", "forward"),
    (ORDERS, PRICES, "ordered_at", "valid_from", ("product_id",), "left", "nearest"),
    (ORDERS, RATES, "ordered_at", "rate_from", (), "inner", "backward"),
    (STAMP_ORDERS, STAMP_PRICES, "placed", "since", ("item",), "left", "nearest"),
    (STAMP_ORDERS, STAMP_PRICES, "placed", "since", ("item",), "inner", "backward"),
]


def _duck_asof(left: RandomSource, right: RandomSource, lt: str, rt: str, on: tuple[str, ...],
               how: str, direction: str) -> str:
    """Every left row's partner recomputed by DuckDB: all right rows of its key on the right
    side of its time ranked (the nearest first, equal times by the right's other columns), the
    first kept."""
    timed = left.schema.column(lt).type.value == "timestamp"

    def at(c: str) -> str:
        return f"epoch_us({c})" if timed else c

    reach = {"backward": f"r.{rt} <= l.{lt}", "forward": f"r.{rt} >= l.{lt}",
             "nearest": f"r.{rt} IS NOT NULL AND l.{lt} IS NOT NULL"}[direction]
    nearest = {"backward": f"r.{rt} DESC", "forward": f"r.{rt} ASC",
               "nearest": f"abs({at(f'r.{rt}')} - {at(f'l.{lt}')}) ASC, r.{rt} DESC"}[direction]
    rest_l = [n for n in left.schema.names if n not in on]
    rest_r = [n for n in right.schema.names if n not in on]
    ties = ", ".join(f"r.{c} ASC NULLS FIRST" for c in rest_r if c != rt)
    key = left.schema.primary_key[0]
    cond = " AND ".join([*(f"l.{k} = r.{k}" for k in on), reach])
    pairs = (f"SELECT {', '.join(f'l.{c}' for c in (*on, *rest_l))}, "
             f"{', '.join(f'r.{c}' for c in rest_r)}, r.{rest_r[0]} IS NOT NULL AS found, "
             f"ROW_NUMBER() OVER (PARTITION BY l.{key} ORDER BY {nearest}, {ties}) AS rn "
             f"FROM \"{left.name}\" l LEFT JOIN \"{right.name}\" r ON {cond}")
    kept = "rn = 1" + (" AND found" if how == "inner" else "")
    return f"SELECT * EXCLUDE (found, rn) FROM ({pairs}) WHERE {kept}"


@pytest.mark.parametrize(("seed", "sizes", "parallelism"),
                         [(1, (1, 7, 0), 1), (2, (7, 0), 2)])
def test_asof_joins_against_duckdb_at_every_batch_size(spark: SparkSession, seed: int,
                                                       sizes: tuple[int, ...], parallelism: int
                                                       ) -> None:
    specs = (ORDERS, PRICES, RATES, STAMP_ORDERS, STAMP_PRICES)
    p = Pipeline()
    sources = {spec.name: p.source(spec.name, spec.schema) for spec in specs}
    outputs: dict[str, Columns] = {}
    views = []
    for i, (left, right, lt, rt, on, how, direction) in enumerate(JOINS):
        name = f"j{i}"
        p.output(name, sources[left.name].asof_join(sources[right.name], lt, rt, on=on,
                                                    how=how, direction=direction))
        kinds = dict(left.columns) | dict(right.columns)
        names = [*on, *(n for n in left.schema.names if n not in on),
                 *(n for n in right.schema.names if n not in on)]
        outputs[name] = tuple((n, kinds[n]) for n in names)
        views.append((name, _duck_asof(left, right, lt, rt, on, how, direction)))
    transactions = random_transactions(random.Random(seed), specs, 25)

    def describe(name: str) -> str:
        left, right, lt, rt, on, how, direction = JOINS[int(name[1:])]
        return f"seed {seed}: {left.name}.asof_join({right.name}, {lt!r}, {rt!r}, on={on}, " \
               f"how={how!r}, direction={direction!r})"

    check_at_every_size(spark, p, specs, outputs, tuple(views), transactions, sizes, describe,
                        parallelism)


# --- Pathway itself on the same changes --------------------------------------------------------

# Right times never tied within a product: each price row keeps to its own decade of times.
PEER_ORDERS = RandomSource(
    "orders", TableSchema.of({"id": "bigint", "product_id": "bigint", "ordered_at": "bigint",
                              "qty": "bigint"}, primary_key=["id"]),
    {"id": range(10), "product_id": (1, 2), "ordered_at": range(0, 60), "qty": (1, 2)})


@pytest.mark.parametrize(("seed", "size", "parallelism"), [(31, 1, 1), (32, 7, 2)])
def test_asof_joins_give_pathways_update_streams(spark: SparkSession, tmp_path: Path, seed: int,
                                                 size: int, parallelism: int) -> None:
    rng = random.Random(seed)
    prices = RandomSource(
        "prices", PRICES.schema,
        {"pid": range(6), "product_id": (1, 2), "valid_from": range(0, 60), "price": (10, 20)})
    transactions = random_transactions(rng, (PEER_ORDERS, prices), 30)
    for tx in transactions:  # price pid's time within [10 * pid, 10 * pid + 10)
        tx["prices"] = [((pid, product, 10 * pid + at % 10, price), diff)
                        for (pid, product, at, price), diff in tx.get("prices", [])]
    directions = ("backward", "forward", "nearest")
    p = Pipeline()
    orders, priced = p.source("orders", PEER_ORDERS.schema), p.source("prices", prices.schema)
    for direction in directions:
        p.output(direction, orders.asof_join(priced, "ordered_at", "valid_from",
                                             on="product_id", how="left", direction=direction))
    sides = {name: [(row, number, diff) for number, tx in enumerate(transactions, 1)
                    for row, diff in tx.get(name, [])] for name in ("orders", "prices")}
    want = joins_streams(sides, {d: {"kind": "asof", "direction": d} for d in directions},
                         tmp_path)
    for direction in directions:
        assert any(row[-1] < 0 for row in want[direction]), f"{direction}: nothing retracted"
        got = _joined(spark, p, sides, size, parallelism, output=direction)
        assert got == [tuple(row) for row in want[direction]], f"{direction}: seed {seed}"


# --- definition errors -------------------------------------------------------------------------

@pytest.mark.parametrize(("how", "direction", "says"), [
    ("right", "backward", "is not one of inner, left"),
    ("left", "sideways", "is not one of backward, forward, nearest"),
])
def test_asof_join_refuses_a_mode_it_has_not(how: str, direction: str, says: str) -> None:
    p = Pipeline()
    with pytest.raises(PipelineDefinitionError, match=says):
        p.source("queries", QUERIES).asof_join(p.source("data", DATA), "tl", "tr",
                                               how=how, direction=direction)  # type: ignore[arg-type]


def test_asof_join_refuses_a_time_among_the_on_columns() -> None:
    p = Pipeline()
    with pytest.raises(PipelineDefinitionError, match="cannot be on columns"):
        p.source("queries", QUERIES).asof_join(p.source("data", DATA), "tl", "tr", on="tl")


@pytest.mark.parametrize(("right", "says"), [
    (TableSchema.of({"b": "bigint", "tr": "timestamp"}, primary_key=["b"]),
     "must both be timestamps or both numbers"),
    (TableSchema.of({"b": "bigint", "tr": "text"}, primary_key=["b"]),
     "must both be timestamps or both numbers"),
    (TableSchema.of({"b": "bigint", "x": "bigint"}, primary_key=["b"]), "right time column"),
    (TableSchema.of({"a": "bigint", "tr": "bigint"}, primary_key=["a"]), "exist on both sides"),
])
def test_asof_join_errors_at_compile_name_the_join(spark: SparkSession, right: TableSchema,
                                                   says: str) -> None:
    p = Pipeline()
    p.output("o", p.source("queries", QUERIES).asof_join(p.source("data", right), "tl", "tr"))
    with pytest.raises(PipelineDefinitionError, match=says) as raised:
        Engine(p, spark)
    assert "asof_join of source queries and source data" in str(raised.value)
