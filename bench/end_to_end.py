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

* groupby_saturation: Pathway's workload end to end (txstream/examples/groupby.py): a backlog of
  `--groupby-events` JSON events `{"k": i % 10000, "v": i % 1000}` in one partition (zstd: the
  embedded broker keeps ~5 MiB per partition and would drop older records; the low watermark is
  checked), group-by count and sum into a PostgreSQL snapshot keyed by `k`: events/s from consumer
  start to the final snapshot and busy time per stage (the busiest named), for txstream with two
  transaction policies (transactions of 10,000 events, each one's state visible; and transactions
  closed every 1,500 ms, as Pathway's Kafka reader closes its times by default; both also close a
  transaction when the backlog is read to its end, as Pathway's static read ends there), and the
  same backlog read by Pathway into a table of its own in the same run
  (bench/peers/pathway_kafka_pg.py, which reports how many times Pathway closed and when its last
  output change was computed, before its PostgreSQL writer finished), with the ratios. Pathway's
  consumer, and the bare consumer below, get the librdkafka fetch settings of txstream's
  (`FETCH_SETTINGS`). Every final table is checked against numpy. txstream's start
  (`start_seconds`, below) is outside its timer while Pathway's run, from building its graph, is
  inside its own: `with_txstream_start` counts it too. `bare_consumer_events_per_s`: a consumer
  reading the same backlog and doing nothing with it, the ceiling of the service's ingest.
  `start_seconds` is the service's start before it consumes (the Spark session is already up):
  building the engine and connecting. The engine's warm-up (`warm_up_rows`) runs only while the
  service is idle, and the backlog waiting here ends it before it begins, so the first batches
  plan and compile on the JVM as it is (before 70e4e9d the warm-up was part of the start).

Prints one JSON object. Uses `KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL` if set, else starts
the embedded broker and a throwaway PostgreSQL.

    .venv/bin/python bench/end_to_end.py [--events 50000] [--rounds 30] [--small 10]
        [--groupby-events 1000000] [--no-peer] [--only low_load,saturation,groupby_saturation]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from txstream.examples import groupby
from txstream.examples.order_events import REGIONS
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.service.embedded.postgres import postgres_from_env
from txstream.service.spark import get_spark
from txstream.sources.transactions import FETCH_SETTINGS

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
        **_stage_busy(runner.metrics.stage_seconds()),
    }


def _stage_busy(seconds: dict[str, float]) -> dict[str, object]:
    """Busy seconds per stage, and the busiest one: the stage that sets the pace."""
    return {"stage_busy_seconds": {stage: round(s, 1) for stage, s in seconds.items()},
            "slowest_stage": max(seconds, key=seconds.__getitem__, default=None)}


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


