"""Models of the output side: sink settings (`SinkSettings`, one per kind, told apart by
`kind`) and the Deephaven-style update record.

What the service needs to know about a sink's kind (does it write PostgreSQL, serve a live
table, which topic does it own, how is its destination named in a message) is asked of its
settings class, which answers for its own kind: no caller compares `kind` strings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from txstream.schemas.kafka import OWNED_SETTING_PREFIXES


class RetryPolicy(BaseModel):
    """How often and how patiently a sink retries a transient failure of its destination."""

    model_config = ConfigDict(frozen=True)

    # Tries of one write before the sink gives up and raises the failure.
    attempts: int = Field(default=5, ge=1)
    # Pause before the first retry, doubled after each.
    initial_backoff_s: float = Field(default=0.2, gt=0)
    # The longest pause between two retries.
    max_backoff_s: float = Field(default=5.0, gt=0)


class TombstonePurge(BaseModel):
    """Background purge of snapshot tombstones (rows with `diff = -1`).

    A tombstone at time t only matters against a change of its key older than t arriving later.
    Once the writer has declared a watermark W (no change with time <= W will ever be written
    again), tombstones with time <= W - `horizon` are purged every `interval_s` seconds; with
    no watermark nothing is purged. The service declares its newest checkpoint's transaction:
    a restart replays only what follows it, so the out-of-order guard needs no tombstone at or
    below it. (A replay from an older checkpoint, the newest one lost, can show a deleted row
    again until it reaches the row's deletion.) Keep `horizon` transactions of tombstones for
    readers that poll the table for deletions.
    """

    model_config = ConfigDict(frozen=True)

    horizon: int = Field(default=0, ge=0, description="transactions kept below the watermark")
    interval_s: float = Field(default=60.0, gt=0)
    batch_rows: int = Field(default=10_000, ge=1, description="rows deleted per statement")


class ModifiedRow(BaseModel):
    """A key changed within one transaction: its row before and after."""

    before: dict[str, Any]
    after: dict[str, Any]


class UpdateRecord(BaseModel):
    """One table's update in one transaction, in Deephaven's terms: the `updates` format of the
    file and Kafka sinks (JSON). Rows are named by their primary key; the live tables' update,
    which names rows by row keys and says how they shift, is `txstream.updates.TableUpdate`.

    A key with both a deletion and an insertion in the transaction is modified; a key with only
    an insertion is added, only a deletion removed. `modified_columns` is the set of columns
    whose value differs in at least one modified row (Deephaven's modified column set).
    """

    table: str
    time: int
    added: list[dict[str, Any]] = Field(default_factory=list)
    removed: list[dict[str, Any]] = Field(default_factory=list)
    modified: list[ModifiedRow] = Field(default_factory=list)
    modified_columns: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _columns_only_with_modifies(self) -> UpdateRecord:
        if self.modified_columns and not self.modified:
            raise ValueError("modified_columns given without modified rows")
        return self


class _SinkSettings(BaseModel):
    """What every kind of sink settings answers; each kind overrides what differs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Which sink: `postgres_snapshot` (the default), `postgres_append`, `kafka`, `file`,
    # `live`.
    kind: str

    @property
    def postgres(self) -> PostgresTableSettings | None:
        """These settings as a PostgreSQL table's, None for a sink of another kind."""
        return None

    @property
    def writes_postgres(self) -> bool:
        """Whether the sink writes a PostgreSQL table (committed with the progress row)."""
        return self.postgres is not None

    @property
    def serves_live(self) -> bool:
        """Whether the sink keeps a live table in the service."""
        return False

    @property
    def kafka_topic(self) -> str | None:
        """The Kafka topic the sink writes, None for a sink of another kind."""
        return None

    @property
    def shows_batch_ends_only(self) -> bool:
        """Whether, under `postgres_commit: batch`, what the destination holds depends only on
        the state each batch commits, not on the states between: a PostgreSQL snapshot (its
        live rows, committed with the progress row; a row's `time` and tombstones say less
        then, see `PipelineConfig.nets_batches`). A stream of changes shows every
        transaction."""
        return False

    @property
    def dependency(self) -> str:
        """The name readiness and the log give the sink's destination while it is down."""
        return f"{self.kind} sink"

    @property
    def replaces(self) -> bool:
        """Whether a start from scratch recreates the destination (`mode: replace`)."""
        return False

    def resumed(self) -> Self:
        """The settings for a run that resumes: a destination holding the transactions the
        checkpoint continues is never recreated."""
        return self

    def destination(self) -> str:
        """Where the sink writes, for messages: `table s.t`, `file p`, `topic t`."""
        raise NotImplementedError


class PostgresTableSettings(_SinkSettings):
    """The table a PostgreSQL sink writes, how it is managed, and how failures are retried."""

    # The PostgreSQL table; defaults to the output's name.
    table: str
    # The PostgreSQL schema of the table (and, for the first PostgreSQL sink, of
    # `txstream_progress`).
    db_schema: str = "public"
    # `create`: create the table if missing, check an existing one; `replace`: recreate it on a
    # start from scratch (never when resuming from a checkpoint).
    mode: Literal["create", "replace"] = "create"
    # Retries of a transient failure of the destination.
    retry: RetryPolicy = RetryPolicy()

    @property
    def postgres(self) -> PostgresTableSettings:
        return self

    @property
    def dependency(self) -> str:
        # Every PostgreSQL sink shares one server (and one transaction per batch).
        return "postgresql"

    @property
    def replaces(self) -> bool:
        return self.mode == "replace"

    def resumed(self) -> Self:
        return self.model_copy(update={"mode": "create"}) if self.replaces else self

    def destination(self) -> str:
        return f"table {self.db_schema}.{self.table}"


class PostgresSnapshotSettings(PostgresTableSettings):
    """A live snapshot in PostgreSQL (`txstream.sinks.postgres.snapshot`)."""

    kind: Literal["postgres_snapshot"] = "postgres_snapshot"
    # The view of the live rows, without `time` and `diff`; null: `<table>_live`.
    live_view: str | None = None
    # Background purge of tombstones below the writer's watermark (its newest checkpoint), on
    # by default so that a table of moving keys does not grow with every key it ever held;
    # null: tombstones stay.
    purge: TombstonePurge | None = Field(default_factory=TombstonePurge)

    @property
    def shows_batch_ends_only(self) -> bool:
        return True


class PostgresAppendSettings(PostgresTableSettings):
    """Every change appended to a PostgreSQL table (`txstream.sinks.postgres.append`)."""

    kind: Literal["postgres_append"] = "postgres_append"


class KafkaSinkSettings(_SinkSettings):
    """Changes or update records to a Kafka topic, transactionally (`txstream.sinks.kafka_sink`)."""

    kind: Literal["kafka"] = "kafka"
    # The Kafka topic written; one sink per topic.
    topic: str
    transactional_id: str = Field(description="stable per writer, distinct between writers")
    # `changes`: one message per change row; `updates`: one update record per table and
    # transaction (`UpdateRecord`).
    format: Literal["changes", "updates"] = "changes"
    # Retries of a transient failure of the destination.
    retry: RetryPolicy = RetryPolicy()
    # Extra librdkafka producer settings (not `security.protocol`, `sasl.*`, `ssl.*`: those
    # are `kafka_security`'s).
    producer_config: dict[str, str] = Field(default_factory=dict)

    @field_validator("producer_config")
    @classmethod
    def _no_security(cls, value: dict[str, str]) -> dict[str, str]:
        # One block secures every client; a sink of its own would also put secrets in the file.
        owned = sorted(k for k in value if k.startswith(OWNED_SETTING_PREFIXES))
        if owned:
            raise ValueError(f"{', '.join(owned)}: TLS and SASL are set in kafka_security, "
                             "which every Kafka client of the service shares; remove them here")
        return value

    @property
    def kafka_topic(self) -> str:
        return self.topic

    def destination(self) -> str:
        return f"topic {self.topic}"


class FileSinkSettings(_SinkSettings):
    """Changes (JSON lines or CSV) or update records appended to a file
    (`txstream.sinks.file_sink`)."""

    kind: Literal["file"] = "file"
    # The file appended to.
    path: Path
    # `jsonl`: a JSON change object per line; `csv`: a row per change; `updates`: an update
    # record per line and transaction.
    format: Literal["jsonl", "csv", "updates"] = "jsonl"

    def destination(self) -> str:
        return f"file {self.path}"


class LiveSinkSettings(_SinkSettings):
    """The output kept as a live table in the service and served over Arrow Flight
    (`txstream.sinks.live`; the endpoint is configured by `PipelineConfig.live`). Keyed outputs
    only."""

    kind: Literal["live"] = "live"

    @property
    def serves_live(self) -> bool:
        return True

    def destination(self) -> str:
        return "its table saved in live.state_dir"


SINK_KINDS: dict[str, type[_SinkSettings]] = {
    cls.model_fields["kind"].default: cls for cls in (
        PostgresSnapshotSettings, PostgresAppendSettings, KafkaSinkSettings, FileSinkSettings,
        LiveSinkSettings)}

SinkSettings = Annotated[
    PostgresSnapshotSettings | PostgresAppendSettings | KafkaSinkSettings | FileSinkSettings
    | LiveSinkSettings,
    Field(discriminator="kind"),
]
