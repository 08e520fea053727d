"""End to end: Kafka -> transactions -> Spark (the example pipeline) -> PostgreSQL snapshot.

Every event is a new paid order of an existing customer, so each one adds exactly one row to
the `paid_orders` live snapshot: an event is committed when the snapshot's row count reaches
its position in the stream. Latency is measured from outside, from just before the event is
produced (its Kafka timestamp) to the first poll of PostgreSQL that sees it (every 10 ms).

* low load: `--small` events at a time, the next ones produced once the previous are visible.
* saturation: `--events` events produced as fast as the producer goes while the service
  consumes them: events/s from the first produce to the last commit, and the latency each event
  saw in that backlog.

Both run with the default transaction policy and `batch_transactions`, as a user who sets
neither would: transactions adapt to the load (closed when the consumer has caught up, else
at 10,000 events or 1 s), and so does the number of transactions per Spark job.

* groupby_saturation: Pathway's workload end to end (txstream/examples/groupby.py): JSON
  events `{"k": i % 10000, "v": i % 1000}` in one partition, grouped by `k` into a count and a
  sum in a PostgreSQL snapshot keyed by `k`, each system deployed as a service in a process of
  its own and measured alike, from outside (`burst`): on a topic of its own holding the first
  100,000 events, the system is started and waited for until its table shows them and it is
  idle (as a service that has been running: txstream's JVM has run batches of the workload,
  then its warm-up, which waits for such an idle moment);
  then it is paused (SIGSTOP, with its JVM), a backlog of `--groupby-events` more events is
  produced (zstd: the embedded broker keeps ~5 MiB per partition; the watermarks are checked),
  and it is resumed (SIGCONT). events/s runs from the resume until the table, polled every
  10 ms, holds the complete result; the final table is checked against numpy; txstream's busy
  time per stage over the backlog (its /metrics) names the stage that set the pace. txstream
  (`txstream run`, default settings) runs with two transaction policies: transactions of
  10,000 events (each one's state PostgreSQL's at a batch end; the default batch commit, with
  every sink a snapshot, nets a batch's transactions into one); and closed every 1,500 ms, as
  Pathway's Kafka reader closes its times by default.
  Pathway (bench/peers/pathway_kafka_pg.py: `pw.io.kafka.read` in streaming mode, then
  `pw.io.postgres.write_snapshot`, no callback) is measured the same way; `pathway_static` is
  its best case, not a service's: all the events read to their end as a batch job (static
  mode), from its spawn until the table holds the result. Pathway's consumer runs with
  txstream's librdkafka fetch settings (`FETCH_SETTINGS`), as does the bare consumer:
  `bare_consumer_events_per_s`, a consumer reading the same backlog and doing nothing with it,
  the ceiling of the service's ingest. Starts are outside the figures but Pathway's static one
  (bench/startup.py measures txstream's).

Prints one JSON object. Uses `KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL` if set, else starts
the embedded broker and a throwaway PostgreSQL.

    .venv/bin/python bench/end_to_end.py [--events 50000] [--rounds 30] [--small 10]
        [--groupby-events 1000000] [--no-peer] [--only low_load,saturation,groupby_saturation]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np
import psycopg
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from txstream.examples import groupby
from txstream.examples.order_events import REGIONS
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.service.embedded.postgres import free_port, postgres_from_env
from txstream.service.spark import get_spark
from txstream.sources.transactions import FETCH_SETTINGS

# A sibling script, not a package: the service as a subprocess, and its log.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import Service

CUSTOMER_COUNT = 200


class Stream:
    """Produces paid orders with increasing ids; remembers when each was produced."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        self._topics = topics
        self.produced_at: list[float] = []

    def customers(self) -> None:
        for cid in range(1, CUSTOMER_COUNT + 1):
            row = {"customer_id": cid, "name": f"c{cid}", "region": REGIONS[cid % len(REGIONS)]}
            self._producer.produce(self._topics["customers"],
                                   key=json.dumps({"customer_id": cid}).encode(),
                                   value=json.dumps(row).encode())
        assert self._producer.flush(60) == 0

    def orders(self, count: int) -> None:
        for _ in range(count):
            oid = len(self.produced_at) + 1
            row = {"order_id": oid, "customer_id": 1 + oid % CUSTOMER_COUNT,
                   "amount": float(oid % 997), "status": "paid"}
            self.produced_at.append(time.time())
            self._producer.produce(self._topics["orders"],
                                   key=json.dumps({"order_id": oid}).encode(),
                                   value=json.dumps(row).encode())
            self._producer.poll(0)
        assert self._producer.flush(120) == 0


