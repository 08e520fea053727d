"""The service layer against real parts: configuration errors (each message), environment
overrides and secrets, `txstream check`, `/healthz` `/readyz` `/metrics`, checkpoints on a
Hadoop file system, graceful stop, and the loop surviving a paused broker and a PostgreSQL
restart without losing anything.

About the broker: the embedded one is librdkafka's mock cluster, which keeps its topics in
memory, so a broker *restart* loses them and cannot be tested meaningfully here. What is
tested is the broker becoming unreachable (its process paused with SIGSTOP: connections hang,
requests time out) and reachable again (SIGCONT) with its data intact.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
import yaml
from chromium import Browser
from confluent_kafka import Producer
from psycopg import sql
from pydantic import SecretStr
from test_recovery import (
    ROOT,
    ServiceProcess,
    expected_tables,
    metric,
    scrape,
    snapshot_tables,
    write_config,
)

from txstream.client import LiveClient
from txstream.examples.order_events import OrderWorld, encode, events
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.schemas.config import ConfigError, LiveServing, PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy
from txstream.service.checkpoint import CheckpointError, CheckpointStore, PipelineIdentity
from txstream.service.cli import main, run_checks, serve_live
from txstream.service.compose import open_runner
from txstream.service.embedded.postgres import EmbeddedPostgres, free_port
from txstream.service.health import HealthServer, Progress, Readiness, render_metrics, stall
from txstream.service.runner import EarlierOutputError, PipelineRunner
from txstream.sources.transactions import SourceState, TransactionLogEntry
from txstream.updates import same_rows

DEPLOY = ROOT / "deploy" / "pipeline.yaml"
ENV = {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092", "DATABASE_URL": "postgresql://u@db/x"}


def _deploy_config() -> dict[str, Any]:
    data = yaml.safe_load(DEPLOY.read_text())
    assert isinstance(data, dict)
    return data


# ---------------------------------------------------------------------------- configuration


def test_every_problem_is_listed_with_its_path() -> None:
    data = _deploy_config()
    del data["pipeline"]
    data["batch_transactions"] = 0
    data["sources"][1]["semantics"] = "sometimes"
    data["sinks"][2]["kind"] = "carrier_pigeon"
    data["transactions"]["max_events"] = -1
    data["checkpoint_every_s"] = "often"
    data["colour"] = "blue"
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(data, env=ENV)
    lines = str(err.value).splitlines()[1:]
    assert [line.strip() for line in lines] == [
        "pipeline: Field required",
        "sources.1.semantics: Input should be 'append_only', 'upsert' or 'insert_delete'",
        "sinks.2: Input tag 'carrier_pigeon' found using 'kind' does not match any of the "
        "expected tags: 'postgres_snapshot', 'postgres_append', 'kafka', 'file', 'live'",
        "transactions.max_events: Input should be greater than 0",
        "batch_transactions: Input should be greater than or equal to 1",
        "checkpoint_every_s: Input should be a valid number, unable to parse string as a number",
        "colour: Extra inputs are not permitted",
    ]


def test_checks_across_fields_are_listed_together() -> None:
    data = {**_deploy_config(), "pipeline": "no_colon", "retry_max_backoff_s": 0.1}
    kafka = {"kind": "kafka", "topic": "out", "transactional_id": "t1"}
    data["sinks"] += [{"output": "statuses", **kafka}, {"output": "paid_orders", **kafka}]
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(data, env={})
    assert [line.strip() for line in str(err.value).splitlines()[1:]] == [
        "pipeline: 'no_colon' must be 'module:function'",
        "kafka_bootstrap_servers: no Kafka: set it or KAFKA_BOOTSTRAP_SERVERS",
        "database_url: PostgreSQL sinks need DATABASE_URL (or TXSTREAM_DATABASE_URL, or "
        "DATABASE_URL_FILE)",
        "retry_max_backoff_s: must be at least retry_initial_backoff_s",
        "sinks (Kafka topics, one sink each): out given more than once",
    ]


def test_environment_overrides_every_field(tmp_path: Path) -> None:
    secret = tmp_path / "kafka"
    secret.write_text("broker-from-file:9092\n")
    config = PipelineConfig.from_mapping(_deploy_config(), env={
        **ENV,
        "KAFKA_BOOTSTRAP_SERVERS_FILE": str(secret),
        "TXSTREAM_BATCH_TRANSACTIONS": "7",
        "TXSTREAM_TRANSACTIONS__MAX_EVENTS": "2000",
        "TXSTREAM_SINKS__0__MODE": "replace",
        "TXSTREAM_SOURCES__1__TOPIC": "orders-v2",
        "TXSTREAM_HTTP_PORT": "null",
        "TXSTREAM_LOG_FORMAT": "json",
        "TXSTREAM_CHECKPOINT_DIR": "s3a://bucket/txstream",
        "TXSTREAM_HEALTHCHECK_PORT": "8080",  # the image's own setting, not an override
    })
    assert config.kafka_bootstrap_servers == "broker-from-file:9092"
    assert config.batch_transactions == 7 and config.transactions.max_events == 2000
    assert config.transactions.max_delay_ms == 500, "the rest of the mapping is the file's"
    assert config.sinks[0].settings.mode == "replace"  # type: ignore[union-attr]
    assert config.sources[1].topic == "orders-v2"
    assert config.http_port is None and config.log_format == "json"
    assert config.checkpoint_location == "s3a://bucket/txstream/txstream-orders"


def test_environment_override_problems_name_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(_deploy_config(), env={
            **ENV, "TXSTREAM_TRANSACTIONS__MAX_EVENTS": "0", "TXSTREAM_SINKS__9__MODE": "create",
            "DATABASE_PASSWORD_FILE": "/nonexistent/secret"})
    assert [line.strip() for line in str(err.value).splitlines()[1:]] == [
        "DATABASE_PASSWORD_FILE: cannot read /nonexistent/secret: No such file or directory",
        "TXSTREAM_SINKS__9__MODE: sinks has 4 item(s); '9' is not one of their indexes",
    ]
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(_deploy_config(), env={
            **ENV, "TXSTREAM_TRANSACTIONS__MAX_EVENTS": "0"})
    assert str(err.value).splitlines()[1].strip() == (
        "transactions.max_events (from TXSTREAM_TRANSACTIONS__MAX_EVENTS): Input should be "
        "greater than 0")


def test_secrets_only_from_the_environment_and_never_shown(tmp_path: Path) -> None:
    data = {**_deploy_config(), "database_url": "postgresql://app:hunter2@db/x",
            "database_password": "hunter2"}
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(data, env={"KAFKA_BOOTSTRAP_SERVERS": "k:9092"})
    assert "hunter2" not in str(err.value)
    assert [line.strip() for line in str(err.value).splitlines()[1:]] == [
        "database_password: secrets are not read from the configuration file; set "
        "DATABASE_PASSWORD or DATABASE_PASSWORD_FILE in the environment",
        "database_url: contains a password; secrets are not read from the configuration file: "
        "give the URL without it and set DATABASE_PASSWORD (or DATABASE_URL) in the environment",
    ]
    password = tmp_path / "password"
    password.write_text("s3cr3t\n")
    config = PipelineConfig.from_mapping(
        {**_deploy_config(), "database_url": "postgresql://app@db:5432/x"},
        env={"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "DATABASE_PASSWORD_FILE": str(password)})
    assert config.database_dsn is not None and "password=s3cr3t" in config.database_dsn
    assert "s3cr3t" not in repr(config) and "s3cr3t" not in str(config.model_dump())


def test_the_live_endpoint_token_comes_from_the_environment_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"live\.token: secrets are not read from the "
                                          r"configuration file; set TXSTREAM_LIVE__TOKEN"):
        PipelineConfig.from_mapping({**_deploy_config(), "live": {"token": "abc"}}, env=ENV)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    config = PipelineConfig.from_mapping(
        _deploy_config(), env={**ENV, "TXSTREAM_LIVE__TOKEN_FILE": str(token)})
    assert config.live.token is not None and config.live.token.get_secret_value() == "t0ken"
    assert "t0ken" not in repr(config)
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file go together"):
        PipelineConfig.from_mapping({**_deploy_config(), "live": {"tls_cert_file": "c.pem"}},
                                    env=ENV)
    remote = PipelineConfig.from_mapping(
        {**_deploy_config(), "checkpoint_dir": "hdfs://nn/ck"}, env=ENV)
    with pytest.raises(ConfigError, match=r"set live\.state_dir"):
        _ = remote.live_state_dir
    assert config.live_state_dir == Path(config.checkpoint_location) / "live"


def test_cli_reports_config_errors_and_exits_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**_deploy_config(), "batch_transactions": 0}))
    assert main(["run", str(path)]) == 2
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("batch_transactions: Input should be greater than or equal to 1") == 2
    path.write_text("- not a mapping\n")
    assert main(["check", str(path)]) == 2
    assert "must be a mapping at the top level" in capsys.readouterr().err


# ---------------------------------------------------------------------------- checkpoints


def _state(next_number: int) -> SourceState:
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    return SourceState(next_number=next_number, offsets={"t": {0: 10 * next_number}},
                       upsert_rows={"s": rows})


def _entry(number: int) -> TransactionLogEntry:
    return TransactionLogEntry(number=number, upstream_id=None,
                               ranges={"t": {0: (number * 10, number * 10 + 10)}})


def test_checkpoints_on_a_hadoop_file_system(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    identity = PipelineIdentity(pipeline="m:f", sources={"s": "t"}, outputs=["o"])
    store = CheckpointStore(f"file://{tmp_path}/ck", spark, identity, keep=2)
    assert store.latest() is None and not store.has_history()
    store.log([_entry(1), _entry(2)])
    store.log([_entry(3)])
    assert store.has_history()
    for number in (2, 3):
        prepared = store.prepare(number, _state(number + 1))
        spark.range(number).write.parquet(store.engine_uri(prepared))
        assert store.latest() is None or store.latest().transaction < number  # type: ignore[union-attr]
        store.publish(prepared)
    # An incomplete one (killed before its manifest) is ignored, then deleted by the next.
    store.prepare(3, _state(4))
    latest = store.latest()
    assert latest is not None and latest.transaction == 3
    assert store.load_source_state(latest) == _state(4)
    assert spark.read.parquet(store.engine_uri(latest)).count() == 3
    assert [e.number for e in store.logged_after(2)] == [3]
    store.log([_entry(4)])
    prepared = store.prepare(4, _state(5))
    spark.range(1).write.parquet(store.engine_uri(prepared))
    store.publish(prepared)
    names = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("ckpt"))
    assert len(names) == 2 and names[0].startswith("ckpt-000000000003"), names
    # Log files no kept checkpoint needs are gone (those through #3, the oldest kept).
    assert sorted(p.name for p in (tmp_path / "ck" / "txlog").glob("*.json")) == [
        "000000000004-000000000004.json"]
    assert [e.number for e in store.logged_after(3)] == [4]

    other = CheckpointStore(f"file://{tmp_path}/ck", spark, identity.model_copy(
        update={"sources": {"s": "another-topic"}}))
    with pytest.raises(CheckpointError, match="written by another pipeline"):
        other.latest()


def test_transaction_log_damage_is_reported(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = CheckpointStore(str(tmp_path), spark, PipelineIdentity(
        pipeline="m:f", sources={}, outputs=[]))
    store.log([_entry(1)])
    store.log([_entry(3)])
    with pytest.raises(CheckpointError, match="has gaps after #0"):
        store.logged_after(0)
    store.log([TransactionLogEntry(number=3, upstream_id="x", ranges={}), _entry(4)])
    with pytest.raises(CheckpointError, match="records #3 twice with different contents"):
        store.logged_after(2)


# ---------------------------------------------------------------------------- in-process loop


def _config(bootstrap: str, database_url: str, schema: str, topics: dict[str, str],
            group: str, checkpoint_dir: Path, **extra: Any) -> PipelineConfig:
    return PipelineConfig(
        pipeline="txstream.examples.orders:pipeline",
        sources=kafka_sources(topics["customers"], topics["orders"]),
        sinks=[SinkConfig.model_validate({"output": o, "db_schema": schema})
               for o in OUTPUTS],
        transactions=BatchPolicy(max_events=100, max_delay_ms=200),
        batch_transactions=5, kafka_bootstrap_servers=bootstrap, consumer_group=group,
        database_url=database_url, checkpoint_dir=str(checkpoint_dir),
        retry_initial_backoff_s=0.2, retry_max_backoff_s=1.0, status_interval_s=1.0,
        **{"warm_up_rows": 0, **extra})  # the warm-up: test_engine_warmup, test_end_to_end


class _Producer:
    """Order events in sequence, with the from-scratch world they leave."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self.world = OrderWorld()
        self._topics = topics
        self._stream = events(random.Random(3), customers=30)
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def send(self, count: int, flush: bool = True) -> None:
        for _ in range(count):
            event = next(self._stream)
            key, value = encode(event)
            self._producer.produce(self._topics[event[0]], key=key, value=value)
            self.world.apply(event)
        if flush:
            assert self._producer.flush(120) == 0


