"""What the runner reads from: closed transactions in, offsets committed after delivery, the
source state for checkpoints, the lag. `txstream.sources.kafka_input.KafkaInput` is the
service's; `txstream.service.compose` opens it and hands the runner the way to open it, so that
the runner imports no Kafka client and a test can hand in an input of its own.

An input is not thread-safe: one thread at a time uses it (the runner's ingest stage, which runs
the other stages' calls between two polls, `txstream.service.stages.Stages.call_input`). A
dependency it cannot reach raises `txstream.sources.kafka_source.KafkaSourceError`, which the
runner retries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from txstream.service.input_reports import InputReports
from txstream.sources.source_state import IngestStats, SourceState
from txstream.sources.transaction_batch import TransactionBatch, TransactionLogEntry


class Input(Protocol):
    """The runner's view of its input (see the module doc)."""

    name: str  # the dependency, as readiness and logs name it

    def poll(self, timeout: float) -> TransactionBatch | None:
        """The transactions closed within `timeout` seconds, as one batch (None: none)."""
        ...

    @property
    def stats(self) -> IngestStats:
        """What was consumed and closed since the start."""
        ...

    def commit(self, batch: TransactionBatch, commit_time: float, with_state: bool
               ) -> SourceState | None:
        """Every sink committed `batch` at `commit_time` (epoch seconds); with `with_state`,
        the source state as of its last transaction, taken in the same call."""
        ...

    def state(self) -> SourceState:
        """The source state as of the last committed transaction."""
        ...

    def read_to_end(self) -> bool:
        """Whether everything there is to read was read and is in a closed transaction."""
        ...

    def waiting_records(self) -> int:
        """Records not read yet, as of the latest reads (no call to the broker)."""
        ...

    def lag(self) -> int:
        """Records not yet in a committed transaction (measured now)."""
        ...

    def close(self) -> None: ...


# Opens the input: resume after the state, re-forming the logged transactions first, with the
# monitor's measurements reported to the service.
OpenInput = Callable[[SourceState, Sequence[TransactionLogEntry], InputReports], Input]
