"""Two `txstream run` processes on one pipeline: the second waits as a standby (`/readyz` 503
`standby`) while the first writes; it takes over after a kill -9 of the first, or after the
first was paused past its lease (SIGSTOP), which, resumed, is fenced and writes nothing more.
Either way the tables end equal to a from-scratch computation, the append table holding every
change exactly once. A pipeline with file sinks only has no lease: a second instance takes the
checkpoint location's next epoch, which fences the first, and the files of the two hold every
change once between them."""

from __future__ import annotations

import json
import signal
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from support.orders import OrderProducer, expected_tables, snapshot_tables, write_config
from support.service_process import ServiceProcess, metric, scrape

from txstream.service.embedded.postgres import PostgresEndpoint, free_port


def committed(body: str) -> bool:
    return (metric(body, "txstream_transactions_committed_total") or 0) > 0


def start_pair(kafka, postgres: PostgresEndpoint, pg_schema: str,  # type: ignore[no-untyped-def]
               topics: dict[str, str], group: str, tmp_path: Path
               ) -> tuple[OrderProducer, list[int], ServiceProcess, ServiceProcess]:
    """An active instance that committed a first batch and a standby that reports so."""
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(1500)
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "DATABASE_URL": postgres.url}
    ports = [free_port(), free_port()]
    configs = [write_config(tmp_path / f"pipeline-{i}.yaml", topics, pg_schema, group,
                            tmp_path / "ck", port, batch_transactions=2,
                            transactions={"max_events": 100, "max_delay_ms": 200},
                            checkpoint_every_batches=3)
               for i, port in enumerate(ports)]
    active = ServiceProcess(configs[0], env, tmp_path / "active.log")
    active.wait_for_metrics(ports[0], committed, timeout=600)
    standby = ServiceProcess(configs[1], env, tmp_path / "standby.log")
    standby.wait_for_log("standby: pipeline", timeout=600)
    assert scrape(ports[1], "/readyz") == (503, "not ready: standby\n")
    assert scrape(ports[1], "/healthz")[0] == 200
    producer.send(700)  # bursts of irregular size, while the active one writes
    time.sleep(1.5)
    producer.send(130)
    return producer, ports, active, standby


def assert_exactly_once(postgres: PostgresEndpoint, pg_schema: str, producer: OrderProducer,
                        writer: ServiceProcess) -> None:
    want = expected_tables(producer.world)
    deadline = time.monotonic() + 300
    while snapshot_tables(postgres.url, pg_schema) != want:
        assert time.monotonic() < deadline, writer.tail()
        time.sleep(1)
    with psycopg.connect(postgres.url) as conn:
        held = conn.execute(sql.SQL(
            "SELECT region, orders, revenue, min_amount, max_amount, sum(diff) FROM {}"
            " GROUP BY 1, 2, 3, 4, 5 HAVING sum(diff) <> 0").format(
                sql.Identifier(pg_schema, "region_totals_changes"))).fetchall()
        writers = conn.execute(sql.SQL("SELECT epoch, pid FROM {}").format(
            sql.Identifier(pg_schema, "txstream_writers"))).fetchall()
    assert set(held) == {(*row, 1) for row in want["region_totals"]}, "exactly once"
    assert writers == [(2, writer.proc.pid)]


def stop(service: ServiceProcess) -> None:
    service.proc.send_signal(signal.SIGTERM)
    assert service.wait(timeout=90) == 0, service.tail()


def test_a_standby_takes_over_from_a_killed_instance(  # type: ignore[no-untyped-def]
        kafka, postgres, pg_schema, topics, topic_name, tmp_path) -> None:
    producer, ports, active, standby = start_pair(kafka, postgres, pg_schema, topics,
                                                  f"g-{topic_name}", tmp_path)
    try:
        active.kill()
        assert active.wait(timeout=30) == -signal.SIGKILL
        killed = time.monotonic()
        producer.send(420)
        standby.wait_for_metrics(ports[1], committed, timeout=600)
        print(f"takeover: {time.monotonic() - killed:.1f}s from kill -9 to the standby's "
              f"first commit; cold start: {killed - active.started:.1f}s")
        assert_exactly_once(postgres, pg_schema, producer, standby)
        assert scrape(ports[1], "/readyz")[0] == 200
        stop(standby)
    finally:
        active.kill()
        standby.kill()


