"""Crash recovery: `txstream run` in a subprocess over 50,000 events, killed with SIGKILL at
chosen points (mid sink write, mid checkpoint, right after a checkpoint, before the offset
commit, right after logging a batch) and at random moments, restarted each time, then stopped
with SIGTERM. The PostgreSQL snapshots and the saved live table must equal a from-scratch
computation of the inputs, the append stream must integrate to the same table, and no
transaction number may have been given to different content.

Real parts only: the broker process and PostgreSQL of the session fixtures, Spark in the
subprocess. Shared helpers (`ServiceProcess`, `scrape`) are used by test_service.py too.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import yaml
from confluent_kafka import Producer

from txstream.examples.order_events import OrderWorld, encode, events
from txstream.service.embedded.postgres import free_port

ROOT = Path(__file__).resolve().parent.parent
EVENTS = 50_000
Row = dict[str, Any]


def scrape(port: int, path: str = "/metrics", timeout: float = 5) -> tuple[int, str]:
    """(status, body) of the service's HTTP endpoint; (0, reason) when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def metric(body: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.MULTILINE)
    return float(m.group(1)) if m else None


class ServiceProcess:
    """`txstream run CONFIG` in a subprocess, with its output in a log file. Without the
    engine's warm-up unless `warm_up`: it costs each start of a cold JVM seconds, and the crash
    test below runs it."""

    def __init__(self, config: Path, env: dict[str, str], log_path: Path,
                 warm_up: bool = False) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in wait())
        self._log_start = self._log.tell()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "txstream.service.cli", "run", str(config),
             "--progress-interval", "5"],
            cwd=ROOT, env={**os.environ, "SPARK_DRIVER_MEMORY": "2g",
                           **({} if warm_up else {"TXSTREAM_WARM_UP_ROWS": "0"}), **env},
            stdout=self._log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"txstream run did not exit within {timeout}s; log:\n"
                                 f"{self.tail()}") from None
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def _until(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        """Poll `ok()` while the process runs; on failure kill it and show its log."""
        deadline = time.monotonic() + timeout
        while not ok():
            if self.proc.poll() is not None:
                raise AssertionError(f"txstream run exited ({self.proc.returncode}) before "
                                     f"{what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {what} within {timeout}s:\n{self.tail()}")
            time.sleep(0.5)

    def wait_for_metrics(self, port: int, ok: Callable[[str], bool], timeout: float) -> str:
        """Poll /metrics until `ok(body)`; the body."""
        last = [""]

        def check() -> bool:
            status, last[0] = scrape(port)
            return status == 200 and ok(last[0])

        self._until("/metrics condition", check, timeout)
        return last[0]

    def wait_for_log(self, text: str, timeout: float) -> None:
        """Until `text` appears in the log of this process."""
        self._until(repr(text), lambda: text in self.log_path.read_bytes()[
            self._log_start:].decode(errors="replace"), timeout)


def produce_orders(bootstrap: str, topics: dict[str, str], count: int, seed: int) -> OrderWorld:
    """`count` events of the example (customers, orders created, updated, moved, deleted)."""
    world = OrderWorld()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "enable.idempotence": True})
    stream = events(random.Random(seed), customers=200)
    for i in range(count):
        event = next(stream)
        key, value = encode(event)
        producer.produce(topics[event[0]], key=key, value=value)
        world.apply(event)
        if i % 5000 == 4999:
            producer.poll(0)
    assert producer.flush(60) == 0
    return world


def expected_tables(world: OrderWorld) -> dict[str, set[tuple[Any, ...]]]:
    """The example pipeline's outputs, computed from scratch in plain Python."""
    stats = {cid: [c["name"], 0, Decimal(0)] for cid, c in world.customers.items()}
    paid: list[tuple[Any, ...]] = []
    regions: dict[str, list[Decimal]] = {}
    for o in world.orders.values():
        customer = world.customers.get(o["customer_id"])
        if customer is None:
            continue
        stats[o["customer_id"]][1] += 1
        stats[o["customer_id"]][2] += o["amount"]
        if o["status"] == "paid":
            paid.append((o["order_id"], o["customer_id"], customer["region"], o["amount"]))
            regions.setdefault(customer["region"], []).append(o["amount"])
    return {
        "customer_stats": {(cid, name, count, total)
                           for cid, (name, count, total) in stats.items()},
        "paid_orders": set(paid),
        "region_totals": {(r, len(v), sum(v), min(v), max(v)) for r, v in regions.items()},
        "statuses": {(o["status"],) for o in world.orders.values()},
    }


_COLUMNS = {
    "customer_stats": "customer_id, name, n_orders, total",
    "paid_orders": "order_id, customer_id, region, amount",
    "region_totals": "region, orders, revenue, min_amount, max_amount",
    "statuses": "status",
}


def snapshot_tables(url: str, schema: str) -> dict[str, set[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: set(conn.execute(
            f'SELECT {cols} FROM "{schema}"."{name}_live"').fetchall())
            for name, cols in _COLUMNS.items()}


def write_config(path: Path, topics: dict[str, str], schema: str, group: str,
                 checkpoint_dir: Path, port: int, **extra: Any) -> Path:
    config = {
        "pipeline": "txstream.examples.orders:pipeline",
        "consumer_group": group,
        "http_port": port,
        "checkpoint_dir": str(checkpoint_dir),
        "sources": [
            {"name": "customers", "topic": topics["customers"], "semantics": "upsert",
             "schema": {"columns": [{"name": "customer_id", "type": "bigint"},
                                    {"name": "name", "type": "text"},
                                    {"name": "region", "type": "text"}],
                        "primary_key": ["customer_id"]}},
            {"name": "orders", "topic": topics["orders"], "semantics": "upsert",
             "schema": {"columns": [{"name": "order_id", "type": "bigint"},
                                    {"name": "customer_id", "type": "bigint"},
                                    {"name": "amount", "type": "decimal(12,2)"},
                                    {"name": "status", "type": "text"}],
                        "primary_key": ["order_id"]}},
        ],
        # `replace`: a restart that resumes from a checkpoint must keep the tables.
        "sinks": [{"output": name, "db_schema": schema, "mode": "replace"} for name in _COLUMNS]
        + [{"output": "region_totals", "kind": "postgres_append", "db_schema": schema,
            "table": "region_totals_changes"}],
        **extra,
    }
    path.write_text(yaml.safe_dump(config))
    return path


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
    world = produce_orders(kafka.bootstrap_servers, topics, EVENTS, seed=11)
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
    # Then kills at random moments after a restore: during a replay, a batch, a PostgreSQL
    # write or a checkpoint, wherever they fall.
    lives: list[str | float] = ["sink_write:1", "checkpoint:1", "commit:2", "checkpointed:1",
                                rng.uniform(0, 40), rng.uniform(0, 40)]
    history: dict[int, str] = {}
    log_path = tmp_path / "txstream.log"
    for life in lives:
        crash = {"TXSTREAM_CRASH_AT": life} if isinstance(life, str) else {}
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

    want = expected_tables(world)
    got = snapshot_tables(postgres.url, pg_schema)
    live = pq.read_table(checkpoints / group / "live" / "customer_stats.parquet")
    got["customer_stats (live)"] = {tuple(r.values()) for r in live.select(
        ["customer_id", "name", "n_orders", "total"]).to_pylist()}
    want["customer_stats (live)"] = want["customer_stats"]
    for name in [*_COLUMNS, "customer_stats (live)"]:
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
