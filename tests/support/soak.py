"""A soak: `txstream run` of the example pipeline for a set time under a steady load whose keys
keep moving, with faults on a schedule, sampled as it goes; then checked against a from-scratch
computation.

    producer -- `rate` events/s of `customers` customers, at most `live_orders` orders live
                (the oldest deleted: new keys forever, old ones gone) --> Kafka
    `txstream run` (the service's defaults; the JVM's GC logged) --> PostgreSQL: a live
        snapshot of every output, and `region_totals`' changes appended
    faults at set times: `kill` (kill -9 of the service, restarted at once), `postgres` (the
        server stopped and started), `broker` (the broker's process frozen `pause_s`), `disk`
        (the checkpoint volume, a tmpfs of `volume_mib` when such a fault is due, full for
        `pause_s`)
    a sample every `sample_s`: see `Sampler`

At the end the producer stops and the service commits everything; the run *holds* when every
snapshot equals the from-scratch tables and the append stream, replayed in time order, never
takes a row out of 0..1 and ends at the snapshot's rows. Used by `bench/soak.py` (an hour) and
`tests/test_soak.py` (three minutes, one fault of each kind).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq

from support.orders import OUTPUT_COLUMNS, OrderProducer, expected_tables, snapshot_tables
from support.orders import write_config as write_orders_config
from support.service_process import ServiceProcess, child_pids, metric, scrape
from support.stress import replay_append, wait_committed_all
from support.volumes import Filler, can_mount, small_volume
from txstream.service.embedded.kafka import KafkaEndpoint, MockKafkaBroker
from txstream.service.embedded.postgres import EmbeddedPostgres, PostgresEndpoint, free_port

APPEND = ("region_totals_changes", "region_totals")  # the append table and its output
FAULTS = ("kill", "postgres", "broker", "disk")
LATENCY = "txstream_end_to_end_latency_seconds"


@dataclass(frozen=True)
class SoakSettings:
    duration_s: float = 3600.0
    rate: float = 2000.0  # events per second
    customers: int = 1000
    live_orders: int = 5000
    sample_s: float = 10.0
    # (seconds from the start, kind): kinds are FAULTS.
    faults: tuple[tuple[float, str], ...] = ()
    pause_s: float = 30.0  # how long a `broker` fault freezes the broker, a `disk` one fills
    volume_mib: int = 64  # the checkpoint volume's size, when a `disk` fault is due
    seed: int = 5
    partitions: int = 1  # of each topic
    # Top-level settings of the service's configuration beyond its defaults.
    service: tuple[tuple[str, Any], ...] = ()


@dataclass
class SoakResult:
    settings: SoakSettings
    events: int = 0
    seconds: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    wrong: dict[str, int] = field(default_factory=dict)  # output -> rows off the from-scratch
    append_problems: list[str] = field(default_factory=list)
    tombstones: dict[str, int] = field(default_factory=dict)  # per snapshot, at the end

    @property
    def held(self) -> bool:
        return not self.wrong and not self.append_problems

    def summary(self) -> dict[str, Any]:
        return {"settings": asdict(self.settings), "events": self.events,
                "seconds": round(self.seconds, 1), "held": self.held, "wrong": self.wrong,
                "append_problems": self.append_problems[:5],
                "faults": self.faults,
                "tombstones": self.tombstones, "samples": self.samples}


def _jvm(pid: int) -> int | None:
    """The driver JVM the service started (its child running java)."""
    for child in child_pids(pid):
        try:
            if Path(f"/proc/{child}/exe").resolve().name == "java":
                return child
        except OSError:
            continue
    return None


def _process(pid: int | None) -> dict[str, Any]:
    """RSS (MB), threads and open file descriptors of `pid`; empty when it is gone."""
    if pid is None:
        return {}
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
            "threads": int(fields["Threads"]), "fds": fds}


# G1's line for one collection: "... GC(12) Pause Young (Normal) (G1 Evacuation Pause)
# 512M->103M(1024M) 5.123ms".
_GC = re.compile(r"GC\(\d+\) Pause (\w+).* (\d+)M->(\d+)M\((\d+)M\)")


def _gc(log: Path) -> dict[str, Any]:
    """From a JVM's GC log: the heap after its last collection (MB), the least after a
    collection of the last ten, the heap after its last full collection (the live heap: a
    young or mixed collection leaves the old generation's garbage counted), and how many full
    collections it made."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    pauses = [m for m in map(_GC.search, lines) if m is not None]
    if not pauses:
        return {}
    after = [int(m.group(3)) for m in pauses]
    full = [int(m.group(3)) for m in pauses if m.group(1) == "Full"]
    return {"heap_after_gc_mb": after[-1], "heap_after_gc_min10_mb": min(after[-10:]),
            "heap_after_full_gc_mb": full[-1] if full else None, "full_gcs": len(full)}


def _bytes(path: Path) -> int:
    """The bytes of the files under `path`, those deleted while they are counted left out
    (a checkpoint is written and older ones pruned meanwhile)."""
    total = 0
    # os.walk skips a directory deleted under it (Path.rglob raises on Python 3.11).
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(directory, name)).st_size
    return total