class Watcher:
    """Polls the snapshot's live row count; records when each count was first seen."""

    def __init__(self, url: str, schema: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._query = f'SELECT count(*) FROM "{schema}".paid_orders_live'
        self.seen_at: list[float] = []  # seen_at[k]: when row count k + 1 was first seen

    def poll(self) -> int:
        row = self._conn.execute(self._query).fetchone()
        count = int(row[0]) if row else 0
        now = time.time()
        while len(self.seen_at) < count:
            self.seen_at.append(now)
        return count

    def wait_for(self, count: int, timeout: float = 600) -> None:
        """Until the snapshot holds `count` orders."""
        deadline = time.monotonic() + timeout
        while self.poll() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"snapshot holds {len(self.seen_at)} of {count} orders")
            time.sleep(0.01)


Measure = Callable[["Stream", "Watcher"], dict[str, object]]


# The invariant checks' seconds, beside the stages' busy seconds (part of compute's).
_CHECKS = "invariant_checks"

def _percentiles(latencies: list[float]) -> dict[str, float]:
    values = np.array(latencies)
    return {"p50_ms": round(float(np.percentile(values, 50)) * 1000, 1),
            "p99_ms": round(float(np.percentile(values, 99)) * 1000, 1),
            "max_ms": round(float(values.max()) * 1000, 1)}


def _run(kafka: KafkaEndpoint, url: str, measure: Measure) -> dict[str, object]:
    """Start a runner on fresh topics in a fresh schema, then `measure(stream, watcher)`."""
    bootstrap = kafka.bootstrap_servers
    run_id = uuid.uuid4().hex[:8]
    topics = {"customers": f"bench-customers-{run_id}", "orders": f"bench-orders-{run_id}"}
    kafka.create_topic(topics["customers"], 1)
    kafka.create_topic(topics["orders"], 3)
    schema = f"bench_{run_id}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    config = PipelineConfig(
        pipeline="txstream.examples.orders:pipeline",
        sources=kafka_sources(topics["customers"], topics["orders"]),
        sinks=[SinkConfig.model_validate({"output": o, "db_schema": schema})
               for o in OUTPUTS],
        kafka_bootstrap_servers=bootstrap, consumer_group=f"bench-{run_id}",
        database_url=url, checkpoint_dir=tempfile.mkdtemp(prefix="txstream-bench-"),
    )
    print(f"{measure.__qualname__.split('.')[0]}: starting", file=sys.stderr, flush=True)
    runner = open_runner(config, spark=get_spark())
    stream = Stream(bootstrap, topics)
    watcher = Watcher(url, schema)
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        stream.customers()
        result = measure(stream, watcher)
    finally:
        runner.request_stop()
        loop.join()
        runner.close()
    # Read once the stages are stopped: the last batch's counters are final then.
    return result | {
        "spark_batches": runner.metrics.delivery.batches,
        "transactions": runner.metrics.delivery.transactions,
        **_stage_busy(runner.metrics.stage_seconds()
                      | {_CHECKS: runner.metrics.compute.check_seconds}),
    }


def _stage_busy(seconds: dict[str, float]) -> dict[str, object]:
    """Busy seconds per stage, and the busiest one: the stage that sets the pace; and the part
    of compute's spent in the invariant checks (`_CHECKS`), where reported."""
    stages = {stage: s for stage, s in seconds.items() if stage != _CHECKS}
    checks = ({"invariant_check_seconds": round(seconds[_CHECKS], 3)} if _CHECKS in seconds
              else {})
    return {"stage_busy_seconds": {stage: round(s, 1) for stage, s in stages.items()},
            "slowest_stage": max(stages, key=stages.__getitem__, default=None), **checks}


def low_load(rounds: int, small: int) -> Measure:
    def measure(stream: Stream, watcher: Watcher) -> dict[str, object]:
        latencies = []
        for _ in range(rounds):
            first = len(stream.produced_at)
            stream.orders(small)
            watcher.wait_for(first + small)
            latencies += [watcher.seen_at[i] - stream.produced_at[i]
                          for i in range(first, first + small)]
        # The first transactions also pay for Spark's first jobs (code generation, caches).
        warm = latencies[small * 3:] if rounds > 5 else latencies
        return {"events": len(stream.produced_at), "events_at_a_time": small,
                "latency": _percentiles(warm)}
    return measure


