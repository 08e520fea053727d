"""The parts `txstream.sources.boundaries` is made of. Pure: no Kafka client, only arrays,
offsets and partitions.

* `TopicRule`: how one source topic's records form transactions; `PolledRecords`: one poll's
  records as arrays; `Placement` and `Closing`: what the core makes of them; `MiniBatches`:
  the mini-batch rule.
* `OpenTransaction`, and `emission_order`: complete ones leave one after every transaction that
  has a record before its first in a partition they share (records of one partition are in
  commit order), the one completed first when several are free.
* `safe_offsets`: the consumer offsets safe to commit after each closed transaction, up to the
  first record of any transaction still open then.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.sources.positions import Partition
from txstream.sources.transaction_batch import Offsets, Ranges, Transaction

log = logging.getLogger(__name__)


@dataclass
class OpenTransaction:
    """An open transaction: a mini-batch (key "b:<n>"), an upstream transaction ("u:<id>") or
    a mini-batch being replayed ("r:<number>"). The key tags the decoded rows waiting for it."""

    key: str
    started: float  # monotonic seconds of its first record
    upstream_id: str | None = None
    number: int | None = None  # fixed by a replay, else given when it closes
    due: dict[Partition, int] | None = None  # replayed mini-batch: complete once read up to these
    seen: int = 0  # records read
    expected: int | None = None  # records it holds, when a count or an END event said so
    awaits_end: bool = False  # its source marks the last record of a transaction
    ended: bool = False  # that marker was read
    first: dict[Partition, int] = field(default_factory=dict)  # first offset per partition
    last: dict[Partition, int] = field(default_factory=dict)  # last offset per partition
    last_seq: int = -1  # consumption position of its latest record
    wall_ms: int = -1  # its wall time: its records' latest (ms, see PolledRecords), -1: none

    def ranges(self) -> Ranges:
        """Topic -> partition -> [first, last + 1) offsets of its records."""
        out: Ranges = {}
        for (topic, partition), first in self.first.items():
            out.setdefault(topic, {})[partition] = (first, self.last[(topic, partition)] + 1)
        return out


@dataclass(frozen=True)
class TopicRule:
    """How the records of one source topic form transactions."""

    upstream: bool = False  # records carry upstream transaction ids
    awaits_end: bool = False  # an upstream transaction closes on its end marker or END event
    ids_optional: bool = False  # records without an id (snapshot reads) go to mini-batches

    @classmethod
    def of(cls, spec: SourceSpec) -> TopicRule:
        up = spec.upstream
        if up is None:
            return cls()
        return cls(upstream=True, awaits_end=up.needs_end, ids_optional=bool(up.metadata_topic))


@dataclass
class PolledRecords:
    """One poll's records of the source topics, in consumption order: one item per record."""

    topics: np.ndarray  # str (object)
    partitions: np.ndarray  # int64
    offsets: np.ndarray  # int64
    upstream_ids: np.ndarray  # str or None (object)
    expected_counts: np.ndarray  # int64; -1: none carried
    end_markers: np.ndarray  # bool
    skipped: np.ndarray  # bool; the record joins no transaction (a Debezium tombstone)
    # int64 wall times (ms): the Kafka timestamp, or a Debezium change event's own time
    # (`DecodedBatch.wall_ms`); -1: not read (no wall clock wanted)
    timestamps: np.ndarray

    @classmethod
    def of(cls, topics: Sequence[str], partitions: Sequence[int], offsets: Sequence[int],
           upstream_ids: Sequence[str | None] | None = None,
           expected_counts: Sequence[int] | None = None,
           end_markers: Sequence[bool] | None = None,
           timestamps: Sequence[int] | None = None) -> PolledRecords:
        """Records without upstream transactions unless told (no id, no count, no marker, no
        timestamp), none skipped."""
        n = len(topics)
        ids = np.full(n, None, dtype=object)
        if upstream_ids is not None:
            ids[:] = list(upstream_ids)
        return cls(np.asarray(topics, dtype=object), np.asarray(partitions, dtype=np.int64),
                   np.asarray(offsets, dtype=np.int64), ids,
                   np.asarray(expected_counts, dtype=np.int64) if expected_counts is not None
                   else np.full(n, -1, dtype=np.int64),
                   np.asarray(end_markers, dtype=bool) if end_markers is not None
                   else np.zeros(n, dtype=bool), np.zeros(n, dtype=bool),
                   np.asarray(timestamps, dtype=np.int64) if timestamps is not None
                   else np.full(n, -1, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class LateRecord:
    """A record of an upstream transaction emitted before it was read."""

    index: int  # in the poll's records
    upstream_id: str
    number: int  # the transaction's


@dataclass
class Placement:
    """Where one poll's records went."""

    keys: pa.Array  # per record, the key of its open transaction; null: in none
    late: list[LateRecord]


@dataclass
class Closing:
    """What `close_ready` closed: transactions in emission order, and the expired ones."""

    transactions: list[Transaction]
    numbers: dict[str, int]  # key of each closed transaction -> its number
    expired: list[OpenTransaction]


@dataclass
class BoundaryCounts:
    transactions: int = 0  # closed
    incomplete_upstream: int = 0  # upstream transactions expired
    replayed_skipped: int = 0  # records of transactions emitted before a restart
    late_upstream_records: int = 0  # records of an upstream transaction already emitted
    ticks: int = 0  # tick transactions (no records: the wall time alone)


@dataclass
class MiniBatches:
    """The mini-batches of sources without upstream ids: records fill them in consumption
    order, `max_events` each; the open one is sealed when it is due (`max_delay_ms` after its
    first record) or the consumer has caught up."""

    policy: BatchPolicy
    number: int = 0  # of the open mini-batch
    fill: int = 0  # its records
    started: float = 0.0  # when its first record was read

    def fill_with(self, batched: np.ndarray, n: int, now: float) -> np.ndarray:
        """Records `batched` (indices among `n`) join mini-batches; per record, its mini-batch
        (-1: none)."""
        batches = np.full(n, -1, dtype=np.int64)
        if not len(batched):
            return batches
        size = self.policy.max_events
        if self.fill == 0:
            self.started = now
        slots = self.fill + np.arange(len(batched))
        batches[batched] = self.number + slots // size
        total = self.fill + len(batched)
        self.number += total // size
        self.fill = total % size
        if total >= size and self.fill:
            self.started = now
        return batches

    def due(self, now: float) -> bool:
        return bool(self.fill) and now - self.started >= self.policy.max_delay_ms / 1000

    def timeout(self, timeout: float, now: float) -> float:
        """`timeout`, or less when the open mini-batch is due sooner."""
        if not self.fill:
            return timeout
        due = self.started + self.policy.max_delay_ms / 1000 - now
        return max(0.0, min(timeout, due))

    def seal(self) -> None:
        self.number += 1
        self.fill = 0


def emission_order(candidates: list[OpenTransaction],
                   complete: Callable[[OpenTransaction], bool]) -> list[OpenTransaction]:
    """The complete ones of `candidates`, in emission order. Within a partition records are
    in commit order, so a transaction goes after every transaction with a record before its
    first one in a partition they share, and an incomplete one holds back those behind it.
    Among free ones, the one completed earliest (`last_seq`) goes first. (Kahn's topological
    sort over per-partition queues: O(k log k) for k transactions.)"""
    done = {t.key for t in candidates if complete(t)}
    queues: dict[Partition, list[OpenTransaction]] = {}
    for txn in candidates:
        for tp in txn.first:
            queues.setdefault(tp, []).append(txn)
    for tp, queue in queues.items():
        queue.sort(key=lambda t, tp=tp: t.first[tp])
    heads = dict.fromkeys(queues, 0)

    def free(txn: OpenTransaction) -> bool:
        return txn.key in done and all(queues[tp][heads[tp]] is txn for tp in txn.first)

    by_key = {t.key: t for t in candidates}
    heap = [(t.last_seq, t.key) for t in candidates if free(t)]
    heapq.heapify(heap)
    pushed = {key for _, key in heap}
    order: list[OpenTransaction] = []
    while heap:
        txn = by_key[heapq.heappop(heap)[1]]
        order.append(txn)
        for tp in txn.first:
            heads[tp] += 1
            if heads[tp] < len(queues[tp]):
                nxt = queues[tp][heads[tp]]
                if nxt.key not in pushed and free(nxt):
                    heapq.heappush(heap, (nxt.last_seq, nxt.key))
                    pushed.add(nxt.key)
    if len(order) < len(candidates) == len(done):
        # Every one is complete, yet some wait for each other: their partitions disagree on
        # the commit order (never so for one Debezium connector). Held back, they would never
        # close; emitted in the order they completed, they go on.
        stuck = sorted((t for t in candidates if t.key not in pushed), key=lambda t: t.last_seq)
        log.warning("upstream transactions %s: their partitions disagree on the commit "
                    "order; emitted in the order they completed",
                    ", ".join(repr(t.upstream_id) for t in stuck))
        order += stuck
    return order


def first_offsets(transactions: Iterable[OpenTransaction]) -> dict[Partition, int]:
    """Per partition, the first offset of any of `transactions`."""
    first: dict[Partition, int] = {}
    for txn in transactions:
        for tp, offset in txn.first.items():
            first[tp] = min(first.get(tp, offset), offset)
    return first


def safe_offsets(positions: Mapping[Partition, int], still_open: list[OpenTransaction],
                 closing: list[OpenTransaction]) -> list[Offsets]:
    """For each of `closing` (in emission order), the offsets to commit once it is delivered:
    the consumer's `positions`, but per partition no further than the first record of a
    transaction open then (those `still_open`, and those closing after it)."""
    pins: list[dict[Partition, int]] = []
    pin = first_offsets(still_open)
    for txn in reversed(closing):
        pins.append(pin)
        pin = {tp: min(pin.get(tp, o), o) for tp, o in (pin | txn.first).items()}
    out: list[Offsets] = []
    for pinned in reversed(pins):
        offsets: Offsets = {}
        for tp, position in positions.items():
            offsets.setdefault(tp[0], {})[tp[1]] = min(position, pinned.get(tp, position))
        out.append(offsets)
    return out