class _Background:
    """`runner.run()` in a thread, stopped and joined on exit."""

    def __init__(self, runner: PipelineRunner) -> None:
        self.runner = runner
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.runner.run()
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> _Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.request_stop()
        self._thread.join(120)

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.error is None, f"the loop failed: {self.error!r}"
            assert time.monotonic() < deadline, f"timed out waiting for: {what}"
            time.sleep(0.2)

    def problems(self) -> list[str]:
        return self.runner.readiness.problems(self.runner.progress)

    def drained(self, events: int) -> Callable[[], bool]:
        """`events` read, and every record of the topics in a committed transaction, measured
        now (the lag in `progress` is measured every few seconds: it may predate the events)."""
        progress = self.runner.progress
        return lambda: (progress.events >= events and not self.problems()
                        and self.runner.lag() == 0)


def _assert_snapshots(url: str, schema: str, world: OrderWorld) -> None:
    assert snapshot_tables(url, schema) == expected_tables(world)


@pytest.fixture
def topics(kafka, topic_name: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    names = {"customers": f"{topic_name}-customers", "orders": f"{topic_name}-orders"}
    kafka.create_topic(names["customers"], 1)
    kafka.create_topic(names["orders"], 2)
    return names


def test_readyz_metrics_and_graceful_stop(kafka, postgres, spark, pg_schema, topics,  # type: ignore[no-untyped-def]
                                          topic_name, tmp_path) -> None:
    config = _config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                     f"g-{topic_name}", tmp_path / "ck")
    producer = _Producer(kafka.bootstrap_servers, topics)
    producer.send(400)
    runner = open_runner(config, spark=spark)
    health = HealthServer(0, runner.progress, runner.readiness, host="127.0.0.1").start()
    try:
        assert scrape(health.port, "/healthz") == (200, "ok\n")
        assert scrape(health.port, "/readyz") == (503, "not ready: starting\n")
        with _Background(runner) as loop:
            loop.wait("all events committed", loop.drained(400))
            loop.wait("a latency sample", lambda: runner.progress.end_to_end_seconds.count > 0)
            assert scrape(health.port, "/readyz") == (200, "ready\n")
            status, body = scrape(health.port, "/metrics")
        assert status == 200
        assert runner.checkpoint(), "the graceful stop's checkpoint"
        _, after = scrape(health.port, "/metrics")
    finally:
        health.stop()
        runner.close()
    last = runner.progress.last_transaction
    assert metric(body, "txstream_events_total") == 400
    assert metric(body, "txstream_dead_letters_total") == 0
    assert metric(body, "txstream_transactions_committed_total") == last
    assert metric(body, "txstream_transactions_closed_total") == last
    assert metric(body, "txstream_last_committed_transaction") == last
    assert metric(body, "txstream_lag_records") == 0
    assert metric(body, "txstream_ready") == 1
    assert metric(body, 'txstream_dependency_up{dependency="kafka"}') == 1
    for partition in (0, 1):
        assert metric(body, f'txstream_partition_lag_records{{topic="{topics["orders"]}",'
                            f'partition="{partition}"}}') == 0
    batches = metric(body, "txstream_batches_total")
    assert batches and metric(body, "txstream_batch_transactions_count") == batches
    assert metric(body, "txstream_batch_transactions_sum") == last
    assert metric(body, "txstream_spark_job_seconds_count") == batches
    assert metric(body, "txstream_batch_input_changes_count") == batches
    assert metric(body, "txstream_checkpoint_failures_total") == 0
    assert metric(body, 'txstream_batch_transactions_bucket{le="+Inf"}') == batches
    assert (metric(body, "txstream_sink_write_seconds_count") or 0) >= batches
    assert (metric(body, "txstream_end_to_end_latency_seconds_count") or 0) > 0
    assert metric(body, "txstream_checkpoint_age_seconds") is not None  # NaN before the first
    assert metric(after, "txstream_checkpoints_total") == 1
    assert metric(after, "txstream_checkpoint_seconds_count") == 1
    assert 0 <= (metric(after, "txstream_checkpoint_age_seconds") or -1) < 60
    _assert_snapshots(postgres.url, pg_schema, producer.world)

    # A restart resumes from that checkpoint: nothing to replay, the same numbering goes on.
    producer.send(50)
    again = open_runner(config, spark=spark)
    try:
        assert again.progress.last_checkpoint_transaction == last
        again.run(until=lambda r: r.lag() == 0)
        assert again.progress.events == 50, "only the new records are read"
        assert again.progress.last_transaction > last
    finally:
        again.close()
    _assert_snapshots(postgres.url, pg_schema, producer.world)


