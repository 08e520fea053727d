"""The walking skeleton end to end: events in Kafka -> transactions -> Spark -> PostgreSQL
live snapshots, against the real broker, PostgreSQL and Spark fixtures. Expected tables are
computed independently, in plain Python, from the events.

The same events go through as JSON, and as Avro, JSON Schema-framed JSON and Protobuf from a
Schema Registry (the test double, or SCHEMA_REGISTRY_URL), so all give the same snapshot; the
Avro orders' writer schema evolves twice mid-stream (a field added with a default, then one
removed)."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import json_format
from support.registry_values import any_object, message_class, record_schema

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


class JsonEvents:
    """The values of the example's sources as JSON."""

    def value(self, topic: str, row: Row, version: int = 1) -> bytes:
        return _value(row)

    def malformed(self, topic: str) -> list[bytes]:
        """Three order values that must be dead-lettered."""
        return [b"{not json",
                _value({"order_id": 101, "customer_id": 1, "amount": "ten", "status": "paid"}),
                _value({"customer_id": 1, "amount": 1.0, "status": "paid"})]


_AMOUNT = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
_ORDER = [{"name": "order_id", "type": "long"}, {"name": "customer_id", "type": "long"},
          {"name": "amount", "type": _AMOUNT}, {"name": "status", "type": "string"}]
