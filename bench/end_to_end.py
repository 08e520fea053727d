"""End to end: Kafka -> transactions -> Spark (the example pipeline) -> PostgreSQL snapshot.

Every event is a new paid order of an existing customer, so each one adds exactly one row to
the `paid_orders` live snapshot: an event is committed when the snapshot's row count reaches
its position in the stream. Latency is measured from outside, from just before the event is
produced (its Kafka timestamp) to the first poll of PostgreSQL that sees it (every 10 ms).

* low load: one small transaction at a time (`--small` events, closed by count), the next one
  produced once the previous is visible; one transaction per Spark job.
* saturation: `--events` events produced as fast as the producer goes while the service
  consumes them (large transactions, several per Spark job): events/s from the first produce
  to the last commit, and the latency each event saw in that backlog.

Prints one JSON object. Uses `KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL` if set, else starts
the embedded broker and a throwaway PostgreSQL.

    .venv/bin/python bench/end_to_end.py [--events 50000] [--rounds 30] [--small 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
from confluent_kafka import Producer

from examples.order_events import REGIONS
from examples.orders import OUTPUTS, kafka_sources
from schemas.config import PipelineConfig, SinkConfig
from schemas.sources import BatchPolicy
from service.embedded.kafka import KafkaEndpoint, kafka_from_env
from service.embedded.postgres import postgres_from_env
from service.runner import PipelineRunner
from service.spark import get_spark

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


def _run(kafka: KafkaEndpoint, url: str, policy: BatchPolicy, batch_transactions: int,
         measure: Measure) -> dict[str, object]:
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
        pipeline="examples.orders:pipeline",
        sources=kafka_sources(topics["customers"], topics["orders"]),
        sinks=[SinkConfig.model_validate({"output": o, "db_schema": schema})
               for o in OUTPUTS],
        transactions=policy, batch_transactions=batch_transactions,
        kafka_bootstrap_servers=bootstrap, consumer_group=f"bench-{run_id}",
        database_url=url, checkpoint_dir=tempfile.mkdtemp(prefix="txstream-bench-"),
    )
    print(f"{measure.__qualname__.split('.')[0]}: starting", file=sys.stderr, flush=True)
    runner = PipelineRunner(config, spark=get_spark())
    stream = Stream(bootstrap, topics)
    watcher = Watcher(url, schema)
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        stream.customers()
        return measure(stream, watcher) | {
            "spark_batches": runner.progress.batches,
            "transactions": runner.progress.transactions,
            "stage_busy_seconds": {stage: round(seconds, 1) for stage, seconds
                                   in runner.progress.stage_seconds.items()},
        }
    finally:
        runner.request_stop()
        loop.join()
        runner.close()


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
        return {"events": len(stream.produced_at), "events_per_transaction": small,
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--small", type=int, default=10)
    args = parser.parse_args()
    kafka = kafka_from_env()
    postgres = postgres_from_env(Path(tempfile.mkdtemp(prefix="txstream-bench-pg-")))
    try:
        get_spark()
        results = {
            "low_load": _run(kafka, postgres.url,
                             BatchPolicy(max_events=args.small, max_delay_ms=50), 1,
                             low_load(args.rounds, args.small)),
            "saturation": _run(kafka, postgres.url,
                               BatchPolicy(max_events=5000, max_delay_ms=500), 10,
                               saturation(args.events)),
        }
        print(json.dumps(results, indent=2))
    finally:
        kafka.stop()
        postgres.stop()
