"""The runner in-process against real parts: `/readyz` and `/metrics` through a run and a
graceful stop, `txstream check`, the stages surviving a paused broker and a PostgreSQL restart
without losing anything, a start from scratch refusing an earlier run's output, and a live
subscriber following the service across a restart.

About the broker: the embedded one is librdkafka's mock cluster, which keeps its topics in
memory, so a broker *restart* loses them and cannot be tested meaningfully here. What is
tested is the broker becoming unreachable (its process paused with SIGSTOP: connections hang,
requests time out) and reachable again (SIGCONT) with its data intact.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from pydantic import SecretStr
from support.orders import OrderProducer, expected_tables
from support.runner import Background, assert_snapshots, example_config
from support.service_process import ROOT, metric, scrape

from txstream.client import LiveClient
from txstream.schemas.config import LiveServing, SinkConfig
from txstream.service.check import run_checks
from txstream.service.checkpoint import CheckpointError
from txstream.service.cli import serve_live
from txstream.service.compose import open_runner
from txstream.service.embedded.postgres import EmbeddedPostgres
from txstream.service.health import HealthServer, metrics_text
from txstream.service.startup import EarlierOutputError
from txstream.updates import same_rows


def test_readyz_metrics_and_graceful_stop(kafka, postgres, spark, pg_schema, topics,  # type: ignore[no-untyped-def]
                                          topic_name, tmp_path) -> None:
    config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                            f"g-{topic_name}", tmp_path / "ck")
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(400)
    runner = open_runner(config, spark=spark)
    health = HealthServer(0, runner.metrics, runner.readiness, host="127.0.0.1").start()
    try:
        assert scrape(health.port, "/healthz") == (200, "ok\n")
        assert scrape(health.port, "/readyz") == (503, "not ready: starting\n")
        with Background(runner) as loop:
            loop.wait("all events committed", loop.drained(400))
            latency = runner.metrics.source.end_to_end_seconds
            loop.wait("a latency sample", lambda: latency.count > 0)
            assert scrape(health.port, "/readyz") == (200, "ready\n")
            status, body = scrape(health.port, "/metrics")
        assert status == 200
        assert runner.checkpoint(), "the graceful stop's checkpoint"
        _, after = scrape(health.port, "/metrics")
    finally:
        health.stop()
        runner.close()
    last = runner.metrics.delivery.last_transaction
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
    assert_snapshots(postgres.url, pg_schema, producer.world)

    # A restart resumes from that checkpoint: nothing to replay, the same numbering goes on.
    producer.send(50)
    again = open_runner(config, spark=spark)
    try:
        assert again.metrics.checkpoint.last_transaction == last
        again.run(until=lambda r: r.lag() == 0)
        assert again.metrics.ingest.events == 50, "only the new records are read"
        assert again.metrics.delivery.last_transaction > last
    finally:
        again.close()
    assert_snapshots(postgres.url, pg_schema, producer.world)

def test_txstream_check_reports_each_part(kafka, postgres, spark, topics, topic_name,  # type: ignore[no-untyped-def]
                                          pg_schema, tmp_path) -> None:
    config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                            f"g-{topic_name}", tmp_path / "ck")
    results = {name: (ok, detail) for name, ok, detail in run_checks(config)}
    assert all(ok for ok, _ in results.values()), results
    assert results["outputs"][1] == ("no progress row of this pipeline: a start from scratch "
                                     "may write them")
    assert results["kafka"][1] == (f"{topics['customers']} (1 partitions), "
                                   f"{topics['orders']} (2 partitions)")
    assert "no checkpoint yet" in results["checkpoint"][1]
    broken = config.model_copy(update={"sources": [
        config.sources[0], config.sources[1].model_copy(update={"topic": "no-such-topic"})]})
    results = {name: (ok, detail) for name, ok, detail in run_checks(broken)}
    assert not results["kafka"][0]
    assert "topic(s) no-such-topic do not exist" in results["kafka"][1]
    assert results["pipeline"][0] and results["spark"][0]

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
    config = example_config(bootstrap, postgres.url, pg_schema, topics, f"g-{topic_name}",
                            tmp_path / "ck")
    producer = OrderProducer(bootstrap, topics)
    producer.send(200)
    runner = open_runner(config, spark=spark)
    try:
        with Background(runner) as loop:
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
    assert_snapshots(postgres.url, pg_schema, producer.world)

def test_postgres_restart_during_a_run(kafka, spark, topics, topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A server of this test's own, to stop and start; its directory must be reachable by the
    # `postgres` user the server runs as under root (pytest's tmp_path is not).
    base = Path(tempfile.mkdtemp(prefix="txstream-pg-"))
    base.chmod(0o755)
    pg = EmbeddedPostgres(base / "pgdata").start()
    try:
        config = example_config(kafka.bootstrap_servers, pg.url, "public", topics,
                                f"g-{topic_name}", tmp_path / "ck")
        producer = OrderProducer(kafka.bootstrap_servers, topics)
        producer.send(200)
        runner = open_runner(config, spark=spark)
        try:
            with Background(runner) as loop:
                loop.wait("the first events committed", loop.drained(200))
                pg.stop()
                producer.send(200)
                loop.wait("not ready: PostgreSQL unavailable",
                          lambda: any(p.startswith("postgresql unavailable")
                                      for p in loop.problems()), timeout=90)
                delivery = runner.metrics.delivery
                committed = delivery.transactions
                time.sleep(1)
                assert delivery.transactions == committed, "nothing commits meanwhile"
                pg.start()
                loop.wait("caught up after PostgreSQL came back", loop.drained(400), timeout=180)
        finally:
            runner.close()
        assert_snapshots(pg.url, "public", producer.world)
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)

def test_a_start_from_scratch_refuses_sinks_holding_an_earlier_run(  # type: ignore[no-untyped-def]
        kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path) -> None:
    config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
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
    # `txstream check` finds it too (the progress row: it opens no sink).
    checks = {name: (ok, detail) for name, ok, detail in run_checks(lost)}
    assert not checks["outputs"][0] and "EarlierOutputError" in checks["outputs"][1]
    assert "says its PostgreSQL outputs hold transactions up to #9" in checks["outputs"][1]
    rebuilt = lost.model_copy(update={"sinks": [
        s.model_copy(update={"settings": s.settings.model_copy(update={"mode": "replace"})})
        for s in lost.sinks]})
    open_runner(rebuilt, spark=spark).close()  # every table and the progress row start over
    open_runner(lost, spark=spark).close()

def test_a_live_subscriber_follows_the_service_across_a_restart(  # type: ignore[no-untyped-def]
    kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path
) -> None:
    """A keyed output with a live sink, subscribed over Arrow Flight while the service runs:
    every update fits the subscriber's mirror, which ends equal to the from-scratch result;
    after a restart the table is back with the same row keys, and a new subscriber follows."""
    config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                            f"g-{topic_name}", tmp_path / "ck")
    config = config.model_copy(update={
        "sinks": [*config.sinks,
                  SinkConfig.model_validate({"output": "customer_stats", "kind": "live"})],
        "live": LiveServing(host="127.0.0.1", port=0, token=SecretStr("t0ken"))})
    producer = OrderProducer(kafka.bootstrap_servers, topics)

    def follow(port: int, events: int) -> tuple[pa.Table, list[int]]:
        """Run until `events` are committed; the mirror of a subscriber and the transactions
        of its updates."""
        client = LiveClient(f"grpc+tcp://127.0.0.1:{port}", token="t0ken")
        seen: list[int] = []
        subscription = client.subscribe("customer_stats")
        reader = threading.Thread(target=lambda: [seen.append(u.transaction)
                                                  for u in subscription], daemon=True)
        reader.start()
        with Background(runner) as loop:
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
        live_bytes = runner.metrics.delivery.live_table_bytes
        assert live_bytes > 0
        metrics = metrics_text(runner.metrics, runner.readiness)
        assert metric(metrics, "txstream_live_table_bytes") == live_bytes
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
        assert transaction == runner.metrics.delivery.last_transaction
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
