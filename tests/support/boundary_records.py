"""Records as the transaction boundaries' pure core sees them (`Rec`), and one poll of them fed
to it (`feed`): for the tests of the core without a broker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from txstream.schemas.sources import BatchPolicy
from txstream.sources.boundaries import Closing, PolledRecords, TransactionBoundaries
from txstream.sources.transaction_batch import Transaction


@dataclass(frozen=True)
class Rec:
    """A record as the core sees it."""

    partition: tuple[str, int]
    offset: int
    upstream_id: str | None = None
    count: int = -1
    end: bool = False
    timestamp: int = -1  # Kafka's, ms


def policy(max_events: int = 1000, caught_up_rule: bool = False, tick_ms: int = 1_000
           ) -> BatchPolicy:
    return BatchPolicy(max_events=max_events, max_delay_ms=60_000,
                       close_when_caught_up=caught_up_rule, upstream_timeout_ms=5_000,
                       tick_ms=tick_ms)


def feed(core: TransactionBoundaries, records: Sequence[Rec], now: float = 0.0,
         caught_up: bool = False, ends: dict[tuple[str, int], int] | None = None) -> Closing:
    """One poll: the records are read (with end reports `ends`), placed, and what is ready
    closes."""
    topics = np.array([r.partition[0] for r in records], dtype=object)
    partitions = np.array([r.partition[1] for r in records], dtype=np.int64)
    offsets = np.array([r.offset for r in records], dtype=np.int64)
    core.consumed(topics, partitions, offsets, ends or {}, now)
    if records:
        seq0 = core.take_seqs(len(records))
        core.place(PolledRecords.of(topics, partitions, offsets,
                                    [r.upstream_id for r in records],
                                    [r.count for r in records], [r.end for r in records],
                                    [r.timestamp for r in records]),
                   seq0, now)
    core.seal_if_caught_up(lambda: caught_up)
    return core.close_ready(now)


def members(transactions: Sequence[Transaction], records: Sequence[Rec]) -> list[list[Rec]]:
    """The records of each transaction, by its offset ranges."""
    return [[r for r in records
             if r.offset in range(*t.ranges.get(r.partition[0], {}).get(r.partition[1],
                                                                         (0, 0)))]
            for t in transactions]
