"""A Kafka sink that cannot recover: fenced once it reopens, fenced again it stops; fenced
after the pipeline's writer epoch moved on it does not reopen; fatal errors on every new
producer stop it; a second live writer with the same transactional id; and `txstream run`
with a fenced Kafka sink: fenced, waiting, not exiting into a restart loop.

The fatal errors come from the broker process: librdkafka's mock cluster answers the next
AddPartitionsToTxn requests with the error asked for (`MockKafkaBroker.fail_requests`). It
does not fence a producer when a second one initialises the same transactional id (it hands
out a new producer id instead), so fencing by a live second writer runs only against a real
Kafka (`KAFKA_BOOTSTRAP_SERVERS` or testcontainers).
"""

from __future__ import annotations

import json
import logging
import signal
import time
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from support.orders import OrderProducer, write_config
from support.postgres_outputs import lease, outputs, wait_to_take
from support.service_process import ServiceProcess, metric, scrape

from txstream.changes import DIFF, TIME, Changes
from txstream.schemas.sinks import RetryPolicy
from txstream.schemas.tables import TableSchema
from txstream.service.embedded.kafka import KafkaEndpoint, MockKafkaBroker
from txstream.service.embedded.postgres import PostgresEndpoint, free_port
from txstream.sinks.kafka_sink import KafkaSink, KafkaSinkFatalError, KafkaSinkFencedError
from txstream.sinks.postgres.writers import WriterFencedError
from txstream.sinks.sink import FencedError, SinkWriteError

SCHEMA = TableSchema.of({"id": "bigint", "name": "text"}, primary_key=["id"])
INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN = 22, 24  # Kafka protocol API keys
FAST_RETRY = RetryPolicy(attempts=3, initial_backoff_s=0.01, max_backoff_s=0.01)


def changes(time_: int, *ids: int) -> Changes:
    """Rows `ids` inserted by transaction `time_`."""
    return Changes.of(pa.Table.from_pylist(
        [{"id": i, "name": f"n{i}", TIME: time_, DIFF: 1} for i in ids],
        schema=SCHEMA.arrow_schema(with_changes=True)))


def written_ids(kafka: KafkaEndpoint, topic: str, count: int) -> list[int]:
    """The ids of the first `count` change messages of `topic` (one partition), in order."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                         "group.id": uuid.uuid4().hex, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[int] = []
    deadline = time.monotonic() + 15
    try:
        while len(got) < count and time.monotonic() < deadline:
            got += [json.loads(m.value() or b"")["id"]
                    for m in consumer.consume(count - len(got), 0.5) if m.error() is None]
    finally:
        consumer.close()
    return got


def mock_broker(kafka: KafkaEndpoint) -> MockKafkaBroker:
    if not isinstance(kafka, MockKafkaBroker):
        pytest.skip("injects broker errors, which only librdkafka's mock cluster can do")
    return kafka


def test_a_fenced_kafka_sink_reopens_once_and_stops_when_fenced_again(
        kafka: KafkaEndpoint, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    broker = mock_broker(kafka)
    broker.create_topic(topic_name, 1)
    sink = KafkaSink(broker.bootstrap_servers, topic_name, "t", SCHEMA,
                     transactional_id=f"txn-{topic_name}", retry=FAST_RETRY)
    sink.write(changes(1, 1))
    broker.fail_requests(ADD_PARTITIONS_TO_TXN, KafkaError.PRODUCER_FENCED, 1)
    with caplog.at_level(logging.WARNING, logger="txstream.sinks.kafka_sink"):
        sink.write(changes(2, 2))  # on a new producer: the fenced one cannot be used again
    assert any("was fenced" in r.getMessage() for r in caplog.records)
    assert written_ids(kafka, topic_name, 2) == [1, 2]

    broker.fail_requests(ADD_PARTITIONS_TO_TXN, KafkaError.PRODUCER_FENCED, 1)
    with pytest.raises(KafkaSinkFencedError, match="Another live producer uses the "
                       f"transactional id 'txn-{topic_name}'") as raised:
        sink.write(changes(3, 3))
    # Not a SinkWriteError: the service retries those forever, and it must stop instead.
    assert not isinstance(raised.value, SinkWriteError)
    # A fence, which the service answers like a fenced PostgreSQL write: it waits.
    assert isinstance(raised.value, FencedError)
    sink.close()


def test_a_kafka_sink_fenced_by_the_pipelines_new_writer_does_not_reopen(
        kafka: KafkaEndpoint, postgres: PostgresEndpoint, pg_schema: str, topic_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The producer of an instance another one took over from was fenced by the new writer's
    producer: reopening would fence that one in turn and commit this batch after the
    takeover. The sink asks the writer epoch first, and raises the WriterFencedError."""
    broker = mock_broker(kafka)
    broker.create_topic(topic_name, 1)
    old, new = (lease(postgres.url, pg_schema, "old-host", 11),
                lease(postgres.url, pg_schema, "new-host", 22))
    epoch = old.try_take()
    assert epoch is not None
    group, *tables = outputs(postgres.url, pg_schema, fence=epoch)
    sink = KafkaSink(broker.bootstrap_servers, topic_name, "t", SCHEMA,
                     transactional_id=f"txn-{topic_name}", retry=FAST_RETRY,
                     writer_check=group.check_writer)
    try:
        sink.write(changes(1, 1))
        old.close()
        wait_to_take(new, timeout_s=5)  # the new writer, whose producer fences this one's
        broker.fail_requests(ADD_PARTITIONS_TO_TXN, KafkaError.PRODUCER_FENCED, 1)
        with caplog.at_level(logging.WARNING, logger="txstream.sinks.kafka_sink"), \
                pytest.raises(WriterFencedError, match="fenced by epoch 2, taken by host "
                              "new-host"):
            sink.write(changes(2, 2))
        assert not any("reopening" in r.getMessage() for r in caplog.records)
        assert written_ids(kafka, topic_name, 2) == [1]
    finally:
        sink.close()
        group.close()
        for table in tables:
            table.close()
        new.close()


