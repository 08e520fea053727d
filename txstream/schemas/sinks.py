"""Models of the output side: sink settings (`SinkSettings`, one per kind, told apart by
`kind`) and the Deephaven-style update record."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from txstream.schemas.kafka import OWNED_SETTING_PREFIXES


class RetryPolicy(BaseModel):
    """How often and how patiently a sink retries a transient failure of its destination."""

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=5, ge=1)
    initial_backoff_s: float = Field(default=0.2, gt=0)
    max_backoff_s: float = Field(default=5.0, gt=0)


class TombstonePurge(BaseModel):
    """Background purge of snapshot tombstones (rows with `diff = -1`).

    A tombstone at time t only matters against a change of its key older than t arriving later.
    Once the writer has declared a watermark W (no change with time <= W will ever be written
    again), tombstones with time <= W - `horizon` are purged every `interval_s` seconds; with
    no watermark nothing is purged.
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
    """One table's update in one transaction, in Deephaven's terms.

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


class _PostgresTableSettings(BaseModel):
    """The table a PostgreSQL sink writes, how it is managed, and how failures are retried."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    db_schema: str = "public"
    mode: Literal["create", "replace"] = "create"
    retry: RetryPolicy = RetryPolicy()


class PostgresSnapshotSettings(_PostgresTableSettings):
    """A live snapshot in PostgreSQL (`txstream.sinks.postgres_snapshot`)."""

    kind: Literal["postgres_snapshot"] = "postgres_snapshot"
    live_view: str | None = None
    purge: TombstonePurge | None = None


class PostgresAppendSettings(_PostgresTableSettings):
    """Every change appended to a PostgreSQL table (`txstream.sinks.postgres_append`)."""

    kind: Literal["postgres_append"] = "postgres_append"


class KafkaSinkSettings(BaseModel):
    """Changes or update records to a Kafka topic, transactionally (`txstream.sinks.kafka_sink`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["kafka"] = "kafka"
    topic: str
    transactional_id: str = Field(description="stable per writer, distinct between writers")
    format: Literal["changes", "updates"] = "changes"
    retry: RetryPolicy = RetryPolicy()
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


class FileSinkSettings(BaseModel):
    """Changes (JSON lines or CSV) or update records appended to a file
    (`txstream.sinks.file_sink`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["file"] = "file"
    path: Path
    format: Literal["jsonl", "csv", "updates"] = "jsonl"


class LiveSinkSettings(BaseModel):
    """The output kept as a live table in the service and served over Arrow Flight
    (`txstream.sinks.live`; the endpoint is configured by `PipelineConfig.live`). Keyed outputs
    only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["live"] = "live"


SinkSettings = Annotated[
    PostgresSnapshotSettings | PostgresAppendSettings | KafkaSinkSettings | FileSinkSettings
    | LiveSinkSettings,
    Field(discriminator="kind"),
]
