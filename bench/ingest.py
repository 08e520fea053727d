"""Ingest throughput: records/s from Kafka to closed transactions (consolidated delta Arrow
tables), for JSON records of ~200 bytes, append-only and upsert. Prints one JSON object.

Uses `KAFKA_BOOTSTRAP_SERVERS` when set, else starts librdkafka's mock broker process. Also
times decoding + upsert/consolidation alone on messages fetched beforehand, to separate the
broker's and the client's share from ours.

    .venv/bin/python bench/ingest.py [--records 100000] [--keys 50000] [--batch 10000]

`--formats-only` times only the decoding of the same records as JSON, and as Avro, JSON
Schema-framed JSON and Protobuf in Confluent's wire format (`value_format` `avro`,
`json_schema`, `protobuf`), without a broker.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import random
import sys
import time
import uuid
from typing import Any

import fastavro
import numpy as np
import pandas  # noqa: F401 (pyarrow's to_numpy imports it once: keep that out of the timings)
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from google.protobuf import json_format

from txstream.changes import DIFF, TIME, consolidate
from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.service.embedded.kafka import KafkaEndpoint, MockKafkaBroker, kafka_from_env
from txstream.sources.consumed import raw_records
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import SIGN, RawRecords
from txstream.sources.registry.framed import WriterSchema
from txstream.sources.registry.protobuf import ProtobufValues
from txstream.sources.transactions import TransactionBuilder
from txstream.sources.upsert import UpsertState

SCHEMA = TableSchema.of(
    {"id": "bigint", "customer": "text", "item": "text", "qty": "int", "price": "double",
     "status": "text", "created": "timestamp"},
    primary_key=["id"],
)


def row(rng: random.Random, key: int) -> dict[str, Any]:
    return {
        "id": key,
        "customer": f"customer-{rng.randrange(100_000):06d}",
        "item": f"sku-{rng.randrange(1_000_000):07d}-{'x' * rng.randrange(35, 55)}",
        "qty": rng.randrange(1, 100),
        "price": round(rng.random() * 1000, 2),
        "status": rng.choice(["new", "paid", "shipped", "cancelled"]),
        "created": f"2026-11-21T10:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z",
    }


def record(rng: random.Random, key: int) -> bytes:
    return json.dumps(row(rng, key)).encode()


AVRO_SCHEMA: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "item", "type": "string"}, {"name": "qty", "type": "int"},
    {"name": "price", "type": "double"}, {"name": "status", "type": "string"},
    {"name": "created", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}
ORDER_PROTO = """syntax = "proto3";
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1; string customer = 2; string item = 3; int32 qty = 4; double price = 5;
  string status = 6; google.protobuf.Timestamp created = 7;
}
"""
AVRO_ID, JSON_SCHEMA_ID, PROTOBUF_ID = 1, 2, 3


class KeptSchemas:
    """The writer schemas as the registry serves them (each is parsed once, on first use)."""

    def schema(self, schema_id: int) -> WriterSchema:
        if schema_id == AVRO_ID:
            return WriterSchema(json.dumps(AVRO_SCHEMA), "AVRO")
        if schema_id == PROTOBUF_ID:
            return WriterSchema(ORDER_PROTO, "PROTOBUF")
        return WriterSchema('{"type": "object"}', "JSON")


def framed(schema_id: int, body: bytes) -> bytes:
    """`body` in Confluent's wire format."""
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def avro_value(parsed: Any, value: dict[str, Any]) -> bytes:
    """`value` as the Schema Registry's Avro serializer writes it."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, {
        **value, "created": datetime.datetime.fromisoformat(value["created"])})
    return framed(AVRO_ID, buf.getvalue())


def protobuf_values(rows: list[dict[str, Any]]) -> list[bytes]:
    """`rows` as the Schema Registry's Protobuf serializer writes them (message indexes [0])."""
    order = ProtobufValues(KeptSchemas()).writer(PROTOBUF_ID).of((0,), PROTOBUF_ID)
    return [framed(PROTOBUF_ID, b"\x00" + json_format.ParseDict(r, order()).SerializeToString())
            for r in rows]


def formats(n: int, batch: int) -> list[dict[str, Any]]:
    """Decoding alone (append-only), the same records as JSON, Avro, framed JSON and
    Protobuf."""
    rng = random.Random(7)
    rows = [row(rng, k) for k in range(n)]
    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    out = []
    for fmt, values in (("json", [json.dumps(r).encode() for r in rows]),
                        ("avro", [avro_value(parsed, r) for r in rows]),
                        ("json_schema", [framed(JSON_SCHEMA_ID, json.dumps(r).encode())
                                         for r in rows]),
                        ("protobuf", protobuf_values(rows))):
        spec = SourceSpec(name="orders", topic="orders", schema=SCHEMA, value_format=fmt,
                          schema_registry_url=None if fmt == "json"
                          else "http://registry.invalid")
        decoder = SourceDecoder(spec, KeptSchemas())
        # Steady state: the writer schema parsed (protoc's compile for Protobuf) and the
        # reader's first use paid before the clock starts, for every format alike.
        decoder.decode(RawRecords.of("orders", values[:100]), range(100))
        start = time.perf_counter()
        for lo in range(0, n, batch):
            chunk = values[lo:lo + batch]
            decoded = decoder.decode(RawRecords.of("orders", chunk), range(len(chunk)))
            assert not decoded.bad and decoded.rows.num_rows == len(chunk)
        elapsed = time.perf_counter() - start
        out.append({"value_format": fmt, "records": n,
                    "avg_value_bytes": round(sum(map(len, values)) / n),
                    "records_per_s": round(n / elapsed)})
    return out


