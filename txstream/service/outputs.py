"""The sinks of one pipeline, opened from its configuration and written together: the
PostgreSQL ones in one PostgreSQL transaction per batch with the pipeline's progress row
(`txstream.sinks.postgres.outputs`), every other one alone, all of them in parallel."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from txstream.changes import Changes
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.tables import TableSchema
from txstream.service.metrics import DeliveryMetrics
from txstream.service.stages import Computed, CrashPoints, Retrying
from txstream.sinks.factory import PostgresSink, open_postgres_sink, open_sink
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.postgres.outputs import Mark, PostgresOutputs
from txstream.sinks.postgres.writers import WriterEpoch
from txstream.sinks.sink import Sink

SinksByOutput = dict[str, list[tuple[SinkConfig, Sink]]]
PostgresTables = dict[str, list[PostgresSink]]


def open_sinks(config: PipelineConfig, schemas: Mapping[str, TableSchema], *, resuming: bool,
               live: LiveTables | None, writer_check: Callable[[], None] | None = None
               ) -> tuple[SinksByOutput, PostgresTables]:
    """Every configured sink, by output (`schemas`: the outputs' schemas), and the PostgreSQL
    ones among them. A run that resumes never recreates a destination (see
    `SinkSettings.resumed`). `writer_check`: raises a `FencedError` once another instance took
    over (a Kafka sink asks it before reopening a fenced producer)."""
    opened: SinksByOutput = {}
    tables: PostgresTables = {}
    try:
        for cfg in config.sinks:
            settings = cfg.settings.resumed() if resuming else cfg.settings
            schema = schemas[cfg.output]
            sink: Sink
            if (postgres := settings.postgres) is not None:
                table = open_postgres_sink(postgres, cfg.output, schema,
                                           database_url=config.database_dsn)
                tables.setdefault(cfg.output, []).append(table)
                sink = table
            else:
                sink = open_sink(settings, cfg.output, schema,
                                 kafka_bootstrap_servers=config.kafka_bootstrap_servers,
                                 kafka_security=config.kafka_security, live=live,
                                 live_state_dir=config.live_state_dir if live else None,
                                 writer_check=writer_check)
            opened.setdefault(cfg.output, []).append((cfg, sink))
    except BaseException:
        for sinks in opened.values():
            for _, sink in sinks:
                sink.close()
        raise
    return opened, tables


def _postgres_outputs(config: PipelineConfig, tables: PostgresTables, resuming: bool,
                      fence: WriterEpoch | None) -> PostgresOutputs | None:
    """The PostgreSQL sinks, committed together with the pipeline's progress row (which a
    start from scratch that recreates every table deletes), each transaction checking the
    writer epoch `fence` if given; None without any."""
    settings = [s for cfg in config.sinks if (s := cfg.settings.postgres) is not None]
    if not settings:
        return None
    assert config.database_dsn is not None  # the configuration's own check
    first = settings[0]
    return PostgresOutputs(
        config.database_dsn, tables, pipeline=config.consumer_group,
        definition=config.pipeline, db_schema=first.db_schema, commit=config.postgres_commit,
        retry=first.retry, start_over=not resuming and all(s.replaces for s in settings),
        fence=fence)


class Outputs:
    """Every sink of a pipeline (`sinks`, by output) and its PostgreSQL ones' progress row
    (`postgres`), written a computed batch at a time by the deliver stage."""

    def __init__(self, config: PipelineConfig, schemas: Mapping[str, TableSchema], *,
                 resuming: bool, live: LiveTables | None, retrying: Retrying,
                 crash: CrashPoints, fence: WriterEpoch | None = None,
                 checkpoint_fence: Callable[[], None] | None = None) -> None:
        """Opens every sink (retrying while PostgreSQL is unavailable). `fence`: the writer
        epoch this instance took (`txstream.service.leadership`), checked by every PostgreSQL
        transaction. `checkpoint_fence`: raises a `FencedError` once the checkpoint location's
        epoch moved on. Both make `check_writer`, which a Kafka sink asks before it reopens a
        fenced producer."""
        self._checkpoint_fence = checkpoint_fence
        self.postgres: PostgresOutputs | None = None
        self._retrying = retrying
        self.sinks, tables = retrying("postgresql", lambda: open_sinks(
            config, schemas, resuming=resuming, live=live, writer_check=self.check_writer))
        try:
            self.postgres = retrying(
                "postgresql", lambda: _postgres_outputs(config, tables, resuming, fence))
        except BaseException:
            self._close_sinks()
            raise
        self.live = live
        self._crash = crash
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(config.sinks)),
                                        thread_name_prefix="sink")

    def each(self) -> Iterator[tuple[SinkConfig, Sink]]:
        for sinks in self.sinks.values():
            yield from sinks

    def held(self) -> list[tuple[SinkConfig, int | None]]:
        """What each sink says its destination holds (it may read it whole)."""
        return [(cfg, sink.held_through()) for cfg, sink in self.each()]

    def saved(self) -> list[tuple[SinkConfig, int | None]]:
        """For each sink, the newest checkpoint it saved its own state for."""
        return [(cfg, sink.saved_through()) for cfg, sink in self.each()]

    def progress_row(self) -> int | None:
        """The last transaction the PostgreSQL outputs' progress row says is committed."""
        return self.postgres.committed() if self.postgres is not None else None

    def write(self, computed: Computed, metrics: DeliveryMetrics) -> None:
        """Every output of `computed` to each of its sinks, in parallel; returns once all are
        written. The PostgreSQL outputs are written even when no table changes: the progress
        row says how far they are."""
        writes: list[Callable[[], None]] = [
            partial(self._write_one, cfg, sink, changes, metrics)
            for name, changes in computed.outputs.items() if changes.num_rows
            for cfg, sink in self.sinks.get(name, []) if not cfg.settings.writes_postgres]
        if self.postgres is not None:
            writes.append(partial(self._write_postgres, self.postgres, computed, metrics))
        for _ in self._pool.map(lambda write: write(), writes):
            pass
        metrics.output_changes += sum(c.num_rows for c in computed.outputs.values())
        metrics.rejected_rows = {name: sum(sink.rejected_rows for _, sink in sinks)
                                 for name, sinks in self.sinks.items()}
        if self.live is not None:
            metrics.live_table_bytes = self.live.nbytes()
            metrics.live_subscribers = self.live.subscriber_count()

    def _write_one(self, cfg: SinkConfig, sink: Sink, changes: Changes,
                   metrics: DeliveryMetrics) -> None:
        started = time.monotonic()
        self._retrying(cfg.settings.dependency, lambda: sink.write(changes))
        metrics.sink_write_seconds.observe(time.monotonic() - started)
        self._crash.reached("sink_write")

    def _write_postgres(self, outputs: PostgresOutputs, computed: Computed,
                        metrics: DeliveryMetrics) -> None:
        """Every PostgreSQL output of the batch in one PostgreSQL transaction (or one per
        stream transaction) with the progress row."""
        started = time.monotonic()
        marks = [Mark(t.number, (t.upstream_id,) if t.upstream_id is not None else (),
                      t.offsets) for t in computed.batch.transactions]
        self._retrying("postgresql", lambda: outputs.write(computed.outputs, marks))
        metrics.sink_write_seconds.observe(time.monotonic() - started)
        self._crash.reached("sink_write")

    def check_writer(self) -> None:
        """A `FencedError` if another instance took over the pipeline: its PostgreSQL
        outputs or its checkpoint location (from any thread: the PostgreSQL outputs run one
        transaction at a time)."""
        if self._checkpoint_fence is not None:
            self._checkpoint_fence()
        if self.postgres is not None:
            self._retrying("postgresql", self.postgres.check_writer)

    def before_checkpoint(self, transaction: int) -> None:
        for _, sink in self.each():
            sink.before_checkpoint(transaction)

    def on_checkpoint(self, transaction: int) -> None:
        for _, sink in self.each():
            sink.on_checkpoint(transaction)

    def close(self) -> None:
        self._pool.shutdown()
        self._close_sinks()

    def _close_sinks(self) -> None:
        if self.postgres is not None:
            self.postgres.close()
        for _, sink in self.each():
            sink.close()
