"""Run inside Pathway's virtualenv (`tests/support/pathway_peer.py`): orders and prices through
Pathway's joins by time on the product, each join's update stream written as JSON.

    <pathway-venv>/bin/python tests/support/pathway_joins.py INPUT.json OUTPUT.json

INPUT: {"orders": [[id, product_id, ordered_at, qty, transaction, diff], ...], "prices":
[[pid, product_id, valid_from, price, transaction, diff], ...], "joins": {name: {"kind":
"asof", "direction": "backward" | "forward" | "nearest"} or {"kind": "interval", "lower": n,
"upper": n, "how": "inner" | "left" | "right" | "outer"}, optionally with "behavior":
{"delay", "cutoff", "keep_results"}}}: a left as-of join, an interval join (inner when "how"
is not given). Transaction N is Pathway time 2N. OUTPUT: {name: [[product_id, id,
ordered_at, qty, pid, valid_from, price, pathway time, diff], ...]}, the product whichever
side's is present.

With "nudged": true in INPUT, transaction N is Pathway time 4N, and at 4N + 2 each side gets a
row that moves no clock and pairs with nothing (its time the largest its side's behavior has
released, its product 98 on the left and 99 on the right, dropped from the output), reported
as time 4N: Pathway forgets a row its side's clock has passed only when that side's next row
comes, a nudge forgets it right after the transaction that passed it, as txstream does.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pathway as pw
from join_behavior_model import Rules, side_fates  # beside this script


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


def _joined(orders: pw.Table, prices: pw.Table, join: dict[str, Any]) -> pw.Table:
    given = join.get("behavior")
    # Pathway refuses `behavior=None` where it takes one: given only when there is one.
    behavior = {"behavior": pw.temporal.common_behavior(**given)} if given is not None else {}
    on = orders.product_id == prices.product_id
    if join["kind"] == "asof":
        direction = getattr(pw.temporal.Direction, join["direction"].upper())
        result = orders.asof_join(prices, orders.ordered_at, prices.valid_from, on,
                                  how=pw.JoinMode.LEFT, direction=direction, **behavior)
    else:
        how = getattr(pw.JoinMode, join.get("how", "inner").upper())
        result = orders.interval_join(prices, orders.ordered_at, prices.valid_from,
                                      pw.temporal.interval(join["lower"], join["upper"]), on,
                                      how=how, **behavior)
    # A right row padded has no left product: the key is whichever side's is present.
    return result.select(product_id=pw.coalesce(pw.left.product_id, pw.right.product_id),
                         key=pw.left.key,
                         ordered_at=pw.left.ordered_at, qty=pw.left.qty, pid=pw.right.pid,
                         valid_from=pw.right.valid_from, price=pw.right.price)


NUDGED = (98, 99)  # the nudges' products, left and right
END_OF_INPUT = 2**64 - 2  # Pathway's time of what it flushes when its input ends


def _rows(changes: list[list[int]], nudged: bool, side: int, last: int, delay: int | None
          ) -> list[tuple[int, ...]]:
    """A side's changes as Pathway rows at their Pathway times; with `nudged`, a nudge after
    each of the `last` transactions (see the module doc)."""
    if not nudged:
        return [(*row, 2 * transaction, diff) for *row, transaction, diff in changes]
    rows = [(*row, 4 * transaction, diff) for *row, transaction, diff in changes]
    for number, latest in enumerate(_released_clock(changes, last, delay), 1):
        if latest is not None:  # before the side's first row a nudge would start its clock
            rows.append((10**6 + number, NUDGED[side], latest, 0, 4 * number + 2, 1))
    return rows


def _released_clock(changes: list[list[int]], last: int, delay: int | None
                    ) -> list[int | None]:
    """After each of the `last` transactions, the largest time a side's behavior has released
    (without a delay, its largest time), changes released together consolidated first: a
    nudge of that time reaches the cutoff at once and moves no clock. (The largest time seen
    would, under a delay, once the row that had it was deleted before its release: the nudge
    would then move the cutoff's clock.)"""
    fates = side_fates([(tuple(row), transaction, diff) for *row, transaction, diff in changes],
                       2, Rules(delay=delay), last)
    net: Counter[tuple[tuple[Any, ...], int]] = Counter()
    for f in fates:
        net[f.row, f.released] += f.diff
    clocks: list[int | None] = []
    for number in range(1, last + 1):
        released = [row[2] for (row, at), diff in net.items() if diff and at <= number]
        clocks.append(max(released, default=None))
    return clocks


def main(source: str, target: str) -> None:
    spec = json.loads(Path(source).read_text())
    nudged = bool(spec.get("nudged"))
    last = max(change[-2] for side in ("orders", "prices") for change in spec[side])
    streams: dict[str, list[list[Any]]] = {}
    names = ["product_id", "key", "ordered_at", "qty", "pid", "valid_from", "price"]
    for name, join in spec["joins"].items():
        # Each join its own inputs: a nudge's time depends on the join's delay.
        delay = (join.get("behavior") or {}).get("delay")
        orders = pw.debug.table_from_rows(
            Orders, _rows(spec["orders"], nudged, 0, last, delay), is_stream=True)
        prices = pw.debug.table_from_rows(
            Prices, _rows(spec["prices"], nudged, 1, last, delay), is_stream=True)
        changes: list[list[Any]] = []
        streams[name] = changes

        def record(key: Any, row: dict[str, Any], time: int, is_addition: bool,
                   changes: list[list[Any]] = changes) -> None:
            if nudged and row["product_id"] in NUDGED:
                return
            at = 2 * (time // 4) if nudged and time < END_OF_INPUT else time
            changes.append([row[n] for n in names] + [at, 1 if is_addition else -1])

        pw.io.subscribe(_joined(orders, prices, join), on_change=record)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    Path(target).write_text(json.dumps(streams))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