def test_txstream_check_reports_each_part(kafka, postgres, spark, topics, topic_name,  # type: ignore[no-untyped-def]
                                          pg_schema, tmp_path) -> None:
    config = _config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                     f"g-{topic_name}", tmp_path / "ck")
    results = {name: (ok, detail) for name, ok, detail in run_checks(config)}
    assert all(ok for ok, _ in results.values()), results
    assert results["kafka"][1] == (f"{topics['customers']} (1 partitions), "
                                   f"{topics['orders']} (2 partitions)")
    assert "no checkpoint yet" in results["checkpoint"][1]
    broken = config.model_copy(update={"sources": [
        config.sources[0], config.sources[1].model_copy(update={"topic": "no-such-topic"})]})
    results = {name: (ok, detail) for name, ok, detail in run_checks(broken)}
    assert not results["kafka"][0]
    assert "topic(s) no-such-topic do not exist" in results["kafka"][1]
    assert results["pipeline"][0] and results["spark"][0]


def test_a_dependency_is_down_while_any_observer_saw_it_fail() -> None:
    # The ingest stage's empty poll of a paused broker succeeds; it must not clear the monitor's
    # failed metadata request (it did, and readiness flickered back to ready).
    readiness, progress = Readiness(max_lag=10), Progress()
    readiness.started.set()
    readiness.fail("kafka", "metadata request timed out", observer="monitor")
    readiness.ok("kafka")
    assert readiness.problems(progress) == ["kafka unavailable: metadata request timed out"]
    assert not readiness.up("kafka")
    readiness.fail("kafka", "poll failed")
    assert len(readiness.problems(progress)) == 1, "one line per dependency"
    readiness.ok("kafka", observer="monitor")
    readiness.ok("kafka")
    assert readiness.problems(progress) == [] and readiness.up("kafka")


