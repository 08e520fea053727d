"""Run inside Pathway's virtualenv (`tests/support/pathway_peer.py`): orders and prices through
Pathway's `asof_join` (left, on the product), each direction's update stream written as JSON.

    <pathway-venv>/bin/python tests/support/pathway_asof.py INPUT.json OUTPUT.json

INPUT: {"orders": [[id, product_id, ordered_at, qty, transaction, diff], ...], "prices":
[[pid, product_id, valid_from, price, transaction, diff], ...], "directions": ["backward",
...]}. Transaction N is Pathway time 2N. OUTPUT: {direction: [[product_id, id, ordered_at,
qty, pid, valid_from, price, pathway time, diff], ...]}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pathway as pw


class Orders(pw.Schema):
    key: int = pw.column_definition(primary_key=True)  # Pathway reserves `id`
    product_id: int
    ordered_at: int
    qty: int


class Prices(pw.Schema):
    pid: int = pw.column_definition(primary_key=True)
    product_id: int
    valid_from: int
    price: int


def main(source: str, target: str) -> None:
    spec = json.loads(Path(source).read_text())

    def rows(changes: list[list[int]]) -> list[tuple[int, ...]]:
        return [(*row, 2 * transaction, diff) for *row, transaction, diff in changes]

    orders = pw.debug.table_from_rows(Orders, rows(spec["orders"]), is_stream=True)
    prices = pw.debug.table_from_rows(Prices, rows(spec["prices"]), is_stream=True)
    streams: dict[str, list[list[Any]]] = {}
    for direction in spec["directions"]:
        joined = orders.asof_join(
            prices, orders.ordered_at, prices.valid_from, orders.product_id == prices.product_id,
            how=pw.JoinMode.LEFT, direction=getattr(pw.temporal.Direction, direction.upper()),
        ).select(product_id=pw.left.product_id, key=pw.left.key, ordered_at=pw.left.ordered_at,
                 qty=pw.left.qty, pid=pw.right.pid, valid_from=pw.right.valid_from,
                 price=pw.right.price)
        changes: list[list[Any]] = []
        streams[direction] = changes
        names = ["product_id", "key", "ordered_at", "qty", "pid", "valid_from", "price"]

        def record(key: Any, row: dict[str, Any], time: int, is_addition: bool,
                   changes: list[list[Any]] = changes, names: list[str] = names) -> None:
            changes.append([row[n] for n in names] + [time, 1 if is_addition else -1])

        pw.io.subscribe(joined, on_change=record)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    Path(target).write_text(json.dumps(streams))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
