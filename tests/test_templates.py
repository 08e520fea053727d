"""Which batches a plan template serves (`txstream.engine.templates`), and that a batch it
serves computes what the operators' own plans compute: a batch rebound to the template of its
shape skips building its plans through the operators and Spark's optimizer and planner, which
for a pipeline of temporal joins cost tens of seconds a batch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from test_asof_join import ORDERS, PRICES, _changes

from txstream import Pipeline
from txstream import temporal as t
from txstream.engine import Engine
from txstream.engine import engine as engine_module
from txstream.engine.spark_internals import optimized, reads_subqueries

_EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"


def _outer_interval_join() -> Pipeline:
    p = Pipeline()
    orders, prices = p.source("orders", ORDERS.schema), p.source("prices", PRICES.schema)
    p.output("o", orders.interval_join(
        prices, "ordered_at", "valid_from", t.interval(-2, 2), on="product_id", how="outer",
        behavior=t.common_behavior(delay=2, cutoff=6, keep_results=False)))
    return p


def _run(engine: Engine) -> tuple[list[list[dict]], list[bool]]:
    """Batches of one row inserted into one side, the sides taking turns, times rising: each
    batch's output rows, and whether it was rebound to a template."""
    outputs, rebound = [], []
    for n, side in enumerate(["prices", "orders"] * 5):
        schema = (ORDERS if side == "orders" else PRICES).schema
        # (id, product, time, quantity or price)
        out = engine.process({side: _changes(schema, [((n, 1, 2 * n, 10), n + 1, 1)])})
        outputs.append(out["o"].table.to_pylist())
        assert engine.last_batch is not None
        rebound.append(engine.last_batch.rebound)
    return outputs, rebound


def _built_every_batch(spark: SparkSession, monkeypatch: pytest.MonkeyPatch
                       ) -> list[list[dict]]:
    """The outputs with every batch's plans built by the operators (no template recorded)."""
    with monkeypatch.context() as patched:
        patched.setattr(engine_module, "record", lambda *args: None)
        outputs, rebound = _run(Engine(_outer_interval_join(), spark))
    assert not any(rebound)
    return outputs


@contextmanager
def _rules_excluded(spark: SparkSession, rules: str) -> Iterator[None]:
    was = spark.conf.get(_EXCLUDED_RULES, "")
    spark.conf.set(_EXCLUDED_RULES, rules)
    try:
        yield
    finally:
        spark.conf.set(_EXCLUDED_RULES, was)


def test_a_temporal_join_rebinds_batches_with_changes_on_one_side(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """An outer interval join under a behavior reads its clock's ungrouped aggregate twice,
    which Spark's `MergeSubplans` would move into a scalar subquery, a plan of its own that a
    template cannot rebind: the service's session excludes that rule, so batches with changes
    on one side are rebound, and compute what the operators' plans compute."""
    want = _built_every_batch(spark, monkeypatch)
    outputs, rebound = _run(Engine(_outer_interval_join(), spark))
    # Each side's first batches record a template per shape (the states fill one by one).
    assert rebound[-4:] == [True] * 4, rebound
    assert outputs == want


def test_a_plan_reading_a_subquery_is_never_rebound(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `MergeSubplans` on (a session other than the service's), the same batches have a
    scalar subquery in their plans: Spark's transforms do not reach into its plan, so a
    template would have every later batch read the recording batch's clock there. No such
    template is recorded, and every batch computes what the operators' plans compute."""
    want = _built_every_batch(spark, monkeypatch)
    with _rules_excluded(spark, ""):
        engine = Engine(_outer_interval_join(), spark)
        outputs, rebound = _run(engine)
    assert not any(rebound[4:]), rebound
    assert outputs == want
    recorded = [plan.logical for template in engine._templates.values()
                for plan in [*(step.plan for step in template.steps), template.final]]
    assert recorded and not any(reads_subqueries(spark, plan) for plan in recorded)


def test_a_scalar_subquery_is_found_anywhere_in_a_plan(spark: SparkSession) -> None:
    plain = spark.range(5).where("id > 1").groupBy().count()
    within = spark.range(5).where(F.col("id") > spark.range(3).agg(F.max("id")).scalar())
    assert not reads_subqueries(spark, optimized(plain))
    assert reads_subqueries(spark, optimized(within))