def test_halted_and_rejected_rows_are_reported() -> None:
    readiness, progress = Readiness(max_lag=10), Progress()
    readiness.started.set()
    progress.rejected_rows = {"customer_stats": 2, "statuses": 0}
    progress.transactions_closed, progress.transactions = 5, 1
    progress.halted = "table t (expression `a DIV b`) failed on this batch's data: ..."
    assert readiness.public_problems(progress) == [
        "halted: an expression failed on the data, see the log"]
    assert readiness.problems(progress) == [f"halted: {progress.halted}"]
    # Work waits and nothing is delivered, yet a restart would only fail the same way.
    assert stall(progress, time.monotonic() + 3600, timeout_s=60) is None
    body = render_metrics(progress, readiness)
    assert 'txstream_rejected_rows_total{output="customer_stats"} 2' in body
    assert "txstream_halted 1" in body and "txstream_ready 0" in body


@pytest.fixture
def paused_broker() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A broker process of this test's own, so pausing it disturbs no other test."""
    proc = subprocess.Popen([sys.executable, "-m", "txstream.service.embedded.kafka"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None and proc.stdin is not None
    bootstrap = proc.stdout.readline().strip()
    yield bootstrap, proc
    proc.send_signal(signal.SIGCONT)
    proc.stdin.close()
    proc.wait(10)


def _create(proc: subprocess.Popen[str], topic: str, partitions: int) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"create {topic} {partitions}\n")
    assert proc.stdout.readline().strip() == "ok"


def test_broker_unreachable_then_back(paused_broker, postgres, spark, pg_schema,  # type: ignore[no-untyped-def]
                                      topic_name, tmp_path) -> None:
    bootstrap, broker = paused_broker
    topics = {"customers": f"{topic_name}-customers", "orders": f"{topic_name}-orders"}
    _create(broker, topics["customers"], 1)
    _create(broker, topics["orders"], 2)
    config = _config(bootstrap, postgres.url, pg_schema, topics, f"g-{topic_name}",
                     tmp_path / "ck")
    producer = _Producer(bootstrap, topics)
    producer.send(200)
    runner = open_runner(config, spark=spark)
    try:
        with _Background(runner) as loop:
            loop.wait("the first events committed", loop.drained(200))
            broker.send_signal(signal.SIGSTOP)
            loop.wait("not ready: Kafka unavailable",
                      lambda: any(p.startswith("kafka unavailable") for p in loop.problems()),
                      timeout=60)
            # And it stays so while the broker is away: an empty poll is not a sign of life.
            samples = []
            for _ in range(20):
                samples.append(any(p.startswith("kafka unavailable") for p in loop.problems()))
                time.sleep(0.2)
            assert all(samples), samples
            producer.send(200, flush=False)  # buffered by the producer meanwhile
            broker.send_signal(signal.SIGCONT)
            producer.send(0)
            loop.wait("caught up after the broker came back", loop.drained(400), timeout=180)
    finally:
        runner.close()
    _assert_snapshots(postgres.url, pg_schema, producer.world)


def test_postgres_restart_during_a_run(kafka, spark, topics, topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A server of this test's own, to stop and start; its directory must be reachable by the
    # `postgres` user the server runs as under root (pytest's tmp_path is not).
    base = Path(tempfile.mkdtemp(prefix="txstream-pg-"))
    base.chmod(0o755)
    pg = EmbeddedPostgres(base / "pgdata").start()
    try:
        config = _config(kafka.bootstrap_servers, pg.url, "public", topics, f"g-{topic_name}",
                         tmp_path / "ck")
        producer = _Producer(kafka.bootstrap_servers, topics)
        producer.send(200)
        runner = open_runner(config, spark=spark)
        try:
            with _Background(runner) as loop:
                loop.wait("the first events committed", loop.drained(200))
                pg.stop()
                producer.send(200)
                loop.wait("not ready: PostgreSQL unavailable",
                          lambda: any(p.startswith("postgresql unavailable")
                                      for p in loop.problems()), timeout=90)
                committed = runner.progress.transactions
                time.sleep(1)
                assert runner.progress.transactions == committed, "nothing commits meanwhile"
                pg.start()
                loop.wait("caught up after PostgreSQL came back", loop.drained(400), timeout=180)
        finally:
            runner.close()
        _assert_snapshots(pg.url, "public", producer.world)
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_sigterm_while_processing_exits_0_with_a_checkpoint(kafka, postgres, pg_schema,  # type: ignore[no-untyped-def]
                                                            topics, topic_name, tmp_path
                                                            ) -> None:
    producer = _Producer(kafka.bootstrap_servers, topics)
    producer.send(3000)
    port = free_port()
    group = f"g-{topic_name}"
    config = write_config(tmp_path / "pipeline.yaml", topics, pg_schema, group,
                          tmp_path / "ck", port, log_format="json",
                          transactions={"max_events": 100, "max_delay_ms": 200},
                          batch_transactions=2, shutdown_timeout_s=45)
    service = ServiceProcess(config, {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                                      "DATABASE_URL": postgres.url}, tmp_path / "run.log")
    body = service.wait_for_metrics(
        port, lambda body: (metric(body, "txstream_transactions_committed_total") or 0) > 0,
        timeout=600)
    committed = metric(body, "txstream_last_committed_transaction")
    stop_sent = time.monotonic()
    service.proc.send_signal(signal.SIGTERM)
    assert service.wait(timeout=90) == 0, service.tail()
    assert time.monotonic() - stop_sent < 45
    manifests = sorted((tmp_path / "ck" / group).glob("ckpt-*/MANIFEST.json"))
    assert manifests, f"no final checkpoint:\n{service.tail()}"
    checkpointed = json.loads(manifests[-1].read_text())["transaction"]
    assert committed and checkpointed >= committed, "the checkpoint is through the last commit"
    assert checkpointed < 30, "stopped mid-run: 3000 events make 30 transactions"
    # Structured logs on request: every log line of the run is a JSON object.
    lines = [line for line in service.log_path.read_text().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert any("SIGTERM" in r.get("message", "") for r in records)


def test_a_start_from_scratch_refuses_sinks_holding_an_earlier_run(  # type: ignore[no-untyped-def]
        kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path) -> None:
    config = _config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                     f"g-{topic_name}", tmp_path / "ck")
    open_runner(config, spark=spark).close()  # creates the tables, writes nothing
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(sql.SQL('INSERT INTO {} (customer_id, "time", "diff") VALUES (1, 7, 1)')
                     .format(sql.Identifier(pg_schema, "customer_stats")))
    # The checkpoint location is lost (a new volume, a renamed consumer group...).
    lost = config.model_copy(update={"checkpoint_dir": str(tmp_path / "new")})
    with pytest.raises(EarlierOutputError) as info:
        open_runner(lost, spark=spark)
    message = str(info.value)
    assert f"table {pg_schema}.customer_stats" in message and "#7" in message
    assert "mode: replace" in message and "paid_orders" not in message
    with psycopg.connect(postgres.url, autocommit=True) as conn:  # as a run would leave it
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, 'p', 9, '{{}}', '{{}}', now())").format(
            sql.Identifier(pg_schema, "txstream_progress")), [config.consumer_group])
    with pytest.raises(EarlierOutputError, match=f"progress row of pipeline "
                       f"'{config.consumer_group}' says .* up to #9"):
        open_runner(lost, spark=spark)
    rebuilt = lost.model_copy(update={"sinks": [
        s.model_copy(update={"settings": s.settings.model_copy(update={"mode": "replace"})})
        for s in lost.sinks]})
    open_runner(rebuilt, spark=spark).close()  # every table and the progress row start over
    open_runner(lost, spark=spark).close()


