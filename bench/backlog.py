"""A backlog as a running service meets it, Kafka to PostgreSQL, each system measured alike.

    produce FIRST_EVENTS ──> system starts, its table shows them, it is idle (+ SETTLE_S)
                              │ SIGSTOP (txstream: with its JVM)
    produce `events` more ───┤
                              │ SIGCONT ── timed ──> the table, polled every 10 ms, holds
                              ▼                      the workload's complete result

A `Workload` says what flows: its JSON events (one partition), the table they leave (a key and
value columns, computed by numpy for any prefix of the stream), the txstream pipeline and its
sources, and the Pathway peer's `--workload` (bench/peers/pathway_kafka_pg.py). The system is
done when the table's row count and the sums of its value columns equal those of the expected
table (values only grow towards them), then the whole table is checked against it (`verified`).

* `txstream_burst`: `txstream run` as a user deploys it (every setting but the transaction
  policy at its default), its busy seconds per stage over the backlog read from /metrics.
* `pathway_burst`: Pathway's `pw.io.kafka.read` in streaming mode to
  `pw.io.postgres.write_snapshot`, no callback.
* `bare_read_events_per_s`: a consumer reading the same backlog and doing nothing with it, the
  ceiling of the service's ingest on this machine.

Used by bench/end_to_end.py (the group-by workload) and bench/temporal_end_to_end.py (windows).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psycopg
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.service.embedded.postgres import free_port
from txstream.sources.transactions import FETCH_SETTINGS

# A sibling script, not a package: the service as a subprocess, and its log.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import Service

PEER = Path(__file__).resolve().parent / "peers" / "pathway_kafka_pg.py"
# Events waiting when a system starts, before the timed backlog: once its table shows them, it
# is running, connected, caught up, and its JVM (txstream's) has run batches of the workload,
# as a service that has been running has.
FIRST_EVENTS = 100_000
# How long a system may take to start, and to compute the backlog.
START_TIMEOUT_S, RUN_TIMEOUT_S = 900, 1800
# Idle time before the pause, for work the first events left (a checkpoint, the last writes).
SETTLE_S = 5.0
# The longest pause: librdkafka's consumer-group session times out after 45 s, and Pathway's
# consumer (a group member) would then rejoin and read the topic again from its beginning.
LONGEST_PAUSE_S = 30.0
# The invariant checks' seconds, beside the stages' busy seconds (part of compute's).
CHECKS = "invariant_checks"

Table = dict[tuple[int, ...], tuple[int, ...]]
Totals = tuple[int, ...]


@dataclass(frozen=True)
class Workload:
    """What flows through a system: `events(first, end)` are the JSON values of events number
    `first` to `end` (excluded); `expected(end)` the table after the first `end` events, {key
    columns: value columns}; `pipeline` ("module:function") and `sources(topic)` the txstream
    pipeline, whose `output` is a snapshot keyed by `key`; `peer` the Pathway peer's
    `--workload`."""

    name: str
    events: Callable[[int, int], Iterator[bytes]]
    expected: Callable[[int], Table]
    key: tuple[str, ...]
    values: tuple[str, ...]
    pipeline: str
    sources: Callable[[str], Sequence[SourceSpec]]
    output: str
    peer: str

    def totals(self, table: Table) -> Totals:
        """`table`'s row count and the sum of each value column: what `TableWatcher` reads."""
        return len(table), *(sum(values[i] for values in table.values())
                             for i in range(len(self.values)))

    def read(self, url: str, table: str) -> Table:
        columns = ", ".join((*self.key, *self.values))
        with psycopg.connect(url) as conn:
            rows = conn.execute(f"SELECT {columns} FROM {table}").fetchall()
        width = len(self.key)
        return {tuple(map(int, row[:width])): tuple(map(int, row[width:])) for row in rows}


