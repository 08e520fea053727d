"""The example pipeline (`txstream.examples.orders`) in tests: its events produced to Kafka
(`OrderProducer`), its configuration file, and its outputs computed from scratch in plain
Python to compare with what the sinks hold."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka import Producer

from txstream.examples.order_events import OrderWorld, encode, events


class OrderProducer:
    """Order events in sequence (of `customers` customers, at most `live_orders` orders live if
    given, from `seed`), produced as they are sent, with the from-scratch world they leave."""

    def __init__(self, bootstrap: str, topics: dict[str, str], *, seed: int = 3,
                 customers: int = 30, live_orders: int | None = None) -> None:
        self.world = OrderWorld()
        self._topics = topics
        self._stream = events(random.Random(seed), customers=customers, live_orders=live_orders)
        # Idempotent: a retried send is neither duplicated nor reordered, so the topics hold
        # exactly the events `world` applied, in its order.
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                   "enable.idempotence": True})

    def send(self, count: int, flush: bool = True) -> None:
        for i in range(count):
            event = next(self._stream)
            key, value = encode(event)
            while True:
                try:
                    self._producer.produce(self._topics[event[0]], key=key, value=value)
                    break
                except BufferError:  # the local queue is full (a broker paused): wait for it
                    self._producer.poll(0.1)
            self.world.apply(event)
            if i % 5000 == 4999:  # delivery reports, so the local queue never fills
                self._producer.poll(0)
        if flush:
            assert self._producer.flush(120) == 0
        else:
            self._producer.poll(0)  # serve the delivery reports of small, frequent sends


def expected_tables(world: OrderWorld) -> dict[str, set[tuple[Any, ...]]]:
    """The example pipeline's outputs, computed from scratch in plain Python."""
    stats = {cid: [c["name"], 0, Decimal(0)] for cid, c in world.customers.items()}
    paid: list[tuple[Any, ...]] = []
    regions: dict[str, list[Decimal]] = {}
    for o in world.orders.values():
        customer = world.customers.get(o["customer_id"])
        if customer is None:
            continue
        stats[o["customer_id"]][1] += 1
        stats[o["customer_id"]][2] += o["amount"]
        if o["status"] == "paid":
            paid.append((o["order_id"], o["customer_id"], customer["region"], o["amount"]))
            regions.setdefault(customer["region"], []).append(o["amount"])
    return {
        "customer_stats": {(cid, name, count, total)
                           for cid, (name, count, total) in stats.items()},
        "paid_orders": set(paid),
        "region_totals": {(r, len(v), sum(v), min(v), max(v)) for r, v in regions.items()},
        "statuses": {(o["status"],) for o in world.orders.values()},
    }


OUTPUT_COLUMNS = {
    "customer_stats": "customer_id, name, n_orders, total",
    "paid_orders": "order_id, customer_id, region, amount",
    "region_totals": "region, orders, revenue, min_amount, max_amount",
    "statuses": "status",
}


def snapshot_tables(url: str, schema: str) -> dict[str, set[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: set(conn.execute(
            f'SELECT {cols} FROM "{schema}"."{name}_live"').fetchall())
            for name, cols in OUTPUT_COLUMNS.items()}


def write_config(path: Path, topics: dict[str, str], schema: str, group: str,
                 checkpoint_dir: Path, port: int, **extra: Any) -> Path:
    config = {
        "pipeline": "txstream.examples.orders:pipeline",
        "consumer_group": group,
        "http_port": port,
        "checkpoint_dir": str(checkpoint_dir),
        "sources": [
            {"name": "customers", "topic": topics["customers"], "semantics": "upsert",
             "schema": {"columns": [{"name": "customer_id", "type": "bigint"},
                                    {"name": "name", "type": "text"},
                                    {"name": "region", "type": "text"}],
                        "primary_key": ["customer_id"]}},
            {"name": "orders", "topic": topics["orders"], "semantics": "upsert",
             "schema": {"columns": [{"name": "order_id", "type": "bigint"},
                                    {"name": "customer_id", "type": "bigint"},
                                    {"name": "amount", "type": "decimal(12,2)"},
                                    {"name": "status", "type": "text"}],
                        "primary_key": ["order_id"]}},
        ],
        # `replace`: a restart that resumes from a checkpoint must keep the tables.
        "sinks": [{"output": name, "db_schema": schema, "mode": "replace"}
                  for name in OUTPUT_COLUMNS]
        + [{"output": "region_totals", "kind": "postgres_append", "db_schema": schema,
            "table": "region_totals_changes"}],
        **extra,
    }
    path.write_text(yaml.safe_dump(config))
    return path