def test_an_expression_failing_on_the_data_halts_without_a_restart_loop(  # type: ignore[no-untyped-def]
        kafka, postgres, pg_schema, topic_name, tmp_path) -> None:
    kafka.create_topic(topic_name, 1)
    port = free_port()
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": "halting_pipeline:pipeline", "consumer_group": f"g-{topic_name}",
        "http_port": port, "checkpoint_dir": str(tmp_path / "ck"), "stall_timeout_s": 1,
        "sources": [{"name": "events", "topic": topic_name, "schema": {
            "columns": [{"name": "k", "type": "bigint"}, {"name": "v", "type": "bigint"}],
            "primary_key": ["k"]}}],
        "sinks": [{"output": "ratios", "db_schema": pg_schema}],
        "transactions": {"max_events": 1, "max_delay_ms": 100}}))
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for k, v in [(1, 4), (2, 0), (3, 5)]:
        producer.produce(topic_name, value=json.dumps({"k": k, "v": v}).encode())
    assert producer.flush(10) == 0
    service = ServiceProcess(config, {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                                      "DATABASE_URL": postgres.url,
                                      "PYTHONPATH": str(ROOT / "tests")}, tmp_path / "run.log")
    body = service.wait_for_metrics(port, lambda body: metric(body, "txstream_halted") == 1,
                                    timeout=300)
    assert metric(body, "txstream_transactions_committed_total") == 1  # the one before it
    time.sleep(2)  # past stall_timeout_s: halted is not stuck, a restart would not help
    assert scrape(port, "/healthz") == (200, "ok\n")
    status, ready = scrape(port, "/readyz")
    assert status == 503 and "halted" in ready and "DIV" not in ready
    assert service.proc.poll() is None, "the process stays up"
    log = service.tail(20000)
    assert "table select(k, q) of source events (expression `100 DIV v`)" in log
    with psycopg.connect(postgres.url) as conn:
        rows = conn.execute(sql.SQL('SELECT k, q FROM {}').format(
            sql.Identifier(pg_schema, "ratios_live"))).fetchall()
    assert rows == [(1, 25)]
    service.proc.send_signal(signal.SIGTERM)
    assert service.wait(timeout=60) == 0, service.tail()


