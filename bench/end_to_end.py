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
  its own and measured alike, from outside (bench/backlog.py's `burst`): on a topic of its own
  holding the first 100,000 events, the system is started and waited for until its table shows
  them and it is idle (as a service that has been running: txstream's JVM has run batches of
  the workload, then its warm-up, which waits for such an idle moment); then it is paused
  (SIGSTOP, with its JVM), a backlog of `--groupby-events` more events is produced (zstd: the
  embedded broker keeps ~5 MiB per partition; the watermarks are checked), and it is resumed
  (SIGCONT). events/s runs from the resume until the table, polled every 10 ms, holds the
  complete result; the final table is checked against numpy; txstream's busy time per stage
  over the backlog (its /metrics) names the stage that set the pace. txstream (`txstream run`,
  default settings) runs with two transaction policies: transactions of 10,000 events (each
  one's state PostgreSQL's at a batch end; the default batch commit, with every sink a
  snapshot, nets a batch's transactions into one); and closed every 1,500 ms, as Pathway's
  Kafka reader closes its times by default. Pathway (bench/peers/pathway_kafka_pg.py:
  `pw.io.kafka.read` in streaming mode, then `pw.io.postgres.write_snapshot`, no callback) is
  measured the same way; `pathway_static` is its best case, not a service's: all the events
  read to their end as a batch job (static mode), from its spawn until the table holds the
  result. Pathway's consumer runs with txstream's librdkafka fetch settings
  (`FETCH_SETTINGS`), as does the bare consumer: `bare_consumer_events_per_s`, a consumer
  reading the same backlog and doing nothing with it, the ceiling of the service's ingest.
  Starts are outside the figures but Pathway's static one (bench/startup.py measures
  txstream's).

Prints one JSON object. Uses `KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL` if set, else starts
the embedded broker and a throwaway PostgreSQL.

    .venv/bin/python bench/end_to_end.py [--events 50000] [--rounds 30] [--small 10]
        [--groupby-events 1000000] [--no-peer] [--only low_load,saturation,groupby_saturation]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psycopg
from confluent_kafka import Producer

from txstream.examples import groupby
from txstream.examples.order_events import REGIONS
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.service.embedded.postgres import postgres_from_env
from txstream.service.spark import get_spark

# A sibling script, not a package: the backlog as a running service meets it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from backlog import (
    CHECKS,
    FIRST_EVENTS,
    RUN_TIMEOUT_S,
    Peer,
    Table,
    TableWatcher,
    Workload,
    pathway_burst,
    stage_busy,
    txstream_burst,
    workload_topic,
)

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
        **stage_busy(runner.metrics.stage_seconds()
                     | {CHECKS: runner.metrics.compute.check_seconds}),
    }


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


def stream(first: int, end: int) -> Iterator[bytes]:
    """Events number `first` to `end` (excluded) of the workload."""
    return (b'{"k": %d, "v": %d}' % (i % GROUPBY_KEYS, i % 1000) for i in range(first, end))


def expected_sums(events: int) -> Table:
    """The table after the first `events` events."""
    i = np.arange(events, dtype=np.int64)
    k, v = i % GROUPBY_KEYS, i % 1000
    counts = np.bincount(k, minlength=GROUPBY_KEYS)
    totals = np.bincount(k, weights=v, minlength=GROUPBY_KEYS).astype(np.int64)
    return {(int(key),): (int(counts[key]), int(totals[key])) for key in np.flatnonzero(counts)}


GROUPBY = Workload(name="groupby", events=stream, expected=expected_sums, key=("k",),
                   values=("count", "total"), pipeline="txstream.examples.groupby:pipeline",
                   sources=groupby.sources, output="sums", peer="groupby")


def groupby_pathway_static(kafka: KafkaEndpoint, url: str, events: int) -> dict[str, object]:
    """Pathway's best case, not a service's: the whole backlog in Kafka read to its end as a
    batch (`mode="static"`), timed from the spawn (its start included, as its start of
    consumption is not seen from outside) until the table, polled every 10 ms, holds the
    result."""
    print("groupby_saturation: the backlog as a batch job in Pathway", file=sys.stderr,
          flush=True)
    end = FIRST_EVENTS + events
    topic = workload_topic(kafka, GROUPBY, end)
    table = f"pathway_sums_{uuid.uuid4().hex[:8]}"
    peer = Peer(kafka, url, GROUPBY, topic, table, mode="static")
    try:
        if "skipped" in peer.info:
            return peer.info
        want = expected_sums(end)
        with contextlib.closing(TableWatcher(url, table, GROUPBY.values)) as watcher:
            done = watcher.wait_for(GROUPBY.totals(want), peer.check_alive, RUN_TIMEOUT_S, 0.01)
        elapsed = done - peer.spawned
        return peer.info | {"events": end, "seconds_from_spawn": round(elapsed, 2),
                            "events_per_s": round(end / elapsed),
                            "verified": GROUPBY.read(url, table) == want}
    finally:
        peer.stop()


def groupby_saturation(kafka: KafkaEndpoint, url: str, events: int, peer: bool
                       ) -> dict[str, object]:
    """Each system on a topic of its own, measured alike (see bench/backlog.py)."""
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
        ours = {name: txstream_burst(kafka, url, GROUPBY, events, policy, Path(work))
                for name, policy in policies.items()}
    result: dict[str, object] = {
        "events": events, "keys": GROUPBY_KEYS,
        "seconds_from": "SIGCONT of the running, idle system, the backlog waiting in Kafka, to "
                        "the complete result seen in PostgreSQL (polled every 10 ms)",
        "txstream": ours}
    if not peer:
        return result
    peers = {"pathway": pathway_burst(kafka, url, GROUPBY, events),
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