def test_a_paused_instance_is_fenced_and_writes_nothing_after_waking(  # type: ignore[no-untyped-def]
        kafka, postgres, pg_schema, topics, topic_name, tmp_path) -> None:
    producer, ports, active, standby = start_pair(kafka, postgres, pg_schema, topics,
                                                  f"g-{topic_name}", tmp_path)
    try:
        active.proc.send_signal(signal.SIGSTOP)
        producer.send(300)
        standby.wait_for_metrics(ports[1], committed, timeout=600)  # after the 10 s lease
        active.proc.send_signal(signal.SIGCONT)
        producer.send(250)  # work for both: only the standby's commits
        active.wait_for_log("fenced: pipeline", timeout=300)
        assert scrape(ports[0], "/readyz") == (503, "not ready: fenced\n")
        assert metric(scrape(ports[0])[1], "txstream_fenced_total") == 1
        assert_exactly_once(postgres, pg_schema, producer, standby)
        stop(active)
        stop(standby)
    finally:
        active.proc.send_signal(signal.SIGCONT)
        active.kill()
        standby.kill()


def file_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
        else []


def integrate(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """The paid_orders rows a change file leaves, as expected_tables has them."""
    held: dict[tuple[Any, ...], int] = {}
    for r in rows:
        key = (r["order_id"], r["customer_id"], r["region"], Decimal(r["amount"]))
        held[key] = held.get(key, 0) + r["diff"]
    assert all(n in (0, 1) for n in held.values()), "a change twice"
    return {key for key, n in held.items() if n}


def test_file_sinks_are_fenced_through_the_checkpoint_location(  # type: ignore[no-untyped-def]
        kafka, topics, topic_name, tmp_path) -> None:
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(1500)
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers}
    ports = [free_port(), free_port()]
    files = [tmp_path / "paid-0.jsonl", tmp_path / "paid-1.jsonl"]
    configs = [write_config(tmp_path / f"pipeline-{i}.yaml", topics, "unused", f"g-{topic_name}",
                            tmp_path / "ck", port, batch_transactions=2,
                            transactions={"max_events": 100, "max_delay_ms": 200},
                            checkpoint_every_batches=3,
                            sinks=[{"output": "paid_orders", "kind": "file", "path": str(path)}])
               for i, (port, path) in enumerate(zip(ports, files, strict=True))]
    first = ServiceProcess(configs[0], env, tmp_path / "first.log")
    second: ServiceProcess | None = None
    try:
        # Caught up, so that no checkpoint of the first prunes the one the second restores.
        first.wait_for_metrics(ports[0], lambda body: committed(body) and metric(
            body, "txstream_lag_records") == 0, timeout=600)
        second = ServiceProcess(configs[1], env, tmp_path / "second.log")
        second.wait_for_log("took checkpoint epoch 2", timeout=600)
        producer.send(300)  # the first one's next batch finds the epoch moved on
        first.wait_for_log("fenced: pipeline at", timeout=300)
        assert scrape(ports[0], "/readyz") == (503, "not ready: fenced\n")
        assert metric(scrape(ports[0])[1], "txstream_fenced_total") == 1
        assert scrape(ports[0], "/healthz")[0] == 200  # waits, not restarted into a fence
        written_by_first = file_rows(files[0])
        producer.send(250)
        want = expected_tables(producer.world)["paid_orders"]
        deadline = time.monotonic() + 300
        while True:
            # The second resumed after the first's last checkpoint: it wrote the transactions
            # since then again (same numbers, same changes), and every later one.
            resumed_at = min((r["time"] for r in file_rows(files[1])), default=None)
            rows = [r for r in written_by_first if resumed_at is None or r["time"] < resumed_at]
            if resumed_at is not None and integrate(rows + file_rows(files[1])) == want:
                break
            assert time.monotonic() < deadline, second.tail()
            time.sleep(1)
        assert file_rows(files[0]) == written_by_first, "the fenced instance wrote on"
        stop(first)
        stop(second)  # with a final checkpoint, of epoch 2
        manifests = [json.loads(m.read_text())
                     for m in (tmp_path / "ck" / f"g-{topic_name}").glob("ckpt-*/MANIFEST.json")]
        assert max(manifests, key=lambda m: m["transaction"])["epoch"] == 2
    finally:
        first.kill()
        if second is not None:
            second.kill()
