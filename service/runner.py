"""The service loop: closed transactions -> engine (several per Spark job) -> sinks -> commit.

Consumer offsets are committed only after every sink holds the batch, so a crash replays
transactions rather than losing them; the snapshot sinks' time guard makes replays harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from connectors.factory import open_sink
from connectors.postgres_snapshot import PostgresSnapshotSink
from connectors.sink import Sink
from connectors.transactions import Transaction, TransactionBuilder
from schemas.config import ConfigError, PipelineConfig
from service.engine import Engine, Pipeline
from service.pipelines import load_pipeline
from service.spark import get_spark

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """What the loop has done so far (counters since start)."""

    started: float = field(default_factory=time.monotonic)
    transactions: int = 0
    batches: int = 0
    events: int = 0
    bad_records: int = 0
    output_changes: int = 0
    last_transaction: int = 0
    lag: int = 0
    engine_seconds: float = 0.0
    sink_seconds: float = 0.0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        rate = self.events / self.elapsed if self.elapsed > 0 else 0.0
        return (
            f"transactions {self.transactions} (last #{self.last_transaction}) | "
            f"events {self.events} ({rate:,.0f}/s) | bad records {self.bad_records} | "
            f"output changes {self.output_changes} | lag {self.lag} | "
            f"spark {self.engine_seconds:.1f}s sinks {self.sink_seconds:.1f}s"
        )


def _check_sources(config: PipelineConfig, pipeline: Pipeline) -> None:
    problems = []
    configured = {s.name: s for s in config.sources}
    for name, node in pipeline.sources.items():
        spec = configured.get(name)
        if spec is None:
            problems.append(f"sources: the pipeline reads {name!r}, which no source configures")
        elif node.schema is not None and spec.schema.columns != node.schema.columns:
            problems.append(
                f"sources.{name}.schema: differs from the pipeline's source schema "
                f"({', '.join(f'{c.name} {c.type.value}' for c in node.schema.columns)})"
            )
    for name in configured.keys() - pipeline.sources.keys():
        problems.append(f"sources.{name}: the pipeline has no source of that name")
    if problems:
        raise ConfigError("configuration does not fit the pipeline:\n  " + "\n  ".join(problems))


class PipelineRunner:
    """Runs one configured pipeline until told to stop."""

    def __init__(self, config: PipelineConfig, *, spark: SparkSession | None = None,
                 pipeline: Pipeline | None = None) -> None:
        self.config = config
        pipeline = pipeline or load_pipeline(config.pipeline)
        _check_sources(config, pipeline)
        self.engine = Engine(pipeline, spark or get_spark(config.spark_master))
        self.sinks = self._make_sinks()
        assert config.kafka_bootstrap_servers is not None
        self.builder = TransactionBuilder(
            config.kafka_bootstrap_servers, config.sources, group_id=config.consumer_group,
            policy=config.transactions, dead_letter_topic=config.dead_letter_topic,
        )
        self._watermarks = Consumer({"bootstrap.servers": config.kafka_bootstrap_servers,
                                     "group.id": f"{config.consumer_group}-lag"})
        self._positions: dict[tuple[str, int], int] = {}
        self._pending: list[Transaction] = []
        self.progress = Progress()

    def _make_sinks(self) -> dict[str, list[Sink]]:
        sinks: dict[str, list[Sink]] = {}
        for i, cfg in enumerate(self.config.sinks):
            out = self.engine.outputs.get(cfg.output)
            if out is None:
                raise ConfigError(
                    f"sinks.{i}.output: {cfg.output!r} is not an output of the pipeline "
                    f"({', '.join(sorted(self.engine.outputs))})"
                )
            sinks.setdefault(cfg.output, []).append(open_sink(
                cfg.settings, cfg.output, out.schema, database_url=self.config.database_url,
                kafka_bootstrap_servers=self.config.kafka_bootstrap_servers,
            ))
        return sinks

    def step(self, poll_timeout: float = 0.2) -> int:
        """Poll once; run a batch when enough transactions wait or the input paused.
        Returns the number of transactions processed."""
        fresh = self.builder.poll(poll_timeout)
        self._pending.extend(fresh)
        stats = self.builder.stats
        self.progress.events, self.progress.bad_records = stats.events, stats.bad_records
        if not self._pending or (fresh and len(self._pending) < self.config.batch_transactions):
            return 0
        batch = self._pending[: self.config.batch_transactions]
        del self._pending[: len(batch)]
        self._process(batch)
        return len(batch)

    def _process(self, batch: list[Transaction]) -> None:
        changes: dict[str, pa.Table] = {}
        for source in self.engine.sources:
            parts = [t.changes[source] for t in batch
                     if source in t.changes and t.changes[source].num_rows]
            if parts:
                changes[source] = pa.concat_tables(parts)
        t0 = time.monotonic()
        outputs = self.engine.process(changes) if changes else {}
        t1 = time.monotonic()
        for name, table in outputs.items():
            if table.num_rows:
                for sink in self.sinks.get(name, []):
                    sink.write(table)
            self.progress.output_changes += table.num_rows
        self.progress.engine_seconds += t1 - t0
        self.progress.sink_seconds += time.monotonic() - t1
        self.builder.commit(batch[-1])
        # One writer in transaction order: no change older than this will reach the snapshots,
        # so their tombstones up to here may be purged (if purging is configured).
        for sinks in self.sinks.values():
            for sink in sinks:
                if isinstance(sink, PostgresSnapshotSink):
                    sink.advance_watermark(batch[-1].number)
        for t in batch:
            for topic, parts in t.offsets.items():
                for partition, offset in parts.items():
                    self._positions[(topic, partition)] = offset
        self.progress.transactions += len(batch)
        self.progress.batches += 1
        self.progress.last_transaction = batch[-1].number
        log.info("batch of %d transactions done, last #%d", len(batch), batch[-1].number)

    def lag(self) -> int:
        """Records in the source topics not yet in a committed transaction."""
        total = 0
        topics = self._watermarks.list_topics(timeout=10).topics
        for spec in self.config.sources:
            meta = topics.get(spec.topic)
            for partition in (meta.partitions if meta else {}):
                _, high = self._watermarks.get_watermark_offsets(
                    TopicPartition(spec.topic, partition), timeout=10, cached=False)
                total += max(0, high - self._positions.get((spec.topic, partition), 0))
        self.progress.lag = total
        return total

    def run(self, until: Callable[[PipelineRunner], bool] | None = None,
            on_progress: Callable[[Progress], None] | None = None,
            progress_interval: float = 2.0) -> Progress:
        """Loop until `until(self)` holds (checked when the input is idle); forever without it."""
        last_report = time.monotonic()
        while True:
            processed = self.step()
            now = time.monotonic()
            if on_progress is not None and now - last_report >= progress_interval:
                self.lag()
                on_progress(self.progress)
                last_report = now
            if not processed and not self._pending and until is not None and until(self):
                return self.progress

    def close(self) -> None:
        self.builder.close()
        self._watermarks.close()
        for sinks in self.sinks.values():
            for sink in sinks:
                sink.close()
