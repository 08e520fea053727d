"""As-of-now joins (`Table.asof_now_join`):

* Pathway's docstring example of `asof_now_join` (inner) and `asof_now_join_left`, with its
  exact update streams, at batch sizes 1, 3 and all and parallelism 1 and 2;
* random transactions on both sides (inserts, updates, deletes, null keys, duplicate rows)
  against a model that keeps the right side per transaction and looks up each insertion once,
  at batch sizes 1, 7 and all and parallelism 1 and 2, and the same stream at every size;
* a definition error that names what to fix.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import RandomSource, apply_changes, random_transactions
from support.pathway_streams import in_stream_order
from test_asof_join import _joined

from txstream import Pipeline, PipelineDefinitionError, TableSchema

DATA = TableSchema.of({"id": "bigint", "value": "bigint", "instance": "bigint"},
                      primary_key=["id"])
QUERIES = TableSchema.of({"value": "bigint", "instance": "bigint"})
# Pathway's times in its example, each a transaction here (2 -> 1, 4 -> 2, ...).
TIMES = [2, 4, 6, 10, 12, 14, 16, 22, 26, 30, 32]


def _at(time: int) -> int:
    return TIMES.index(time) + 1


@pytest.mark.parametrize(("size", "parallelism"), [(1, 1), (3, 1), (None, 2)])
def test_pathways_asof_now_join_example(spark: SparkSession, size: int | None,
                                        parallelism: int) -> None:
    p = Pipeline()
    data = p.source("data", DATA).select("instance", ans="value")
    queries = p.source("queries", QUERIES).select("instance", query="value")
    p.output("inner", queries.asof_now_join(data, on="instance").select("query", "ans"))
    p.output("left", queries.asof_now_join(data, on="instance", how="left")
             .select("query", "ans"))
    sides = {
        "data": [((2, 4, 1), _at(4), 1), ((2, 4, 1), _at(10), -1), ((5, 5, 1), _at(10), 1),
                 ((7, 2, 2), _at(14), 1), ((7, 2, 2), _at(22), -1), ((11, 3, 2), _at(26), 1),
                 ((5, 5, 1), _at(30), -1), ((14, 9, 1), _at(32), 1)],
        "queries": [((1, 1), _at(2), 1), ((2, 1), _at(6), 1), ((4, 1), _at(12), 1),
                    ((5, 2), _at(16), 1), ((10, 1), _at(26), 1)],
    }
    # query | ans | transaction | diff, as Pathway's docstrings print them.
    inner = [(2, 4, _at(6), 1), (4, 5, _at(12), 1), (5, 2, _at(16), 1), (10, 5, _at(26), 1)]
    assert _joined(spark, p, sides, size, parallelism, "inner") == in_stream_order(inner)
    assert _joined(spark, p, sides, size, parallelism, "left") == in_stream_order(
        [(1, None, _at(2), 1), *inner])


# --- against a model ---------------------------------------------------------------------------

ORDERS = RandomSource(
    "orders", TableSchema.of({"id": "bigint", "product_id": "bigint", "qty": "bigint"},
                             primary_key=["id"]),
    {"id": range(8), "product_id": (1, 2, None), "qty": (1, 2)})
VISITS = RandomSource(  # no key: duplicates, inserted twice at once and deleted one at a time
    "visits", TableSchema.of({"product_id": "bigint", "page": "text"}),
    {"product_id": (1, 2, None), "page": ("a", "b")})
PRICES = RandomSource(
    "prices", TableSchema.of({"pid": "bigint", "product_id": "bigint", "price": "bigint"},
                             primary_key=["pid"]),
    {"pid": range(5), "product_id": (1, 2, None), "price": (10, 20)})


def _model(left: RandomSource, right: RandomSource, how: str,
           transactions: list[dict[str, list[tuple[tuple, int]]]]) -> list[tuple]:
    """The join's update stream `(product_id, left's others, right's others, transaction,
    diff)`: the right side applied transaction by transaction, each row a transaction inserts
    on the left (its net change there positive) paired with the right rows of its key then."""
    key_at, price_at = left.schema.names.index("product_id"), right.schema.names.index(
        "product_id")
    prices: Counter[tuple] = Counter()
    out: Counter[tuple] = Counter()
    for number, tx in enumerate(transactions, 1):
        apply_changes(prices, tx.get(right.name, []))
        net: Counter[tuple] = Counter()
        for row, diff in tx.get(left.name, []):
            net[row] += diff
        for row, n in net.items():
            if n <= 0:
                continue
            rest = row[:key_at] + row[key_at + 1:]
            partners = [(p, m) for p, m in prices.items()
                        if row[key_at] is not None and p[price_at] == row[key_at]]
            for p, m in partners:
                out[(row[key_at], *rest, *(p[:price_at] + p[price_at + 1:]), number)] += n * m
            if not partners and how == "left":
                out[(row[key_at], *rest, *([None] * (len(right.schema.names) - 1)), number)] += n
    return in_stream_order((*row, diff) for row, diff in out.items() if diff)


@pytest.mark.parametrize(("seed", "parallelism"), [(1, 1), (2, 2)])
def test_asof_now_joins_against_a_model_at_every_batch_size(spark: SparkSession, seed: int,
                                                            parallelism: int) -> None:
    specs = (ORDERS, VISITS, PRICES)
    transactions = random_transactions(random.Random(seed), specs, 30)
    p = Pipeline()
    sources = {s.name: p.source(s.name, s.schema) for s in specs}
    joins = {f"{left.name}_{how}": (left, how) for left in (ORDERS, VISITS)
             for how in ("inner", "left")}
    for name, (left, how) in joins.items():
        p.output(name, sources[left.name].asof_now_join(sources["prices"], on="product_id",
                                                        how=how))
    sides = {s.name: [(row, number, diff) for number, tx in enumerate(transactions, 1)
                      for row, diff in tx.get(s.name, [])] for s in specs}
    for name, (left, how) in joins.items():
        want = _model(left, PRICES, how, transactions)
        assert any(row[-3] is not None for row in want), f"{name}: nothing ever matched"
        for size in (1, 7, None):
            got = _joined(spark, p, sides, size, parallelism, name)
            assert got == want, f"{name} at batch size {size or 'all'}, seed {seed}"


def test_asof_now_join_refuses_a_right_or_outer_join() -> None:
    p = Pipeline()
    orders, prices = p.source("orders", ORDERS.schema), p.source("prices", PRICES.schema)
    with pytest.raises(PipelineDefinitionError, match="is not one of inner, left"):
        orders.asof_now_join(prices, on="product_id", how="outer")  # type: ignore[arg-type]
