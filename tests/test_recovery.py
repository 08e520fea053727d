"""Crash recovery: `txstream run` in a subprocess over 50,000 events, killed with SIGKILL at
chosen points (mid sink write, mid checkpoint, right after a checkpoint, before the offset
commit, right after logging a batch), then at random moments while it works through 10,000 more
events produced before each such life, restarted each time, then stopped with SIGTERM. The
PostgreSQL snapshots and the saved live table must equal a from-scratch computation of the
inputs, the append stream must integrate to the same table, and no transaction number may have
been given to different content.

Real parts only: the broker process and PostgreSQL of the session fixtures, Spark in the
subprocess. The helpers are in tests/support.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import yaml
from support.orders import (
    OUTPUT_COLUMNS,
    OrderProducer,
    expected_tables,
    snapshot_tables,
    write_config,
)
from support.service_process import ServiceProcess, metric

from txstream.service.embedded.postgres import free_port

EVENTS = 50_000
# Produced before each life killed at a random moment: a batch to replay, compute, write and
# checkpoint, for the kill to land in (the first 50,000 are done by then).
LIFE_EVENTS = 10_000


def logged_transactions(location: Path) -> dict[int, str]:
    """Transaction number -> its logged identity (offset ranges), from the transaction log."""
    found: dict[int, str] = {}
    for file in sorted((location / "txlog").glob("*.json")):
        for entry in json.loads(file.read_text()):
            found[entry["number"]] = json.dumps(entry, sort_keys=True)
    return found


def test_kill_9_at_random_points_then_snapshot_equals_from_scratch(
        kafka, postgres, pg_schema, topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topics = {"customers": f"{topic_name}-customers", "orders": f"{topic_name}-orders"}
    kafka.create_topic(topics["customers"], 1)
    kafka.create_topic(topics["orders"], 3)
    producer = OrderProducer(kafka.bootstrap_servers, topics, seed=11, customers=200)
    producer.send(EVENTS)
    port = free_port()
    group = f"g-{topic_name}"
    checkpoints = tmp_path / "checkpoints"
    # 25,000 events per Spark batch: Spark's cost is mostly per job, and every life restarts
    # Spark, so few large batches keep the test within minutes.
    config = write_config(tmp_path / "pipeline.yaml", topics, pg_schema, group, checkpoints,
                          port, transactions={"max_events": 5000, "max_delay_ms": 1000},
                          batch_transactions=5, live={"host": "127.0.0.1", "port": 0})
    with_live = yaml.safe_load(config.read_text())
    with_live["sinks"].append({"output": "customer_stats", "kind": "live"})
    config.write_text(yaml.safe_dump(with_live))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "DATABASE_URL": postgres.url,
           # Overrides from the environment: a checkpoint after every batch, so lives resume
           # from checkpoints and one of them is killed while writing one.
           "TXSTREAM_CHECKPOINT_EVERY_BATCHES": "1"}
    rng = random.Random(5)
    # Crash points first, each reached in its life: after the first batch's PostgreSQL
    # transaction (every output table and the progress row; offsets not committed), the first
    # checkpoint (data written, manifest not), after the sinks of the second batch (offsets
    # not committed), right after the next checkpoint (the live table saved before it).
    # Then kills at random moments after a restore, with a new backlog: during a replay, a
    # batch, a PostgreSQL write or a checkpoint, wherever they fall.
    lives: list[str | float] = ["sink_write:1", "checkpoint:1", "commit:2", "checkpointed:1",
                                rng.uniform(0, 20), rng.uniform(0, 20)]
    history: dict[int, str] = {}
    log_path = tmp_path / "txstream.log"
    for life in lives:
        crash = {"TXSTREAM_CRASH_AT": life} if isinstance(life, str) else {}
        if isinstance(life, float):
            producer.send(LIFE_EVENTS)
        service = ServiceProcess(config, {**env, **crash}, log_path, warm_up=True)
        if isinstance(life, float):
            service.wait_for_log("resuming after transaction", timeout=600)
            time.sleep(life)
            service.kill()
        code = service.wait(timeout=900)
        assert code == -signal.SIGKILL, f"life {life}: exit {code}\n{service.tail()}"
        for number, identity in logged_transactions(checkpoints / group).items():
            assert history.setdefault(number, identity) == identity, (
                f"transaction #{number} re-formed differently after a crash: "
                f"{history[number]} then {identity}")

    service = ServiceProcess(config, env, log_path, warm_up=True)
    service.wait_for_metrics(
        port, lambda body: metric(body, "txstream_lag_records") == 0
        and metric(body, "txstream_ready") == 1, timeout=900)
    stop_sent = time.monotonic()
    service.proc.send_signal(signal.SIGTERM)
    assert service.wait(timeout=90) == 0, service.tail()
    assert time.monotonic() - stop_sent < 40, "SIGTERM: exit within shutdown_timeout_s (25 s)"
    for number, identity in logged_transactions(checkpoints / group).items():
        assert history.setdefault(number, identity) == identity

    want = expected_tables(producer.world)
    got = snapshot_tables(postgres.url, pg_schema)
    live = pq.read_table(checkpoints / group / "live" / "customer_stats.parquet")
    got["customer_stats (live)"] = {tuple(r.values()) for r in live.select(
        ["customer_id", "name", "n_orders", "total"]).to_pylist()}
    want["customer_stats (live)"] = want["customer_stats"]
    for name in [*OUTPUT_COLUMNS, "customer_stats (live)"]:
        assert got[name] == want[name], f"{name}: snapshot differs from a from-scratch " \
            f"computation: missing {sorted(want[name] - got[name])[:5]}, extra " \
            f"{sorted(got[name] - want[name])[:5]}"
    with psycopg.connect(postgres.url) as conn:
        changes = conn.execute(
            f'SELECT region, orders, revenue, min_amount, max_amount, time, diff FROM '
            f'"{pg_schema}".region_totals_changes').fetchall()
        last = conn.execute(
            f'SELECT max(time) FROM "{pg_schema}".customer_stats').fetchone()
        progress = conn.execute(
            f'SELECT "transaction" FROM "{pg_schema}".txstream_progress WHERE pipeline = %s',
            [group]).fetchone()
    # The append stream: each (row, time) once, and integrated it is the from-scratch table.
    keyed = [(tuple(c[:5]), c[5]) for c in changes]
    assert len(keyed) == len(set(keyed)), "a change appended twice"
    weights: dict[tuple[Any, ...], int] = {}
    for (row, _), (*_, diff) in zip(keyed, changes, strict=True):
        weights[row] = weights.get(row, 0) + diff
    assert {row for row, w in weights.items() if w} == want["region_totals"]
    assert all(w in (0, 1) for w in weights.values())
    # The final checkpoint (SIGTERM) is through the last committed transaction.
    manifests = sorted((checkpoints / group).glob("ckpt-*/MANIFEST.json"))
    assert manifests and last is not None
    assert json.loads(manifests[-1].read_text())["transaction"] >= last[0]
    # The progress row names the transaction the tables reflect: the last one committed.
    assert progress is not None
    assert progress[0] == json.loads(manifests[-1].read_text())["transaction"] >= last[0]
    assert len(manifests) <= 2, "old checkpoints are deleted (2 kept)"
