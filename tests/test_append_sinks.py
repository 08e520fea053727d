"""Append-stream sinks (PostgreSQL COPY, Kafka, files) and the snapshot of a change topic read
back, against the real PostgreSQL and the Kafka-protocol broker fixtures.

The default broker is librdkafka's mock cluster. It writes transaction markers, but it serves
records up to the high watermark instead of the last stable offset and does not filter aborted
records, so under it a `read_committed` consumer does see the records of an open or aborted
transaction. What it can show, and what these tests check, is that every write is exactly one
Kafka transaction: its records are contiguous in the partition and followed by exactly one
transaction marker (an offset no consumer receives). That no record of an open transaction is
visible to `read_committed` consumers is checked only against a real Kafka
(`KAFKA_BOOTSTRAP_SERVERS` or testcontainers); under the mock that test is skipped.
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from psycopg import sql
from pydantic import TypeAdapter, ValidationError
from support.pg_proxy import CommitCutter

from txstream.changes import Changes, order
from txstream.schemas.sinks import RetryPolicy, SinkSettings, UpdateRecord
from txstream.schemas.tables import TableSchema
from txstream.service.embedded.kafka import KafkaEndpoint, MockKafkaBroker
from txstream.service.embedded.postgres import PostgresEndpoint
from txstream.sinks.change_json import decode_changes
from txstream.sinks.factory import open_sink
from txstream.sinks.file_sink import FileSink
from txstream.sinks.kafka_sink import KafkaSink
from txstream.sinks.postgres.append import PostgresAppendSink
from txstream.sinks.postgres.snapshot import PostgresSnapshotSink
from txstream.sinks.sink import Sink, SinkSchemaError, SinkWriteError

SCHEMA = TableSchema.of({"id": "bigint", "name": "text", "score": "double", "at": "timestamp"},
                        primary_key=["id"])


def changes(rows: list[tuple[int, str | None, float, int, int]]) -> Changes:
    """(id, name, score, time, diff) rows; `at` is a fixed instant."""
    at = pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC")).as_py()
    return Changes.of(pa.Table.from_pylist(
        [{"id": i, "name": n, "score": s, "at": at, "time": t, "diff": d}
         for i, n, s, t, d in rows],
        schema=SCHEMA.arrow_schema(with_changes=True)))


TXN1 = changes([(1, "a", 1.0, 1, 1), (2, "b\n\"c\"", math.nan, 1, 1), (3, None, -0.0, 1, 1)])
TXN2 = changes([(1, "a", 1.0, 2, -1), (1, "A", 2.0, 2, 1), (3, None, -0.0, 2, -1)])
TXN3 = changes([(4, "ü", math.inf, 3, 1), (2, "b\n\"c\"", math.nan, 3, -1)])


def same_changes(a: pa.Table | Changes, b: pa.Table | Changes) -> bool:
    """Equal as lists of rows, NaN equal to NaN."""
    def canon(t: pa.Table | Changes) -> list[str]:
        rows = t.table if isinstance(t, Changes) else t
        return sorted(json.dumps(r, default=str) for r in rows.to_pylist())
    return canon(a) == canon(b)


def test_postgres_append_copies_every_change_once(postgres: PostgresEndpoint,
                                                  pg_schema: str) -> None:
    with PostgresAppendSink(postgres.url, "log", SCHEMA, db_schema=pg_schema) as sink:
        assert isinstance(sink, Sink)
        sink.write(TXN1)
        sink.write(TXN2)
    # A restarted writer replays from its checkpoint: already appended transactions are skipped.
    again = PostgresAppendSink(postgres.url, "log", SCHEMA, db_schema=pg_schema)
    again.write(TXN2)
    again.write(TXN3)
    again.close()
    assert same_changes(stored_changes(postgres.url, pg_schema, "log"),
                        TXN1.concat([TXN2, TXN3]))
    with pytest.raises(SinkSchemaError, match="'diff' has type bigint, expected smallint"):
        PostgresSnapshotSink(postgres.url, "log", SCHEMA, db_schema=pg_schema)


def stored_changes(url: str, db_schema: str, table: str) -> pa.Table:
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL('SELECT * FROM {} ORDER BY "time", id, diff').format(
            sql.Identifier(db_schema, table)))
        return pa.Table.from_pylist(
            [dict(zip([c.name for c in cur.description or []], r, strict=True))
             for r in cur.fetchall()], schema=SCHEMA.arrow_schema(with_changes=True))


def test_postgres_append_a_write_lost_around_commit_is_not_appended_twice(
        postgres: PostgresEndpoint, pg_schema: str) -> None:
    with CommitCutter(postgres.url) as proxy, PostgresAppendSink(
            proxy.url, "log", SCHEMA, db_schema=pg_schema,
            retry=RetryPolicy(attempts=1)) as sink:
        sink.write(TXN1)
        proxy.cut_next_commit()
        with pytest.raises(SinkWriteError):
            sink.write(TXN2)  # committed, but the sink cannot know
        assert proxy.cuts == 1
        sink.write(TXN2)  # the runner writes the batch again
        sink.write(TXN3)
    assert same_changes(stored_changes(postgres.url, pg_schema, "log"),
                        TXN1.concat([TXN2, TXN3]))


def test_postgres_append_keeps_refused_rows_aside(postgres: PostgresEndpoint,
                                                  pg_schema: str) -> None:
    with PostgresAppendSink(postgres.url, "log", SCHEMA, db_schema=pg_schema) as sink:
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER TABLE {} ADD CHECK (id < 100)").format(
                sql.Identifier(pg_schema, "log")))
        bad = changes([(100, "big", 1.0, 1, 1), (5, "nul\x00", 2.0, 1, 1)])
        sink.write(TXN1.concat([bad]))
        assert sink.rejected_rows == 2
    assert same_changes(stored_changes(postgres.url, pg_schema, "log"), TXN1)
    with psycopg.connect(postgres.url) as conn:
        rejected = conn.execute(sql.SQL("SELECT output_table, row_json FROM {}").format(
            sql.Identifier(pg_schema, "txstream_rejects"))).fetchall()
    assert sorted(json.loads(r)["id"] for t, r in rejected if t == "log") == [5, 100]


def test_jsonl_and_csv_files(tmp_path: Path) -> None:
    jsonl = FileSink(tmp_path / "out.jsonl", "t", SCHEMA)
    csv = FileSink(tmp_path / "out.csv", "t", SCHEMA, format="csv")
    for sink in (jsonl, csv):
        sink.write(TXN1)
        sink.close()
    # Reopened sinks append; a torn JSON line left by a crash is cut off first.
    with open(tmp_path / "out.jsonl", "ab") as f:
        f.write(b'{"id": 9, "na')
    jsonl = FileSink(tmp_path / "out.jsonl", "t", SCHEMA)
    csv = FileSink(tmp_path / "out.csv", "t", SCHEMA, format="csv")
    for sink in (jsonl, csv):
        assert sink.held_through() == 1  # what a run from scratch must not append to
        sink.write(TXN2)
        sink.close()
    expected = TXN1.concat([TXN2])
    lines = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert json.loads(lines[1])["score"] == "NaN"
    assert same_changes(decode_changes(lines, SCHEMA).cast(expected.table.schema), expected)
    # Only an unquoted empty field is null ("nan" is a double, "" an empty string).
    read = pacsv.read_csv(tmp_path / "out.csv", convert_options=pacsv.ConvertOptions(
        column_types=expected.table.schema, null_values=[""], strings_can_be_null=True,
        quoted_strings_can_be_null=False))
    assert same_changes(read, expected)


@pytest.mark.parametrize("format", ["jsonl", "csv", "updates"])
def test_a_file_says_what_it_holds(tmp_path: Path, format: str) -> None:
    path = tmp_path / f"out.{format}"
    with FileSink(path, "t", SCHEMA, format=format) as sink:  # type: ignore[arg-type]
        assert sink.held_through() is None
        sink.write(TXN1)
        sink.write(changes([(7, "x" * 70_000 + "\n", 1.0, 2, 1)]))  # longer than a block
    with FileSink(path, "t", SCHEMA, format=format) as sink:  # type: ignore[arg-type]
        assert sink.held_through() == 2


def test_update_record_files(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "updates.jsonl", "t", SCHEMA, format="updates")
    sink.write(TXN1.concat([TXN2]))
    sink.close()
    first, second = (UpdateRecord.model_validate_json(line)
                     for line in (tmp_path / "updates.jsonl").read_bytes().splitlines())
    assert (first.time, len(first.added)) == (1, 3)
    assert [r["id"] for r in second.removed] == [3]
    assert second.modified_columns == ["name", "score"]


def read_topic(bootstrap: str, topic: str, partitions: int, count: int,
               timeout_s: float = 20.0) -> list[Message]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += [m for m in consumer.consume(count - len(got), 0.5) if m.error() is None]
    consumer.close()
    return got


def test_kafka_changes_one_transaction_per_write(kafka: KafkaEndpoint, topic_name: str) -> None:
    kafka.create_topic(topic_name, 1)
    sink = KafkaSink(kafka.bootstrap_servers, topic_name, "t", SCHEMA,
                     transactional_id=f"txn-{topic_name}")
    for txn in (TXN1, TXN2, TXN3):
        sink.write(txn)
    sink.close()
    messages = read_topic(kafka.bootstrap_servers, topic_name, 1, 8)
    # Each write's records are contiguous, then one offset holds its commit marker.
    assert [m.offset() for m in messages] == [0, 1, 2, 4, 5, 6, 8, 9]
    first = messages[1]
    assert json.loads(first.key() or b"") == {"id": 2}
    assert dict(first.headers() or []) == {"time": b"1", "diff": b"1"}
    decoded = decode_changes([m.value() or b"" for m in messages], SCHEMA)
    assert same_changes(decoded.cast(TXN1.table.schema), TXN1.concat([TXN2, TXN3]))


@pytest.mark.parametrize("format", ["changes", "updates"])
def test_kafka_sink_reads_back_its_topic_and_writes_each_transaction_once(
        kafka: KafkaEndpoint, topic_name: str, format: str) -> None:
    kafka.create_topic(topic_name, 3)
    options: dict[str, Any] = {"transactional_id": f"txn-{topic_name}", "format": format}
    with KafkaSink(kafka.bootstrap_servers, topic_name, "t", SCHEMA, **options) as sink:
        assert sink.held_through() is None
        sink.write(TXN1)
        sink.write(TXN2)
    # A restarted writer replays from its checkpoint: what the topic holds is skipped.
    with KafkaSink(kafka.bootstrap_servers, topic_name, "t", SCHEMA, **options) as again:
        assert again.held_through() == 2
        again.write(TXN2)
        again.write(TXN2.concat([TXN3]))
    expected = 3 if format == "updates" else 8
    messages = read_topic(kafka.bootstrap_servers, topic_name, 3, expected + 1, timeout_s=5)
    times = sorted(int(dict(m.headers() or [])["time"]) for m in messages)
    assert times == ([1, 2, 3] if format == "updates" else [1, 1, 1, 2, 2, 2, 3, 3])


def test_kafka_update_records(kafka: KafkaEndpoint, topic_name: str) -> None:
    kafka.create_topic(topic_name, 1)
    sink = KafkaSink(kafka.bootstrap_servers, topic_name, "scores", SCHEMA,
                     transactional_id=f"txn-{topic_name}", format="updates")
    sink.write(TXN1.concat([TXN2]))
    sink.close()
    first, second = read_topic(kafka.bootstrap_servers, topic_name, 1, 2)
    assert first.key() == b"scores" and dict(second.headers() or []) == {"time": b"2"}
    record = UpdateRecord.model_validate_json(second.value() or b"")
    assert [(m.before["name"], m.after["name"]) for m in record.modified] == [("a", "A")]


@pytest.mark.parametrize("topic", ["", "a b", "x;y", "ü", "t" * 250])
def test_kafka_topic_names_are_checked(kafka: KafkaEndpoint, topic: str) -> None:
    with pytest.raises(SinkSchemaError, match="not a valid Kafka topic name"):
        KafkaSink(kafka.bootstrap_servers, topic, "t", SCHEMA, transactional_id="unused")


def test_read_committed_never_sees_an_open_transaction(kafka: KafkaEndpoint,
                                                       topic_name: str) -> None:
    if isinstance(kafka, MockKafkaBroker):
        pytest.skip("librdkafka's mock broker serves records of open transactions to "
                    "read_committed consumers; set KAFKA_BOOTSTRAP_SERVERS to a real Kafka")
    kafka.create_topic(topic_name, 2)
    sink = KafkaSink(kafka.bootstrap_servers, topic_name, "t", SCHEMA,
                     transactional_id=f"txn-{topic_name}")
    # The steps of `write`, stopped before the commit.
    messages = sink.messages(TXN1)
    sink._producer.begin_transaction()
    sink.produce(messages)
    sink._producer.flush(10)
    assert read_topic(kafka.bootstrap_servers, topic_name, 2, 1, timeout_s=3) == []
    sink._producer.commit_transaction(10)
    assert len(read_topic(kafka.bootstrap_servers, topic_name, 2, 3)) == 3
    sink.close()


def test_snapshot_from_a_change_topic(postgres: PostgresEndpoint, pg_schema: str,
                                      kafka: KafkaEndpoint, topic_name: str) -> None:
    """Two producers write the transactions of one stream, one of them newest first and one
    transaction twice, into three partitions; the snapshot read back ends as the in-order one."""
    kafka.create_topic(topic_name, 3)
    rng = random.Random(7)
    state: dict[int, tuple[int, str | None, float]] = {}
    transactions: list[pa.Table] = []
    for t in range(1, 13):
        rows: list[tuple[int, str | None, float, int, int]] = []
        for key in rng.sample(range(8), 3):
            if key in state:
                rows.append((*state.pop(key), t, -1))
            if rng.random() < 0.7:
                state[key] = (key, rng.choice(["x", "y", None]), float(t))
                rows.append((*state[key], t, 1))
        transactions.append(changes(rows))
    writers = [KafkaSink(kafka.bootstrap_servers, topic_name, "t", SCHEMA,
                         transactional_id=f"{topic_name}-{w}", skip_replays=False)
               for w in range(2)]
    for txn in transactions[0::2]:
        writers[0].write(txn)
    for txn in [*reversed(transactions[1::2]), transactions[3]]:
        writers[1].write(txn)
    for writer in writers:
        writer.close()

    total = sum(t.num_rows for t in transactions) + transactions[3].num_rows
    messages = read_topic(kafka.bootstrap_servers, topic_name, 3, total)
    assert len(messages) == total
    # Read across partitions in no time order, in batches of 7, a change delivered twice
    # left twice (not consolidated: the time guard applies it once, a sum would double it).
    with PostgresSnapshotSink(postgres.url, "snap", SCHEMA, db_schema=pg_schema) as sink:
        for i in range(0, total, 7):
            batch = decode_changes([m.value() or b"" for m in messages[i:i + 7]], SCHEMA)
            sink.write(Changes(order(batch)))
    with psycopg.connect(postgres.url) as conn:
        live: list[tuple[Any, ...]] = conn.execute(sql.SQL(
            "SELECT id, name, score FROM {} ORDER BY id").format(
                sql.Identifier(pg_schema, "snap_live"))).fetchall()
    assert live == sorted(state.values())


def test_sinks_open_from_settings(postgres: PostgresEndpoint, pg_schema: str,
                                  kafka: KafkaEndpoint, topic_name: str, tmp_path: Path) -> None:
    kafka.create_topic(topic_name, 1)
    documents: list[dict[str, Any]] = [
        {"kind": "postgres_snapshot", "table": "snap", "db_schema": pg_schema,
         "purge": {"horizon": 10}},
        {"kind": "postgres_append", "table": "log", "db_schema": pg_schema},
        {"kind": "kafka", "topic": topic_name, "transactional_id": topic_name,
         "format": "updates"},
        {"kind": "file", "path": str(tmp_path / "out.csv"), "format": "csv"},
    ]
    adapter: TypeAdapter[SinkSettings] = TypeAdapter(SinkSettings)
    kinds = []
    for document in documents:
        with open_sink(adapter.validate_python(document), "scores", SCHEMA,
                       database_url=postgres.url,
                       kafka_bootstrap_servers=kafka.bootstrap_servers) as sink:
            sink.write(TXN1)
            kinds.append(type(sink).__name__)
    assert kinds == ["PostgresSnapshotSink", "PostgresAppendSink", "KafkaSink", "FileSink"]
    with pytest.raises(SinkSchemaError, match="needs a database URL"):
        open_sink(adapter.validate_python(documents[0]), "scores", SCHEMA)
    with pytest.raises(ValidationError, match="'ftp' found using 'kind' does not match"):
        adapter.validate_python({"kind": "ftp"})