def saturation(events: int) -> Measure:
    def measure(stream: Stream, watcher: Watcher) -> dict[str, object]:
        producer = threading.Thread(target=stream.orders, args=(events,), daemon=True)
        producer.start()
        watcher.wait_for(events, timeout=3600)
        producer.join()
        elapsed = watcher.seen_at[-1] - stream.produced_at[0]
        latencies = [s - p for s, p in zip(watcher.seen_at, stream.produced_at, strict=True)]
        return {"events": events, "seconds": round(elapsed, 1),
                "events_per_s": round(events / elapsed), "latency": _percentiles(latencies)}
    return measure


GROUPBY_KEYS = 10_000
GROUPBY_EVENTS_PER_TRANSACTION = 10_000
PATHWAY_COMMIT_MS = 1500  # pw.io.kafka.read's default autocommit_duration_ms
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


def stream(first: int, end: int) -> Iterator[bytes]:
    """Events number `first` to `end` (excluded) of the workload."""
    return (b'{"k": %d, "v": %d}' % (i % GROUPBY_KEYS, i % 1000) for i in range(first, end))


def expected_sums(events: int) -> dict[int, tuple[int, int]]:
    """The table after the first `events` events."""
    i = np.arange(events, dtype=np.int64)
    k, v = i % GROUPBY_KEYS, i % 1000
    counts = np.bincount(k, minlength=GROUPBY_KEYS)
    totals = np.bincount(k, weights=v, minlength=GROUPBY_KEYS).astype(np.int64)
    return {int(key): (int(counts[key]), int(totals[key])) for key in np.flatnonzero(counts)}