def test_a_kafka_sink_failing_fatally_on_every_new_producer_stops(
        kafka: KafkaEndpoint, topic_name: str) -> None:
    broker = mock_broker(kafka)
    broker.create_topic(topic_name, 1)
    sink = KafkaSink(broker.bootstrap_servers, topic_name, "t", SCHEMA,
                     transactional_id=f"txn-{topic_name}", retry=FAST_RETRY)
    broker.fail_requests(ADD_PARTITIONS_TO_TXN, KafkaError.INVALID_TXN_STATE,
                         FAST_RETRY.attempts)
    with pytest.raises(KafkaSinkFatalError, match="failed fatally 3 time") as raised:
        sink.write(changes(1, 1))
    assert not isinstance(raised.value, (SinkWriteError, KafkaSinkFencedError))
    # One fatal failure among the attempts is mended by reopening.
    broker.fail_requests(ADD_PARTITIONS_TO_TXN, KafkaError.INVALID_TXN_STATE, 1)
    sink.write(changes(2, 2))
    assert written_ids(kafka, topic_name, 1) == [2]
    sink.close()


def test_a_kafka_sink_whose_first_producer_fails_fatally_stops(
        kafka: KafkaEndpoint, topic_name: str) -> None:
    broker = mock_broker(kafka)
    broker.create_topic(topic_name, 1)
    broker.fail_requests(INIT_PRODUCER_ID, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 1)
    with pytest.raises(KafkaSinkFatalError, match="Retrying cannot help: check the ACLs of "
                       f"transactional id 'txn-{topic_name}'"):
        KafkaSink(broker.bootstrap_servers, topic_name, "t", SCHEMA,
                  transactional_id=f"txn-{topic_name}", retry=FAST_RETRY)


def test_a_second_live_writer_with_the_same_transactional_id_stops_the_sink(
        kafka: KafkaEndpoint, topic_name: str) -> None:
    if isinstance(kafka, MockKafkaBroker):
        pytest.skip("librdkafka's mock cluster does not fence a producer when another one "
                    "initialises its transactional id; set KAFKA_BOOTSTRAP_SERVERS to a real Kafka")
    kafka.create_topic(topic_name, 1)
    txn_id = f"txn-{topic_name}"
    first = KafkaSink(kafka.bootstrap_servers, topic_name, "t", SCHEMA,
                      transactional_id=txn_id, retry=FAST_RETRY)
    second = KafkaSink(kafka.bootstrap_servers, topic_name, "t", SCHEMA,
                       transactional_id=txn_id, retry=FAST_RETRY)  # fences the first
    first.write(changes(1, 1))  # fenced: reopens, which fences the second
    second.write(changes(2, 2))  # fenced: reopens, which fences the first again
    with pytest.raises(KafkaSinkFencedError, match="Another live producer"):
        first.write(changes(3, 3))
    second.close()
    first.close()


def test_the_service_waits_fenced_when_its_kafka_sink_is_fenced_twice(  # type: ignore[no-untyped-def]
        kafka, topics, topic_name, tmp_path) -> None:
    broker = mock_broker(kafka)
    broker.create_topic(f"{topic_name}-paid", 1)
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(500)
    port = free_port()
    config = write_config(tmp_path / "pipeline.yaml", topics, "unused", f"g-{topic_name}",
                          tmp_path / "ck", port, sinks=[{
                              "output": "paid_orders", "kind": "kafka",
                              "topic": f"{topic_name}-paid",
                              "transactional_id": f"txn-{topic_name}"}])
    service = ServiceProcess(config, {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers},
                             tmp_path / "service.log")
    try:
        service.wait_for_metrics(port, lambda body: (metric(
            body, "txstream_transactions_committed_total") or 0) > 0, timeout=600)
        broker.fail_requests(ADD_PARTITIONS_TO_TXN, KafkaError.PRODUCER_FENCED, 2)
        producer.send(200)
        service.wait_for_log("fenced: the Kafka sink of 'paid_orders'", timeout=300)
        assert scrape(port, "/readyz") == (503, "not ready: fenced\n")
        assert metric(scrape(port)[1], "txstream_fenced_total") == 1
        assert scrape(port, "/healthz")[0] == 200
        assert service.proc.poll() is None  # waiting, not exited with an error
        service.proc.send_signal(signal.SIGTERM)
        assert service.wait(timeout=90) == 0, service.tail()
    finally:
        service.kill()
