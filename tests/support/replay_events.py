"""Random changes to the example pipeline's sources in `txstream replay`'s input format, for the
tests that replay them on a Spark cluster."""

from __future__ import annotations

import random
from typing import Any


def generate_events(seed: int, transactions: int = 40) -> list[dict[str, Any]]:
    """Random changes to the example's sources, in replay's input format.

    Times start at 1 and never decrease; an update is a -1 of the old row and a +1 of the new
    one in the same time; a transaction touches each key at most once and often both sources.
    Amounts are multiples of 0.25, so sums are exact whatever the order Spark adds them in.
    """
    rng = random.Random(seed)
    tables: dict[str, dict[int, dict[str, Any]]] = {"customers": {}, "orders": {}}
    next_id = {"customers": 1, "orders": 1}
    events: list[dict[str, Any]] = []

    def emit(time: int, source: str, diff: int, row: dict[str, Any]) -> None:
        events.append({"source": source, "time": time, "diff": diff, "row": row})

    def new_row(source: str, key: int) -> dict[str, Any]:
        if source == "customers":
            return {"customer_id": key, "name": f"c{key}",
                    "region": rng.choice(["north", "south", "east"])}
        return {"order_id": key, "customer_id": rng.randint(1, max(next_id["customers"] - 1, 1)),
                "amount": rng.randint(1, 400) * 0.25,
                "status": rng.choice(["new", "paid", "shipped"])}

    for time in range(1, transactions + 1):
        touched: set[tuple[str, int]] = set()
        for _ in range(rng.randint(1, 5)):
            source = "customers" if time == 1 or rng.random() < 0.3 else "orders"
            table = tables[source]
            if rng.random() < 0.5 or not table:
                key = next_id[source]
                next_id[source] += 1
                table[key] = new_row(source, key)
                emit(time, source, 1, table[key])
                touched.add((source, key))
                continue
            key = rng.choice(sorted(table))
            if (source, key) in touched:
                continue
            touched.add((source, key))
            old = table.pop(key)
            emit(time, source, -1, old)
            if rng.random() < 0.7:  # an update; otherwise the -1 alone is a delete
                updated = new_row(source, key)
                if source == "orders":
                    updated["customer_id"] = old["customer_id"]
                table[key] = updated
                emit(time, source, 1, updated)
    return events
