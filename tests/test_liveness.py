"""A sink that cannot recover, a stalled pipeline, and what the unauthenticated endpoints and
the logs tell: the Kafka sink's fatal errors against the broker fixture, the `/healthz` stall
rule (pure, then through the runner), `/readyz` bodies and the value excerpts of bad records.

The fatal errors come from the broker process: librdkafka's mock cluster answers the next
AddPartitionsToTxn requests with the error asked for (`MockKafkaBroker.fail_requests`). It
does not fence a producer when a second one initialises the same transactional id (it hands
out a new producer id instead), so fencing by a live second writer runs only against a real
Kafka (`KAFKA_BOOTSTRAP_SERVERS` or testcontainers).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from kafka_helpers import (  # noqa: F401 (fixtures by name)
    ORDERS,
    builders_fixture,
    dlq_fixture,
    make_builder,
    n_events,
    poll_until,
    produce,
    read_dead_letters,
)
from psycopg import sql
from pyspark.sql import SparkSession

from txstream.engine import Pipeline
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sinks import RetryPolicy
from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.service.compose import open_runner
from txstream.service.embedded.kafka import KafkaEndpoint, MockKafkaBroker
from txstream.service.embedded.postgres import PostgresEndpoint
from txstream.service.health import HealthServer, Progress, Readiness, stall
from txstream.sinks.kafka_sink import KafkaSink, KafkaSinkFatalError, KafkaSinkFencedError
from txstream.sinks.sink import SinkWriteError
from txstream.sources.transactions import TransactionBuilder

SCHEMA = TableSchema.of({"id": "bigint", "name": "text"}, primary_key=["id"])
INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN = 22, 24  # Kafka protocol API keys
FAST_RETRY = RetryPolicy(attempts=3, initial_backoff_s=0.01, max_backoff_s=0.01)


def changes(time_: int, *ids: int) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "name": f"n{i}", "time": time_, "diff": 1} for i in ids],
        schema=SCHEMA.arrow_schema(with_changes=True))


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


# ---- a Kafka sink that cannot recover -----------------------------------------------------


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
    sink.close()


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


# ---- the stall rule of /healthz -----------------------------------------------------------


def progress_at(*, closed: int, committed: int, delivered_at: float, waiting_since: float
                ) -> Progress:
    return Progress(transactions_closed=closed, transactions=committed,
                    last_delivered_at=delivered_at, waiting_since=waiting_since)


def test_idle_is_healthy_however_long_ago_the_last_batch() -> None:
    progress = progress_at(closed=7, committed=7, delivered_at=0.0, waiting_since=0.0)
    assert stall(progress, now=10_000.0, timeout_s=60) is None


def test_waiting_work_without_a_delivery_for_the_timeout_is_a_stall() -> None:
    progress = progress_at(closed=9, committed=7, delivered_at=100.0, waiting_since=90.0)
    assert stall(progress, now=160.0, timeout_s=60) is None
    reason = stall(progress, now=161.0, timeout_s=60)
    assert reason == ("stalled: 2 transaction(s) waiting, no batch delivered in the last 61s "
                      "(stall_timeout_s=60)")
    progress.last_delivered_at, progress.transactions = 161.0, 8  # a batch got through
    assert stall(progress, now=200.0, timeout_s=60) is None


def test_the_wait_counts_from_when_work_arrived_after_an_idle_spell() -> None:
    progress = progress_at(closed=3, committed=3, delivered_at=0.0, waiting_since=0.0)
    progress.closed(4, now=1000.0)
    assert progress.waiting_since == 1000.0
    assert stall(progress, now=1059.0, timeout_s=60) is None
    assert stall(progress, now=1061.0, timeout_s=60) is not None


def test_a_trickle_of_new_transactions_does_not_hide_a_stall() -> None:
    progress = progress_at(closed=3, committed=3, delivered_at=0.0, waiting_since=0.0)
    progress.closed(4, now=1000.0)
    for now in range(1010, 1100, 10):  # more close while the first still waits
        progress.closed(progress.transactions_closed + 1, now=float(now))
    assert progress.waiting_since == 1000.0
    assert stall(progress, now=1061.0, timeout_s=60) is not None


def scrape(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def health() -> Iterator[Callable[..., HealthServer]]:
    servers: list[HealthServer] = []

    def start(progress: Progress, readiness: Readiness, **kwargs: float | None
              ) -> HealthServer:
        servers.append(HealthServer(0, progress, readiness, host="127.0.0.1",
                                    **kwargs).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_healthz_fails_while_stalled_and_logs_it_once(
        health: Callable[..., HealthServer], caplog: pytest.LogCaptureFixture) -> None:
    now = time.monotonic()
    progress = progress_at(closed=5, committed=2, delivered_at=now - 100, waiting_since=now - 100)
    server = health(progress, Readiness(max_lag=10), stall_timeout_s=30.0)
    with caplog.at_level(logging.INFO, logger="txstream.service.health"):
        for _ in range(3):
            status, body = scrape(server.port, "/healthz")
            assert status == 503
            assert body.startswith("unhealthy: stalled: 3 transaction(s) waiting")
        progress.last_delivered_at = time.monotonic()
        assert scrape(server.port, "/healthz") == (200, "ok\n")
    logged = [r.getMessage() for r in caplog.records]
    assert len([m for m in logged if "/healthz answers 503" in m]) == 1
    assert len([m for m in logged if "/healthz answers 200" in m]) == 1


def test_healthz_without_a_stall_timeout_never_fails(
        health: Callable[..., HealthServer]) -> None:
    progress = progress_at(closed=5, committed=2, delivered_at=0.0, waiting_since=0.0)
    server = health(progress, Readiness(max_lag=10))
    assert scrape(server.port, "/healthz") == (200, "ok\n")


# ---- /readyz names what is down, the log says why -----------------------------------------


def test_readyz_names_the_dependency_and_only_the_log_has_the_error(
        health: Callable[..., HealthServer], caplog: pytest.LogCaptureFixture) -> None:
    detail = "connection to kafka-0.corp.internal:9093 failed: SASL user 'etl_admin' rejected"
    progress, readiness = Progress(lag=50), Readiness(max_lag=10)
    readiness.started.set()
    server = health(progress, readiness)
    with caplog.at_level(logging.INFO, logger="txstream.service.health"):
        for observer in ("stages", "monitor", "stages"):  # every retry and probe reports it
            readiness.fail("kafka", detail, observer=observer)
            assert scrape(server.port, "/readyz") == (
                503, "not ready: kafka: unavailable; lag 50 > 10\n")
        readiness.ok("kafka")
        readiness.ok("kafka", observer="monitor")
        progress.lag = 0
        assert scrape(server.port, "/readyz") == (200, "ready\n")
    logged = [r.getMessage() for r in caplog.records]
    # Once per observer that saw it go down, once each when it came back.
    assert len([m for m in logged if detail in m]) == 2
    assert len([m for m in logged if "kafka available again" in m]) == 2


# ---- value excerpts in bad-record logs ----------------------------------------------------


@pytest.mark.parametrize("excerpts", [False, True])
def test_bad_record_logs_quote_values_only_when_the_source_says_so(
        kafka: KafkaEndpoint, topic_name: str, dlq: str, builders: list[TransactionBuilder],
        caplog: pytest.LogCaptureFixture, excerpts: bool) -> None:
    kafka.create_topic(topic_name, 1)
    spec = SourceSpec(name="orders", topic=topic_name, schema=ORDERS, semantics="upsert",
                      **({"value_excerpts": True} if excerpts else {}))
    builders.append(b := make_builder(kafka, [spec], dlq))
    secret = "4111-1111-1111-1111"
    produce(kafka, topic_name, [("1", {"id": 1, "item": "x", "qty": secret}),
                                (f'{{"card": "{secret}"}}', None),  # a tombstone without id
                                ("2", {"id": 2, "item": "ok", "qty": 2})])
    with caplog.at_level(logging.WARNING, logger="txstream.sources.transactions"):
        txs = poll_until(b, n_events(1))
    warnings = [r.getMessage() for r in caplog.records if "bad record" in r.getMessage()]
    assert len(warnings) == 2
    assert "field 'qty': Input should be a valid integer" in warnings[0]
    assert "does not carry the primary key" in warnings[1]
    assert all((secret in warning) is excerpts for warning in warnings)
    # The dead letter's reason is the logged one; the record itself is there whole.
    b.commit(txs[-1])
    letters = read_dead_letters(kafka, dlq, 2)
    assert [w.endswith(x["txstream.error"]) for w, x in zip(warnings, letters, strict=True)] \
        == [True, True]
    assert secret.encode() in letters[0]["value"] and secret.encode() in letters[1]["key"]


# ---- the runner's progress, end to end ----------------------------------------------------


def items_pipeline() -> Pipeline:
    p = Pipeline()
    p.output("items_out", p.source("items", SCHEMA).select("id", "name"))
    return p


def wait_for(what: str, condition: Callable[[], bool], failed: Callable[[], object],
             timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert failed() is None, f"the runner failed: {failed()!r}"
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.2)


def test_healthz_fails_while_a_sink_hangs_with_work_waiting_and_recovers(
        kafka: KafkaEndpoint, postgres: PostgresEndpoint, pg_schema: str, spark: SparkSession,
        topic_name: str, tmp_path: Path, health: Callable[..., HealthServer]) -> None:
    kafka.create_topic(topic_name, 1)
    config = PipelineConfig(
        pipeline="test_liveness:items_pipeline",
        sources=[SourceSpec(name="items", topic=topic_name, schema=SCHEMA)],
        sinks=[SinkConfig.model_validate({"output": "items_out", "kind": "postgres_snapshot",
                                          "db_schema": pg_schema})],
        transactions=BatchPolicy(max_events=10, max_delay_ms=100),
        kafka_bootstrap_servers=kafka.bootstrap_servers, consumer_group=f"g-{topic_name}",
        database_url=postgres.url, checkpoint_dir=str(tmp_path / "ck"), http_port=None,
        stall_timeout_s=2.0, warm_up_rows=0)
    runner = open_runner(config, spark=spark, pipeline=items_pipeline())
    server = health(runner.progress, runner.readiness, stall_timeout_s=config.stall_timeout_s)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:
            failures.append(exc)

    def failed() -> BaseException | None:
        return failures[0] if failures else None

    thread = threading.Thread(target=run, daemon=True)
    blocker = psycopg.connect(postgres.url)
    try:
        thread.start()
        wait_for("the first poll", runner.readiness.started.is_set, failed)
        time.sleep(3)  # idle for longer than stall_timeout_s
        assert scrape(server.port, "/healthz") == (200, "ok\n")
        # The sink's table locked: its write waits as long as the lock is held.
        blocker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(pg_schema, "items_out")))
        produce(kafka, topic_name, [(None, {"id": 1, "name": "a"})])
        wait_for("/healthz 503", lambda: scrape(server.port, "/healthz")[0] == 503, failed)
        assert runner.progress.transactions == 0 < runner.progress.transactions_closed
        blocker.rollback()
        wait_for("/healthz 200", lambda: scrape(server.port, "/healthz") == (200, "ok\n"),
                 failed)
        assert runner.progress.transactions == 1
    finally:
        blocker.close()
        runner.request_stop()
        thread.join(60)
        runner.close()
    assert failed() is None