def produce(bootstrap: str, topic: str, values: Iterable[bytes], expected_end: int) -> None:
    """`values` into partition 0 of `topic`, compressed; fails unless the partition then holds
    offsets [0, expected_end): the embedded broker keeps ~5 MiB per partition and drops older
    records."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd",
                         "linger.ms": 100, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=0)
        if i % 100_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()
    if (low, high) != (0, expected_end):
        raise SystemExit(f"the broker holds offsets [{low}, {high}) of {topic}, not "
                         f"[0, {expected_end}): it dropped records (retention); produce fewer")


def workload_topic(kafka: KafkaEndpoint, workload: Workload, events: int = FIRST_EVENTS) -> str:
    """A topic of one partition holding the first `events` events."""
    topic = f"bench-{workload.name}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    produce(kafka.bootstrap_servers, topic, workload.events(0, events), events)
    return topic


class TableWatcher:
    """A system's output table, polled from outside as any PostgreSQL client would: its row
    count and the sums of its value columns."""

    def __init__(self, url: str, table: str, values: Sequence[str]) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        sums = "".join(f", coalesce(sum({column}), 0)" for column in values)
        self._query = f"SELECT count(*){sums} FROM {table}"

    def totals(self) -> Totals | None:
        try:
            row = self._conn.execute(self._query).fetchone()
        except psycopg.errors.UndefinedTable:
            return None  # the system creates it when it starts
        assert row is not None
        return tuple(int(value) for value in row)

    def wait_for(self, want: Totals, alive: Callable[[], None], timeout: float, poll_s: float,
                 ready: Callable[[], bool] = lambda: True) -> float:
        """Until the table's totals are `want` and the system is `ready` (idle); when they
        first were (time.monotonic)."""
        deadline = time.monotonic() + timeout
        while (found := self.totals()) != want or not ready():
            alive()
            if time.monotonic() > deadline:
                why = f"not {want}" if found != want else "but the system is not idle"
                raise SystemExit(f"after {timeout} s the table holds {found}, {why}")
            time.sleep(poll_s)
        return time.monotonic()

    def close(self) -> None:
        self._conn.close()


class Peer:
    """bench/peers/pathway_kafka_pg.py in a subprocess, in `mode`, until `stop`; its first
    stdout line says what runs (or that Pathway could not be installed)."""

    def __init__(self, kafka: KafkaEndpoint, url: str, workload: Workload, topic: str,
                 table: str, mode: str = "streaming") -> None:
        self.spawned = time.monotonic()
        info = psycopg.conninfo.conninfo_to_dict(url)
        settings = {"host": info.get("host", "127.0.0.1"), "port": int(info.get("port", 5432)),
                    "dbname": info.get("dbname", "postgres"),
                    "user": info.get("user", "postgres")}
        if info.get("password"):
            settings["password"] = info["password"]
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), "--bootstrap", kafka.bootstrap_servers, "--topic", topic,
             "--table", table, "--pg", json.dumps(settings), "--mode", mode,
             "--workload", workload.peer, "--fetch", json.dumps(FETCH_SETTINGS)],
            stdout=subprocess.PIPE, text=True, env=os.environ)
        self._mode = mode
        assert self.proc.stdout is not None
        try:
            # Waits while the peer's virtualenv is made, the first time.
            line = self.proc.stdout.readline()
            self.info: dict[str, object] = (
                json.loads(line) if line.strip()
                else {"skipped": f"exit {self.proc.wait()} before running"})
        except BaseException:
            self.stop()
            raise

    def check_alive(self) -> None:
        # A static run ends by itself once it has written the result.
        if self.proc.poll() not in ((None, 0) if self._mode == "static" else (None,)):
            raise SystemExit(f"the Pathway peer exited ({self.proc.returncode})")

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGCONT)  # a paused peer would not see the SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class Running(Protocol):
    def check_alive(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


def stage_busy(seconds: dict[str, float]) -> dict[str, object]:
    """Busy seconds per stage, and the busiest one: the stage that sets the pace; and the part
    of compute's spent in the invariant checks (`CHECKS`), where reported."""
    stages = {stage: s for stage, s in seconds.items() if stage != CHECKS}
    checks = ({"invariant_check_seconds": round(seconds[CHECKS], 3)} if CHECKS in seconds
              else {})
    return {"stage_busy_seconds": {stage: round(s, 1) for stage, s in stages.items()},
            "slowest_stage": max(stages, key=stages.__getitem__, default=None), **checks}


def burst(system: Running, ready: Callable[[], bool], kafka: KafkaEndpoint, url: str,
          workload: Workload, topic: str, table: str, events: int,
          busy: Callable[[], dict[str, float]] | None = None) -> dict[str, object]:
    """The backlog as a running system meets it: once `system` shows the `FIRST_EVENTS` of
    its `workload_topic` in `table` and is `ready` (idle; then `SETTLE_S` more), it is paused
    (SIGSTOP), `events` more are produced, and it is resumed (SIGCONT): from then until the
    table, polled every 10 ms, holds the complete result. `busy`: the system's busy seconds
    per stage so far, reported for the backlog (read before the pause and once the result is
    complete)."""
    with contextlib.closing(TableWatcher(url, table, workload.values)) as watcher:
        watcher.wait_for(workload.totals(workload.expected(FIRST_EVENTS)), system.check_alive,
                         START_TIMEOUT_S, 0.1, ready)
        time.sleep(SETTLE_S)
        end = FIRST_EVENTS + events
        want = workload.expected(end)
        busy_before = busy() if busy is not None else {}
        system.pause()
        paused = time.monotonic()
        try:
            produce(kafka.bootstrap_servers, topic, workload.events(FIRST_EVENTS, end), end)
        finally:
            resumed = time.monotonic()
            system.resume()
        if resumed - paused > LONGEST_PAUSE_S:
            raise SystemExit(f"producing the backlog took {resumed - paused:.0f} s, longer than "
                             f"a consumer may be paused ({LONGEST_PAUSE_S:.0f} s): produce fewer")
        done = watcher.wait_for(workload.totals(want), system.check_alive, RUN_TIMEOUT_S,
                                0.01)
    elapsed = done - resumed
    result: dict[str, object] = {"seconds": round(elapsed, 2),
                                 "events_per_s": round(events / elapsed),
                                 "verified": workload.read(url, table) == want}
    if busy is not None:
        busy_after = busy()
        result |= stage_busy({stage: seconds - busy_before.get(stage, 0.0)
                              for stage, seconds in busy_after.items()})
    return result


