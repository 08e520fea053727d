"""Transaction boundaries, pure: which records form which transaction, when it closes, its
number, and the offsets safe to commit after it. It sees records as arrays (topic, partition,
offset, upstream id, expected count, end marker) and never a Kafka client:
`txstream.sources.transactions` polls, decodes, and hands them in.

One rule per source, one numbering for the pipeline:

* Sources without upstream transaction ids: their records, in consumption order, form
  mini-batches closed every `BatchPolicy.max_events` records or `max_delay_ms` after the
  batch's first record (Pathway's autocommit), and (`close_when_caught_up`) as soon as every
  assigned partition has been read to its end.
* Sources with upstream ids (`SourceSpec.upstream`, id in a field or a header): all records
  with one id, across every partition and topic, form one transaction. It closes when known
  complete, by the first rule the source configures:
  1. expected count (`count`): as soon as that many records of the id were read. Bad records
     whose id can still be read (header, or JSON with a wrong field) count too, so a poison
     record neither holds its transaction back nor drops its valid records. Exact whatever
     order the partitions are fetched in: the rule to prefer.
  2. end marker (`end`): as soon as the record carrying the marker was read.
  2'. Debezium transaction metadata (`metadata_topic`): a transaction's `END` event gives its
     record count per table, and the counts of the pipeline's tables become its expected count
     (rule 1; `announce`). Until that event is read the transaction stays open, whatever its
     records' order. Changes are applied in partition order, which for one key is Debezium's
     `total_order`: the rows of one key are in one partition, and a transaction's changes all
     get one number. `END` events are in commit order, and so are the transactions emitted
     (`END` records join their offset ranges, so a restart re-reads those of transactions not
     yet committed).
  3. id change (neither; needs `isolation.level=read_committed`): when every partition it was
     read from has since delivered a record of another id, or reached its end.
  An upstream transaction still incomplete `upstream_timeout_ms` after its first record is
  never emitted: it is returned as expired, and its records go to the dead-letter topic (an
  aborted transaction the broker did not hide, lost records, or a poison record whose id
  could not be read).

Limits. Aborted upstream transactions: with `read_committed`, Apache Kafka never delivers
them; a broker that does (librdkafka's mock) is covered only while the aborted transaction is
incomplete by the rule (a count not reached, no end marker), which then expires it. Rules 2
and 3 trust the fetch order: a partition fetched late can deliver records of a transaction
after the marker, or after the other partitions moved on, was read; rule 3 also assumes a
transaction's records are contiguous in each partition (one producer writing one transaction
after the other, as Debezium does). Such late records are never emitted as a second
transaction with the same id: `place` returns them as late, to be dead-lettered. Partitions
added to a topic while running are picked up at restart.

Numbers are given when transactions close, in order of completion (`open_transactions`). Each
closed transaction carries its upstream id and the offset range of its records per partition,
its log entry. `restore(next number, emitted ids, replay=log entries of the transactions
emitted after it)` resumes: the replayed transactions are rebuilt from the same records with
the same numbers, and nothing before them is emitted twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.schemas.sources import BatchPolicy
from txstream.sources.kafka_source import KafkaSourceError
from txstream.sources.open_transactions import (
    BoundaryCounts,
    Closing,
    LateRecord,
    MiniBatches,
    OpenTransaction,
    Placement,
    PolledRecords,
    TopicRule,
    emission_order,
    safe_offsets,
)
from txstream.sources.positions import Partition, advance
from txstream.sources.transaction_batch import Offsets, Transaction, TransactionLogEntry

log = logging.getLogger(__name__)

# Emitted upstream transactions kept to recognize late records, beyond those whose records may
# still be read again after a restore.
_LATE_WINDOW = 10_000


class TransactionBoundaries:
    """The open transactions of a pipeline's sources, and the consumer positions they need."""

    def __init__(self, policy: BatchPolicy, rules: Mapping[str, TopicRule]) -> None:
        """`rules`: per source topic."""
        self._policy = policy
        self._rules = dict(rules)
        self.positions: dict[Partition, int] = {}  # next offset to read, where known
        self.at_end: set[Partition] = set()  # read to the end, as the client reported
        self.assigned: set[Partition] = set()
        self.counts = BoundaryCounts()
        self._seq = 0  # records and metadata events read so far
        self._batch = MiniBatches(policy)
        self._open: dict[str, OpenTransaction] = {}
        self._last_key: dict[Partition, str] = {}  # the latest record's transaction
        self._skip_ids: set[str] = set()  # emitted before the restore
        # Upstream id -> (number, last offset per partition) of emitted upstream transactions.
        self._emitted: dict[str, tuple[int, dict[Partition, int]]] = {}
        self._next_number = 1
        self._committed_number = 0
        self.committed_offsets: Offsets = {}
        self._last_wall_ms = -1  # the latest wall time of a transaction closed

    # ---- the consumer's side ---------------------------------------------------------------

    def assign(self, partitions: Iterable[Partition], positions: Mapping[Partition, int]
               ) -> None:
        """The consumer reads `partitions`, from `positions` where known (else the beginning);
        what it committed before is known to be there."""
        self.assigned = set(partitions)
        for (topic, partition), offset in positions.items():
            self.positions[(topic, partition)] = offset
            self.committed_offsets.setdefault(topic, {})[partition] = offset

    def timeout(self, timeout: float, now: float) -> float:
        """How long a poll may wait: no longer than until the open mini-batch is due."""
        return self._batch.timeout(timeout, now)

    def consumed(self, topics: np.ndarray, partitions: np.ndarray, offsets: np.ndarray,
                 ends: Mapping[Partition, int], now: float) -> None:
        """The consumer read records (see `positions.advance`) at `now`: the open mini-batch
        closes if it is due, then the positions move."""
        if self._batch.due(now):
            self._batch.seal()
        advance(self.positions, self.at_end, topics, partitions, offsets, ends)

    def seal_if_caught_up(self, caught_up: Callable[[], bool]) -> None:
        """Nothing more to read now (asked only when it matters: `caught_up` may call the
        client): the open mini-batch need not wait for more records."""
        if self._batch.fill and self._policy.close_when_caught_up and caught_up():
            self._batch.seal()

    @property
    def holding(self) -> bool:
        """Whether records read wait in a transaction not closed yet."""
        return bool(self._batch.fill or self._open)

    @property
    def started(self) -> bool:
        """Whether any record was read."""
        return self._seq > 0

    def take_seqs(self, n: int) -> int:
        """The consumption positions of `n` more records: returns the first."""
        seq, self._seq = self._seq, self._seq + n
        return seq

    # ---- records -----------------------------------------------------------------------

    def place(self, records: PolledRecords, seq0: int, now: float) -> Placement:
        """Put one poll's records (consumption positions `seq0`...) into open transactions."""
        n = len(records)
        ids = records.upstream_ids.copy()
        by_topic = {t: np.flatnonzero(records.topics == t) for t in self._rules}
        without_id = pc.is_null(pa.array(ids, pa.string())).to_numpy(zero_copy_only=False)
        batched = np.concatenate([
            np.zeros(0, dtype=np.int64),
            *(ix for t, ix in by_topic.items() if not self._rules[t].upstream),
            *(ix[without_id[ix]] for t, ix in by_topic.items() if self._rules[t].ids_optional),
        ])
        replayed = np.full(n, -1, dtype=np.int64)
        batched = batched[~records.skipped[batched]]  # records that join no transaction
        batched = np.sort(batched[self._replayed(batched, records, replayed)])
        batches = self._batch.fill_with(batched, n, now)
        late = self._drop_emitted(ids)
        keys = _keys(batches, replayed, ids)
        awaits_end = np.zeros(n, dtype=bool)
        for topic, idx in by_topic.items():
            awaits_end[idx] = self._rules[topic].awaits_end
        self._track(keys, records, awaits_end, seq0, now)
        return Placement(keys, late)

    def _replayed(self, idx: np.ndarray, records: PolledRecords, replayed: np.ndarray
                  ) -> np.ndarray:
        """Marks the records at `idx` of mini-batches being replayed (by their logged offset
        ranges) with their numbers in `replayed`; returns the mask of those left for new
        mini-batches."""
        free = np.ones(len(idx), dtype=bool)
        topics, partitions, offsets = (records.topics[idx], records.partitions[idx],
                                       records.offsets[idx])
        for txn in self._open.values():
            if txn.due is None or txn.number is None:
                continue
            for (topic, partition), first in txn.first.items():
                hit = ((topics == topic) & (partitions == partition) & (offsets >= first)
                       & (offsets < txn.due[(topic, partition)]))
                replayed[idx[hit]] = txn.number
                free &= ~hit
        return free

    def _drop_emitted(self, ids: np.ndarray) -> list[LateRecord]:
        """Records of upstream transactions already emitted leave `ids` (so they join no
        transaction): silently when emitted before a restore (replayed input), and as late
        records when emitted since (the rule closed the transaction before this record was
        read; see the limits above) rather than as a second transaction."""
        as_arrow = pa.array(ids, pa.string())
        skipped = _member(as_arrow, self._skip_ids)
        self.counts.replayed_skipped += int(skipped.sum())
        ids[skipped] = None
        late: list[LateRecord] = []
        for i in np.flatnonzero(_member(as_arrow, self._emitted) & ~skipped):
            uid, ids[i] = ids[i], None
            late.append(LateRecord(int(i), uid, self._emitted[uid][0]))
        self.counts.late_upstream_records += len(late)
        return late

    def _track(self, keys: pa.Array, records: PolledRecords, awaits_end: np.ndarray,
               seq0: int, now: float) -> None:
        """Per open transaction: records seen, expected count, offset range per partition.
        Grouped in Arrow; the loop runs over (transaction, partition) pairs, not records."""
        table = pa.table({
            "key": keys,
            "topic": pa.array(records.topics, pa.string()),
            "partition": pa.array(records.partitions),
            "offset": pa.array(records.offsets),
            "seq": pa.array(np.arange(len(records)) + seq0),
            "expected_count": pa.array(records.expected_counts),
            "end_marker": pa.array(records.end_markers),
            "awaits_end": pa.array(awaits_end),
            "timestamp": pa.array(records.timestamps),
        }).filter(pc.is_valid(keys))
        groups = table.group_by(["key", "topic", "partition"], use_threads=False).aggregate(
            [("offset", "min"), ("offset", "max"), ("seq", "max"), ("expected_count", "max"),
             ("offset", "count"), ("end_marker", "any"), ("awaits_end", "any"),
             ("timestamp", "max")]
        ).to_pylist()
        latest: dict[Partition, tuple[int, str]] = {}
        for g in groups:
            key, tp = g["key"], (g["topic"], g["partition"])
            first, last = g["offset_min"], g["offset_max"]
            txn = self._open.get(key)
            if txn is None:
                upstream = key[2:] if key.startswith("u:") else None
                txn = self._open[key] = OpenTransaction(key=key, started=now,
                                                        upstream_id=upstream)
            txn.seen += g["offset_count"]
            if g["expected_count_max"] > 0:
                txn.expected = g["expected_count_max"]
            txn.ended |= g["end_marker_any"]
            txn.awaits_end |= g["awaits_end_any"]
            txn.first[tp] = min(txn.first.get(tp, first), first)
            txn.last[tp] = max(txn.last.get(tp, last), last)
            txn.last_seq = max(txn.last_seq, g["seq_max"])
            txn.wall_ms = max(txn.wall_ms, g["timestamp_max"])
            if last >= latest.get(tp, (-1, ""))[0]:
                latest[tp] = (last, key)
        for tp, (_, key) in latest.items():
            self._last_key[tp] = key

    def announce(self, upstream_id: str, expected: int, partition: Partition, offset: int,
                 seq: int, now: float) -> None:
        """A Debezium `END` event (at `offset` of `partition`) says transaction `upstream_id`
        holds `expected` records of the pipeline's tables. Events of transactions already
        emitted, or touching none of these tables, change nothing."""
        if upstream_id in self._skip_ids or upstream_id in self._emitted or expected <= 0:
            return
        key = f"u:{upstream_id}"
        txn = self._open.get(key)
        if txn is None:
            txn = self._open[key] = OpenTransaction(key=key, started=now,
                                                    upstream_id=upstream_id)
        txn.expected = expected
        txn.first[partition] = min(txn.first.get(partition, offset), offset)
        txn.last[partition] = max(txn.last.get(partition, offset), offset)
        txn.last_seq = max(txn.last_seq, seq)

    # ---- closing -----------------------------------------------------------------------

    def _complete(self, txn: OpenTransaction) -> bool:
        if txn.due is not None:
            return all(self.positions.get(tp, 0) >= end for tp, end in txn.due.items())
        if txn.upstream_id is None:
            return int(txn.key[2:]) < self._batch.number
        if txn.seen == 0:
            # Replayed after a restart, none of its records read again yet (every rule needs
            # one: the id-change rule would hold it complete over no partitions at all).
            return False
        if txn.expected is not None:
            if txn.seen > txn.expected:
                log.warning("upstream transaction %s: %d records read, %d announced",
                            txn.upstream_id, txn.seen, txn.expected)
            return txn.seen >= txn.expected
        if txn.awaits_end:
            return txn.ended
        return all(self._last_key.get(tp) != txn.key or tp in self.at_end for tp in txn.last)

    def close_ready(self, now: float) -> Closing:
        """Close what is complete, numbered and in emission order; expire the upstream
        transactions incomplete after the timeout."""
        timeout = self._policy.upstream_timeout_ms / 1000
        expired = [t for t in self._open.values()
                   if t.upstream_id is not None and now - t.started > timeout
                   and not self._complete(t)]
        for txn in expired:
            del self._open[txn.key]
        self.counts.incomplete_upstream += len(expired)
        # Replayed transactions go first, in their logged order; new ones wait for them.
        replays = sorted((t for t in self._open.values() if t.number is not None),
                         key=lambda t: t.number or 0)
        ready: list[OpenTransaction] = []
        for txn in replays:
            if not self._complete(txn):
                break
            ready.append(txn)
        if len(ready) == len(replays):
            fresh = emission_order([t for t in self._open.values() if t.number is None],
                                   self._complete)
            for txn in fresh:
                txn.number = self._next_number
                self._next_number += 1
            ready += fresh
        for txn in ready:
            del self._open[txn.key]
        out: list[Transaction] = []
        offsets = safe_offsets(self.positions, list(self._open.values()), ready)
        for txn, safe in zip(ready, offsets, strict=True):
            number = txn.number or 0
            out.append(Transaction(number=number, offsets=safe, upstream_id=txn.upstream_id,
                                   ranges=txn.ranges(),
                                   wall_time_ms=txn.wall_ms if txn.wall_ms >= 0 else None))
            if txn.upstream_id is not None:
                self._emitted[txn.upstream_id] = (number, dict(txn.last))
        self.counts.transactions += len(out)
        self._last_wall_ms = max([self._last_wall_ms, *(t.wall_ms for t in ready)])
        return Closing(out, {t.key: t.number or 0 for t in ready}, expired)

    def tick(self, wall_ms: int) -> Transaction | None:
        """A tick transaction at wall time `wall_ms` (epoch ms): no records, only the wall time
        now() reads, so that rows enter and leave filters while the input is idle. None while
        any transaction is open (a tick would be numbered before it), before
        `BatchPolicy.tick_ms` passed since the last transaction's wall time, or always with
        `tick_ms` 0."""
        tick_ms = self._policy.tick_ms
        if not tick_ms or self._open or wall_ms < self._last_wall_ms + tick_ms:
            return None
        number, self._next_number = self._next_number, self._next_number + 1
        self._last_wall_ms = wall_ms
        self.counts.ticks += 1
        self.counts.transactions += 1
        [offsets] = safe_offsets(self.positions, [], [OpenTransaction(key="tick", started=0)])
        return Transaction(number=number, offsets=offsets, wall_time_ms=wall_ms)

    # ---- commits and restores ----------------------------------------------------------

    def committed(self, transaction: Transaction) -> None:
        """`transaction` and those before it are delivered, its offsets committed."""
        self._committed_number = transaction.number
        self.committed_offsets = transaction.offsets
        # Emitted upstream transactions entirely below the committed offsets can no longer be
        # read again after a restore; late records of the last _LATE_WINDOW ones are still
        # recognized.
        self._emitted = {
            uid: (number, last) for uid, (number, last) in self._emitted.items()
            if number > transaction.number - _LATE_WINDOW or self._beyond(last)
        }

    def _beyond(self, last: Mapping[Partition, int]) -> bool:
        """Whether a record at `last` offsets lies at or beyond the committed offsets."""
        offsets = self.committed_offsets
        return any(o >= offsets.get(t, {}).get(p, 0) for (t, p), o in last.items())

    @property
    def committed_number(self) -> int:
        return self._committed_number

    def emitted_ids(self) -> list[str]:
        """Upstream transactions committed whose records may lie beyond the committed
        offsets: a restore skips their records."""
        return [uid for uid, (number, last) in self._emitted.items()
                if number <= self._committed_number and self._beyond(last)]

    def restore(self, next_number: int, emitted_ids: Iterable[str],
                replay: Sequence[TransactionLogEntry], now: float) -> None:
        """Resume (before any record is read) at `next_number`, skipping the records of
        `emitted_ids`, after rebuilding the `replay` transactions with their numbers."""
        if self._seq:
            raise KafkaSourceError("restore() must be called before the first poll()")
        numbers = [e.number for e in replay]
        if numbers != list(range(next_number, next_number + len(numbers))):
            raise KafkaSourceError(
                f"replay entries {numbers} do not continue the state's numbering at "
                f"{next_number}; pass the log of the transactions emitted after it"
            )
        self._skip_ids = set(emitted_ids) - {e.upstream_id for e in replay}
        for entry in replay:
            spans = {(t, p): r for t, parts in entry.ranges.items() for p, r in parts.items()}
            if entry.upstream_id is not None:
                txn = OpenTransaction(key=f"u:{entry.upstream_id}", started=now,
                                      upstream_id=entry.upstream_id, number=entry.number)
            else:  # a mini-batch, or a tick (no ranges: complete at once)
                txn = OpenTransaction(key=f"r:{entry.number}", started=now,
                                      number=entry.number,
                                      due={tp: end for tp, (_, end) in spans.items()},
                                      first={tp: start for tp, (start, _) in spans.items()})
            # As logged: a tick's has no record to take it from.
            txn.wall_ms = entry.wall_time_ms if entry.wall_time_ms is not None else -1
            self._open[txn.key] = txn
        self._next_number = next_number + len(replay)
        self._committed_number = next_number - 1
        self.positions = {}
        self.at_end = set()  # reported before the restore, for positions it no longer holds
        self.committed_offsets = {}


def _member(ids: pa.Array, values: Iterable[str]) -> np.ndarray:
    found = pc.is_in(ids, value_set=pa.array(list(values), pa.string()))
    return pc.fill_null(found, False).to_numpy(zero_copy_only=False)


def _keys(batches: np.ndarray, replayed: np.ndarray, ids: np.ndarray) -> pa.Array:
    """Per record, the key of its open transaction; null for a record in none (dead-lettered
    without a readable upstream id, or skipped as emitted before a restart)."""
    null = pa.scalar(None, pa.string())

    def tagged(prefix: str, values: pa.Array, valid: pa.Array) -> pa.Array:
        text = pc.binary_join_element_wise(prefix, pc.cast(values, pa.string()), "")
        return pc.if_else(valid, text, null)

    b, r, u = pa.array(batches), pa.array(replayed), pa.array(ids, pa.string())
    return pc.coalesce(
        tagged("r:", r, pc.greater_equal(r, 0)),
        tagged("b:", b, pc.greater_equal(b, 0)),
        tagged("u:", u, pc.is_valid(u)),
    )
