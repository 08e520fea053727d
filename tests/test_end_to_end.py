"""The walking skeleton end to end: events in Kafka -> transactions -> Spark -> PostgreSQL
live snapshots, against the real broker, PostgreSQL and Spark fixtures. Expected tables are
computed independently, in plain Python, from the events."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from txstream.examples.orders import kafka_sources
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.runner import PipelineRunner

Row = dict[str, Any]


def _produce(bootstrap: str, topic: str, records: list[tuple[Any, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(topic, key=json.dumps(key).encode(), value=value)
    assert producer.flush(10) == 0


def _value(row: Row) -> bytes:
    # Amounts as JSON numbers with their exact digits, as a producer writing numerics would.
    return json.dumps({k: float(v) if isinstance(v, Decimal) else v for k, v in row.items()}
                      ).encode()


@pytest.fixture
def runner(kafka, postgres, spark, pg_schema, topic_name, tmp_path):  # type: ignore[no-untyped-def]
    topics = {"customers": f"{topic_name}-customers", "orders": f"{topic_name}-orders"}
    kafka.create_topic(topics["customers"], 1)
    kafka.create_topic(topics["orders"], 2)
    config = PipelineConfig(
        pipeline="txstream.examples.orders:pipeline",
        sources=kafka_sources(topics["customers"], topics["orders"]),
        sinks=[SinkConfig.model_validate({"output": o, "db_schema": pg_schema})
               for o in ("customer_stats", "region_totals", "statuses")],
        transactions=BatchPolicy(max_events=4, max_delay_ms=100),
        batch_transactions=3,
        kafka_bootstrap_servers=kafka.bootstrap_servers,
        consumer_group=f"g-{topic_name}",
        database_url=postgres.url,
        checkpoint_dir=str(tmp_path),
    )
    r = open_runner(config, spark=spark)
    r.topics = topics  # type: ignore[attr-defined]
    yield r
    r.close()


def _drain(runner: PipelineRunner) -> None:
    runner.run(until=lambda r: r.lag() == 0)


Stats = dict[int, tuple[str, int, Decimal]]
Regions = dict[str, tuple[int, Decimal, Decimal, Decimal]]


def _expected(customers: dict[int, Row], orders: dict[int, Row]) -> tuple[Stats, Regions]:
    stats = {cid: (c["name"], 0, Decimal(0)) for cid, c in customers.items()}
    paid: dict[str, list[Decimal]] = {}
    for o in orders.values():
        if o["customer_id"] in stats:
            name, n, total = stats[o["customer_id"]]
            stats[o["customer_id"]] = (name, n + 1, total + o["amount"])
            if o["status"] == "paid":
                paid.setdefault(customers[o["customer_id"]]["region"], []).append(o["amount"])
    regions = {r: (len(v), sum(v), min(v), max(v)) for r, v in paid.items()}
    return stats, regions


def _snapshot(url: str, schema: str) -> tuple[Stats, Regions, set[str]]:
    with psycopg.connect(url) as conn:
        stats = conn.execute(
            f'SELECT customer_id, name, n_orders, total FROM "{schema}".customer_stats_live'
        ).fetchall()
        regions = conn.execute(f'SELECT * FROM "{schema}".region_totals_live').fetchall()
        statuses = conn.execute(f'SELECT status FROM "{schema}".statuses_live').fetchall()
    return ({r[0]: (r[1], r[2], r[3]) for r in stats},
            {r[0]: (r[1], r[2], r[3], r[4]) for r in regions},
            {r[0] for r in statuses})


def _assert_matches(runner: PipelineRunner, url: str, schema: str, customers: dict[int, Row],
                    orders: dict[int, Row]) -> None:
    want_stats, want_regions = _expected(customers, orders)
    got_stats, got_regions, got_statuses = _snapshot(url, schema)
    assert got_stats.keys() == want_stats.keys()
    # Exact: amounts are decimal(12,2), and so are their sums.
    assert got_stats == want_stats
    assert got_regions == want_regions
    assert got_statuses == {o["status"] for o in orders.values()}


def test_events_to_live_snapshot(runner: PipelineRunner, postgres, pg_schema) -> None:  # type: ignore[no-untyped-def]
    topics = runner.topics  # type: ignore[attr-defined]
    bootstrap = runner.config.kafka_bootstrap_servers
    assert bootstrap is not None
    customers = {i: {"customer_id": i, "name": f"c{i}", "region": "eu" if i % 2 else "us"}
                 for i in range(1, 5)}
    orders = {i: {"order_id": i, "customer_id": 1 + i % 4,
                  "amount": Decimal(10 * i) + Decimal("0.25"),
                  "status": "paid" if i % 3 else "new"} for i in range(1, 13)}
    _produce(bootstrap, topics["customers"],
             [({"customer_id": k}, _value(v)) for k, v in customers.items()])
    _produce(bootstrap, topics["orders"],
             [({"order_id": k}, _value(v)) for k, v in orders.items()])
    _drain(runner)
    first_round = runner.metrics.delivery.last_transaction
    assert first_round >= 2, "16 events in transactions of at most 4 make several transactions"
    _assert_matches(runner, postgres.url, pg_schema, customers, orders)

    # Updates of the same keys in later transactions: status and amount changes, an order
    # moved to another customer, a deleted order (tombstone), a customer moved to another
    # region, a deleted customer; plus malformed records, which must not stop anything.
    updates: list[tuple[Any, bytes | None]] = []
    for oid, change in ((3, {"status": "paid"}), (4, {"amount": Decimal("99.05")}),
                        (5, {"customer_id": 2}), (1, {"status": "refunded"})):
        orders[oid] = {**orders[oid], **change}
        updates.append(({"order_id": oid}, _value(orders[oid])))
    del orders[7]
    updates.append(({"order_id": 7}, None))
    updates += [({"order_id": 100}, b"{not json"),
                ({"order_id": 101}, _value({"order_id": 101, "customer_id": 1,
                                            "amount": "ten", "status": "paid"})),
                ({"order_id": 102}, _value({"customer_id": 1, "amount": 1.0,
                                            "status": "paid"}))]
    _produce(bootstrap, topics["orders"], updates)
    customers[2] = {**customers[2], "region": "eu"}
    del customers[4]
    _produce(bootstrap, topics["customers"],
             [({"customer_id": 2}, _value(customers[2])), ({"customer_id": 4}, None)])
    _drain(runner)

    assert runner.metrics.delivery.last_transaction > first_round
    assert runner.metrics.ingest.bad_records == 3
    _assert_matches(runner, postgres.url, pg_schema, customers, orders)
    with psycopg.connect(postgres.url) as conn:
        tombstone = conn.execute(
            f'SELECT diff, time FROM "{pg_schema}".customer_stats WHERE customer_id = 4'
        ).fetchone()
    assert tombstone is not None and tombstone[0] == -1 and tombstone[1] > first_round
