"""`txstream run` as a process: SIGTERM while processing exits 0 with a final checkpoint and
structured logs, and a stop outlasting `shutdown_timeout_s` exits 3 without one; an expression
failing on the data halts the process, up and not ready, instead of a restart loop; the live
page refuses a request without its token while the service is still starting."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import psycopg
import yaml
from confluent_kafka import Producer
from psycopg import sql
from support.orders import OrderProducer, write_config
from support.service_process import ROOT, ServiceProcess, metric, scrape

from txstream.service.cli import EXIT_NO_FINAL_CHECKPOINT
from txstream.service.embedded.postgres import free_port


def test_sigterm_while_processing_exits_0_with_a_checkpoint(kafka, postgres, pg_schema,  # type: ignore[no-untyped-def]
                                                            topics, topic_name, tmp_path
                                                            ) -> None:
    producer = OrderProducer(kafka.bootstrap_servers, topics)
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

def test_a_shutdown_outlasting_its_timeout_exits_3_and_says_what_it_did_not_checkpoint(  # type: ignore[no-untyped-def]
        kafka, postgres, pg_schema, topics, topic_name, tmp_path) -> None:
    """The watchdog ends a stop that takes longer than `shutdown_timeout_s` (here any stop:
    no final checkpoint is written in a millisecond) with its own status, not 0."""
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(300)
    port = free_port()
    config = write_config(tmp_path / "pipeline.yaml", topics, pg_schema, f"g-{topic_name}",
                          tmp_path / "ck", port, shutdown_timeout_s=0.001,
                          # No checkpoint while idle either: the stop has one to write.
                          checkpoint_when_idle_s=0)
    service = ServiceProcess(config, {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                                      "DATABASE_URL": postgres.url}, tmp_path / "run.log")
    body = service.wait_for_metrics(
        port, lambda body: (metric(body, "txstream_transactions_committed_total") or 0) > 0,
        timeout=600)
    committed = int(metric(body, "txstream_last_committed_transaction") or 0)
    service.proc.send_signal(signal.SIGTERM)
    assert service.wait(timeout=60) == EXIT_NO_FINAL_CHECKPOINT, service.tail()
    assert not list((tmp_path / "ck").glob("*/ckpt-*/MANIFEST.json")), "no final checkpoint"
    said = re.search(r"shutdown took longer than shutdown_timeout_s \(0.001s\): exiting with "
                     r"status 3 without a final checkpoint \(last committed transaction #(\d+), "
                     r"last checkpointed #0\): transactions #1 to #(\d+) are committed to the "
                     r"sinks but in no checkpoint; the next start replays them", service.tail())
    assert said, service.tail()
    assert int(said[1]) == int(said[2]) >= committed


def test_an_expression_failing_on_the_data_halts_without_a_restart_loop(  # type: ignore[no-untyped-def]
        kafka, postgres, pg_schema, topic_name, tmp_path) -> None:
    kafka.create_topic(topic_name, 1)
    port = free_port()
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": "support.halting_pipeline:pipeline", "consumer_group": f"g-{topic_name}",
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


def test_the_live_page_refuses_without_its_token_while_the_service_starts(
        tmp_path: Path) -> None:
    """Before the runner exists (Spark starting, Kafka not answering: the live tables are not
    attached yet) `/ui` already asks for the token, like every other `/ui` path; it shows
    the status only to those who give it."""
    port = free_port()
    token = "st4rting+t0ken"
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": "support.halting_pipeline:pipeline", "http_port": port,
        "checkpoint_dir": str(tmp_path / "ck"),
        "sources": [{"name": "events", "topic": "events", "schema": {
            "columns": [{"name": "k", "type": "bigint"}, {"name": "v", "type": "bigint"}],
            "primary_key": ["k"]}}],
        "sinks": [{"output": "ratios", "kind": "live"}]}))
    service = ServiceProcess(config, {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
                                      "TXSTREAM_LIVE__TOKEN": token,
                                      "PYTHONPATH": str(ROOT / "tests")}, tmp_path / "run.log")
    try:
        service.wait_for_metrics(port, lambda body: "txstream_ready 0" in body, timeout=60)
        assert scrape(port, "/readyz") == (503, "not ready: starting\n")
        for path in ("/ui", "/ui/tables", "/ui/events?table=ratios"):
            status, body = scrape(port, path)
            assert (status, body) == (
                401, "the live tables need their token: open /ui?token=<token>\n"), path
        status, body = scrape(port, f"/ui/tables?token={token}")
        assert status == 200
        assert json.loads(body) == {"tables": [], "status": {
            "ready": False, "problems": ["starting"], "last_transaction": 0,
            "lag_records": 0, "events": 0}}
    finally:
        service.kill()
        service.wait(timeout=30)

