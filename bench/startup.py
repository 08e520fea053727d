"""Start and recovery times of `txstream run`, as a user sees them from outside.

The example pipeline (`txstream.examples.orders`) runs as a `txstream run CONFIG` subprocess,
configured as a user who sets nothing else would: the default transaction policy,
`batch_transactions` and engine warm-up (`warm_up_rows`), its four outputs as PostgreSQL
snapshots, checkpoints in a temporary directory. Before each life a backlog of `--events`
example order events (customers, orders created, updated, moved and deleted: the stream of
`txstream.examples.order_events`, continued from one life to the next) is produced to Kafka, so
the service starts with work waiting. Every figure is seconds from just before the process is
spawned:

* `spark_start_s`: the service's log says the Spark session is up (the first line containing
  `spark_start_marker`: `Spark session started in`, else `engine parallelism`, logged once
  the engine is built on the session). The log is read through a pipe and
  each line stamped when it arrives.
* `first_commit_s`: the progress row (`txstream_progress`, committed with the output tables in
  one PostgreSQL transaction) first names a transaction after the one it named at the spawn:
  the first change of this life a reader of PostgreSQL can see. Polled every 50 ms.
  `first_commit_after_spark_s` is the part after the Spark session: building the engine,
  connecting, restoring the checkpoint, the first batch. `warm_up_s`: the warm-up that ran
  before the first batch, as revisions before 70e4e9d log it; null since, when it runs only
  while the service is idle (after a backlog at start, once no batch has been computed for 3 s).
* `caught_up_s`: the progress row's offsets (where the sources resume) reach the end of every
  partition of both topics: every event produced so far is in the tables.

Lives, all with one consumer group and one checkpoint directory:

* `cold_start`: no checkpoint, empty tables; stopped with SIGTERM once caught up (it writes a
  final checkpoint; `sigterm_exit_s` is the time from the signal to the exit,
  `final_checkpoint_s` the checkpoint's own time as the service logs it, null when the stop
  wrote none).
* `restart`: a new backlog, then the service started again: it restores that checkpoint.
  Stopped with SIGTERM once caught up.
* `after_kill_9`: a new backlog; the service is started, killed with SIGKILL as soon as the
  progress row has moved past where it was (`killed`), and, after one more backlog, started
  again: it restores the checkpoint of the previous SIGTERM and replays the transactions the
  killed life had logged (those already in PostgreSQL change nothing there), then goes on.
* `stop_when_idle`: a new backlog, started again, caught up, then left idle for `--idle-s`
  before the SIGTERM: the service checkpoints an idle pipeline by itself
  (`checkpoint_when_idle_s`), so that such a stop has no final checkpoint to write.

Each life also reports `backlog_events` (events beyond the progress row's offsets at the spawn)
and `transactions` (the progress row's transaction at the spawn and once caught up).
`TXSTREAM_WARM_UP_ROWS` is removed from the service's environment, so that the default warm-up
is what is measured.

Prints one JSON object. Uses `KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL` if set, else starts
the embedded broker and a throwaway PostgreSQL.

    flock /tmp/spark.lock .venv/bin/python bench/startup.py [--events 20000] [--timeout 900] \
        [--idle-s 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.service_process import child_pids

from txstream.examples.order_events import Event, encode, events
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.service.embedded.postgres import free_port, postgres_from_env

ROOT = Path(__file__).resolve().parent.parent
SPARK_MARKER = "Spark session started in"
# Logged by txstream.service.compose once the engine is built on the session (2-3 s after
# the session is up): older revisions log no session line.
FALLBACK_MARKER = "engine parallelism"
# The service's own measure of its warm-up, part of `first_commit_after_spark_s`.
WARM_UP_LINE = re.compile(r"engine warmed up in ([0-9.]+) s")
# txstream.service.checkpointing's line for every checkpoint written.
CHECKPOINT_LINE = re.compile(r"checkpoint through transaction #\d+ in ([0-9.]+)s")
POLL_S = 0.05
CUSTOMERS = 200
# (topic, partition) -> end offset (the next offset a producer would write).
Ends = dict[tuple[str, int], int]


class Backlog:
    """The example's event stream, produced to Kafka a slice at a time: one stream across
    lives, so later slices update and delete the orders of earlier ones."""

    def __init__(self, bootstrap: str, topics: dict[str, str], seed: int) -> None:
        self._bootstrap = bootstrap
        self._topics = topics
        self._stream: Iterator[Event] = events(random.Random(seed), customers=CUSTOMERS)
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                                   "enable.idempotence": True})
        self.partitions = {"customers": 1, "orders": 3}

    def produce(self, count: int) -> Ends:
        """`count` more events; the end offset of every partition once they are written."""
        for i in range(count):
            source, key, row = next(self._stream)
            k, v = encode((source, key, row))
            self._producer.produce(self._topics[source], key=k, value=v)
            if i % 5000 == 4999:
                self._producer.poll(0)
        if self._producer.flush(120) != 0:
            raise SystemExit("the producer could not deliver the backlog within 120 s")
        return self.ends()

    def ends(self) -> Ends:
        """End offsets of every partition, failing if the broker dropped records: the embedded
        broker keeps a few MiB per partition, and a dropped backlog would not be measured."""
        consumer = Consumer({"bootstrap.servers": self._bootstrap,
                             "group.id": f"bench-watermarks-{uuid.uuid4().hex[:8]}"})
        ends: Ends = {}
        try:
            for source, count in self.partitions.items():
                topic = self._topics[source]
                for p in range(count):
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                               timeout=30)
                    if low != 0:
                        raise SystemExit(f"the broker dropped records of {topic}[{p}] "
                                         f"(offsets below {low}): use fewer --events")
                    ends[(topic, p)] = high
        finally:
            consumer.close()
        return ends


@dataclass(frozen=True)
class Progress:
    transaction: int
    offsets: dict[str, dict[str, int]]  # topic -> partition (JSON: a string) -> next offset

    def behind(self, ends: Ends) -> int:
        """Events produced beyond these offsets."""
        return sum(max(0, end - int(self.offsets.get(topic, {}).get(str(p), 0)))
                   for (topic, p), end in ends.items())


class ProgressReader:
    """The pipeline's progress row, read from outside as any PostgreSQL client would."""

    def __init__(self, url: str, schema: str, pipeline: str) -> None:
        # Autocommit: each poll sees the latest commit, and a failed query (the table does
        # not exist yet) leaves no aborted transaction behind.
        self._conn = psycopg.connect(url, autocommit=True)
        self._query = f'SELECT "transaction", offsets FROM "{schema}".txstream_progress ' \
                      "WHERE pipeline = %s"
        self._pipeline = pipeline

    def read(self) -> Progress | None:
        try:
            row = self._conn.execute(self._query, [self._pipeline]).fetchone()
        except psycopg.errors.UndefinedTable:
            return None  # the service creates it when it starts
        return None if row is None else Progress(int(row[0]), row[1])

    def close(self) -> None:
        self._conn.close()


