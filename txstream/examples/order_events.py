"""Sample events for the example pipeline: upserts and deletes of customers and orders.

Messages are keyed by a JSON object of the primary key columns (a tombstone, value null, has only
its key to say which row it deletes); values are JSON rows, amounts exact decimal strings
(`"123.40"`, as Debezium's `decimal.handling.mode=string` writes them). Used by `txstream demo`
and by the docker-compose event generator.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa

from txstream.changes import DIFF, TIME
from txstream.examples.orders import CUSTOMERS, ORDERS

REGIONS = ("north", "south", "east", "west")
STATUSES = ("new", "paid", "shipped", "delivered", "refunded")
KEY_COLUMNS = {"customers": "customer_id", "orders": "order_id"}

Event = tuple[str, int, dict[str, Any] | None]  # (source, primary key, row; None deletes)


@dataclass
class OrderWorld:
    """The current rows, as the events so far leave them: what a correct snapshot must show."""

    customers: dict[int, dict[str, Any]] = field(default_factory=dict)
    orders: dict[int, dict[str, Any]] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        source, key, row = event
        table = self.customers if source == "customers" else self.orders
        if row is None:
            table.pop(key, None)
        else:
            table[key] = row


def _cents(rng: random.Random) -> Decimal:
    """An amount of money: decimal(12,2), exact (1.00 to 500.00)."""
    return Decimal(rng.randint(100, 50_000)).scaleb(-2)


def events(rng: random.Random, customers: int, live_orders: int | None = None
           ) -> Iterator[Event]:
    """An endless stream: every customer first, then orders created, updated (status or
    amount) and deleted; now and then a customer changes region. Orders are created more often
    than deleted, so their number grows, unless `live_orders` is given: then an order created
    while that many are live first deletes the oldest (a key space that keeps moving at a
    steady size, as a service running for months sees)."""
    if live_orders is not None and live_orders < 1:
        raise ValueError(f"live_orders must be at least 1, not {live_orders}")
    for customer_id in range(1, customers + 1):
        yield "customers", customer_id, _customer(rng, customer_id)
    orders: dict[int, dict[str, Any]] = {}
    # The live order ids in a list, for a random pick in O(1) (a deletion moves the last id into
    # the gap): picking from `list(orders)` would make a long stream quadratic.
    ids: list[int] = []
    position: dict[int, int] = {}
    # Every order id in creation order, deleted ones skipped when reached (`live_orders`).
    created: deque[int] = deque()

    def delete(order_id: int) -> Event:
        del orders[order_id]
        last = ids.pop()
        gap = position.pop(order_id)
        if last != order_id:
            ids[gap] = last
            position[last] = gap
        return "orders", order_id, None

    next_order_id = 1
    while True:
        roll = rng.random()
        if roll < 0.45 or not orders:
            if live_orders is not None and len(orders) >= live_orders:
                while created[0] not in orders:
                    created.popleft()
                yield delete(created.popleft())
            row = {
                "order_id": next_order_id,
                "customer_id": rng.randint(1, customers),
                "amount": _cents(rng),
                "status": STATUSES[0],
            }
            orders[next_order_id] = row
            position[next_order_id] = len(ids)
            ids.append(next_order_id)
            if live_orders is not None:
                created.append(next_order_id)
            next_order_id += 1
            yield "orders", row["order_id"], row
        elif roll < 0.85:
            order_id = ids[rng.randrange(len(ids))]
            row = dict(orders[order_id])
            if rng.random() < 0.7:
                row["status"] = rng.choice(STATUSES)
            else:
                row["amount"] = _cents(rng)
            orders[order_id] = row
            yield "orders", order_id, row
        elif roll < 0.93:
            customer_id = rng.randint(1, customers)
            yield "customers", customer_id, _customer(rng, customer_id)
        else:
            yield delete(ids[rng.randrange(len(ids))])


def _customer(rng: random.Random, customer_id: int) -> dict[str, Any]:
    return {"customer_id": customer_id, "name": f"customer {customer_id}",
            "region": rng.choice(REGIONS)}


def encode(event: Event) -> tuple[bytes, bytes | None]:
    """The Kafka key and value of an event."""
    source, key, row = event
    return (json.dumps({KEY_COLUMNS[source]: key}).encode(),
            None if row is None else json.dumps(row, default=str).encode())


def as_changes(batch: list[Event], rows: dict[str, dict[int, dict[str, Any]]], time: int
               ) -> dict[str, pa.Table]:
    """Engine input for `batch` as one transaction numbered `time`: each event becomes the
    `-1 old, +1 new` changes the upsert Kafka source would emit. `rows` holds the current row
    of every key (per source) and is updated."""
    schemas = {"customers": CUSTOMERS, "orders": ORDERS}
    out: dict[str, list[dict[str, Any]]] = {"customers": [], "orders": []}
    for source, key, row in batch:
        current = rows.setdefault(source, {})
        old = current.pop(key, None)
        if old is not None:
            out[source].append({**old, TIME: time, DIFF: -1})
        if row is not None:
            current[key] = row
            out[source].append({**row, TIME: time, DIFF: 1})
    return {s: pa.Table.from_pylist(changes, schema=schemas[s].arrow_schema(with_changes=True))
            for s, changes in out.items() if changes}
