"""The example pipeline under load, as a user deploys it: `txstream run` of the orders pipeline
with a live snapshot of every output and an append stream of `paid_orders`, fed in bursts while
another process keeps a core busy (a neighbour on a shared node), then checked against a
from-scratch computation.

    producer -- 300 events, then bursts of 1-30 events 0.02-0.4 s apart --> Kafka
    `txstream run` (batch_transactions, backlog_wait_ms, mini-batch size drawn from the seed)
        --> PostgreSQL: <output>_live snapshots, paid_orders_changes (append)
    a busy process spinning on one core meanwhile

The run *holds* when, once the service has committed every record, each snapshot equals the
from-scratch tables (`support.orders.expected_tables`) and the append table, replayed in time
order, never takes a row below multiplicity 0 or above 1 (a keyed output) and ends at the
snapshot's rows. Used by `tests/test_stress.py` (a few seeds) and `bench/stress.py` (many).
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka import Consumer, TopicPartition

from support.orders import OUTPUT_COLUMNS, OrderProducer, expected_tables, snapshot_tables
from support.service_process import ServiceProcess
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.service.embedded.postgres import free_port

_SOURCES = [
    {"name": "customers", "semantics": "upsert",
     "schema": {"columns": [{"name": "customer_id", "type": "bigint"},
                            {"name": "name", "type": "text"},
                            {"name": "region", "type": "text"}],
                "primary_key": ["customer_id"]}},
    {"name": "orders", "semantics": "upsert",
     "schema": {"columns": [{"name": "order_id", "type": "bigint"},
                            {"name": "customer_id", "type": "bigint"},
                            {"name": "amount", "type": "decimal(12,2)"},
                            {"name": "status", "type": "text"}],
                "primary_key": ["order_id"]}},
]
APPEND_TABLE = "paid_orders_changes"


@dataclass(frozen=True)
class StressSettings:
    """One run's settings; `of(seed)` draws the service's batching from the seed."""

    seed: int
    batch_transactions: int = 100
    backlog_wait_ms: int = 3_000
    max_events: int = 1_000
    max_delay_ms: int = 500
    warm_up: bool = True
    customers: int = 40
    seconds: float = 40.0  # of bursts after the first 300 events
    busy: bool = True  # a process spinning on one core

    @classmethod
    def of(cls, seed: int, **fixed: Any) -> StressSettings:
        rng = random.Random(seed)
        # Mini-batches of 10 events would make a run of several minutes.
        drawn = {"batch_transactions": rng.choice([5, 20, 100]),
                 "backlog_wait_ms": rng.choice([0, 200, 3_000]),
                 "max_events": rng.choice([100, 1_000]),
                 "max_delay_ms": rng.choice([50, 200, 500])}
        return cls(seed=seed, **{**drawn, **fixed})


@dataclass
class StressResult:
    settings: StressSettings
    events: int
    seconds: float  # from the first event to the last commit
    wrong: dict[str, int] = field(default_factory=dict)  # output -> rows differing
    append_problems: list[str] = field(default_factory=list)
    log_tail: str = ""

    @property
    def held(self) -> bool:
        return not self.wrong and not self.append_problems

    def summary(self) -> dict[str, Any]:
        return {**asdict(self.settings), "events": self.events,
                "seconds": round(self.seconds, 1), "held": self.held, "wrong": self.wrong,
                "append_problems": self.append_problems[:5]}


def _config(path: Path, topics: dict[str, str], schema: str, group: str, port: int,
            settings: StressSettings) -> Path:
    path.write_text(yaml.safe_dump({
        "pipeline": "txstream.examples.orders:pipeline",
        "consumer_group": group,
        "http_port": port,
        "checkpoint_dir": str(path.parent / "ck"),
        "sources": [{**s, "topic": topics[str(s["name"])]} for s in _SOURCES],
        "sinks": [{"output": name, "db_schema": schema} for name in OUTPUT_COLUMNS]
        + [{"output": "paid_orders", "kind": "postgres_append", "db_schema": schema,
            "table": APPEND_TABLE}],
        "transactions": {"max_events": settings.max_events,
                         "max_delay_ms": settings.max_delay_ms},
        "batch_transactions": settings.batch_transactions,
        "backlog_wait_ms": settings.backlog_wait_ms,
    }))
    return path


def committed_all(bootstrap: str, group: str, topics: dict[str, str], partitions: int = 1
                  ) -> bool:
    """Whether the service's consumer group committed every partition (of `partitions` per
    topic) to its end (the service commits offsets after every sink committed a batch)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        for topic in topics.values():
            for partition in range(partitions):
                at = TopicPartition(topic, partition)
                committed = consumer.committed([at], timeout=10)[0].offset
                _, high = consumer.get_watermark_offsets(at, timeout=10)
                if committed < high:
                    return False
        return True
    finally:
        consumer.close()


