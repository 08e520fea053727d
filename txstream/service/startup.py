"""The checks made before a pipeline runs, as pure functions of what they look at: each
returns the problems it finds (none: the start may go on). The runner refuses to start on
any (`refuse`); `txstream check` reports them with the rest of its checks.

* the configuration fits the pipeline: `sources_fit`, `sinks_fit`;
* a start from scratch finds no earlier run's output in the sinks: `earlier_output`;
* a resumed start finds the state the sinks saved, and the PostgreSQL outputs, no newer than
  the checkpoint location: `stale_saved_state`, `outputs_ahead`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from txstream.schemas.config import ConfigError, PipelineConfig, SinkConfig
from txstream.schemas.tables import TableSchema
from txstream.service.checkpoint import CheckpointError
from txstream.sinks.postgres.outputs import PROGRESS_TABLE

if TYPE_CHECKING:
    from txstream.engine import Pipeline


class EarlierOutputError(ConfigError):
    """A run from scratch found sinks holding an earlier run's output."""


class Kind(Enum):
    """What a problem is about, and the error a start raises for it."""

    UNFIT = ConfigError  # the configuration does not fit the pipeline
    EARLIER_OUTPUT = EarlierOutputError
    CHECKPOINT = CheckpointError  # the checkpoint location is older than the outputs


@dataclass(frozen=True)
class Problem:
    """One problem a check found: its kind and what it says (with what to do)."""

    kind: Kind
    text: str

    def __str__(self) -> str:
        return self.text


def refuse(problems: Sequence[Problem]) -> None:
    """Raise the error of the first problem's kind with every problem of that kind; nothing
    without problems."""
    if not problems:
        return
    kind = problems[0].kind
    texts = [p.text for p in problems if p.kind is kind]
    if kind is Kind.UNFIT:
        raise ConfigError("configuration does not fit the pipeline:\n  " + "\n  ".join(texts))
    raise kind.value("\n".join(texts))


def _shape(schema: TableSchema) -> tuple[object, ...]:
    """Names, types and key; not nullability, which a schema written in YAML leaves at its
    default even for key columns (that `TableSchema.of` makes non-null)."""
    return tuple((c.name, c.type) for c in schema.columns), tuple(schema.primary_key)


def sources_fit(config: PipelineConfig, pipeline: Pipeline) -> list[Problem]:
    """The configured sources are exactly the pipeline's, with its schemas."""
    found = []
    configured = {s.name: s for s in config.sources}
    for name, node in pipeline.sources.items():
        spec = configured.get(name)
        if spec is None:
            found.append(f"sources: the pipeline reads {name!r}, which no source configures")
        elif node.schema is not None and _shape(spec.schema) != _shape(node.schema):
            found.append(
                f"sources.{name}.schema: differs from the pipeline's source schema "
                f"({', '.join(f'{c.name} {c.type.value}' for c in node.schema.columns)}; "
                f"primary key {', '.join(node.schema.primary_key) or 'none'})"
            )
    for name in configured.keys() - pipeline.sources.keys():
        found.append(f"sources.{name}: the pipeline has no source of that name")
    return [Problem(Kind.UNFIT, text) for text in found]


def event_times_required(config: PipelineConfig, pipeline: Pipeline) -> PipelineConfig:
    """`config` with each source column the pipeline reads as an event time
    (`Pipeline.event_times`) required: a record without one is a dead letter with the reason,
    not a row silently in no window."""
    sources = []
    for spec in config.sources:
        required = pipeline.event_times.get(spec.name, set())
        if required:
            schema = spec.table_schema
            spec = spec.model_copy(update={"table_schema": schema.model_copy(update={
                "columns": tuple(c.model_copy(update={"nullable": False})
                                 if c.name in required else c for c in schema.columns)})})
        sources.append(spec)
    return config.model_copy(update={"sources": sources})


def sinks_fit(config: PipelineConfig, outputs: Collection[str]) -> list[Problem]:
    """Every sink names one of the pipeline's `outputs`."""
    return [Problem(Kind.UNFIT, f"sinks.{i}.output: {cfg.output!r} is not an output of the "
                                f"pipeline ({', '.join(sorted(outputs))})")
            for i, cfg in enumerate(config.sinks) if cfg.output not in outputs]


