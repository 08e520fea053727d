"""`txstream demo`: the example pipeline end to end on embedded defaults.

Starts (or reuses, from the environment) a Kafka-protocol broker, a PostgreSQL cluster and a
local Spark, produces sample order events, runs the service until every event is in the
snapshot, checks the snapshot against a from-scratch computation, and leaves PostgreSQL running
so the tables can be inspected with psql. `txstream demo --stop` stops that PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import psycopg
from confluent_kafka import Producer

from txstream.examples.order_events import OrderWorld, encode, events
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.kafka_client import client_settings
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.kafka import PLAINTEXT
from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.service.embedded.postgres import EmbeddedPostgres

DEMO_DIR = Path(".txstream/demo")
# Records that are not valid events: the demo shows they are counted and skipped.
MALFORMED = (b"{not json", b'{"order_id": "seven", "customer_id": 1, "amount": 1.0}')

Say = Callable[[str], None]


class DemoError(RuntimeError):
    """The demo could not finish or its snapshot is wrong."""


def stop(work_dir: Path = DEMO_DIR) -> bool:
    """Stop the PostgreSQL a previous demo left running; True if there was one."""
    pgdata = work_dir / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        return False
    EmbeddedPostgres(pgdata).stop()
    return True


class _Producer(threading.Thread):
    """Produces the sample events at a steady pace while the service consumes them."""

    def __init__(self, bootstrap: str, topics: dict[str, str], count: int, seed: int) -> None:
        super().__init__(name="demo-producer", daemon=True)
        self.bootstrap = bootstrap
        self.topics = topics
        self.count = count
        self.seed = seed
        self.world = OrderWorld()
        self.done = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        # Local to the thread, so the client is gone before the broker stops.
        producer = Producer(client_settings(self.bootstrap, PLAINTEXT, **{
            "enable.idempotence": True, "linger.ms": 20}))
        rng = random.Random(self.seed)
        stream = events(rng, customers=200)
        malformed_at = {self.count // 3: MALFORMED[0], 2 * self.count // 3: MALFORMED[1]}
        try:
            for i in range(self.count):
                event = next(stream)
                key, value = encode(event)
                producer.produce(self.topics[event[0]], key=key, value=value)
                self.world.apply(event)
                if i in malformed_at:
                    producer.produce(self.topics["orders"], key=b'{"order_id": 0}',
                                          value=malformed_at[i])
                if i % 500 == 499:
                    producer.poll(0)
                    time.sleep(0.05)  # a stream, not one burst: transactions keep closing
            if producer.flush(60) != 0:
                self.error = "events not delivered within 60 s"
        finally:
            self.done.set()


def _expected_customer_stats(world: OrderWorld) -> dict[int, tuple[str, int, Decimal]]:
    stats = {cid: (row["name"], 0, Decimal(0)) for cid, row in world.customers.items()}
    for order in world.orders.values():
        cid = order["customer_id"]
        if cid in stats:
            name, n, total = stats[cid]
            stats[cid] = (name, n + 1, total + order["amount"])
    return stats


def run_demo(events_count: int = 20_000, work_dir: Path = DEMO_DIR, say: Say = print) -> float:
    """Run the demo; returns events per second end to end."""
    started = time.monotonic()
    stop(work_dir)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True)
    work_dir.chmod(0o755)
    run_id = uuid.uuid4().hex[:8]

    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        say(f"starting PostgreSQL in {work_dir / 'pgdata'}")
        database_url = EmbeddedPostgres(work_dir / "pgdata").start().url
    say("starting the Kafka-protocol broker" + (
        f" ({os.environ['KAFKA_BOOTSTRAP_SERVERS']})" if os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        else " (librdkafka mock cluster, a separate process)"))
    kafka: KafkaEndpoint = kafka_from_env()
    try:
        # Topic names unique per run: a real cluster keeps the previous run's topics.
        topics = {"customers": f"demo-customers-{run_id}", "orders": f"demo-orders-{run_id}"}
        kafka.create_topic(topics["customers"], 1)
        kafka.create_topic(topics["orders"], 3)
        dead_letters = f"demo-dead-letters-{run_id}"
        kafka.create_topic(dead_letters, 1)
        config = PipelineConfig(
            pipeline="txstream.examples.orders:pipeline",
            sources=kafka_sources(topics["customers"], topics["orders"]),
            sinks=[SinkConfig.model_validate({"output": name, "mode": "replace"}) for name in
                   OUTPUTS],
            transactions=BatchPolicy(max_events=500, max_delay_ms=200),
            kafka_bootstrap_servers=kafka.bootstrap_servers,
            consumer_group=f"txstream-demo-{run_id}",
            dead_letter_topic=dead_letters,
            database_url=database_url,
            # Removed with the rest of the work dir, so every demo starts from scratch.
            checkpoint_dir=str(work_dir / "checkpoints"),
        )
        say("starting Spark (local mode) and compiling the pipeline")
        runner = open_runner(config)
        producer = _Producer(kafka.bootstrap_servers, topics, events_count, seed=7)
        say(f"producing {events_count} order events; the service turns them into transactions")
        run_started = time.monotonic()
        producer.start()
        try:
            metrics = runner.run(
                until=lambda r: producer.done.is_set() and r.lag() == 0,
                on_progress=lambda m: say("  " + m.line()),
            )
        finally:
            runner.close()
        if producer.error:
            raise DemoError(producer.error)
        run_seconds = time.monotonic() - run_started
        say("  " + metrics.line())
        ingest, delivery = metrics.ingest, metrics.delivery
        rate = ingest.events / run_seconds
        say(f"done: {ingest.events} events ({ingest.bad_records} malformed, counted and "
            f"dead-lettered) in {delivery.transactions} transactions, {delivery.batches} Spark "
            f"batches, {run_seconds:.1f}s: {rate:,.0f} events/s (demo total "
            f"{time.monotonic() - started:.1f}s)")
        _show_and_check(database_url, producer.world, say)
        return rate
    finally:
        kafka.stop()


def _show_and_check(url: str, world: OrderWorld, say: Say) -> None:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT customer_id, name, n_orders, total, time, diff FROM customer_stats "
            "ORDER BY total DESC, customer_id LIMIT 10"
        ).fetchall()
        live = conn.execute(
            "SELECT customer_id, name, n_orders, total FROM customer_stats_live"
        ).fetchall()
        regions = conn.execute("SELECT * FROM region_totals_live ORDER BY region").fetchall()
        progress = conn.execute(
            'SELECT pipeline, "transaction", offsets FROM txstream_progress').fetchall()
    say("\ncustomer_stats (live snapshot; top 10 by total):")
    say(f"  {'customer_id':>11} {'name':<14} {'n_orders':>8} {'total':>12} {'time':>6} diff")
    for cid, name, n, total, t, d in rows:
        say(f"  {cid:>11} {name:<14} {n:>8} {total:>12.2f} {t:>6} {d:>4}")
    say("\nregion_totals (paid orders):")
    for region, n, revenue, lo, hi in regions:
        say(f"  {region:<6} orders {n:>5}  revenue {revenue:>12.2f}  min {lo:>8.2f} "
            f"max {hi:>8.2f}")
    say("\ntxstream_progress (committed with the tables, in the same PostgreSQL transaction):")
    for pipeline, transaction, offsets in progress:
        resume = ", ".join(f"{topic.rsplit('-', 1)[0]}/{p}@{o}" for topic, parts in
                           sorted(offsets.items()) for p, o in sorted(parts.items()))
        say(f"  pipeline {pipeline}: through transaction #{transaction}; sources resume at "
            f"{resume}")
    expected = _expected_customer_stats(world)
    got = {cid: (name, n, total) for cid, name, n, total in live}
    wrong = [cid for cid in expected.keys() | got.keys()
             if cid not in got or cid not in expected or got[cid] != expected[cid]]
    if wrong:
        raise DemoError(f"snapshot differs from a from-scratch computation for customers "
                        f"{sorted(wrong)[:10]}")
    say(f"\nchecked: customer_stats equals a from-scratch computation for all {len(expected)} "
        "customers, to the cent")
    say(f"\nconnect: psql '{url}'   (tables customer_stats, region_totals, paid_orders, "
        "statuses, txstream_progress; views *_live)\nstop PostgreSQL: make demo-stop")
