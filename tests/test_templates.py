"""Which batches a plan template serves (`txstream.engine.templates`): a batch rebound to the
template of its shape skips building its plans through the operators and Spark's optimizer
and planner, which for a pipeline of temporal joins cost tens of seconds a batch. A batch
not rebound computes the same result, only slower, so these tests ask for the rebinding
itself: what they guard is planning time."""

from __future__ import annotations

from pyspark.sql import SparkSession
from test_asof_join import ORDERS, PRICES, _changes

from txstream import Pipeline
from txstream import temporal as t
from txstream.engine import Engine


def _rebound(engine: Engine, batches: list[tuple[str, tuple[int, ...]]]) -> list[bool]:
    """Whether each batch (one row inserted into one source, transaction by transaction) was
    rebound to a template."""
    rebound = []
    for number, (name, row) in enumerate(batches, 1):
        schema = (ORDERS if name == "orders" else PRICES).schema
        engine.process({name: _changes(schema, [(row, number, 1)])})
        assert engine.last_batch is not None
        rebound.append(engine.last_batch.rebound)
    return rebound


def test_an_outer_interval_join_rebinds_batches_with_changes_on_one_side(spark: SparkSession
                                                                        ) -> None:
    """A batch with changes on one side of an outer interval join under a behavior has in its
    plans the one empty row Spark's optimizer puts where it knows a side to be one row
    (`OneRowRelation`), a constant a template keeps as it keeps any other: before, such a
    batch never found its template ready, and every batch was planned anew (the model test of
    `tests/test_join_behaviors.py`, ten joins: 25-55 s a batch, against 5-10 s rebound)."""
    p = Pipeline()
    orders, prices = p.source("orders", ORDERS.schema), p.source("prices", PRICES.schema)
    behavior = t.common_behavior(delay=2, cutoff=6, keep_results=False)
    p.output("interval", orders.interval_join(prices, "ordered_at", "valid_from",
                                              t.interval(-2, 2), on="product_id", how="outer",
                                              behavior=behavior))
    sides = ["prices", "orders"] * 5
    # (id, product, time, quantity or price), times rising.
    rebound = _rebound(Engine(p, spark), [(side, (n, 1, 2 * n, 10))
                                          for n, side in enumerate(sides)])
    # Each side's first batches record a template per shape (the states fill one by one).
    assert rebound[-4:] == [True] * 4, rebound
