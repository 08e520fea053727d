"""What an example of `txstream demo` is (`txstream.service.demo` runs them): its pipeline,
topics, sample records, and the check of its snapshots against a from-scratch computation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from txstream.schemas.sources import SourceSpec
from txstream.service.runner import PipelineRunner

# Events a transaction holds at most in the demo: the page views' check relies on it.
MAX_EVENTS = 500

Say = Callable[[str], None]
Record = tuple[str, bytes, bytes | None]  # (source, Kafka key, value; None: a tombstone)


class DemoError(RuntimeError):
    """The demo could not finish or its snapshot is wrong."""


class DemoExample(ABC):
    """One example the demo runs: its pipeline, topics, sample records and the check of its
    snapshots. An instance runs once: `records` remembers what it produced, for `check`."""

    pipeline: str  # module:function
    partitions: dict[str, int]  # source -> partitions of its topic
    outputs: tuple[str, ...]  # each a live snapshot in PostgreSQL
    what: str  # what the producer produces, for the log

    @abstractmethod
    def sources(self, topics: dict[str, str]) -> list[SourceSpec]:
        """The pipeline's sources reading `topics` (source -> topic)."""

    @abstractmethod
    def records(self, count: int, seed: int) -> Iterator[Record]:
        """`count` sample events as Kafka records, remembered as they are taken."""

    @abstractmethod
    def check(self, url: str, runner: PipelineRunner, say: Say) -> None:
        """Show the snapshots in PostgreSQL at `url` and check them against a from-scratch
        computation of the records produced; raise `DemoError` when one differs."""
