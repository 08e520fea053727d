"""`txstream demo`: an example pipeline end to end on embedded defaults.

Starts (or reuses, from the environment) a Kafka-protocol broker, a PostgreSQL cluster and a
local Spark, produces the example's sample events, runs the service until every event is in
the snapshots, checks them against a from-scratch computation, and leaves PostgreSQL running
so the tables can be inspected with psql. `txstream demo --stop` stops that PostgreSQL.

The examples (`--example`): `orders` (customers and their orders, `txstream.service.demo_orders`)
and `page_views` (event time: windows, sessions, an as-of join, a last-hour filter,
`txstream.service.demo_page_views`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
from confluent_kafka import Producer

from txstream.kafka_client import client_settings
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.kafka import PLAINTEXT
from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.demo_example import MAX_EVENTS, DemoError, DemoExample, Record, Say
from txstream.service.demo_orders import OrdersDemo
from txstream.service.demo_page_views import PageViewsDemo
from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.service.embedded.postgres import EmbeddedPostgres

DEMO_DIR = Path(".txstream/demo")

EXAMPLES: dict[str, Callable[[], DemoExample]] = {"orders": OrdersDemo,
                                                   "page_views": PageViewsDemo}


def stop(work_dir: Path = DEMO_DIR) -> bool:
    """Stop the PostgreSQL a previous demo left running; True if there was one."""
    pgdata = work_dir / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        return False
    EmbeddedPostgres(pgdata).stop()
    return True


class _Producer(threading.Thread):
    """Produces the sample records at a steady pace while the service consumes them."""

    def __init__(self, bootstrap: str, topics: dict[str, str], records: Iterator[Record]
                 ) -> None:
        super().__init__(name="demo-producer", daemon=True)
        self.bootstrap = bootstrap
        self.topics = topics
        self.records = records
        self.done = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        # Local to the thread, so the client is gone before the broker stops.
        producer = Producer(client_settings(self.bootstrap, PLAINTEXT, **{
            "enable.idempotence": True, "linger.ms": 20}))
        try:
            for i, (source, key, value) in enumerate(self.records):
                producer.produce(self.topics[source], key=key, value=value)
                if i % 500 == 499:
                    producer.poll(0)
                    time.sleep(0.05)  # a stream, not one burst: transactions keep closing
            if producer.flush(60) != 0:
                self.error = "events not delivered within 60 s"
        finally:
            self.done.set()


def run_demo(events_count: int = 20_000, work_dir: Path = DEMO_DIR, say: Say = print,
             example: str = "orders") -> float:
    """Run the demo of `example` (a name of `EXAMPLES`); returns events per second end to
    end."""
    chosen = EXAMPLES[example]()
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
        topics = {source: f"demo-{source.replace('_', '-')}-{run_id}"
                  for source in chosen.partitions}
        for source, partitions in chosen.partitions.items():
            kafka.create_topic(topics[source], partitions)
        dead_letters = f"demo-dead-letters-{run_id}"
        kafka.create_topic(dead_letters, 1)
        runner = open_runner(PipelineConfig(
            pipeline=chosen.pipeline,
            sources=chosen.sources(topics),
            sinks=[SinkConfig.model_validate({"output": name, "mode": "replace"})
                   for name in chosen.outputs],
            transactions=BatchPolicy(max_events=MAX_EVENTS, max_delay_ms=200),
            kafka_bootstrap_servers=kafka.bootstrap_servers,
            consumer_group=f"txstream-demo-{run_id}",
            dead_letter_topic=dead_letters,
            database_url=database_url,
            # Removed with the rest of the work dir, so every demo starts from scratch.
            checkpoint_dir=str(work_dir / "checkpoints"),
        ))
        producer = _Producer(kafka.bootstrap_servers, topics,
                             chosen.records(events_count, seed=7))
        say(f"producing {events_count} {chosen.what}; the service turns them into transactions")
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
        chosen.check(database_url, runner, say)
        _show_progress(database_url, say)
        say(f"\nconnect: psql '{database_url}'   (tables: the outputs, each with a view *_live, "
            "and txstream_progress)\nstop PostgreSQL: make demo-stop")
        return rate
    finally:
        kafka.stop()


def _show_progress(url: str, say: Say) -> None:
    with psycopg.connect(url) as conn:
        progress = conn.execute(
            'SELECT pipeline, "transaction", offsets FROM txstream_progress').fetchall()
    say("\ntxstream_progress (committed with the tables, in the same PostgreSQL transaction):")
    for pipeline, transaction, offsets in progress:
        resume = ", ".join(f"{topic.rsplit('-', 1)[0]}/{p}@{o}" for topic, parts in
                           sorted(offsets.items()) for p, o in sorted(parts.items()))
        say(f"  pipeline {pipeline}: through transaction #{transaction}; sources resume at "
            f"{resume}")