def _checkpoint_rows(location: Path) -> dict[str, int]:
    """Rows per state in the newest complete checkpoint (its Parquet footers)."""
    done = sorted((p for p in location.glob("ckpt-*") if (p / "MANIFEST.json").exists()),
                  key=lambda p: int(p.name.split("-")[1]))
    if not done:
        return {}
    rows: dict[str, int] = {}
    for part in (done[-1] / "engine").rglob("*.parquet"):
        try:
            count = pq.ParquetFile(part).metadata.num_rows
        except Exception:  # deleted by a newer checkpoint meanwhile
            continue
        name = part.relative_to(done[-1] / "engine").parts[0]
        rows[name] = rows.get(name, 0) + count
    return rows


def _buckets(body: str) -> dict[float, float]:
    """The end-to-end latency histogram's cumulative buckets (upper bound -> count)."""
    found: dict[float, float] = {}
    for m in re.finditer(rf'^{LATENCY}_bucket{{.*?le="([^"]+)".*?}} (\S+)$', body, re.MULTILINE):
        bound = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        found[bound] = found.get(bound, 0.0) + float(m.group(2))
    return found


def _quantile(buckets: dict[float, float], q: float) -> float | None:
    """Quantile `q` of the counts, interpolated linearly inside its bucket as Prometheus'
    `histogram_quantile` does (in the last, unbounded bucket: that bucket's lower bound)."""
    ordered = sorted(buckets.items())
    total = ordered[-1][1] if ordered else 0
    if total <= 0:
        return None
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= q * total:
            if bound == float("inf"):
                return lower
            inside = count - below
            return round(lower + (bound - lower) * (q * total - below) / inside, 3)
        lower, below = bound, count
    return None


class Sampler:
    """What a soak samples: the service's Python and driver JVM (RSS, threads, descriptors,
    the heap after GC from the GC log), the newest checkpoint (bytes, rows per state), the
    transaction log's bytes, PostgreSQL's bytes per output table (tombstones included), and
    from `/metrics` dead letters, consumer lag, the last committed transaction, the checkpoints
    that failed (since the process started) and the end-to-end latency's p50 and p99 over the
    interval."""

    def __init__(self, port: int, checkpoints: Path, gc_logs: Path, url: str, schema: str
                 ) -> None:
        self._port, self._checkpoints, self._gc_logs = port, checkpoints, gc_logs
        self._url, self._schema = url, schema
        self._buckets: dict[float, float] = {}

    def sample(self, service: ServiceProcess, at: float, events: int) -> dict[str, Any]:
        jvm = _jvm(service.proc.pid)
        row: dict[str, Any] = {"at_s": round(at, 1), "events": events}
        row |= {f"python_{k}": v for k, v in _process(service.proc.pid).items()}
        row |= {f"jvm_{k}": v for k, v in _process(jvm).items()}
        if jvm is not None:
            row |= _gc(self._gc_logs / f"gc-{jvm}.log")
        location = next(self._checkpoints.iterdir(), None) if self._checkpoints.exists() else None
        if location is not None:
            # Every checkpoint kept, one being written, and the writer epochs.
            row["txlog_bytes"] = _bytes(location / "txlog")
            row["checkpoints_bytes"] = _bytes(location) - row["txlog_bytes"]
            row["state_rows"] = _checkpoint_rows(location)
        row["postgres_bytes"] = self._table_bytes()
        status, body = scrape(self._port)
        row["ready"] = scrape(self._port, "/readyz")[0] == 200
        if status == 200:
            for key, name in (("dead_letters", "txstream_dead_letters_total"),
                              ("committed", "txstream_last_committed_transaction"),
                              ("checkpoint_failures", "txstream_checkpoint_failures_total")):
                row[key] = metric(body, name)
            row["lag"] = sum(float(v) for v in re.findall(
                r"^txstream_lag_records(?:{.*})? (\S+)$", body, re.MULTILINE))
            buckets = _buckets(body)
            # Counts fall after a restart: the new process's histogram is the interval's.
            interval = ({b: c - self._buckets.get(b, 0.0) for b, c in buckets.items()}
                        if all(c >= self._buckets.get(b, 0.0) for b, c in buckets.items())
                        else buckets)
            self._buckets = buckets
            row["latency_p50_s"] = _quantile(interval, 0.5)
            row["latency_p99_s"] = _quantile(interval, 0.99)
        return row

    def _table_bytes(self) -> dict[str, int] | None:
        """Bytes of every output table (heap, indexes, TOAST); None while the server is down."""
        try:
            with psycopg.connect(self._url, connect_timeout=3) as conn:
                return {name: conn.execute(
                    "SELECT pg_total_relation_size(%s)", [f'"{self._schema}"."{name}"']
                ).fetchone()[0] for name in [*OUTPUT_COLUMNS, APPEND[0]]}  # type: ignore[index]
        except psycopg.Error:
            return None