def _sink(cfg: SinkConfig) -> str:
    return f"output {cfg.output!r} ({cfg.settings.kind} {cfg.settings.destination()})"


def earlier_output(config: PipelineConfig, held: Sequence[tuple[SinkConfig, int | None]],
                   progress_row: int | None) -> list[Problem]:
    """For a run from scratch, which numbers its transactions from 1: a sink still holding an
    earlier run's transactions (`held`: the last each holds; `progress_row`: the last the
    PostgreSQL outputs' progress row says) would ignore (snapshot) or duplicate (append)
    everything it gets."""
    stale = [f"{_sink(cfg)} holds transactions up to #{through}" for cfg, through in held
             if through]
    if progress_row:
        stale.insert(0, f"the progress row of pipeline {config.consumer_group!r} says its "
                        f"PostgreSQL outputs hold transactions up to #{progress_row}")
    if not stale:
        return []
    return [Problem(Kind.EARLIER_OUTPUT,
        f"{'; '.join(stale)}, written by an earlier run, but this run starts from scratch"
        f" (no checkpoint or logged transaction in {config.checkpoint_location}). "
        "Restore that run's checkpoint location, or start the outputs over from the "
        "topics (`mode: replace` on every PostgreSQL sink, which also deletes the "
        "progress row; move files away), or write to new tables, files and topics")]


def stale_saved_state(config: PipelineConfig, saved: Sequence[tuple[SinkConfig, int | None]],
                      checkpointed: int) -> list[Problem]:
    """For a resumed run: a sink that saves state of its own at checkpoints (a live table;
    `saved`: the checkpoint each saved it for) must have saved it for the checkpoint resumed
    from (`checkpointed`), as the replay starts after it."""
    stale = [f"{_sink(cfg)} was saved for checkpoint #{through}" for cfg, through in saved
             if through is not None and through < checkpointed]
    if not stale:
        return []
    return [Problem(Kind.CHECKPOINT,
        f"{'; '.join(stale)}, older than the checkpoint resumed from (#{checkpointed} in "
        f"{config.checkpoint_location}); the transactions between cannot be replayed. Restore "
        "the state saved with that checkpoint, or start over from the topics (an empty "
        "checkpoint location, the saved state moved away)")]


def outputs_ahead(config: PipelineConfig, progress_row: int | None, logged_through: int
                  ) -> list[Problem]:
    """For a resumed run: the PostgreSQL outputs may hold no transaction the checkpoint
    location does not know (`logged_through`: its checkpoint and transaction log)."""
    if progress_row is None or progress_row <= logged_through:
        return []
    return [Problem(Kind.CHECKPOINT,
        f"the progress row of pipeline {config.consumer_group!r} says its PostgreSQL outputs "
        f"hold transactions up to #{progress_row}, but {config.checkpoint_location} knows them "
        f"only up to #{logged_through}: the checkpoint location is older than the outputs "
        "(restored from a backup?). Use the newest checkpoint location, or start over (an "
        "empty checkpoint location and `mode: replace` on every PostgreSQL sink)")]


def read_progress_row(config: PipelineConfig) -> int | None:
    """What the PostgreSQL outputs' progress row says, read without changing anything (None:
    no PostgreSQL sink, no progress table, or no row of this pipeline)."""
    settings = next((s for cfg in config.sinks if (s := cfg.settings.postgres) is not None),
                    None)
    if settings is None or config.database_dsn is None:
        return None
    with psycopg.connect(config.database_dsn, connect_timeout=10) as conn:
        name = sql.Identifier(settings.db_schema, PROGRESS_TABLE)
        exists = conn.execute("SELECT to_regclass(%s)", [name.as_string(conn)]).fetchone()
        if exists is None or exists[0] is None:
            return None
        row = conn.execute(sql.SQL('SELECT "transaction" FROM {} WHERE pipeline = %s')
                           .format(name), [config.consumer_group]).fetchone()
    return None if row is None else int(str(row[0]))
