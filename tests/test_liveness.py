"""A stalled pipeline, and what the unauthenticated endpoints and the logs tell: the
`/healthz` stall rule (pure, then through the runner), readiness and `/readyz` bodies, the
metrics of a halt and of rejected rows, and the value excerpts of bad records. (The Kafka
sink's fatal errors: test_kafka_sink_fencing.)"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import SparkSession
from support.kafka_helpers import (
    ORDERS,
    make_builder,
    n_events,
    poll_until,
    produce,
    read_dead_letters,
)
from support.service_process import scrape

from txstream.engine import Pipeline
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.service.compose import open_runner
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.service.embedded.postgres import PostgresEndpoint
from txstream.service.health import HealthServer, Readiness, metrics_text, stall
from txstream.service.metrics import Metrics
from txstream.sources.source_state import IngestStats
from txstream.sources.transactions import TransactionBuilder

SCHEMA = TableSchema.of({"id": "bigint", "name": "text"}, primary_key=["id"])


# ---- the stall rule of /healthz -----------------------------------------------------------


def metrics_at(*, closed: int, committed: int, delivered_at: float, waiting_since: float
               ) -> Metrics:
    """Metrics of a pipeline that closed and committed so many transactions."""
    metrics = Metrics()
    metrics.ingest.transactions_closed, metrics.ingest.waiting_since = closed, waiting_since
    metrics.delivery.transactions, metrics.delivery.last_delivered_at = committed, delivered_at
    return metrics


def close(metrics: Metrics, total: int, now: float) -> None:
    """The ingest stage saw the input close `total` transactions at `now`."""
    metrics.ingest.polled(IngestStats(transactions=total), busy_s=0.0, now=now,
                          committed=metrics.delivery.transactions)


def test_idle_is_healthy_however_long_ago_the_last_batch() -> None:
    metrics = metrics_at(closed=7, committed=7, delivered_at=0.0, waiting_since=0.0)
    assert stall(metrics, now=10_000.0, timeout_s=60) is None


def test_waiting_work_without_a_delivery_for_the_timeout_is_a_stall() -> None:
    metrics = metrics_at(closed=9, committed=7, delivered_at=100.0, waiting_since=90.0)
    assert stall(metrics, now=160.0, timeout_s=60) is None
    reason = stall(metrics, now=161.0, timeout_s=60)
    assert reason == ("stalled: 2 transaction(s) waiting, no batch delivered in the last 61s "
                      "(stall_timeout_s=60)")
    metrics.delivery.last_delivered_at, metrics.delivery.transactions = 161.0, 8  # got through
    assert stall(metrics, now=200.0, timeout_s=60) is None


def test_the_wait_counts_from_when_work_arrived_after_an_idle_spell() -> None:
    metrics = metrics_at(closed=3, committed=3, delivered_at=0.0, waiting_since=0.0)
    close(metrics, 4, now=1000.0)
    assert metrics.ingest.waiting_since == 1000.0
    assert stall(metrics, now=1059.0, timeout_s=60) is None
    assert stall(metrics, now=1061.0, timeout_s=60) is not None


def test_a_trickle_of_new_transactions_does_not_hide_a_stall() -> None:
    metrics = metrics_at(closed=3, committed=3, delivered_at=0.0, waiting_since=0.0)
    close(metrics, 4, now=1000.0)
    for now in range(1010, 1100, 10):  # more close while the first still waits
        close(metrics, metrics.ingest.transactions_closed + 1, now=float(now))
    assert metrics.ingest.waiting_since == 1000.0
    assert stall(metrics, now=1061.0, timeout_s=60) is not None


@pytest.fixture
def health() -> Iterator[Callable[..., HealthServer]]:
    servers: list[HealthServer] = []

    def start(metrics: Metrics, readiness: Readiness, **kwargs: float | None
              ) -> HealthServer:
        servers.append(HealthServer(0, metrics, readiness, host="127.0.0.1",
                                    **kwargs).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_healthz_fails_while_stalled_and_logs_it_once(
        health: Callable[..., HealthServer], caplog: pytest.LogCaptureFixture) -> None:
    now = time.monotonic()
    metrics = metrics_at(closed=5, committed=2, delivered_at=now - 100, waiting_since=now - 100)
    server = health(metrics, Readiness(max_lag=10), stall_timeout_s=30.0)
    with caplog.at_level(logging.INFO, logger="txstream.service.health"):
        for _ in range(3):
            status, body = scrape(server.port, "/healthz")
            assert status == 503
            assert body.startswith("unhealthy: stalled: 3 transaction(s) waiting")
        metrics.delivery.last_delivered_at = time.monotonic()
        assert scrape(server.port, "/healthz") == (200, "ok\n")
    logged = [r.getMessage() for r in caplog.records]
    assert len([m for m in logged if "/healthz answers 503" in m]) == 1
    assert len([m for m in logged if "/healthz answers 200" in m]) == 1


def test_healthz_without_a_stall_timeout_never_fails(
        health: Callable[..., HealthServer]) -> None:
    metrics = metrics_at(closed=5, committed=2, delivered_at=0.0, waiting_since=0.0)
    server = health(metrics, Readiness(max_lag=10))
    assert scrape(server.port, "/healthz") == (200, "ok\n")


def test_a_standby_or_fenced_instance_is_never_stalled(
        health: Callable[..., HealthServer]) -> None:
    """A fenced instance abandoned a batch and runs none while it waits: a restart by the
    liveness probe would only cost it its warm Spark session (or, without a lease, fence the
    instance that took over)."""
    now = time.monotonic()
    metrics = metrics_at(closed=5, committed=2, delivered_at=now - 100, waiting_since=now - 100)
    readiness = Readiness(max_lag=10)
    server = health(metrics, readiness, stall_timeout_s=30.0)
    for waiting in ("fenced", "standby"):
        readiness.wait_as(waiting)
        assert scrape(server.port, "/healthz") == (200, "ok\n")
        assert scrape(server.port, "/readyz") == (503, f"not ready: {waiting}\n")
    readiness.wait_as(None)  # it took the lease: its own batches count again
    assert scrape(server.port, "/healthz")[0] == 503


# ---- /readyz names what is down, the log says why -----------------------------------------


def test_readyz_names_the_dependency_and_only_the_log_has_the_error(
        health: Callable[..., HealthServer], caplog: pytest.LogCaptureFixture) -> None:
    detail = "connection to kafka-0.corp.internal:9093 failed: SASL user 'etl_admin' rejected"
    metrics, readiness = Metrics(), Readiness(max_lag=10)
    metrics.source.lag = 50
    readiness.started.set()
    server = health(metrics, readiness)
    with caplog.at_level(logging.INFO, logger="txstream.service.health"):
        for observer in ("stages", "monitor", "stages"):  # every retry and probe reports it
            readiness.fail("kafka", detail, observer=observer)
            assert scrape(server.port, "/readyz") == (
                503, "not ready: kafka: unavailable; lag 50 > 10\n")
        readiness.ok("kafka")
        readiness.ok("kafka", observer="monitor")
        metrics.source.lag = 0
        assert scrape(server.port, "/readyz") == (200, "ready\n")
    logged = [r.getMessage() for r in caplog.records]
    # Once per observer that saw it go down, once each when it came back.
    assert len([m for m in logged if detail in m]) == 2
    assert len([m for m in logged if "kafka available again" in m]) == 2


def test_a_dependency_is_down_while_any_observer_saw_it_fail() -> None:
    # The ingest stage's empty poll of a paused broker succeeds; it must not clear the monitor's
    # failed metadata request (it did, and readiness flickered back to ready).
    readiness, metrics = Readiness(max_lag=10), Metrics()
    readiness.started.set()
    readiness.fail("kafka", "metadata request timed out", observer="monitor")
    readiness.ok("kafka")
    assert readiness.problems(metrics) == ["kafka unavailable: metadata request timed out"]
    assert not readiness.up("kafka")
    readiness.fail("kafka", "poll failed")
    assert len(readiness.problems(metrics)) == 1, "one line per dependency"
    readiness.ok("kafka", observer="monitor")
    readiness.ok("kafka")
    assert readiness.problems(metrics) == [] and readiness.up("kafka")

def test_halted_and_rejected_rows_are_reported() -> None:
    readiness, metrics = Readiness(max_lag=10), Metrics()
    readiness.started.set()
    metrics.delivery.rejected_rows = {"customer_stats": 2, "statuses": 0}
    metrics.ingest.transactions_closed, metrics.delivery.transactions = 5, 1
    halted = metrics.compute.halted = "table t (expression `a DIV b`) failed on this data: ..."
    assert readiness.public_problems(metrics) == [
        "halted: an expression failed on the data or an invariant broke, see the log"]
    assert readiness.problems(metrics) == [f"halted: {halted}"]
    # Work waits and nothing is delivered, yet a restart would only fail the same way.
    assert stall(metrics, time.monotonic() + 3600, timeout_s=60) is None
    body = metrics_text(metrics, readiness)
    assert 'txstream_rejected_rows_total{output="customer_stats"} 2' in body
    assert "txstream_halted 1" in body and "txstream_ready 0" in body


def test_late_rows_are_counted_per_windowed_table() -> None:
    metrics = Metrics()
    late = {'tumbling(0:01:00) windows of source "v" by ts under common_behavior(cutoff=0:00:10)':
            3, "sliding(hop=2, duration=4) windows of source w by t under "
            "exactly_once_behavior()": 1}
    metrics.compute.computed(1, 10, engine_s=0.1, check_s=0.0, busy_s=0.1, jobs=1, stages=1,
                             index_bytes=0, late_rows=late)
    body = metrics_text(metrics, Readiness(max_lag=10))
    assert ('txstream_late_rows_total{operator="tumbling(0:01:00) windows of source \\"v\\" '
            'by ts under common_behavior(cutoff=0:00:10)"} 3') in body
    assert "exactly_once_behavior()\"} 1" in body
    assert "| late rows 4" in metrics.line() and metrics.fields()["late_rows"] == 4


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
    server = health(runner.metrics, runner.readiness, stall_timeout_s=config.stall_timeout_s)
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
        assert runner.metrics.delivery.transactions == 0 < runner.metrics.ingest.transactions_closed
        blocker.rollback()
        wait_for("/healthz 200", lambda: scrape(server.port, "/healthz") == (200, "ok\n"),
                 failed)
        assert runner.metrics.delivery.transactions == 1
    finally:
        blocker.close()
        runner.request_stop()
        thread.join(60)
        runner.close()
    assert failed() is None