def scrape_metrics(port: int) -> str:
    """The service's /metrics page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def scrape_busy(port: int) -> dict[str, float]:
    """The service's busy seconds per stage so far, from its /metrics endpoint."""
    body = scrape_metrics(port)
    found = re.findall(r'^txstream_stage_busy_seconds_total\{stage="([^"]+)"\} ([0-9.]+)$',
                       body, re.MULTILINE)
    checks = re.search(r"^txstream_invariant_check_seconds_total ([0-9.]+)$", body, re.MULTILINE)
    return {stage: float(seconds) for stage, seconds in found} | (
        {CHECKS: float(checks.group(1))} if checks else {})


def txstream_burst(kafka: KafkaEndpoint, url: str, workload: Workload, events: int,
                   policy: BatchPolicy, work: Path,
                   after: Callable[[int], dict[str, object]] | None = None
                   ) -> dict[str, object]:
    """`txstream run` as a user deploys it (every setting but the transaction policy at its
    default), meeting the backlog once it has started and warmed up. `after(port)`: more
    figures, read from the service before it stops."""
    run_id = uuid.uuid4().hex[:8]
    topic, schema = workload_topic(kafka, workload), f"bench_{run_id}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    config, port = work / f"{workload.name}-{run_id}.yaml", free_port()
    config.write_text(yaml.safe_dump({
        "pipeline": workload.pipeline,
        "consumer_group": f"bench-{run_id}",
        "http_port": port,
        "checkpoint_dir": str(work / f"checkpoints-{run_id}"),
        "transactions": policy.model_dump(mode="json", exclude_defaults=True),
        "sources": [s.model_dump(mode="json", exclude_defaults=True)
                    for s in workload.sources(topic)],
        "sinks": [{"output": workload.output, "db_schema": schema}],
    }, sort_keys=False))
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "DATABASE_URL": url}
    env.pop("TXSTREAM_WARM_UP_ROWS", None)  # the default warm-up, as a user runs it
    print(f"{workload.name}: txstream, at most {policy.max_events:,} events or "
          f"{policy.max_delay_ms} ms per transaction", file=sys.stderr, flush=True)
    service = Service(config, env, work / f"txstream-{run_id}.log")
    try:
        # Idle: its warm-up, which begins once no batch has been computed for a few seconds
        # (here, after the first events), is over, or was not run (the reason logged).
        result = burst(service, lambda: any(line in service.tail(100_000) for line in (
            "warm-up done", "no warm-up")), kafka, url, workload, topic,
            f'"{schema}".{workload.output}_live', events, busy=lambda: scrape_busy(port))
        if after is not None:
            result |= after(port)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):  # if paused: the JVM must run to exit
            service.resume()
        service.kill_9()
        print(service.tail(), file=sys.stderr)
        raise
    service.stop()
    return result | {"bare_consumer_events_per_s": bare_read_events_per_s(
        kafka.bootstrap_servers, topic, FIRST_EVENTS + events)}


def pathway_burst(kafka: KafkaEndpoint, url: str, workload: Workload, events: int
                  ) -> dict[str, object]:
    print(f"{workload.name}: the same backlog in Pathway", file=sys.stderr, flush=True)
    topic = workload_topic(kafka, workload)
    table = f"pathway_{workload.name}_{uuid.uuid4().hex[:8]}"
    peer = Peer(kafka, url, workload, topic, table)
    try:
        if "skipped" in peer.info:
            return peer.info
        return peer.info | burst(peer, lambda: True, kafka, url, workload, topic, table, events)
    finally:
        peer.stop()


def bare_read_events_per_s(bootstrap: str, topic: str, events: int) -> int:
    """Records/s a bare consumer reads the backlog at, assigned partition 0 as txstream's is,
    with the service's fetch settings and nothing done with the records: the broker's and the
    client's ceiling for the service's ingest on this machine."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bare-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, **FETCH_SETTINGS})
    try:
        started = time.monotonic()
        consumer.assign([TopicPartition(topic, 0, 0)])
        read = 0
        while read < events:
            read += sum(m.error() is None for m in consumer.consume(50_000, 0.05))
            if time.monotonic() - started > 300:
                raise SystemExit(f"read {read} of {events} records within 300 s")
        return round(events / (time.monotonic() - started))
    finally:
        consumer.close()
