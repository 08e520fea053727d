"""A Debezium stream in Confluent's wire format (AvroConverter, JsonSchemaConverter or
ProtobufConverter values; JSON keys) through the transaction builder and the broker fixture,
schemas from the Schema Registry test double (or SCHEMA_REGISTRY_URL): snapshot reads in a
mini-batch, then a transaction (BEGIN and END framed alike on the metadata topic) holding an
update, a delete and its tombstone, as one stream transaction; a record naming an unknown
schema id lands in the dead-letter topic byte for byte, with its reason. A registry down when
the service starts is waited for, never a crash."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from support.kafka_helpers import integrate, make_builder, poll_until, produce, read_dead_letters
from support.registry_values import (
    ENVELOPE,
    ORDERS,
    TRANSACTION_METADATA,
    JsonSchemaProducer,
    Producer,
    ProtobufProducer,
    any_object,
    json_order,
    metadata,
    order,
)
from support.schema_registry_double import running_double

from txstream.schemas.config import PipelineConfig
from txstream.schemas.sources import SourceSpec, UpstreamTransactions
from txstream.service.check import run_checks
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.service.health import Readiness
from txstream.service.input_reports import InputReports
from txstream.service.metrics import Metrics
from txstream.service.stages import Retrying
from txstream.sources.kafka_input import KafkaInput
from txstream.sources.source_state import SourceState
from txstream.sources.transactions import TransactionBuilder


def change(op: str, before: dict | None, after: dict | None, txid: str | None = None,
           order_in_tx: int = 1) -> dict[str, Any]:
    tx = None if txid is None else {"id": txid, "total_order": order_in_tx,
                                    "data_collection_order": order_in_tx}
    return {"before": before, "after": after, "op": op, "ts_ms": 1, "transaction": tx,
            "source": {"connector": "postgresql", "txId": 780}}


def key(i: int) -> bytes:
    return b'{"id": %d}' % i


# Debezium's envelope and transaction metadata as Protobuf messages, decimals and timestamps as
# text (decimal.handling.mode=string, ZonedTimestamp).
ENVELOPE_PROTO = """syntax = "proto3";
package dbserver1.orders;
message Envelope {
  message Value {
    int64 id = 1; string customer = 2; string amount = 3; string placed_at = 4; string day = 5;
    optional string note = 6;
  }
  message Source { string connector = 1; int64 txId = 2; }
  message Block { string id = 1; int64 total_order = 2; int64 data_collection_order = 3; }
  Value before = 1; Value after = 2; Source source = 3; string op = 4; optional int64 ts_ms = 5;
  Block transaction = 6;
}
"""
METADATA_PROTO = """syntax = "proto3";
package io.debezium.connector.common;
message TransactionMetadataValue {
  message DataCollection { string data_collection = 1; int64 event_count = 2; }
  string status = 1; string id = 2; optional int64 event_count = 3;
  repeated DataCollection data_collections = 4; int64 ts_ms = 5;
}
"""


@dataclass(frozen=True)
class Framing:
    value_format: str
    producer: Callable[[str], Any]  # registry URL -> .topic, .values(schema, records)
    envelope: str  # the change events' schema
    metadata: str  # the transaction metadata's schema
    order: Callable[..., dict[str, Any]]
    # JsonSchemaConverter keeps decimals as the connector wrote them: here as text.
    settings: dict[str, Any]


FRAMINGS = [
    Framing("avro", Producer, ENVELOPE, TRANSACTION_METADATA, order, {}),
    Framing("json_schema", JsonSchemaProducer, any_object("Envelope"),
            any_object("TransactionMetadataValue"), json_order,
            {"decimal_handling_mode": "string"}),
    Framing("protobuf", ProtobufProducer, ENVELOPE_PROTO, METADATA_PROTO, json_order,
            {"decimal_handling_mode": "string"}),
]


@pytest.mark.parametrize("framing", FRAMINGS, ids=lambda f: f.value_format)
def test_debezium_framed_stream(kafka: KafkaEndpoint, registry_url: str,
                                dlq: str, builders: list[TransactionBuilder],
                                framing: Framing) -> None:
    producer = framing.producer(registry_url)
    row = framing.order
    meta = f"{producer.topic}.transaction"
    kafka.create_topic(producer.topic, 1)
    kafka.create_topic(meta, 1)
    spec = SourceSpec(name="orders", topic=producer.topic, schema=ORDERS, format="debezium",
                      semantics="upsert", value_format=framing.value_format,
                      schema_registry_url=registry_url, **framing.settings,
                      upstream=UpstreamTransactions(metadata_topic=meta,
                                                    data_collection="public.orders"))
    builders.append(b := make_builder(kafka, [spec], dlq))
    snapshot = producer.values(framing.envelope,
                               [change("r", None, row(i)) for i in (1, 2, 3)])
    produce(kafka, producer.topic, [(key(i), v) for i, v in zip((1, 2, 3), snapshot,
                                                                 strict=True)])
    txs = poll_until(b, lambda ts: len(ts) == 1)
    update, delete = producer.values(framing.envelope, [
        change("u", row(1), row(1, note="gift"), "780:34131368", 1),
        change("d", row(3), None, "780:34131400", 2)])
    unknown = b"\x00\x7f\xff\xff\xf0" + update[5:]
    begin, end = producer.values(framing.metadata, [metadata("BEGIN", "780:34131152"),
                                                        metadata("END", "780:34131464", 2)])
    produce(kafka, meta, [(None, begin)])
    produce(kafka, producer.topic, [(key(1), update), (key(2), unknown), (key(3), delete),
                                    (key(3), None)])
    produce(kafka, meta, [(None, end)])
    txs += poll_until(b, lambda ts: any(t.upstream_id == "780" for t in ts), deadline_s=20)
    assert [t.upstream_id for t in txs if t.upstream_id is not None] == ["780"]
    assert b.stats.incomplete_upstream == 0
    final = {dict(r)["id"]: dict(r) for r in integrate(txs, "orders")}
    assert {i: r["note"] for i, r in final.items()} == {1: "gift", 2: None}
    dead, = read_dead_letters(kafka, dlq, 1)
    assert dead["value"] == unknown and dead["key"] == key(2)
    assert "schema id 2147483632 is unknown" in dead["txstream.error"]


def test_a_registry_down_at_start_is_waited_for(kafka: KafkaEndpoint,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The input's start as `PipelineRunner` runs it (under its `Retrying`) while nothing
    answers at the registry's address: not ready, retried with backoff and the registry named in
    the log, no exception out of the start; it starts once a registry answers there.
    `txstream check` says the same."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    config = PipelineConfig(
        pipeline="txstream.examples.orders:pipeline", sinks=[], consumer_group=f"g-{topic}",
        sources=[SourceSpec(name="orders", topic=topic, schema=ORDERS, value_format="avro",
                            schema_registry_url=url)],
        kafka_bootstrap_servers=kafka.bootstrap_servers)

    def no_spark(*_: object, **__: object) -> None:
        raise RuntimeError("no Spark in this test")

    monkeypatch.setattr("txstream.service.spark.get_spark", no_spark)

    def registry_check() -> tuple[bool, str]:
        return next((ok, found) for name, ok, found in run_checks(config)
                    if name == "schema_registry")

    ok, found = registry_check()
    assert not ok and f"Schema Registry at {url} does not answer" in found

    readiness, stop = Readiness(config.ready_max_lag), threading.Event()
    retrying = Retrying(readiness, stop, initial_s=0.1, max_s=0.5)
    started: list[KafkaInput] = []
    state = SourceState(next_number=1, offsets={}, upsert_rows={})

    def start() -> None:
        started.append(retrying(KafkaInput.name, lambda: KafkaInput(
            config, state, [], InputReports(Metrics().source, readiness, KafkaInput.name))))

    thread = threading.Thread(target=start)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while "retrying in" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"Schema Registry at {url} does not answer" in caplog.text
        assert not readiness.up(KafkaInput.name) and thread.is_alive()
        with running_double({"SCHEMA_REGISTRY_DOUBLE_PORT": str(port)}):
            thread.join(timeout=60)
            assert started and readiness.up(KafkaInput.name)
            assert registry_check() == (True, f"Schema Registry at {url} answers")
    finally:
        stop.set()
        thread.join()
        for source in started:
            source.close()
