"""The contract every output connector implements, and the errors they raise."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from txstream.changes import Changes


class SinkError(Exception):
    """Base of every error an output connector raises."""


class SinkSchemaError(SinkError):
    """The destination's shape (table, columns, types, key) does not fit the output table."""


class SinkDataError(SinkError):
    """A batch of changes cannot be written as is (missing columns, types that do not convert,
    a diff other than +1/-1 on a keyed table...)."""


class SinkWriteError(SinkError):
    """The destination kept failing after all retries; nothing of the failed batch is visible."""


class FencedError(Exception):
    """Another instance took over this pipeline's outputs: this one must write nothing more.

    Not a failure to retry or to exit on: the service stops consuming, reports it (`/readyz`
    `fenced`, `txstream_fenced_total`, the message in the log) and waits
    (`txstream.service.leadership`). The message names what was fenced and by whom."""


@runtime_checkable
class Sink(Protocol):
    """An output connector.

    `changes` (`txstream.changes.Changes`) holds the output table's columns plus `time` and
    `diff`; it may span several consecutive stream transactions. A sink to a
    transactional destination (PostgreSQL, Kafka) makes each call atomically visible, or raises
    and makes none of it visible; the file sink's weaker guarantee is in its docstring.
    """

    rejected_rows: int  # rows the destination refused, kept aside (never silently dropped)

    def write(self, changes: Changes) -> None: ...

    def held_through(self) -> int | None:
        """The greatest transaction the destination holds (None: none, or the sink cannot
        tell); it may read the whole destination: for a start from scratch, before writing."""
        ...

    def on_checkpoint(self, transaction: int) -> None:
        """Every transaction up to `transaction` is checkpointed: a recovery never writes a
        change with a `time` at or below it again."""
        ...

    def before_checkpoint(self, transaction: int) -> None:
        """A checkpoint through `transaction` (which every sink committed) is about to be
        published, after which a recovery replays nothing at or below it: a sink that keeps
        state of its own beside its destination saves it now. Called from the checkpoint's
        thread while `write` may run."""
        ...

    def saved_through(self) -> int | None:
        """For a sink that saves its state at `before_checkpoint`: the newest checkpoint it
        saved it for (0: none). None for the others."""
        ...

    def close(self) -> None: ...


class Closing:
    """Mixin: a sink (or reader) used as a context manager is closed on leaving the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class SinkBase(Closing):
    """What every sink shares: closed on leaving a `with` block; ignores checkpoints unless it
    keeps something a checkpoint makes obsolete; counts the rows its destination refused (kept
    aside by the sink, see `txstream.sinks.postgres.rejects`)."""

    rejected_rows: int = 0

    def on_checkpoint(self, transaction: int) -> None:
        return None

    def before_checkpoint(self, transaction: int) -> None:
        return None

    def saved_through(self) -> int | None:
        return None

    def held_through(self) -> int | None:
        """None: the sink cannot tell. A sink that can must say, so that a run starting from
        scratch does not add to an earlier run's output."""
        return None