def test_a_live_subscriber_follows_the_service_across_a_restart(  # type: ignore[no-untyped-def]
    kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path
) -> None:
    """A keyed output with a live sink, subscribed over Arrow Flight while the service runs:
    every update fits the subscriber's mirror, which ends equal to the from-scratch result;
    after a restart the table is back with the same row keys, and a new subscriber follows."""
    config = _config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                     f"g-{topic_name}", tmp_path / "ck")
    config = config.model_copy(update={
        "sinks": [*config.sinks,
                  SinkConfig.model_validate({"output": "customer_stats", "kind": "live"})],
        "live": LiveServing(host="127.0.0.1", port=0, token=SecretStr("t0ken"))})
    producer = _Producer(kafka.bootstrap_servers, topics)

    def follow(port: int, events: int) -> tuple[pa.Table, list[int]]:
        """Run until `events` are committed; the mirror of a subscriber and the transactions
        of its updates."""
        client = LiveClient(f"grpc+tcp://127.0.0.1:{port}", token="t0ken")
        seen: list[int] = []
        subscription = client.subscribe("customer_stats")
        reader = threading.Thread(target=lambda: [seen.append(u.transaction)
                                                  for u in subscription], daemon=True)
        reader.start()
        with _Background(runner) as loop:
            loop.wait("all events committed", loop.drained(events))
            table = runner.live.table("customer_stats")  # type: ignore[union-attr]
            loop.wait("the subscriber caught up",
                      lambda: subscription.mirror.transaction == table.transaction)
        subscription.close()
        reader.join(30)
        return subscription.mirror.rows(), seen

    def rows_of(table: pa.Table) -> set[tuple[Any, ...]]:
        return {tuple(r.values()) for r in table.select(
            ["customer_id", "name", "n_orders", "total"]).to_pylist()}

    producer.send(300)
    runner = open_runner(config, spark=spark)
    server = serve_live(config, runner.live)  # type: ignore[arg-type]
    try:
        mirrored, seen = follow(server.port, 300)
        assert seen[0] == 0 and len(seen) > 1 and seen == sorted(set(seen))
        assert runner.progress.live_table_bytes > 0
        metrics = render_metrics(runner.progress, runner.readiness)
        assert metric(metrics, "txstream_live_table_bytes") == runner.progress.live_table_bytes
        assert rows_of(mirrored) == expected_tables(producer.world)["customer_stats"]
        assert runner.checkpoint()
        before = runner.live.snapshot("customer_stats").rows  # type: ignore[union-attr]
    finally:
        server.shutdown()
        runner.close()

    runner = open_runner(config, spark=spark)
    server = serve_live(config, runner.live)  # type: ignore[arg-type]
    try:
        restored = LiveClient(f"grpc+tcp://127.0.0.1:{server.port}", token="t0ken")
        rows, transaction = restored.snapshot("customer_stats")
        assert transaction == runner.progress.last_transaction
        assert same_rows(rows, before)  # the same rows under the same row keys
        producer.send(200)
        mirrored, _ = follow(server.port, 200)  # counted since this start
        assert rows_of(mirrored) == expected_tables(producer.world)["customer_stats"]
        assert runner.checkpoint()
    finally:
        server.shutdown()
        runner.close()

    # The saved table lost (a state_dir on storage that did not survive): the replay after
    # the checkpoint cannot rebuild it, and the service says so instead of serving a part.
    shutil.rmtree(config.live_state_dir)
    with pytest.raises(CheckpointError, match=r"output 'customer_stats' \(live .*checkpoint"):
        open_runner(config, spark=spark)