def fill(kafka: KafkaEndpoint, topic: str, n: int, keys: int, partitions: int
         ) -> tuple[int, int]:
    """Produces `n` records; returns their average size and how many the broker kept (the mock
    broker drops the oldest segments beyond roughly 25k records per partition)."""
    kafka.create_topic(topic, partitions)
    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 50,
                         "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000})
    size = 0
    for _ in range(n):
        key = rng.randrange(keys)
        value = record(rng, key)
        size += len(value)
        while True:
            try:
                producer.produce(topic, key=str(key).encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    probe = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "bench-probe"})
    kept = 0
    for p in range(partitions):
        low, high = probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        kept += high - low
    probe.close()
    return size // n, kept


def run(kafka: KafkaEndpoint, topic: str, semantics: str, n: int, batch: int) -> dict[str, Any]:
    spec = SourceSpec(name="orders", topic=topic, schema=SCHEMA, semantics=semantics)
    policy = BatchPolicy(max_events=batch, max_delay_ms=100, max_poll_records=batch * 5)
    expected = -(-n // batch)  # the last, partial batch closes on time
    builder = TransactionBuilder(kafka.bootstrap_servers, [spec], group_id=uuid.uuid4().hex,
                                 policy=policy)
    try:
        start = time.perf_counter()
        transactions = rows = 0
        while transactions < expected:
            batch = builder.poll(0.5)
            if batch is not None:
                transactions += len(batch)
                rows += batch.rows
            if time.perf_counter() - start > 300:
                raise RuntimeError(f"{transactions} of {expected} transactions after 300 s")
        elapsed = time.perf_counter() - start
        stats = builder.stats
    finally:
        builder.close()
    return {
        "semantics": semantics,
        "records": n,
        "seconds": round(elapsed, 3),
        "records_per_s": round(n / elapsed),
        "transactions": transactions,
        "change_rows": rows,
        "bad_records": stats.bad_records,
        "unchanged_upserts": stats.unchanged_upserts,
    }


def decode_only(kafka: KafkaEndpoint, topic: str, semantics: str, n: int, batch: int,
                partitions: int) -> dict[str, Any]:
    """Decoding, upsert and consolidation alone, on messages fetched beforehand."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                         "group.id": uuid.uuid4().hex})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    messages: list[Any] = []
    deadline = time.perf_counter() + 120
    while len(messages) < n and time.perf_counter() < deadline:
        messages += [m for m in consumer.consume(batch, 0.5) if m.error() is None]
    consumer.close()
    spec = SourceSpec(name="orders", topic=topic, schema=SCHEMA, semantics=semantics)
    decoder = SourceDecoder(spec)
    state = UpsertState(SCHEMA)
    columns = SCHEMA.names
    start = time.perf_counter()
    for lo in range(0, len(messages), batch):
        chunk = messages[lo:lo + batch]
        rows = decoder.decode(raw_records(chunk), range(lo, lo + len(chunk))).rows
        rows = rows.append_column(TIME, pa.array(np.full(rows.num_rows, lo // batch + 1)))
        if semantics == "upsert":
            state.apply(rows)
        else:
            consolidate(rows.select([*columns, TIME, SIGN]).rename_columns(
                [*columns, TIME, DIFF]), columns)
    elapsed = time.perf_counter() - start
    return {"semantics": semantics, "records": len(messages), "seconds": round(elapsed, 3),
            "records_per_s": round(len(messages) / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--formats-only", action="store_true")
    args = parser.parse_args()
    decode_formats = formats(args.records, args.batch)
    if args.formats_only:
        print(json.dumps({"decode_by_value_format": decode_formats}, indent=2))
        return
    kafka = kafka_from_env()
    try:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        avg, kept = fill(kafka, topic, args.records, args.keys, args.partitions)
        produce_s = time.perf_counter() - t0
        results = [run(kafka, topic, s, kept, args.batch)
                   for s in ("append_only", "upsert")]
        decoding = [decode_only(kafka, topic, s, kept, args.batch, args.partitions)
                    for s in ("append_only", "upsert")]
    finally:
        kafka.stop()
    print(json.dumps({
        "broker": "librdkafka mock" if isinstance(kafka, MockKafkaBroker)
        else os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "testcontainers"),
        "avg_value_bytes": avg,
        "keys": args.keys,
        "batch_events": args.batch,
        "records_kept_by_broker": kept,
        "produce_records_per_s": round(args.records / produce_s),
        "kafka_to_transactions": results,
        "decode_upsert_consolidate_only": decoding,
        "decode_by_value_format": decode_formats,
    }, indent=2))


if __name__ == "__main__":
    sys.exit(main())
