"""The orders example in `txstream demo`: customers and their orders
(`txstream.examples.orders`), customer_stats checked against a from-scratch computation."""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import Decimal

import psycopg

from txstream.examples.order_events import OrderWorld, encode, events
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.schemas.sources import SourceSpec
from txstream.service.demo_example import DemoError, DemoExample, Record, Say
from txstream.service.runner import PipelineRunner

# Records that are not valid events: the demo shows they are counted and skipped.
MALFORMED = (b"{not json", b'{"order_id": "seven", "customer_id": 1, "amount": 1.0}')


class OrdersDemo(DemoExample):
    pipeline = "txstream.examples.orders:pipeline"
    partitions = {"customers": 1, "orders": 3}
    outputs = OUTPUTS
    what = "order events"

    def __init__(self) -> None:
        self.world = OrderWorld()

    def sources(self, topics: dict[str, str]) -> list[SourceSpec]:
        return kafka_sources(topics["customers"], topics["orders"])

    def records(self, count: int, seed: int) -> Iterator[Record]:
        stream = events(random.Random(seed), customers=200)
        malformed_at = {count // 3: MALFORMED[0], 2 * count // 3: MALFORMED[1]}
        for i in range(count):
            event = next(stream)
            self.world.apply(event)
            yield (event[0], *encode(event))
            if i in malformed_at:
                yield "orders", b'{"order_id": 0}', malformed_at[i]

    def check(self, url: str, runner: PipelineRunner, say: Say) -> None:
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT customer_id, name, n_orders, total, time, diff FROM customer_stats "
                "ORDER BY total DESC, customer_id LIMIT 10"
            ).fetchall()
            live = conn.execute(
                "SELECT customer_id, name, n_orders, total FROM customer_stats_live"
            ).fetchall()
            regions = conn.execute("SELECT * FROM region_totals_live ORDER BY region").fetchall()
        say("\ncustomer_stats (live snapshot; top 10 by total):")
        say(f"  {'customer_id':>11} {'name':<14} {'n_orders':>8} {'total':>12} {'time':>6} diff")
        for cid, name, n, total, t, d in rows:
            say(f"  {cid:>11} {name:<14} {n:>8} {total:>12.2f} {t:>6} {d:>4}")
        say("\nregion_totals (paid orders):")
        for region, n, revenue, lo, hi in regions:
            say(f"  {region:<6} orders {n:>5}  revenue {revenue:>12.2f}  min {lo:>8.2f} "
                f"max {hi:>8.2f}")
        expected = self._expected_customer_stats()
        got = {cid: (name, n, total) for cid, name, n, total in live}
        wrong = [cid for cid in expected.keys() | got.keys()
                 if cid not in got or cid not in expected or got[cid] != expected[cid]]
        if wrong:
            raise DemoError(f"snapshot differs from a from-scratch computation for customers "
                            f"{sorted(wrong)[:10]}")
        say(f"\nchecked: customer_stats equals a from-scratch computation for all "
            f"{len(expected)} customers, to the cent")

    def _expected_customer_stats(self) -> dict[int, tuple[str, int, Decimal]]:
        world = self.world
        stats = {cid: (row["name"], 0, Decimal(0)) for cid, row in world.customers.items()}
        for order in world.orders.values():
            cid = order["customer_id"]
            if cid in stats:
                name, n, total = stats[cid]
                stats[cid] = (name, n + 1, total + order["amount"])
        return stats
