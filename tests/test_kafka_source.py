"""The Kafka input end to end against the broker fixture: mini-batches, upserts, bad records to
the dead-letter topic, metadata columns and Debezium read from real records; the decoder's
formats and checks record by record are tested without a broker in test_decoder."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from support.kafka_helpers import (
    BAD_OFFSETS,
    BAD_ORDER,
    BAD_RECORDS,
    FAST,
    ORDERS,
    Record,
    integrate,
    make_builder,
    n_events,
    poll_until,
    produce,
    read_dead_letters,
    rows,
)

from txstream.schemas.sources import SourceSpec, UpstreamTransactions
from txstream.schemas.tables import TableSchema
from txstream.service.embedded.kafka import KafkaEndpoint, MockKafkaBroker
from txstream.sources.dead_letters import _Letter
from txstream.sources.kafka_source import KafkaSourceError
from txstream.sources.transactions import TransactionBuilder

# ---- append_only and mini-batches ---------------------------------------------------------


def test_append_only_json_in_numbered_batches(kafka: KafkaEndpoint, topic_name: str,
                                               builders: list[TransactionBuilder]) -> None:
    kafka.create_topic(topic_name, 2)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
    builders.append(b := make_builder(kafka, [spec], policy=FAST.model_copy(
        update={"max_events": 4})))
    produce(kafka, topic_name, [(None, {"id": i, "item": f"x{i}", "qty": i}) for i in range(6)], 0)
    produce(kafka, topic_name, [(None, {"id": i, "item": f"x{i}", "qty": i}) for i in range(6, 10)],
            1)
    txs = poll_until(b, n_events(10))
    assert [t.number for t in txs] == list(range(1, len(txs) + 1))
    # Count-closed batches hold exactly max_events records; the rest closes on time.
    assert [sum(x.num_rows for x in t.changes.values()) for t in txs] == [4, 4, 2]
    assert txs[-1].changes["orders"].schema == ORDERS.arrow_schema(with_changes=True)
    assert integrate(txs, "orders") == {
        (("id", i), ("item", f"x{i}"), ("qty", i)): 1 for i in range(10)
    }
    assert txs[-1].offsets == {topic_name: {0: 6, 1: 4}}
    assert b.stats.events == 10 and b.stats.transactions == 3 and b.stats.bad_records == 0


# ---- upsert -------------------------------------------------------------------------------


def test_upsert_emits_retractions_nets_and_deletes(kafka: KafkaEndpoint, topic_name: str,
                                                   builders: list[TransactionBuilder]) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert")
    builders.append(b := make_builder(kafka, [spec]))

    def row(i: int, item: str, qty: int) -> Record:
        return (str(i), {"id": i, "item": item, "qty": qty})

    produce(kafka, topic_name, [row(1, "a", 1), row(2, "b", 1), row(1, "a", 2)])
    t1 = poll_until(b, lambda ts: len(ts) >= 1)
    assert rows(t1[0]) == [
        {"id": 1, "item": "a", "qty": 2, "time": 1, "diff": 1},
        {"id": 2, "item": "b", "qty": 1, "time": 1, "diff": 1},
    ]
    # update 1, no-op on 2, tombstone 2 (its last record wins), delete of absent key 9.
    produce(kafka, topic_name, [row(1, "a", 5), row(2, "b", 1), (json.dumps({"id": 2}), None),
                                ("9", None), row(3, "c", 1)])
    t2 = poll_until(b, lambda ts: len(ts) >= 1)
    assert rows(t2[0]) == [
        {"id": 1, "item": "a", "qty": 2, "time": 2, "diff": -1},
        {"id": 1, "item": "a", "qty": 5, "time": 2, "diff": 1},
        {"id": 2, "item": "b", "qty": 1, "time": 2, "diff": -1},
        {"id": 3, "item": "c", "qty": 1, "time": 2, "diff": 1},
    ]
    assert b.stats.absent_deletes == 1
    produce(kafka, topic_name, [row(3, "c", 1)])
    t3 = poll_until(b, lambda ts: len(ts) >= 1)
    assert rows(t3[0]) == []  # an upsert that changes nothing emits nothing
    assert b.stats.unchanged_upserts == 1


# ---- bad input ----------------------------------------------------------------------------


def test_bad_records_are_dead_lettered_and_the_rest_flows(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder],
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert",
                      max_value_bytes=200)
    builders.append(b := make_builder(kafka, [spec], dlq))
    produce(kafka, topic_name, BAD_ORDER)
    with caplog.at_level(logging.WARNING, logger="txstream.sources.transactions"):
        txs = poll_until(b, n_events(5))
    assert integrate(txs, "orders") == {
        (("id", i), ("item", "ok"), ("qty", i)): 1 for i in range(5)
    }
    assert b.stats.bad_records == len(BAD_RECORDS) and b.stats.events == len(BAD_ORDER)
    b.commit(txs[-1])
    # The reasons are the decoder's (test_decoder); here the letters carry them with the record
    # and its coordinates.
    letters = read_dead_letters(kafka, dlq, len(BAD_RECORDS))
    assert sorted(int(x["txstream.offset"]) for x in letters) == BAD_OFFSETS
    by_offset = {int(x["txstream.offset"]): x for x in letters}
    assert by_offset[1]["value"] == b'{"id": 10, "item": "x", "qty": '
    assert by_offset[1]["key"] == b"10" and by_offset[7]["key"] is None
    assert "malformed JSON" in by_offset[1]["txstream.error"]
    assert "null message key" in by_offset[7]["txstream.error"]
    assert all(x["txstream.topic"] == topic_name and x["txstream.source"] == "orders"
               for x in letters)
    warned = [r.getMessage() for r in caplog.records]
    assert any(f"{topic_name}/0@1" in w and "malformed JSON" in w for w in warned)


def test_spec_errors_tell_what_to_fix() -> None:
    with pytest.raises(ValueError, match="primary key"):
        SourceSpec(name="s", topic="t", schema=TableSchema.of({"a": "int"}), semantics="upsert")
    with pytest.raises(ValueError, match="declare it as bigint"):
        SourceSpec(name="s", topic="t", schema=TableSchema.of({"a": "int", "o": "text"}),
                   metadata={"o": "offset"})
    with pytest.raises(ValueError, match="not a column"):
        SourceSpec(name="s", topic="t", schema=ORDERS, fields={"nope": "a.b"})
    with pytest.raises(ValueError, match="exactly one"):
        UpstreamTransactions.model_validate({"id": {}})


def test_schema_alias_and_arrow_types() -> None:
    spec = SourceSpec(name="s", topic="t", schema=ORDERS)
    assert spec.schema is ORDERS and spec.table_schema is ORDERS
    assert pa.int32() == spec.schema.arrow_schema().field("qty").type


# ---- formats: nested paths, metadata, insert_delete, Debezium -----------------------------


def test_nested_paths_and_metadata_columns(kafka: KafkaEndpoint, topic_name: str,
                                           builders: list[TransactionBuilder]) -> None:
    kafka.create_topic(topic_name, 1)
    schema = TableSchema.of({"id": "bigint", "city": "text", "k": "text", "off": "bigint",
                             "part": "int", "ts": "timestamp", "hdr": "text", "src": "text"})
    spec = SourceSpec(name="people", topic=topic_name, schema=schema,
                      fields={"city": "address.city"},
                      metadata={"k": "key", "off": "offset", "part": "partition",
                                "ts": "timestamp", "hdr": "headers", "src": "topic"})
    builders.append(b := make_builder(kafka, [spec]))
    produce(kafka, topic_name, [
        ("k1", {"id": 1, "address": {"city": "Oslo", "zip": "0150"}}, [("trace", b"abc")]),
        (None, {"id": 2, "address": None}),
    ])
    (t,) = poll_until(b, lambda ts: len(ts) == 1)
    r1, r2 = sorted(t.changes["people"].to_pylist(), key=lambda r: r["id"])
    assert (r1["city"], r1["k"], r1["off"], r1["part"], r1["src"]) == ("Oslo", "k1", 0, 0,
                                                                       topic_name)
    assert json.loads(r1["hdr"]) == {"trace": "abc"} and r1["ts"].year >= 2024
    assert (r2["city"], r2["k"], r2["off"]) == (None, None, 1)


def _debezium(op: str, before: dict | None, after: dict | None, wrapped: bool) -> dict:
    envelope = {"op": op, "before": before, "after": after, "source": {"lsn": 1}}
    return {"schema": {"type": "struct"}, "payload": envelope} if wrapped else envelope


@pytest.mark.parametrize("semantics", ["insert_delete", "upsert"])
def test_debezium_create_update_delete_snapshot(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder],
    semantics: str,
) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, format="debezium",
                      semantics=semantics)
    builders.append(b := make_builder(kafka, [spec], dlq))
    a1 = {"id": 1, "item": "a", "qty": 1}
    a2 = {"id": 1, "item": "a", "qty": 2}
    c3 = {"id": 3, "item": "c", "qty": 3}
    produce(kafka, topic_name, [
        ('{"id": 1}', _debezium("r", None, a1, wrapped=True)),
        ('{"id": 3}', _debezium("c", None, c3, wrapped=False)),
    ])
    (t1,) = poll_until(b, lambda ts: len(ts) == 1)
    produce(kafka, topic_name, [
        ('{"id": 1}', _debezium("u", a1, a2, wrapped=False)),
        ('{"id": 3}', _debezium("d", c3, None, wrapped=True)),
        ('{"id": 3}', None),  # Debezium's tombstone after a delete
        (None, _debezium("t", None, None, wrapped=False)),  # a truncate has no key
    ])
    (t2,) = poll_until(b, lambda ts: len(ts) == 1)
    assert rows(t1) == [{**a1, "time": 1, "diff": 1}, {**c3, "time": 1, "diff": 1}]
    if semantics == "upsert":  # the truncate deletes a2, updated in its own transaction
        assert rows(t2) == [{**a1, "time": 2, "diff": -1}, {**c3, "time": 2, "diff": -1}]
        assert b.stats.bad_records == 0
        return
    assert rows(t2) == [{**a1, "time": 2, "diff": -1}, {**a2, "time": 2, "diff": 1},
                        {**c3, "time": 2, "diff": -1}]
    assert b.stats.bad_records == 1 and b.stats.ignored_tombstones == 1
    b.commit(t2)
    (letter,) = read_dead_letters(kafka, dlq, 1)
    assert "truncate (op 't') on an insert_delete source" in letter["txstream.error"]


def test_a_record_too_large_for_the_dead_letter_topic_goes_there_truncated(
    kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder],
) -> None:
    # Over max_value_bytes (1,000,000), under the broker's limit: the source topic takes it,
    # the dead-letter producer's own 1 MB limit would not.
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
    builders.append(b := make_builder(kafka, [spec], dlq))
    huge = json.dumps({"id": 2, "item": "x" * 1_010_000, "qty": 1}).encode()
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers,
                         "message.max.bytes": 2_000_000})
    for value in [json.dumps({"id": 1, "item": "a", "qty": 1}).encode(), huge,
                  json.dumps({"id": 3, "item": "c", "qty": 3}).encode()]:
        producer.produce(topic_name, value=value)
    assert producer.flush(10) == 0
    txs = poll_until(b, n_events(2))
    assert integrate(txs, "orders") == {
        (("id", 1), ("item", "a"), ("qty", 1)): 1, (("id", 3), ("item", "c"), ("qty", 3)): 1}
    assert b.stats.bad_records == 1
    b.commit(txs[-1])
    [letter] = read_dead_letters(kafka, dlq, 1)
    assert letter["txstream.truncated"] == "true"
    assert letter["txstream.value_bytes"] == str(len(huge))
    assert "max_value_bytes" in letter["txstream.error"]
    assert huge.startswith(letter["value"]) and 0 < len(letter["value"]) < 1_000_000


def test_a_dead_letter_the_broker_refused_is_sent_again_before_offsets_move(
    topic_name: str, tmp_path: Any,
) -> None:
    broker = MockKafkaBroker()  # its own, so the injected errors disturb no other test
    try:
        broker.create_topic(topic_name, 1)
        broker.create_topic("dlq", 1)
        spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS)
        b = make_builder(broker, [spec], "dlq")
        try:
            produce(broker, topic_name, [(None, {"id": 1, "item": "a", "qty": 1}),
                                         (None, {"id": 2, "item": "b", "qty": "many"})])
            broker.fail_requests(0, 29, 1)  # the next Produce: TOPIC_AUTHORIZATION_FAILED
            txs = poll_until(b, n_events(1))
            with pytest.raises(KafkaSourceError, match="dead-letter topic"):
                b.commit(txs[-1])
            # The runner's retries, with a backoff: the client refuses the topic until it has
            # refreshed its metadata after the error, so a retry at once can fail again.
            deadline = time.monotonic() + 10
            while True:
                try:
                    b.commit(txs[-1])  # the letter goes out before the offsets
                    break
                except KafkaSourceError as exc:
                    if "dead-letter topic" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            [letter] = read_dead_letters(broker, "dlq", 1)
            assert letter["txstream.offset"] == "1" and "qty" in letter["txstream.error"]
        finally:
            b.close()
    finally:
        broker.stop()


def test_decimal_handling_mode_is_for_debezium_sources() -> None:
    with pytest.raises(ValueError, match="Debezium connector"):
        SourceSpec(name="s", topic="t", schema=TableSchema.of({"v": "decimal(5,2)"}),
                   decimal_handling_mode="string")


def test_a_dead_letter_is_cut_to_fit_value_first_then_the_records_own_headers_and_key() -> None:
    letter = _Letter(b"k" * 2000, b"v" * 5000, [("h", b"x" * 3000), ("txstream.error", b"e")])
    assert letter.within(20_000) is letter
    cut = letter.within(6000)
    assert cut.size() == 6000 and cut.key == letter.key and ("h", b"x" * 3000) in cut.headers
    assert 0 < len(cut.value or b"") < 1000 and letter.value.startswith(cut.value or b"")
    assert dict(cut.headers)["txstream.value_bytes"] == b"5000"
    # Key and headers alone too large: the record's headers go, the key is cut; ours stay.
    tiny = letter.within(300)
    assert tiny.size() <= 300 and tiny.value == b"" and dict(tiny.headers) == {
        "txstream.error": b"e", "txstream.truncated": b"true", "txstream.value_bytes": b"5000"}
