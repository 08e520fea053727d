"""Two batches of the example pipeline's changes (`CUSTOMERS`, then orders in `FIRST` and
`SECOND`) as `Engine.process` takes them, and outputs compared as sorted rows: for the tests of
the engine's state and parallelism."""

from __future__ import annotations

import pyarrow as pa


def orders(rows: list[tuple[int, int, float, str, int, int]]) -> pa.Table:
    names = ["order_id", "customer_id", "amount", "status", "time", "diff"]
    return pa.table({n: [row[i] for row in rows] for i, n in enumerate(names)})


CUSTOMERS = pa.table({"customer_id": [1, 2], "name": ["a", "b"], "region": ["eu", "us"],
                      "time": [1, 1], "diff": [1, 1]})
FIRST = orders([(10, 1, 5.0, "paid", 1, 1), (11, 2, 7.0, "paid", 2, 1),
                (12, 1, 1.0, "new", 2, 1)])
SECOND = orders([(10, 1, 5.0, "paid", 3, -1), (10, 1, 6.0, "paid", 3, 1),
                 (11, 2, 7.0, "paid", 4, -1), (13, 2, 2.0, "paid", 4, 1)])


def sorted_rows(tables: dict[str, pa.Table]) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    return {n: sorted(t.to_pylist(), key=repr) for n, t in tables.items()}