class Service:
    """`txstream run CONFIG` in a subprocess; its output copied to `log_path`, each line
    stamped (time.monotonic) when it arrives, for the markers."""

    def __init__(self, config: Path, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._marks: dict[str, float] = {}
        self.warm_up_s: float | None = None
        self._checkpoints: list[tuple[float, float]] = []  # (when logged, seconds it took)
        self.final_checkpoint_s: float | None = None  # set by `stop`
        self.spawned = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "txstream.service.cli", "run", str(config)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,),
                                        daemon=True, name="service-log")
        self._reader.start()

    def _read(self, output: IO[bytes]) -> None:
        with open(self.log_path, "ab") as log:
            for raw in iter(output.readline, b""):
                now = time.monotonic()
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace")
                for marker in (SPARK_MARKER, FALLBACK_MARKER):
                    if marker in line:
                        self._marks.setdefault(marker, now)
                if (warm_up := WARM_UP_LINE.search(line)) is not None:
                    self.warm_up_s = float(warm_up.group(1))
                if (checkpoint := CHECKPOINT_LINE.search(line)) is not None:
                    self._checkpoints.append((now, float(checkpoint.group(1))))

    def spark_start(self) -> tuple[str, float] | None:
        """(marker, seconds from the spawn) of the Spark session's start, if logged yet."""
        for marker in (SPARK_MARKER, FALLBACK_MARKER):
            if marker in self._marks:
                return marker, self._marks[marker] - self.spawned
        return None

    def children(self) -> list[int]:
        """Pids of the service's own child processes (the JVM)."""
        return child_pids(self.proc.pid)

    def pause(self) -> None:
        """SIGSTOP the service and its JVM: nothing of it runs until `resume`."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig: signal.Signals) -> None:
        for pid in [self.proc.pid, *self.children()]:
            os.kill(pid, sig)

    def kill_9(self) -> None:
        """SIGKILL, then wait until the JVM it launched is gone too (it exits when its stdin
        closes): the next life must not share the two cores with a dying JVM."""
        jvm = self.children()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(30)
        _wait_gone(jvm)

    def stop(self, timeout: float = 90) -> float:
        """SIGTERM; seconds until the process exits (after its final checkpoint, whose own time
        is then `final_checkpoint_s`). Returns once its JVM is gone too, like `kill_9`."""
        jvm = self.children()
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise SystemExit(f"txstream run ignored SIGTERM for {timeout} s:\n"
                             f"{self.tail()}") from None
        exited = round(time.monotonic() - sent, 2)
        self._reader.join(30)
        if code != 0:
            raise SystemExit(f"txstream run exited {code} after SIGTERM:\n{self.tail()}")
        _wait_gone(jvm)
        after = [seconds for logged, seconds in self._checkpoints if logged >= sent]
        self.final_checkpoint_s = after[-1] if after else None
        return exited

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            self._reader.join(30)
            raise SystemExit(f"txstream run exited ({self.proc.returncode}):\n{self.tail()}")


def _wait_gone(pids: list[int]) -> None:
    """Until processes of a stopped service (its JVM, which exits when its stdin closes) are
    gone: what runs next must not share the two cores with a dying JVM."""
    deadline = time.monotonic() + 60
    while alive := [pid for pid in pids if Path(f"/proc/{pid}").exists()]:
        if time.monotonic() > deadline:
            for pid in alive:
                os.kill(pid, signal.SIGKILL)
            raise SystemExit(f"the JVM (pids {alive}) outlived its service by 60 s: killed")
        time.sleep(POLL_S)


def write_config(path: Path, topics: dict[str, str], schema: str, group: str,
                 checkpoint_dir: Path) -> Path:
    """The pipeline's configuration file: the example's own source definitions, its four
    outputs as PostgreSQL snapshots (every other setting at its default). Kafka and
    PostgreSQL come from the environment, as the file may hold no password."""
    config = {
        "pipeline": "txstream.examples.orders:pipeline",
        "consumer_group": group,
        # A free port: the default (8080) may be taken on a shared machine.
        "http_port": free_port(),
        "checkpoint_dir": str(checkpoint_dir),
        "sources": [s.model_dump(mode="json", exclude_defaults=True)
                    for s in kafka_sources(topics["customers"], topics["orders"])],
        "sinks": [{"output": name, "db_schema": schema} for name in OUTPUTS],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def checkpoint_transaction(location: Path) -> int | None:
    """The transaction of the newest checkpoint, the one a start restores (None: none)."""
    manifests = sorted(location.glob("ckpt-*/MANIFEST.json"))
    return json.loads(manifests[-1].read_text())["transaction"] if manifests else None


def measure(service: Service, progress: ProgressReader, before: Progress | None, ends: Ends,
            timeout: float) -> dict[str, Any]:
    """The three figures of one life, polling PostgreSQL until caught up with `ends`."""
    was = before.transaction if before else 0
    first_commit: float | None = None
    deadline = service.spawned + timeout
    while True:
        service.check_alive()
        row = progress.read()
        now = time.monotonic()
        if row is not None and row.transaction > was and first_commit is None:
            first_commit = now - service.spawned
        if row is not None and first_commit is not None and row.behind(ends) == 0:
            caught_up, last = now - service.spawned, row
            break
        if now > deadline:
            service.proc.kill()
            raise SystemExit(f"not caught up within {timeout} s (progress {row}):\n"
                             f"{service.tail()}")
        time.sleep(POLL_S)
    spark = service.spark_start()
    if spark is None:
        raise SystemExit(f"the log shows neither {SPARK_MARKER!r} nor {FALLBACK_MARKER!r}:\n"
                         f"{service.tail()}")
    marker, spark_s = spark
    return {"spark_start_s": round(spark_s, 2), "first_commit_s": round(first_commit, 2),
            "first_commit_after_spark_s": round(first_commit - spark_s, 2),
            "caught_up_s": round(caught_up, 2), "spark_start_marker": marker,
            "warm_up_s": service.warm_up_s,
            "backlog_events": before.behind(ends) if before else sum(ends.values()),
            "transactions": {"at_spawn": was, "caught_up": last.transaction}}


def run(kafka: KafkaEndpoint, url: str, events_per_life: int, timeout: float, idle_s: float,
        work: Path) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    topics = {"customers": f"bench-customers-{run_id}", "orders": f"bench-orders-{run_id}"}
    backlog = Backlog(kafka.bootstrap_servers, topics, seed=11)
    for source, partitions in backlog.partitions.items():
        kafka.create_topic(topics[source], partitions)
    schema, group = f"bench_{run_id}", f"bench-startup-{run_id}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    checkpoints = work / "checkpoints"
    config = write_config(work / "pipeline.yaml", topics, schema, group, checkpoints)
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "DATABASE_URL": url}
    # The default warm-up is part of what a user waits for at every start.
    env.pop("TXSTREAM_WARM_UP_ROWS", None)
    progress = ProgressReader(url, schema, group)
    log_path = work / "txstream.log"

    def life(name: str) -> tuple[Service, Progress | None, int | None]:
        print(f"{name}: starting txstream run", file=sys.stderr, flush=True)
        at_spawn, ckpt = progress.read(), checkpoint_transaction(checkpoints / group)
        return Service(config, env, log_path), at_spawn, ckpt

    def caught_up_life(name: str, idle: float = 0.0) -> dict[str, Any]:
        ends = backlog.produce(events_per_life)
        service, at_spawn, ckpt = life(name)
        result = measure(service, progress, at_spawn, ends, timeout)
        result["checkpoint_transaction_at_spawn"] = ckpt
        if idle:
            time.sleep(idle)
            result["idle_before_sigterm_s"] = idle
        result["sigterm_exit_s"] = service.stop()
        result["final_checkpoint_s"] = service.final_checkpoint_s
        return result

    try:
        report: dict[str, Any] = {"cold_start": caught_up_life("cold_start"),
                                  "restart": caught_up_life("restart")}
        # The life to kill: it gets a backlog, and dies right after its first commit, with
        # later transactions logged or being computed.
        backlog.produce(events_per_life)
        doomed, at_spawn, _ = life("after_kill_9 (the life killed)")
        was = at_spawn.transaction if at_spawn else 0
        deadline = doomed.spawned + timeout
        while (row := progress.read()) is None or row.transaction <= was:
            doomed.check_alive()
            if time.monotonic() > deadline:
                doomed.proc.kill()
                raise SystemExit(f"no commit within {timeout} s:\n{doomed.tail()}")
            time.sleep(POLL_S)
        doomed.kill_9()
        killed = {"after_s": round(time.monotonic() - doomed.spawned, 2),
                  "transaction": row.transaction}
        # One more backlog, so that the restart has new work besides what the killed life
        # left (with small backlogs its first commit may already have covered all of it).
        report["after_kill_9"] = caught_up_life("after_kill_9")
        report["after_kill_9"]["killed"] = killed
        report["stop_when_idle"] = caught_up_life("stop_when_idle", idle_s)
        return report
    finally:
        progress.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per backlog")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds a life may take to catch up")
    parser.add_argument("--idle-s", type=float, default=5.0,
                        help="seconds the last life stays idle before its SIGTERM")
    parser.add_argument("--log", type=Path, help="keep the service's log (every life) here")
    args = parser.parse_args()
    load_start = os.getloadavg()
    kafka = kafka_from_env()
    postgres = postgres_from_env(Path(tempfile.mkdtemp(prefix="txstream-bench-pg-")))
    try:
        with tempfile.TemporaryDirectory(prefix="txstream-bench-startup-") as work:
            try:
                lives = run(kafka, postgres.url, args.events, args.timeout, args.idle_s,
                            Path(work))
            finally:
                if args.log is not None and (Path(work) / "txstream.log").exists():
                    shutil.copyfile(Path(work) / "txstream.log", args.log)
        print(json.dumps({
            "events_per_life": args.events,
            "seconds_from": "the spawn of txstream run",
            "progress_poll_ms": int(POLL_S * 1000),
            **lives,
            "load_average": [list(load_start), list(os.getloadavg())],
        }, indent=2))
    finally:
        kafka.stop()
        postgres.stop()
