"""The service loop: closed transactions -> engine (several per Spark job) -> sinks -> commit,
with checkpoints and recovery.

Per batch, in this order: the transactions' identities go to the transaction log; the engine
runs; every sink writes; the consumer offsets are committed to Kafka. Every so many batches (and
at a graceful stop) a checkpoint saves the builder's state (next number, offsets, upsert rows)
and the engine's state, both as of the last committed transaction.

After a crash the runner loads the newest complete checkpoint and the transactions logged after
it; the builder re-forms those from the same records with the same numbers and boundaries, the
engine recomputes them, and the sinks receive them again:
* live snapshots end exactly as if no crash had happened: their time guard ignores a change
  not newer than what a key holds;
* append streams are at-least-once: Kafka and file sinks may receive a replayed transaction a
  second time (same number, same changes: consumers can deduplicate by `time`); the PostgreSQL
  append sink skips times it already holds.
The Kafka consumer group's committed offsets are for monitoring only: a restart resumes from
the checkpoint's offsets, which belong with the engine's state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, TopicPartition
from pyspark.sql import SparkSession

from connectors.factory import open_sink
from connectors.kafka_source import KafkaSourceError
from connectors.postgres_snapshot import PostgresSnapshotSink
from connectors.sink import Sink, SinkWriteError
from connectors.transactions import (
    Offsets,
    Ranges,
    SourceState,
    Transaction,
    TransactionBuilder,
    TransactionLogEntry,
)
from schemas.config import ConfigError, PipelineConfig, SinkConfig
from schemas.tables import TableSchema
from service.checkpoint import CheckpointStore, PipelineIdentity
from service.engine import Engine, Pipeline
from service.health import Progress, Readiness
from service.pipelines import load_pipeline
from service.spark import get_spark

__all__ = ["PipelineRunner", "Progress", "ShutdownRequested"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Fault injection for the crash tests: `TXSTREAM_CRASH_AT=<point>:<n>` kills the process with
# SIGKILL the n-th time it reaches <point>: `log` (batch logged, nothing written), `sink_write`
# (the first sink of a batch written, the others not), `commit` (sinks written, offsets not
# committed), `checkpoint` (checkpoint data written, manifest not).
CRASH_ENV = "TXSTREAM_CRASH_AT"


class ShutdownRequested(Exception):
    """A stop was requested while the loop waited for an unavailable dependency: the current
    batch is abandoned (recovery replays it)."""


class _CrashPoints:
    def __init__(self, spec: str | None) -> None:
        self._point, self._countdown = None, 0
        if spec:
            point, _, n = spec.partition(":")
            self._point, self._countdown = point, int(n or "1")

    def reached(self, point: str) -> None:
        if point == self._point:
            self._countdown -= 1
            if self._countdown == 0:
                log.warning("%s=%s: killing the process", CRASH_ENV, os.environ.get(CRASH_ENV))
                os.kill(os.getpid(), signal.SIGKILL)


def _shape(schema: TableSchema) -> tuple[object, ...]:
    """Names, types and key; not nullability, which a schema written in YAML leaves at its
    default even for key columns (that `TableSchema.of` makes non-null)."""
    return tuple((c.name, c.type) for c in schema.columns), tuple(schema.primary_key)


def check_sources(config: PipelineConfig, pipeline: Pipeline) -> None:
    """The configured sources are exactly the pipeline's, with its schemas."""
    problems = []
    configured = {s.name: s for s in config.sources}
    for name, node in pipeline.sources.items():
        spec = configured.get(name)
        if spec is None:
            problems.append(f"sources: the pipeline reads {name!r}, which no source configures")
        elif node.schema is not None and _shape(spec.schema) != _shape(node.schema):
            problems.append(
                f"sources.{name}.schema: differs from the pipeline's source schema "
                f"({', '.join(f'{c.name} {c.type.value}' for c in node.schema.columns)}; "
                f"primary key {', '.join(node.schema.primary_key) or 'none'})"
            )
    for name in configured.keys() - pipeline.sources.keys():
        problems.append(f"sources.{name}: the pipeline has no source of that name")
    if problems:
        raise ConfigError("configuration does not fit the pipeline:\n  " + "\n  ".join(problems))