def read_sums(url: str, table: str) -> dict[int, tuple[int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT k, count, total FROM {table}").fetchall()
    return {int(k): (int(c), int(t)) for k, c, t in rows}


Totals = tuple[int, int, int]


def totals_of(sums: dict[int, tuple[int, int]]) -> Totals:
    return len(sums), sum(c for c, _ in sums.values()), sum(t for _, t in sums.values())


class TableWatcher:
    """A system's output table, polled from outside as any PostgreSQL client would: its rows,
    the sum of its counts and of its totals (equal to the expected ones only once every event
    is in: counts only grow)."""

    def __init__(self, url: str, table: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._query = f"SELECT count(*), coalesce(sum(count), 0), coalesce(sum(total), 0) " \
                      f"FROM {table}"

    def totals(self) -> Totals | None:
        try:
            row = self._conn.execute(self._query).fetchone()
        except psycopg.errors.UndefinedTable:
            return None  # the system creates it when it starts
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

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

    def __init__(self, kafka: KafkaEndpoint, url: str, topic: str, table: str,
                 mode: str = "streaming") -> None:
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
             "--fetch", json.dumps(FETCH_SETTINGS)],
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


def workload_topic(kafka: KafkaEndpoint, name: str, events: int = FIRST_EVENTS) -> str:
    """A topic of one partition holding the first `events` events."""
    kafka.create_topic(name, 1)
    produce(kafka.bootstrap_servers, name, stream(0, events), events)
    return name


def burst(system: Running, ready: Callable[[], bool], kafka: KafkaEndpoint, url: str,
          topic: str, table: str, events: int,
          busy: Callable[[], dict[str, float]] | None = None) -> dict[str, object]:
    """The backlog as a running system meets it: once `system` shows the `FIRST_EVENTS` of
    its `workload_topic` in `table` and is `ready` (idle; then `SETTLE_S` more), it is paused
    (SIGSTOP), `events` more are produced, and it is resumed (SIGCONT): from then until the
    table, polled every 10 ms, holds the complete result. `busy`: the system's busy seconds
    per stage so far, reported for the backlog (read before the pause and once the result is
    complete)."""
    with contextlib.closing(TableWatcher(url, table)) as watcher:
        watcher.wait_for(totals_of(expected_sums(FIRST_EVENTS)), system.check_alive,
                         START_TIMEOUT_S, 0.1, ready)
        time.sleep(SETTLE_S)
        end = FIRST_EVENTS + events
        want = expected_sums(end)
        busy_before = busy() if busy is not None else {}
        system.pause()
        paused = time.monotonic()
        try:
            produce(kafka.bootstrap_servers, topic, stream(FIRST_EVENTS, end), end)
        finally:
            resumed = time.monotonic()
            system.resume()
        if resumed - paused > LONGEST_PAUSE_S:
            raise SystemExit(f"producing the backlog took {resumed - paused:.0f} s, longer than "
                             f"a consumer may be paused ({LONGEST_PAUSE_S:.0f} s): produce fewer")
        done = watcher.wait_for(totals_of(want), system.check_alive, RUN_TIMEOUT_S, 0.01)
    elapsed = done - resumed
    result: dict[str, object] = {"seconds": round(elapsed, 2),
                                 "events_per_s": round(events / elapsed),
                                 "verified": read_sums(url, table) == want}
    if busy is not None:
        busy_after = busy()
        result |= _stage_busy({stage: seconds - busy_before.get(stage, 0.0)
                               for stage, seconds in busy_after.items()})
    return result


def scrape_busy(port: int) -> dict[str, float]:
    """The service's busy seconds per stage so far, from its /metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    found = re.findall(r'^txstream_stage_busy_seconds_total\{stage="([^"]+)"\} ([0-9.]+)$',
                       body, re.MULTILINE)
    checks = re.search(r"^txstream_invariant_check_seconds_total ([0-9.]+)$", body, re.MULTILINE)
    return {stage: float(seconds) for stage, seconds in found} | (
        {_CHECKS: float(checks.group(1))} if checks else {})


def groupby_txstream(kafka: KafkaEndpoint, url: str, events: int, policy: BatchPolicy,
                     work: Path) -> dict[str, object]:
    """`txstream run` as a user deploys it (every setting but the transaction policy at its
    default), meeting the backlog once it has started and warmed up."""
    run_id = uuid.uuid4().hex[:8]
    topic, schema = workload_topic(kafka, f"bench-groupby-{run_id}"), f"bench_{run_id}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    config, port = work / f"groupby-{run_id}.yaml", free_port()
    config.write_text(yaml.safe_dump({
        "pipeline": "txstream.examples.groupby:pipeline",
        "consumer_group": f"bench-{run_id}",
        "http_port": port,
        "checkpoint_dir": str(work / f"checkpoints-{run_id}"),
        "transactions": policy.model_dump(mode="json", exclude_defaults=True),
        "sources": [s.model_dump(mode="json", exclude_defaults=True)
                    for s in groupby.sources(topic)],
        "sinks": [{"output": "sums", "db_schema": schema}],
    }, sort_keys=False))
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "DATABASE_URL": url}
    env.pop("TXSTREAM_WARM_UP_ROWS", None)  # the default warm-up, as a user runs it
    print(f"groupby_saturation: txstream, at most {policy.max_events:,} events or "
          f"{policy.max_delay_ms} ms per transaction", file=sys.stderr, flush=True)
    service = Service(config, env, work / f"txstream-{run_id}.log")
    try:
        # Idle: its warm-up, which begins once no batch has been computed for a few seconds
        # (here, after the first events), is over, or was not run (the reason logged).
        result = burst(service, lambda: any(line in service.tail(100_000) for line in (
            "warm-up done", "no warm-up")), kafka, url, topic, f'"{schema}".sums_live', events,
            busy=lambda: scrape_busy(port))
    except BaseException:
        with contextlib.suppress(ProcessLookupError):  # if paused: the JVM must run to exit
            service.resume()
        service.kill_9()
        print(service.tail(), file=sys.stderr)
        raise
    service.stop()
    return result | {"bare_consumer_events_per_s": bare_read_events_per_s(
        kafka.bootstrap_servers, topic, FIRST_EVENTS + events)}


def groupby_pathway(kafka: KafkaEndpoint, url: str, events: int) -> dict[str, object]:
    print("groupby_saturation: the same backlog in Pathway", file=sys.stderr, flush=True)
    run_id = uuid.uuid4().hex[:8]
    topic, table = workload_topic(kafka, f"bench-groupby-{run_id}"), f"pathway_sums_{run_id}"
    peer = Peer(kafka, url, topic, table)
    try:
        if "skipped" in peer.info:
            return peer.info
        return peer.info | burst(peer, lambda: True, kafka, url, topic, table, events)
    finally:
        peer.stop()


def groupby_pathway_static(kafka: KafkaEndpoint, url: str, events: int) -> dict[str, object]:
    """Pathway's best case, not a service's: the whole backlog in Kafka read to its end as a
    batch (`mode="static"`), timed from the spawn (its start included, as its start of
    consumption is not seen from outside) until the table, polled every 10 ms, holds the
    result."""
    print("groupby_saturation: the backlog as a batch job in Pathway", file=sys.stderr,
          flush=True)
    run_id = uuid.uuid4().hex[:8]
    end = FIRST_EVENTS + events
    topic = workload_topic(kafka, f"bench-groupby-{run_id}", end)
    table = f"pathway_sums_{run_id}"
    peer = Peer(kafka, url, topic, table, mode="static")
    try:
        if "skipped" in peer.info:
            return peer.info
        want = expected_sums(end)
        with contextlib.closing(TableWatcher(url, table)) as watcher:
            done = watcher.wait_for(totals_of(want), peer.check_alive, RUN_TIMEOUT_S, 0.01)
        elapsed = done - peer.spawned
        return peer.info | {"events": end, "seconds_from_spawn": round(elapsed, 2),
                            "events_per_s": round(end / elapsed),
                            "verified": read_sums(url, table) == want}
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


def groupby_saturation(kafka: KafkaEndpoint, url: str, events: int, peer: bool
                       ) -> dict[str, object]:
    """Each system on a topic of its own, measured alike (see `burst`)."""
    # txstream twice: transactions of a fixed size (any of them a batch's last, visible in
    # PostgreSQL),
    # and closed by time as Pathway's reader closes its times (`autocommit_duration_ms`).
    policies = {
        f"transactions_of_{GROUPBY_EVENTS_PER_TRANSACTION}_events":
            BatchPolicy(max_events=GROUPBY_EVENTS_PER_TRANSACTION, max_delay_ms=500),
        f"transactions_closed_every_{PATHWAY_COMMIT_MS}_ms":
            BatchPolicy(max_events=events, max_delay_ms=PATHWAY_COMMIT_MS),
    }
    with tempfile.TemporaryDirectory(prefix="txstream-bench-groupby-") as work:
        ours = {name: groupby_txstream(kafka, url, events, policy, Path(work))
                for name, policy in policies.items()}
    result: dict[str, object] = {
        "events": events, "keys": GROUPBY_KEYS,
        "seconds_from": "SIGCONT of the running, idle system, the backlog waiting in Kafka, to "
                        "the complete result seen in PostgreSQL (polled every 10 ms)",
        "txstream": ours}
    if not peer:
        return result
    peers = {"pathway": groupby_pathway(kafka, url, events),
             "pathway_static": groupby_pathway_static(kafka, url, events)}
    result |= peers
    for name, theirs in peers.items():
        if "events_per_s" in theirs:
            result[f"ratios_txstream_to_{name}"] = {
                policy: round(run["events_per_s"] / theirs["events_per_s"], 2)  # type: ignore[operator]
                for policy, run in ours.items()}
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--groupby-events", type=int, default=1_000_000)
    parser.add_argument("--no-peer", action="store_true", help="skip the Pathway run")
    parser.add_argument("--only", default="low_load,saturation,groupby_saturation")
    args = parser.parse_args()
    only = set(args.only.split(","))
    kafka = kafka_from_env()
    postgres = postgres_from_env(Path(tempfile.mkdtemp(prefix="txstream-bench-pg-")))
    try:
        results: dict[str, object] = {}
        # First, before this process starts a JVM of its own: each system runs in its own
        # process, alone on the machine with the broker and PostgreSQL.
        if "groupby_saturation" in only:
            results["groupby_saturation"] = groupby_saturation(
                kafka, postgres.url, args.groupby_events, peer=not args.no_peer)
        if {"low_load", "saturation"} & only:
            get_spark()
        if "low_load" in only:
            results["low_load"] = _run(kafka, postgres.url, low_load(args.rounds, args.small))
        if "saturation" in only:
            results["saturation"] = _run(kafka, postgres.url, saturation(args.events))
        print(json.dumps(results, indent=2))
    finally:
        kafka.stop()
        postgres.stop()