_COUPON = {"name": "coupon", "type": ["null", "string"], "default": None}  # read by no column
_CHANNEL = {"name": "channel", "type": "string", "default": "web"}
# Writer schemas of each source by version: orders v2 adds a field with a default, v3 removes
# one; the pipeline's sources are never restarted between them.
_AVRO_SCHEMAS = {
    ("customers", 1): record_schema("Customer", [
        {"name": "customer_id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "region", "type": "string"}]),
    ("orders", 1): record_schema("Order", [*_ORDER, _COUPON]),
    ("orders", 2): record_schema("Order", [*_ORDER, _COUPON, _CHANNEL]),
    ("orders", 3): record_schema("Order", [*_ORDER, _CHANNEL]),
}


class FramedEvents(ABC):
    """The values as a Schema Registry serializer writes them, each schema registered under
    `<topic>-value`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = SchemaRegistryClient({"url": url})

    @staticmethod
    def context(topic: str) -> SerializationContext:
        return SerializationContext(topic, MessageField.VALUE)

    @abstractmethod
    def value(self, topic: str, row: Row, version: int = 1) -> bytes:
        """`row` of the source `topic` feeds, with writer schema `version` where it has
        several."""

    @abstractmethod
    def keyless(self, topic: str) -> bytes:
        """An order without its primary key."""

    def malformed(self, topic: str) -> list[bytes]:
        """Not the wire format, an unknown schema id, no primary key."""
        good = self.value(topic, {"order_id": 101, "customer_id": 1,
                                  "amount": Decimal("1.00"), "status": "paid"})
        return [b"{not json", b"\x00\x7f\xff\xff\xf0" + good[5:], self.keyless(topic)]


class AvroEvents(FramedEvents):
    def value(self, topic: str, row: Row, version: int = 1) -> bytes:
        schema = _AVRO_SCHEMAS[(topic.rsplit("-", 1)[1], version)]
        serialize = AvroSerializer(self.client, schema, conf={"auto.register.schemas": True})
        return serialize(row, self.context(topic))

    def keyless(self, topic: str) -> bytes:
        serialize = AvroSerializer(self.client, record_schema("Order", _ORDER[1:]),
                                   conf={"auto.register.schemas": True})
        return serialize({"customer_id": 1, "amount": Decimal("1.00"), "status": "paid"},
                         self.context(topic))


class JsonSchemaEvents(FramedEvents):
    def value(self, topic: str, row: Row, version: int = 1) -> bytes:
        serialize = JSONSerializer(any_object(topic.rsplit("-", 1)[1]), self.client,
                                   conf={"auto.register.schemas": True})
        return serialize(json.loads(_value(row)), self.context(topic))

    def keyless(self, topic: str) -> bytes:
        return self.value(topic, {"customer_id": 1, "amount": Decimal("1.00"), "status": "paid"})


# `optional`: an order without its id has none (proto3 would read 0), and is dead-lettered.
_PROTOS = {
    "customers": 'syntax = "proto3"; message Customer { int64 customer_id = 1; '
                 "string name = 2; string region = 3; }",
    "orders": 'syntax = "proto3"; message Order { optional int64 order_id = 1; '
              "int64 customer_id = 2; string amount = 3; string status = 4; }",
}


class ProtobufEvents(FramedEvents):
    def value(self, topic: str, row: Row, version: int = 1) -> bytes:
        cls = message_class(_PROTOS[topic.rsplit("-", 1)[1]])
        serialize = ProtobufSerializer(cls, self.client, {"auto.register.schemas": True})
        text = {k: str(v) if isinstance(v, Decimal) else v for k, v in row.items()}
        return serialize(json_format.ParseDict(text, cls()), self.context(topic))

    def keyless(self, topic: str) -> bytes:
        return self.value(topic, {"customer_id": 1, "amount": Decimal("1.00"), "status": "paid"})


_FRAMED: dict[str, type[FramedEvents]] = {
    "avro": AvroEvents, "json_schema": JsonSchemaEvents, "protobuf": ProtobufEvents}


@pytest.fixture(params=["json", "avro", "json_schema", "protobuf"])
def value_format(request) -> str:  # type: ignore[no-untyped-def]
    return request.param


@pytest.fixture
def values(value_format: str, request) -> JsonEvents | FramedEvents:  # type: ignore[no-untyped-def]
    if value_format == "json":
        return JsonEvents()
    return _FRAMED[value_format](request.getfixturevalue("registry_url"))


@pytest.fixture
def runner(kafka, postgres, spark, pg_schema, topic_name, tmp_path, value_format,  # type: ignore[no-untyped-def]
           values):
    topics = {"customers": f"{topic_name}-customers", "orders": f"{topic_name}-orders"}
    kafka.create_topic(topics["customers"], 1)
    kafka.create_topic(topics["orders"], 2)
    settings = {} if value_format == "json" else {
        "value_format": value_format, "schema_registry_url": values.url}
    config = PipelineConfig(
        pipeline="txstream.examples.orders:pipeline",
        sources=kafka_sources(topics["customers"], topics["orders"], **settings),
        # Tombstones kept: the test reads one, which a purge after a checkpoint could take.
        sinks=[SinkConfig.model_validate({"output": o, "db_schema": pg_schema, "purge": None})
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


def test_events_to_live_snapshot(runner: PipelineRunner, postgres, pg_schema,  # type: ignore[no-untyped-def]
                                 values) -> None:
    topics = runner.topics  # type: ignore[attr-defined]
    bootstrap = runner.config.kafka_bootstrap_servers
    assert bootstrap is not None
    customers = {i: {"customer_id": i, "name": f"c{i}", "region": "eu" if i % 2 else "us"}
                 for i in range(1, 5)}
    orders = {i: {"order_id": i, "customer_id": 1 + i % 4,
                  "amount": Decimal(10 * i) + Decimal("0.25"),
                  "status": "paid" if i % 3 else "new"} for i in range(1, 13)}
    _produce(bootstrap, topics["customers"],
             [({"customer_id": k}, values.value(topics["customers"], v))
              for k, v in customers.items()])
    _produce(bootstrap, topics["orders"],
             [({"order_id": k}, values.value(topics["orders"], v)) for k, v in orders.items()])
    _drain(runner)
    first_round = runner.metrics.delivery.last_transaction
    assert first_round >= 2, "16 events in transactions of at most 4 make several transactions"
    _assert_matches(runner, postgres.url, pg_schema, customers, orders)

    # Updates of the same keys in later transactions: status and amount changes, an order
    # moved to another customer, a deleted order (tombstone), a customer moved to another
    # region, a deleted customer; plus malformed records, which must not stop anything.
    # Avro orders: the first two updates with writer schema v2, the others with v3.
    updates: list[tuple[Any, bytes | None]] = []
    for oid, change, version in ((3, {"status": "paid"}, 2), (4, {"amount": Decimal("99.05")}, 2),
                                 (5, {"customer_id": 2}, 3), (1, {"status": "refunded"}, 3)):
        orders[oid] = {**orders[oid], **change}
        updates.append(({"order_id": oid}, values.value(topics["orders"], orders[oid], version)))
    del orders[7]
    updates.append(({"order_id": 7}, None))
    updates += [({"order_id": 100 + i}, bad)
                for i, bad in enumerate(values.malformed(topics["orders"]))]
    _produce(bootstrap, topics["orders"], updates)
    customers[2] = {**customers[2], "region": "eu"}
    del customers[4]
    _produce(bootstrap, topics["customers"],
             [({"customer_id": 2}, values.value(topics["customers"], customers[2])),
              ({"customer_id": 4}, None)])
    _drain(runner)

    assert runner.metrics.delivery.last_transaction > first_round
    assert runner.metrics.ingest.bad_records == 3
    _assert_matches(runner, postgres.url, pg_schema, customers, orders)
    with psycopg.connect(postgres.url) as conn:
        tombstone = conn.execute(
            f'SELECT diff, time FROM "{pg_schema}".customer_stats WHERE customer_id = 4'
        ).fetchone()
    assert tombstone is not None and tombstone[0] == -1 and tombstone[1] > first_round