def wait_committed_all(service: ServiceProcess, bootstrap: str, group: str,
                       topics: dict[str, str], timeout_s: float, partitions: int = 1) -> None:
    """Until the running `service` committed every record of `topics` (`committed_all`)."""
    deadline = time.monotonic() + timeout_s
    while not committed_all(bootstrap, group, topics, partitions):
        if service.proc.poll() is not None:
            raise AssertionError(f"txstream run exited ({service.proc.returncode}):\n"
                                 f"{service.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not every record committed within {timeout_s} s:\n"
                                 f"{service.tail()}")
        time.sleep(0.5)


def replay_append(url: str, schema: str, table: str = APPEND_TABLE, output: str = "paid_orders"
                  ) -> tuple[set[tuple[Any, ...]], list[str]]:
    """The append `table` of the keyed `output` integrated transaction by transaction: the rows
    it ends at, and every point where a row's multiplicity left 0..1."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f'SELECT {OUTPUT_COLUMNS[output]}, time, diff FROM "{schema}".'
            f'"{table}" ORDER BY time').fetchall()
    live: Counter[tuple[Any, ...]] = Counter()
    problems: list[str] = []
    by_time: dict[int, list[tuple[Any, ...]]] = {}
    for *row, time_, diff in rows:
        by_time.setdefault(time_, []).append((tuple(row), diff))
    for time_, changes in sorted(by_time.items()):
        for row, diff in changes:
            live[row] += diff
        problems += [f"after transaction {time_}: {row} at multiplicity {live[row]}"
                     for row, _ in changes if not 0 <= live[row] <= 1]
    return {row for row, n in live.items() if n}, problems


def run_stress(kafka: KafkaEndpoint, database_url: str, workdir: Path,
               settings: StressSettings, timeout_s: float = 300) -> StressResult:
    """One run of the scenario of the module doc."""
    tag = uuid.uuid4().hex[:10]
    topics = {"customers": f"stress-customers-{tag}", "orders": f"stress-orders-{tag}"}
    for topic in topics.values():
        kafka.create_topic(topic, 1)
    schema = f"stress_{tag}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    group = f"stress-{tag}"
    config = _config(workdir / "pipeline.yaml", topics, schema, group, port, settings)
    busy = (subprocess.Popen([sys.executable, "-c", "while True: pass"])
            if settings.busy else None)
    service = ServiceProcess(config, {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                                      "DATABASE_URL": database_url}, workdir / "run.log",
                             warm_up=settings.warm_up)
    try:
        producer = OrderProducer(kafka.bootstrap_servers, topics, seed=settings.seed,
                                 customers=settings.customers)
        rng = random.Random(settings.seed * 7919 + 1)
        started = time.monotonic()
        producer.send(300)
        events = 300
        while time.monotonic() - started < settings.seconds:
            burst = rng.randint(1, 30)
            producer.send(burst)
            events += burst
            time.sleep(rng.uniform(0.02, 0.4))
        wait_committed_all(service, kafka.bootstrap_servers, group, topics, timeout_s)
        seconds = time.monotonic() - started
        expected = expected_tables(producer.world)
        held = snapshot_tables(database_url, schema)
        result = StressResult(settings, events, seconds)
        result.wrong = {name: len(rows ^ held[name]) for name, rows in expected.items()
                        if rows != held[name]}
        ended_at, result.append_problems = replay_append(database_url, schema)
        if ended_at != expected["paid_orders"]:
            result.append_problems.append(
                f"the append stream ends at {len(ended_at ^ expected['paid_orders'])} row(s) "
                "other than the from-scratch paid_orders")
        if not result.held:
            result.log_tail = service.tail(6000)
        return result
    finally:
        service.kill()
        service.wait(30)
        if busy is not None:
            busy.kill()
            busy.wait()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
