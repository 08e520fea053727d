"""Engine state survives a save and a load into a new engine: the continued output stream is the
one an uninterrupted engine emits."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from txstream.engine import Engine, EngineStateError, Pipeline
from txstream.engine import reducers as r
from txstream.examples.orders import pipeline
from txstream.schemas.tables import TableSchema


def _orders(rows: list[tuple[int, int, float, str, int, int]]) -> pa.Table:
    names = ["order_id", "customer_id", "amount", "status", "time", "diff"]
    return pa.table({n: [row[i] for row in rows] for i, n in enumerate(names)})


CUSTOMERS = pa.table({"customer_id": [1, 2], "name": ["a", "b"], "region": ["eu", "us"],
                      "time": [1, 1], "diff": [1, 1]})
FIRST = _orders([(10, 1, 5.0, "paid", 1, 1), (11, 2, 7.0, "paid", 2, 1),
                 (12, 1, 1.0, "new", 2, 1)])
SECOND = _orders([(10, 1, 5.0, "paid", 3, -1), (10, 1, 6.0, "paid", 3, 1),
                  (11, 2, 7.0, "paid", 4, -1), (13, 2, 2.0, "paid", 4, 1)])


def _sorted(tables: dict[str, pa.Table]) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    return {n: sorted(t.to_pylist(), key=repr) for n, t in tables.items()}


def test_saved_state_continues_the_stream(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    straight = Engine(pipeline(), spark)
    straight.process({"customers": CUSTOMERS, "orders": FIRST})
    expected = _sorted(straight.process({"orders": SECOND}))

    first = Engine(pipeline(), spark)
    first.process({"customers": CUSTOMERS, "orders": FIRST})
    first.save_state(str(tmp_path / "state"))
    resumed = Engine(pipeline(), spark)
    resumed.load_state(str(tmp_path / "state"))
    assert _sorted(resumed.process({"orders": SECOND})) == expected
    assert any(expected.values())


def test_state_of_another_pipeline_is_refused(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = Engine(pipeline(), spark)
    first.process({"customers": CUSTOMERS, "orders": FIRST})
    first.save_state(str(tmp_path / "state"))
    other = Pipeline()
    t = other.source("orders", TableSchema.of({"order_id": "bigint", "amount": "double"}))
    other.output("n", t.groupby("order_id").reduce(n=r.count()))
    with pytest.raises(EngineStateError, match="different pipeline definition"):
        Engine(other, spark).load_state(str(tmp_path / "state"))
    with pytest.raises(EngineStateError, match="no complete engine state"):
        Engine(other, spark).load_state(str(tmp_path / "missing"))
