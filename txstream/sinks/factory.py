"""Opening a sink from its settings (`txstream.schemas.sinks.SinkSettings`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.schemas.sinks import (
    FileSinkSettings,
    KafkaSinkSettings,
    LiveSinkSettings,
    PostgresAppendSettings,
    PostgresSnapshotSettings,
    PostgresTableSettings,
    SinkSettings,
)
from txstream.schemas.tables import TableSchema
from txstream.sinks.file_sink import FileSink
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.live.sink import LiveSink
from txstream.sinks.postgres.append import PostgresAppendSink
from txstream.sinks.postgres.snapshot import PostgresSnapshotSink
from txstream.sinks.sink import Sink, SinkSchemaError

# A sink that is also a `txstream.sinks.postgres.outputs.PostgresTable` (written inside the
# transaction that commits the progress row).
PostgresSink = PostgresSnapshotSink | PostgresAppendSink


def open_postgres_sink(settings: PostgresTableSettings, output: str, schema: TableSchema, *,
                       database_url: str | None) -> PostgresSink:
    """The PostgreSQL sink `settings` describe for the output table `output` with `schema`."""
    if not database_url:
        raise SinkSchemaError(f"the {settings.kind} sink of {output!r} needs a database URL")
    match settings:
        case PostgresSnapshotSettings():
            return PostgresSnapshotSink(
                database_url, settings.table, schema, db_schema=settings.db_schema,
                mode=settings.mode, live_view=settings.live_view, retry=settings.retry,
                purge=settings.purge)
        case PostgresAppendSettings():
            return PostgresAppendSink(database_url, settings.table, schema,
                                      db_schema=settings.db_schema, mode=settings.mode,
                                      retry=settings.retry)
    raise SinkSchemaError(f"no PostgreSQL sink of kind {settings.kind!r}")


def open_sink(settings: SinkSettings, output: str, schema: TableSchema, *,
              database_url: str | None = None, kafka_bootstrap_servers: str | None = None,
              kafka_security: KafkaSecurity = PLAINTEXT, live: LiveTables | None = None,
              live_state_dir: Path | None = None,
              writer_check: Callable[[], None] | None = None) -> Sink:
    """The sink `settings` describe for the output table `output` with `schema`; a Kafka sink
    connects with `kafka_security` and asks `writer_check` before reopening a fenced producer
    (see `KafkaSink`); a live sink writes into `live`, saved in `live_state_dir`."""
    match settings:
        case PostgresSnapshotSettings() | PostgresAppendSettings():
            return open_postgres_sink(settings, output, schema, database_url=database_url)
        case KafkaSinkSettings() if not kafka_bootstrap_servers:
            raise SinkSchemaError(f"the Kafka sink of {output!r} needs bootstrap servers")
        case KafkaSinkSettings():
            assert kafka_bootstrap_servers is not None
            # Here: Kafka's client loads only for a pipeline with a Kafka sink.
            from txstream.sinks.kafka_sink import KafkaSink
            return KafkaSink(kafka_bootstrap_servers, settings.topic, output, schema,
                             transactional_id=settings.transactional_id,
                             format=settings.format, retry=settings.retry,
                             producer_config=settings.producer_config,
                             security=kafka_security, writer_check=writer_check)
        case FileSinkSettings():
            return FileSink(settings.path, output, schema, format=settings.format)
        case LiveSinkSettings():
            if live is None or live_state_dir is None:
                raise SinkSchemaError(f"the live sink of {output!r} needs the live tables")
            return LiveSink(live, output, live_state_dir)