def check_sinks(config: PipelineConfig, engine: Engine) -> None:
    """Every sink names an output of the pipeline."""
    problems = [
        f"sinks.{i}.output: {cfg.output!r} is not an output of the pipeline "
        f"({', '.join(sorted(engine.outputs))})"
        for i, cfg in enumerate(config.sinks) if cfg.output not in engine.outputs
    ]
    if problems:
        raise ConfigError("configuration does not fit the pipeline:\n  " + "\n  ".join(problems))


def _dependency(cfg: SinkConfig) -> str:
    kind = cfg.settings.kind
    return "postgresql" if kind.startswith("postgres") else f"{kind} sink"


class KafkaMonitor:
    """A thread that measures the lag per partition (high watermark minus the committed
    position) and the end-to-end latency of committed batches (commit time minus the Kafka
    timestamp of the first and last record per partition), off the loop, with its own
    consumer: a slow or unreachable broker never stalls the loop through it."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], progress: Progress,
                 readiness: Readiness, interval_s: float) -> None:
        settings = {"bootstrap.servers": bootstrap, "group.id": f"{group}-monitor",
                    "enable.auto.commit": False, "socket.timeout.ms": 5000}
        # Two consumers: a latency probe waiting on a fetch never delays a lag measurement.
        self._consumer = Consumer(settings)
        self._probe = Consumer(settings)
        self._lock = threading.Lock()  # `lag()` from the loop and the thread share _consumer
        self._topics = topics
        self._progress = progress
        self._readiness = readiness
        self._interval = interval_s
        self.positions: Offsets = {}  # replaced (never mutated) by the loop
        self._latency: queue.Queue[tuple[Ranges, float]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-monitor", daemon=True)

    def start(self) -> KafkaMonitor:
        self._thread.start()
        return self

    def committed(self, ranges: Ranges, commit_time: float) -> None:
        """A batch with these offset ranges was committed at `commit_time` (epoch seconds).
        Sampled: dropped while the previous one is still being measured."""
        with contextlib.suppress(queue.Full):
            self._latency.put_nowait((ranges, commit_time))

    def measure_lag(self) -> int:
        """Measure now; the total lag. Raises KafkaException when the broker does not answer."""
        with self._lock:
            lags: dict[tuple[str, int], int] = {}
            topics = self._consumer.list_topics(timeout=5).topics
            for topic in self._topics:
                meta = topics.get(topic)
                for partition in sorted(meta.partitions if meta else {}):
                    _, high = self._consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=5, cached=False)
                    done = self.positions.get(topic, {}).get(partition, 0)
                    lags[(topic, partition)] = max(0, high - done)
        self._progress.lag_by_partition = lags
        self._progress.lag = sum(lags.values())
        return self._progress.lag

    def _measure_latency(self, ranges: Ranges, commit_time: float) -> None:
        for index in (0, 1):  # the first, then the last record of each range
            tps = [TopicPartition(t, p, span[0] if index == 0 else span[1] - 1)
                   for t, parts in ranges.items() for p, span in parts.items()]
            if not tps:
                return
            self._probe.assign(tps)
            wanted = {(tp.topic, tp.partition): tp.offset for tp in tps}
            deadline = time.monotonic() + 5
            while wanted and time.monotonic() < deadline and not self._stop.is_set():
                for m in self._probe.consume(len(wanted), timeout=0.5):
                    tp = (m.topic(), m.partition())
                    if m.error() is None and wanted.get(tp) == m.offset():
                        del wanted[tp]
                        kind, stamp_ms = m.timestamp()
                        if kind != 0 and stamp_ms > 0:  # 0: TIMESTAMP_NOT_AVAILABLE
                            self._progress.end_to_end_seconds.observe(
                                max(0.0, commit_time - stamp_ms / 1000))
        self._probe.unassign()

    def _run(self) -> None:
        next_lag = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_lag:
                try:
                    self.measure_lag()
                    self._readiness.ok("kafka", observer="monitor")
                except KafkaException as exc:
                    self._readiness.fail("kafka", str(exc.args[0] if exc.args else exc),
                                          observer="monitor")
                next_lag = time.monotonic() + self._interval
            try:
                ranges, commit_time = self._latency.get(timeout=self._interval / 4)
            except queue.Empty:
                continue
            try:
                self._measure_latency(ranges, commit_time)
            except KafkaException as exc:
                log.debug("latency probe failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._consumer.close()
        self._probe.close()


class PipelineRunner:
    """Runs one configured pipeline until told to stop.

    Construction restores the newest checkpoint (or starts from scratch) and connects to Kafka
    and the sinks, retrying while they are unavailable. `run` loops; `request_stop` (e.g. from a
    SIGTERM handler) makes it return after the current batch; `checkpoint` then `close`.
    """

    def __init__(self, config: PipelineConfig, *, spark: SparkSession | None = None,
                 pipeline: Pipeline | None = None, progress: Progress | None = None,
                 readiness: Readiness | None = None) -> None:
        """`progress` and `readiness`: given when an HTTP endpoint serves them from before the
        runner exists (restoring and connecting take a while)."""
        self.config = config
        pipeline = pipeline or load_pipeline(config.pipeline)
        check_sources(config, pipeline)
        spark = spark or get_spark(config.spark_master)
        self.engine = Engine(pipeline, spark)
        check_sinks(config, self.engine)
        self.progress = progress or Progress()
        self.readiness = readiness or Readiness(config.ready_max_lag)
        self._stop = threading.Event()
        self._crash = _CrashPoints(os.environ.get(CRASH_ENV))
        assert config.kafka_bootstrap_servers is not None
        self.checkpoints = CheckpointStore(
            config.checkpoint_location, spark, keep=config.checkpoints_kept,
            identity=PipelineIdentity(pipeline=config.pipeline,
                                      sources={s.name: s.topic for s in config.sources},
                                      outputs=sorted(self.engine.outputs)))
        latest = self.checkpoints.latest()
        # Sinks may hold transactions of an earlier run exactly when there is a checkpoint or a
        # logged transaction; only a start from scratch may recreate `mode: replace` tables.
        resuming = self.checkpoints.has_history()
        if latest is not None:
            state = self.checkpoints.load_source_state(latest)
            self.engine.load_state(self.checkpoints.engine_uri(latest))
            self._checkpointed = latest.transaction
            self.progress.last_checkpoint_transaction = latest.transaction
        else:
            # No checkpoint: the engine state is empty, so the input starts at the beginning
            # of every topic (whatever offsets the consumer group committed).
            state = SourceState(next_number=1, offsets={}, upsert_rows={
                s.name: s.table_schema.arrow_schema().empty_table()
                for s in config.sources if s.semantics == "upsert"})
            self._checkpointed = 0
        replay = self.checkpoints.logged_after(self._checkpointed)
        self._logged_through = self._checkpointed + len(replay)
        self._last_checkpoint = time.monotonic()
        self._batches_since_checkpoint = 0
        self._engine_ahead = False  # the engine ran a batch the sinks did not all commit
        self.progress.last_transaction = self._checkpointed
        if latest is not None or replay:
            log.info("resuming after transaction #%d (%s); replaying %d logged transaction(s)",
                     self._checkpointed, latest.name if latest else "no checkpoint", len(replay))
        self.sinks: dict[str, list[tuple[SinkConfig, Sink]]] = self._retrying(
            "postgresql", lambda: self._open_sinks(resuming))
        self.builder: TransactionBuilder = self._retrying(
            "kafka", lambda: self._open_builder(state, replay))
        self.monitor = KafkaMonitor(
            config.kafka_bootstrap_servers, config.consumer_group,
            [s.topic for s in config.sources], self.progress, self.readiness,
            interval_s=min(2.0, config.status_interval_s))
        self.monitor.positions = state.offsets
        self.monitor.start()
        self._pending: list[Transaction] = []

    # ---- connections ---------------------------------------------------------------------

    def _open_sinks(self, resuming: bool) -> dict[str, list[tuple[SinkConfig, Sink]]]:
        opened: dict[str, list[tuple[SinkConfig, Sink]]] = {}
        try:
            for cfg in self.config.sinks:
                settings = cfg.settings
                if resuming and getattr(settings, "mode", None) == "replace":
                    settings = settings.model_copy(update={"mode": "create"})
                sink = open_sink(settings, cfg.output, self.engine.outputs[cfg.output].schema,
                                 database_url=self.config.database_dsn,
                                 kafka_bootstrap_servers=self.config.kafka_bootstrap_servers)
                opened.setdefault(cfg.output, []).append((cfg, sink))
        except BaseException:
            for sinks in opened.values():
                for _, sink in sinks:
                    sink.close()
            raise
        return opened

    def _open_builder(self, state: SourceState, replay: list[TransactionLogEntry]
                      ) -> TransactionBuilder:
        assert self.config.kafka_bootstrap_servers is not None
        builder = TransactionBuilder(
            self.config.kafka_bootstrap_servers, self.config.sources,
            group_id=self.config.consumer_group, policy=self.config.transactions,
            dead_letter_topic=self.config.dead_letter_topic,
        )
        try:
            builder.restore(state, replay)
        except BaseException:
            builder.close()
            raise
        return builder

    def _retrying(self, dependency: str, work: Callable[[], _T]) -> _T:
        """`work()`, retried with exponential backoff while `dependency` is unavailable (not
        ready meanwhile); ShutdownRequested if a stop is requested while waiting."""
        delay = self.config.retry_initial_backoff_s
        while True:
            try:
                result = work()
            except (SinkWriteError, KafkaSourceError, KafkaException) as exc:
                self.readiness.fail(dependency, str(exc).splitlines()[0])
                log.warning("%s unavailable, retrying in %.1fs: %s", dependency, delay, exc)
                if self._stop.wait(delay):
                    raise ShutdownRequested(f"stopped while {dependency} was unavailable"
                                            ) from exc
                delay = min(delay * 2, self.config.retry_max_backoff_s)
            else:
                self.readiness.ok(dependency)
                return result

    # ---- the loop ------------------------------------------------------------------------

    def step(self, poll_timeout: float = 0.2) -> int:
        """Poll once; run a batch when enough transactions wait or the input paused; checkpoint
        when due. Returns the number of transactions processed."""
        fresh = self._retrying("kafka", lambda: self.builder.poll(poll_timeout))
        self.readiness.started.set()
        self._pending.extend(fresh)
        stats = self.builder.stats
        self.progress.events, self.progress.bad_records = stats.events, stats.bad_records
        self.progress.transactions_closed = stats.transactions
        processed = 0
        if self._pending and (not fresh or len(self._pending) >= self.config.batch_transactions):
            batch = self._pending[: self.config.batch_transactions]
            del self._pending[: len(batch)]
            self._process(batch)
            processed = len(batch)
        if self._batches_since_checkpoint and (
                self._batches_since_checkpoint >= self.config.checkpoint_every_batches
                or time.monotonic() - self._last_checkpoint >= self.config.checkpoint_every_s):
            try:
                self.checkpoint()
            except Exception:
                # The storage may be back by the next batch; until then a crash replays more
                # (an incomplete checkpoint has no manifest and is never read).
                self.progress.checkpoint_failures += 1
                log.exception("checkpoint failed; retried after the next batch")
        return processed

    def _process(self, batch: list[Transaction]) -> None:
        # Logged before any sink sees them: a recovery re-forms exactly these transactions.
        self.checkpoints.log([t.log_entry() for t in batch if t.number > self._logged_through])
        self._logged_through = max(self._logged_through, batch[-1].number)
        self._crash.reached("log")
        changes: dict[str, pa.Table] = {}
        for source in self.engine.sources:
            parts = [t.changes[source] for t in batch
                     if source in t.changes and t.changes[source].num_rows]
            if parts:
                changes[source] = pa.concat_tables(parts)
        self._engine_ahead = True
        t0 = time.monotonic()
        outputs = self.engine.process(changes) if changes else {}
        t1 = time.monotonic()
        self.progress.spark_job_seconds.observe(t1 - t0)
        self.progress.spark_jobs = self.engine.totals.jobs
        self.progress.spark_stages = self.engine.totals.stages
        for name, table in outputs.items():
            if not table.num_rows:
                continue
            for cfg, sink in self.sinks.get(name, []):
                started = time.monotonic()
                self._retrying(_dependency(cfg), lambda s=sink, t=table: s.write(t))
                self.progress.sink_write_seconds.observe(time.monotonic() - started)
                self._crash.reached("sink_write")
            self.progress.output_changes += table.num_rows
        commit_time = time.time()
        self.progress.engine_seconds += t1 - t0
        self.progress.sink_seconds += time.monotonic() - t1
        self._crash.reached("commit")
        self._retrying("kafka", lambda: self.builder.commit(batch[-1]))
        self._engine_ahead = False
        self.monitor.positions = batch[-1].offsets
        ranges: Ranges = {}
        for t in batch:
            for topic, parts in t.ranges.items():
                for p, (first, end) in parts.items():
                    lo, hi = ranges.setdefault(topic, {}).get(p, (first, end))
                    ranges[topic][p] = (min(lo, first), max(hi, end))
        self.monitor.committed(ranges, commit_time)
        self.progress.transactions += len(batch)
        self.progress.batches += 1
        self.progress.batch_transactions.observe(len(batch))
        self.progress.batch_changes.observe(sum(t.num_rows for t in changes.values()))
        self.progress.last_transaction = batch[-1].number
        self._batches_since_checkpoint += 1
        log.debug("batch of %d transactions done, last #%d", len(batch), batch[-1].number)

    def checkpoint(self) -> bool:
        """Checkpoint the state through the last committed transaction, if anything changed
        since the last checkpoint and the engine is not ahead of the sinks; True if written."""
        number = self.progress.last_transaction
        if self._engine_ahead or number == self._checkpointed:
            return False
        started = time.monotonic()
        prepared = self.checkpoints.prepare(number, self.builder.state())
        self.engine.save_state(self.checkpoints.engine_uri(prepared))
        self._crash.reached("checkpoint")
        self.checkpoints.publish(prepared)
        elapsed = time.monotonic() - started
        self._checkpointed = number
        self._last_checkpoint = time.monotonic()
        self._batches_since_checkpoint = 0
        self.progress.checkpoints += 1
        self.progress.checkpoint_seconds.observe(elapsed)
        self.progress.last_checkpoint_transaction = number
        self.progress.last_checkpoint_at = self._last_checkpoint
        # No change at or below a checkpointed transaction is ever written again (a recovery
        # replays only later ones), so tombstones up to it may be purged.
        for sinks in self.sinks.values():
            for _, sink in sinks:
                if isinstance(sink, PostgresSnapshotSink):
                    sink.advance_watermark(number)
        log.info("checkpoint through transaction #%d in %.2fs (%s)", number, elapsed,
                 prepared.name)
        return True

    def lag(self) -> int:
        """Records in the source topics not yet in a committed transaction (measured now)."""
        return self.monitor.measure_lag()

    def request_stop(self) -> None:
        """Make `run` return after the current batch (or at once, abandoning it, while it waits
        for an unavailable dependency). Safe from a signal handler or another thread."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, until: Callable[[PipelineRunner], bool] | None = None,
            on_progress: Callable[[Progress], None] | None = None,
            progress_interval: float = 2.0) -> Progress:
        """Loop until `until(self)` holds (checked when the input is idle) or a stop is
        requested; forever without either. A batch abandoned by a stop is left to recovery."""
        last_report = time.monotonic()
        try:
            while not self._stop.is_set():
                processed = self.step()
                now = time.monotonic()
                if on_progress is not None and now - last_report >= progress_interval:
                    on_progress(self.progress)
                    last_report = now
                if not processed and not self._pending and until is not None and until(self):
                    break
        except ShutdownRequested as exc:
            log.warning("%s: the current batch is abandoned; the next start replays it", exc)
        return self.progress

    def close(self) -> None:
        self.monitor.close()
        self.builder.close()
        for sinks in self.sinks.values():
            for _, sink in sinks:
                sink.close()
