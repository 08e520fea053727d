"""Interval joins (`Table.interval_join`, `txstream.temporal.interval`): pairs of rows of the
same key whose times differ by an amount within the interval.

* Pathway's examples, ported with their exact results: the docstring of `interval` and the
  inner joins of its `test_interval_join_time_only` (a constant key added on both sides: Pathway
  allows none, txstream joins on columns);
* random transactions on both sides against DuckDB after every transaction, numeric and
  timestamp times, inner, left, right and outer, at batch sizes 1, 7 and all and parallelism 1
  and 2;
* definition errors.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import Columns, check_at_every_size, random_transactions
from test_asof_join import ORDERS, PRICES, STAMP_ORDERS, STAMP_PRICES, _joined

from txstream import Pipeline, PipelineDefinitionError, TableSchema
from txstream import temporal as t
from txstream.engine.temporal import Length

LEFT = TableSchema.of({"k": "bigint", "a": "bigint", "tl": "bigint"}, primary_key=["a"])
RIGHT = TableSchema.of({"k": "bigint", "b": "bigint", "tr": "bigint"}, primary_key=["b"])


def _pairs(spark: SparkSession, left: list[tuple[int, int]], right: list[tuple[int, int]],
           lower: int, upper: int) -> list[tuple[int, ...]]:
    """(a, tl, b, tr) of the inner interval join of (a, t) rows, all in transaction 1."""
    p = Pipeline()
    p.output("o", p.source("l", LEFT).interval_join(p.source("r", RIGHT), "tl", "tr",
                                                    t.interval(lower, upper), on="k"))
    got = _joined(spark, p, {"l": [((0, a, tl), 1, 1) for a, tl in left],
                             "r": [((0, b, tr), 1, 1) for b, tr in right]}, None)
    assert all(row[-2:] == (1, 1) for row in got)
    return sorted(row[1:-2] for row in got)


def test_pathways_interval_docstring(spark: SparkSession) -> None:
    got = _pairs(spark, [(1, 3), (2, 4), (3, 5), (4, 11)], [(1, 0), (2, 1), (3, 4), (4, 7)],
                 -2, 1)
    assert [(tl, tr) for _, tl, _, tr in got] == [(3, 1), (3, 4), (4, 4), (5, 4)]


@pytest.mark.parametrize(("difference", "pairs"), [
    (1, [(3, 1), (4, 1), (5, 3)]),
    (2, [(2, 1), (3, 1), (4, 1), (4, 2), (5, 2), (5, 3), (6, 5)]),
])
def test_pathways_interval_join_time_only(spark: SparkSession, difference: int,
                                          pairs: list[tuple[int, int]]) -> None:
    got = _pairs(spark, [(1, -1), (2, 0), (3, 2), (4, 3), (5, 7), (6, 13)],
                 [(1, 2), (2, 5), (3, 6), (4, 10), (5, 15)], -difference, difference)
    assert [(a, b) for a, _, b, _ in got] == pairs


JOINS = [
    (ORDERS, PRICES, "ordered_at", "valid_from", "product_id", t.interval(-6, 3), "inner"),
    (STAMP_ORDERS, STAMP_PRICES, "placed", "since", "item",
     t.interval(timedelta(seconds=-40), timedelta(0)), "inner"),
    (ORDERS, PRICES, "ordered_at", "valid_from", "product_id", t.interval(-6, 3), "left"),
    (ORDERS, PRICES, "ordered_at", "valid_from", "product_id", t.interval(0, 5), "right"),
    (STAMP_ORDERS, STAMP_PRICES, "placed", "since", "item",
     t.interval(timedelta(seconds=-40), timedelta(0)), "outer"),
]


def _duck_interval(left: str, right: str, lt: str, rt: str, on: str, lower: Length,
                   upper: Length, columns: list[str], how: str) -> str:
    """The join in DuckDB: the interval a condition of the join, so that an outer join pads
    the rows it leaves; the key of a padded row is its own side's."""
    if isinstance(lower, timedelta):
        assert isinstance(upper, timedelta)
        gap = f"epoch_us(r.{rt}) - epoch_us(l.{lt})"
        lower, upper = lower // timedelta(microseconds=1), upper // timedelta(microseconds=1)
    else:
        gap = f"r.{rt} - l.{lt}"
    shown = ", ".join([f"COALESCE(l.{on}, r.{on}) AS {on}", *columns[1:]])
    kind = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT JOIN",
            "outer": "FULL OUTER JOIN"}[how]
    return (f"SELECT {shown} FROM \"{left}\" l {kind} \"{right}\" r "
            f"ON l.{on} = r.{on} AND {gap} BETWEEN {lower} AND {upper}")


@pytest.mark.parametrize(("seed", "sizes", "parallelism"), [(1, (1, 7, 0), 1), (2, (7, 0), 2)])
def test_interval_joins_against_duckdb_at_every_batch_size(
        spark: SparkSession, seed: int, sizes: tuple[int, ...], parallelism: int) -> None:
    specs = (ORDERS, PRICES, STAMP_ORDERS, STAMP_PRICES)
    p = Pipeline()
    sources = {spec.name: p.source(spec.name, spec.schema) for spec in specs}
    outputs: dict[str, Columns] = {}
    views = []
    for i, (left, right, lt, rt, on, window, how) in enumerate(JOINS):
        name = f"i{i}"
        p.output(name, sources[left.name].interval_join(sources[right.name], lt, rt, window,
                                                        on=on, how=how))
        kinds = dict(left.columns) | dict(right.columns)
        names = [on, *(n for n in left.schema.names if n != on),
                 *(n for n in right.schema.names if n != on)]
        outputs[name] = tuple((n, kinds[n]) for n in names)
        columns = [on, *(f"l.{n}" for n in names[1:] if n in left.schema.names),
                   *(f"r.{n}" for n in names[1:] if n in right.schema.names
                     and n not in left.schema.names)]
        views.append((name, _duck_interval(left.name, right.name, lt, rt, on,
                                           window.lower_bound, window.upper_bound, columns,
                                           how)))
    transactions = random_transactions(random.Random(seed), specs, 25)

    def describe(name: str) -> str:
        left, right, lt, rt, on, window, how = JOINS[int(name[1:])]
        return f"seed {seed}: {left.name}.interval_join({right.name}, {lt!r}, {rt!r}, " \
               f"{window}, on={on!r}, how={how!r})"

    check_at_every_size(spark, p, specs, outputs, tuple(views), transactions, sizes, describe,
                        parallelism)


@pytest.mark.parametrize(("make", "says"), [
    (lambda: t.interval(3, -3), "the lower bound is above the upper one"),
    (lambda: t.interval(timedelta(seconds=-1), 1), "both timedelta"),
    (lambda: t.interval("a", "b"), "both timedelta"),
])
def test_an_interval_that_cannot_be_says_why(make, says: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PipelineDefinitionError, match=says):
        make()


def test_interval_join_refuses_what_it_does_not_do() -> None:
    p = Pipeline()
    left, right = p.source("l", LEFT), p.source("r", RIGHT)
    with pytest.raises(PipelineDefinitionError, match="is not one of inner, left, right"):
        left.interval_join(right, "tl", "tr", t.interval(-1, 1), on="k",
                           how="cross")  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="cannot be on columns"):
        left.interval_join(right, "tl", "tr", t.interval(-1, 1), on=("k", "tl"), how="left")
    with pytest.raises(PipelineDefinitionError, match="is not an interval"):
        left.interval_join(right, "tl", "tr", (-1, 1), on="k")  # type: ignore[arg-type]