def produce_backlog(bootstrap: str, topic: str, events: int) -> None:
    """Pathway's workload into one partition, compressed; fails if the broker dropped any."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd",
                         "linger.ms": 100, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000})
    for i in range(events):
        producer.produce(topic, value=b'{"k": %d, "v": %d}' % (i % GROUPBY_KEYS, i % 1000))
        if i % 100_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()
    if (low, high) != (0, events):
        raise SystemExit(f"the broker holds offsets [{low}, {high}) of the {events} events "
                         "produced: it dropped records (retention); produce fewer")


def expected_sums(events: int) -> dict[int, tuple[int, int]]:
    i = np.arange(events, dtype=np.int64)
    k, v = i % GROUPBY_KEYS, i % 1000
    counts = np.bincount(k, minlength=GROUPBY_KEYS)
    totals = np.bincount(k, weights=v, minlength=GROUPBY_KEYS).astype(np.int64)
    return {int(key): (int(counts[key]), int(totals[key])) for key in np.flatnonzero(counts)}


def read_sums(url: str, table: str) -> dict[int, tuple[int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT k, count, total FROM {table}").fetchall()
    return {int(k): (int(c), int(t)) for k, c, t in rows}


def groupby_txstream(kafka: KafkaEndpoint, url: str, topic: str, events: int,
                     want: dict[int, tuple[int, int]], policy: BatchPolicy
                     ) -> dict[str, float | int | bool | dict[str, float]]:
    run_id = uuid.uuid4().hex[:8]
    schema = f"bench_{run_id}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    table = f'"{schema}".sums_live'
    config = PipelineConfig(
        pipeline="txstream.examples.groupby:pipeline", sources=groupby.sources(topic),
        sinks=[SinkConfig.model_validate({"output": "sums", "db_schema": schema})],
        transactions=policy,
        kafka_bootstrap_servers=kafka.bootstrap_servers, consumer_group=f"bench-{run_id}",
        database_url=url, checkpoint_dir=tempfile.mkdtemp(prefix="txstream-bench-"),
    )
    print(f"groupby_saturation: txstream, at most {policy.max_events:,} events or "
          f"{policy.max_delay_ms} ms per transaction", file=sys.stderr, flush=True)
    opening = time.monotonic()
    runner = open_runner(config, spark=get_spark())
    start_s = time.monotonic() - opening
    loop = threading.Thread(target=runner.run, daemon=True)
    started = time.monotonic()
    loop.start()
    ingest, delivery = runner.metrics.ingest, runner.metrics.delivery
    try:
        # Done when every event is consumed, every closed transaction is in the snapshot and
        # the snapshot holds the sums (the last transaction may still be open, closed by time).
        while not (ingest.events == events and ingest.transactions_closed
                   and delivery.transactions == ingest.transactions_closed
                   and read_sums(url, table) == want):
            if not loop.is_alive():
                raise SystemExit("the runner stopped before the end of the backlog")
            time.sleep(0.01 if ingest.events < events else 0.05)
        elapsed = time.monotonic() - started
    finally:
        runner.request_stop()
        loop.join()
        runner.close()
    return {"seconds": round(elapsed, 2), "events_per_s": round(events / elapsed),
            "start_seconds": round(start_s, 2),
            "events_per_s_with_start": round(events / (elapsed + start_s)), "verified": True,
            "spark_batches": delivery.batches, "transactions": delivery.transactions,
            **_stage_busy(runner.metrics.stage_seconds())}


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


def groupby_pathway(kafka: KafkaEndpoint, url: str, topic: str, events: int,
                    want: dict[int, tuple[int, int]]) -> dict[str, object]:
    print("groupby_saturation: the same backlog in Pathway", file=sys.stderr, flush=True)
    info = psycopg.conninfo.conninfo_to_dict(url)
    settings = {"host": info.get("host", "127.0.0.1"), "port": int(info.get("port", 5432)),
                "dbname": info.get("dbname", "postgres"), "user": info.get("user", "postgres")}
    if info.get("password"):
        settings["password"] = info["password"]
    table = f"pathway_sums_{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, str(PEER), "--bootstrap", kafka.bootstrap_servers, "--topic", topic,
         "--events", str(events), "--table", table, "--pg", json.dumps(settings),
         "--fetch", json.dumps(FETCH_SETTINGS)],
        capture_output=True, text=True, check=False, env=os.environ)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"peer": "pathway", "skipped": f"exit {done.returncode}: {done.stderr[-800:]}"}
    result = json.loads(lines[-1])
    if "skipped" not in result:
        result["verified"] = read_sums(url, table) == want
    return result


def groupby_saturation(kafka: KafkaEndpoint, url: str, events: int, peer: bool
                       ) -> dict[str, object]:
    topic = f"bench-groupby-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    print(f"groupby_saturation: producing {events:,} events", file=sys.stderr, flush=True)
    produce_backlog(kafka.bootstrap_servers, topic, events)
    want = expected_sums(events)
    # txstream twice: transactions of a fixed size (each one's state visible in PostgreSQL),
    # and closed by time as Pathway's reader closes its times (`autocommit_duration_ms`).
    policies = {
        f"transactions_of_{GROUPBY_EVENTS_PER_TRANSACTION}_events":
            BatchPolicy(max_events=GROUPBY_EVENTS_PER_TRANSACTION, max_delay_ms=500),
        f"transactions_closed_every_{PATHWAY_COMMIT_MS}_ms":
            BatchPolicy(max_events=events, max_delay_ms=PATHWAY_COMMIT_MS),
    }
    ours = {name: groupby_txstream(kafka, url, topic, events, want, policy)
            for name, policy in policies.items()}
    result: dict[str, object] = {
        "events": events, "keys": GROUPBY_KEYS, "txstream": ours,
        "bare_consumer_events_per_s": bare_read_events_per_s(kafka.bootstrap_servers, topic,
                                                              events)}
    if not peer:
        return result
    theirs = groupby_pathway(kafka, url, topic, events, want)
    result["pathway"] = theirs
    if "events_per_s" not in theirs:
        return result
    result["ratios_txstream_to_pathway"] = {
        name: {"raw": round(run["events_per_s"] / theirs["events_per_s"], 2),
               "with_txstream_start": round(run["events_per_s_with_start"]
                                            / theirs["events_per_s"], 2)}
        for name, run in ours.items()}
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
        get_spark()
        results: dict[str, object] = {}
        if "low_load" in only:
            results["low_load"] = _run(kafka, postgres.url, low_load(args.rounds, args.small))
        if "saturation" in only:
            results["saturation"] = _run(kafka, postgres.url, saturation(args.events))
        if "groupby_saturation" in only:
            results["groupby_saturation"] = groupby_saturation(
                kafka, postgres.url, args.groupby_events, peer=not args.no_peer)
        print(json.dumps(results, indent=2))
    finally:
        kafka.stop()
        postgres.stop()