def test_the_live_table_page_shows_a_produced_change_in_a_browser(  # type: ignore[no-untyped-def]
    kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path
) -> None:
    """The service's /ui in headless Chromium: events produced to Kafka reach the rows the page
    shows (those of the first viewport, compared with the from-scratch result), and a
    screenshot is saved."""
    config = _config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                     f"g-{topic_name}", tmp_path / "ck")
    config = config.model_copy(update={"sinks": [
        *config.sinks, SinkConfig.model_validate({"output": "customer_stats", "kind": "live"})]})
    producer = _Producer(kafka.bootstrap_servers, topics)
    producer.send(150)
    runner = open_runner(config, spark=spark)
    assert runner.live is not None
    health = HealthServer(0, runner.progress, runner.readiness, "127.0.0.1").start()
    health.serve_live(runner.live)
    browser = Browser(tmp_path / "profile")
    shown = "[...document.querySelectorAll('#grid .row')].map(r => r.innerText.split('\\n'))"

    def page_matches() -> Callable[[], bool]:
        """Whether the page shows the from-scratch rows of the customers it shows."""
        want = {(str(cid), name, str(n), Decimal(total))
                for cid, name, n, total in expected_tables(producer.world)["customer_stats"]}

        def check() -> bool:
            rows = browser.evaluate(shown) or []
            return bool(rows) and all((cid, name, n, Decimal(total)) in want
                                      for cid, name, n, total in rows)
        return check

    try:
        with _Background(runner) as loop:
            loop.wait("all events committed", loop.drained(150))
            browser.open(f"http://127.0.0.1:{health.port}/ui")
            loop.wait("the page shows the table", page_matches(), timeout=60)
            before = {tuple(r) for r in browser.evaluate(shown)}
            producer.send(60)
            loop.wait("the page shows the new rows", page_matches(), timeout=60)
            after = {tuple(r) for r in browser.evaluate(shown)}
            assert after != before, "the events changed rows the page shows"
            shot = browser.screenshot(tmp_path / "live_page.png")
            assert shot.stat().st_size > 1000
    finally:
        browser.close()
        health.stop()
        runner.close()