def run_soak(kafka: KafkaEndpoint, postgres: PostgresEndpoint, workdir: Path,
             settings: SoakSettings, progress: Callable[[str], None] = lambda _: None,
             drain_s: float = 300) -> SoakResult:
    """One soak (see the module doc). Faults a set-up cannot inject (a real broker, an
    external PostgreSQL, a full volume without root) are recorded as skipped."""
    volume = workdir / "volume"  # the checkpoints'
    with contextlib.ExitStack() as stack:
        if "disk" in {kind for _, kind in settings.faults} and can_mount():
            stack.enter_context(small_volume(volume, settings.volume_mib))
        return _soak(kafka, postgres, workdir, volume, settings, progress, drain_s)


def _soak(kafka: KafkaEndpoint, postgres: PostgresEndpoint, workdir: Path, volume: Path,
          settings: SoakSettings, progress: Callable[[str], None], drain_s: float
          ) -> SoakResult:
    url: str = postgres.url  # type: ignore[attr-defined]
    tag = uuid.uuid4().hex[:10]
    topics = {"customers": f"soak-customers-{tag}", "orders": f"soak-orders-{tag}"}
    for topic in topics.values():
        kafka.create_topic(topic, settings.partitions)
    schema, group, port = f"soak_{tag}", f"soak-{tag}", free_port()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoints, gc_logs = volume / "checkpoints", workdir / "gc"
    gc_logs.mkdir(exist_ok=True)
    config = write_orders_config(workdir / "pipeline.yaml", topics, schema, group, checkpoints,
                                 port, **dict(settings.service))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "DATABASE_URL": url,
           # Each JVM's collections logged to a file of its own (%p: its pid).
           "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} "
                                f"-Xlog:gc:file={gc_logs}/gc-%p.log".strip()}

    def start() -> ServiceProcess:
        return ServiceProcess(config, env, workdir / "run.log", warm_up=True)

    service = start()
    sampler = Sampler(port, checkpoints, gc_logs, url, schema)
    result = SoakResult(settings)
    pending = sorted(settings.faults)
    producer = OrderProducer(kafka.bootstrap_servers, topics, seed=settings.seed,
                             customers=settings.customers, live_orders=settings.live_orders)
    try:
        service.wait_for_ready(port, timeout=180)
        started = time.monotonic()
        next_sample, next_check = started, started
        # What ends a fault that lasts (`pause_s`), and when.
        undo: list[tuple[float, Callable[[], None]]] = []
        # Faults the service is still recovering from, each with when it was injected.
        following: list[tuple[dict[str, Any], float]] = []
        while (now := time.monotonic()) - started < settings.duration_s:
            due = int(settings.rate * (now - started)) - result.events
            if due > 0:
                producer.send(due, flush=False)
                result.events += due
            while undo and now >= undo[0][0]:
                undo.pop(0)[1]()
            if now >= next_check:  # twice a second: each check asks the service twice
                following = [(f, since) for f, since in following
                             if _recovering(f, since, port)]
                next_check += 0.5
            if pending and now - started >= pending[0][0]:
                at, kind = pending.pop(0)
                progress(f"{now - started:.0f} s: fault {kind}")
                fault, service, end = _inject(kind, at, service, port, start, kafka, postgres,
                                              volume, settings)
                result.faults.append(fault)
                if "skipped" not in fault:
                    following.append((fault, now))
                if end is not None:
                    undo = sorted([*undo, (now + settings.pause_s, end)], key=lambda u: u[0])
            if now >= next_sample:
                result.samples.append(sampler.sample(service, now - started, result.events))
                progress(f"{now - started:.0f} s: {result.samples[-1]}")
                next_sample += settings.sample_s
            time.sleep(0.1)
        for _, end in undo:
            end()
        producer.send(0)  # flushes
        wait_committed_all(service, kafka.bootstrap_servers, group, topics, drain_s,
                           settings.partitions)
        result.seconds = time.monotonic() - started
        result.samples.append(sampler.sample(service, result.seconds, result.events))
        expected = expected_tables(producer.world)
        held = snapshot_tables(url, schema)
        result.wrong = {name: len(rows ^ held[name]) for name, rows in expected.items()
                        if rows != held[name]}
        with psycopg.connect(url) as conn:
            result.tombstones = {name: conn.execute(
                f'SELECT count(*) FROM "{schema}"."{name}" WHERE diff = -1').fetchone()[0]  # type: ignore[index]
                for name in OUTPUT_COLUMNS}
        ended_at, result.append_problems = replay_append(url, schema, *APPEND)
        if ended_at != expected[APPEND[1]]:
            result.append_problems.append(
                f"the append stream ends at {len(ended_at ^ expected[APPEND[1]])} row(s) "
                f"other than the from-scratch {APPEND[1]}")
        return result
    finally:
        if isinstance(kafka, MockKafkaBroker):
            kafka.resume()
        Filler(volume).free()
        service.kill()
        service.wait(30)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _inject(kind: str, at: float, service: ServiceProcess, port: int,
            start: Callable[[], ServiceProcess], kafka: KafkaEndpoint,
            postgres: PostgresEndpoint, volume: Path, settings: SoakSettings
            ) -> tuple[dict[str, Any], ServiceProcess, Callable[[], None] | None]:
    """Inject fault `kind`: its record (to be completed by `_recovering`), the service (a new
    one after a kill) and what ends the fault `pause_s` later (None: it ends by itself)."""
    committed = metric(scrape(port)[1], "txstream_last_committed_transaction")
    record: dict[str, Any] = {"kind": kind, "at_s": round(at, 1), "committed_before": committed}
    end = None
    if kind == "kill":
        service.kill()
        service.wait(30)
        service = start()
    elif kind == "postgres":
        if not isinstance(postgres, EmbeddedPostgres):
            return {**record, "skipped": "an external PostgreSQL is not restarted"}, service, None
        postgres.stop()
        postgres.start()
    elif kind == "broker":
        if not isinstance(kafka, MockKafkaBroker):
            return {**record, "skipped": "a real broker is not paused"}, service, None
        kafka.pause()
        end = kafka.resume
    elif kind == "disk":
        if not os.path.ismount(volume):
            return {**record, "skipped": "mounting a tmpfs needs root"}, service, None
        filler = Filler(volume)
        filler.fill()
        end = filler.free
    else:
        raise ValueError(f"unknown fault {kind!r}: one of {', '.join(FAULTS)}")
    return record, service, end


def _recovering(record: dict[str, Any], since: float, port: int) -> bool:
    """Complete the record of a fault injected at `since` as the service recovers: when
    `/readyz` first said not ready, when it was ready again, when a transaction after the
    fault was committed; False once done."""
    status, _ = scrape(port, "/readyz", timeout=1)
    waited = round(time.monotonic() - since, 1)
    if status != 200 and "not_ready_after_s" not in record:
        record["not_ready_after_s"] = waited
    if status == 200 and "not_ready_after_s" in record and "ready_again_after_s" not in record:
        record["ready_again_after_s"] = waited
    committed = metric(scrape(port, timeout=1)[1], "txstream_last_committed_transaction")
    before = record["committed_before"] or 0
    if committed is not None and committed > before and "committed_after_s" not in record:
        record["committed_after_s"] = waited
    # Followed a minute past the first commit (readiness may flap meanwhile) and until ready
    # again if it was not (a batch computed before a full disk commits at once), at most ten.
    done = "committed_after_s" in record and waited > 60 and (
        "not_ready_after_s" not in record or "ready_again_after_s" in record)
    return not (done or waited > 600)
