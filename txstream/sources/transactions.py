"""Transaction builder: Kafka records of all the pipeline's sources -> numbered, consolidated
transactions of Arrow change tables, with the consumer offsets that are safe to commit after
each one.

Transaction boundaries (one rule per source, one numbering for the pipeline):

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
  2'. Debezium transaction metadata (`metadata_topic`): the builder also reads that topic; a
     transaction's `END` event gives its record count per table (`data_collections`), and the
     counts of the pipeline's tables become its expected count (rule 1). Until that event is
     read the transaction stays open, whatever its records' order. Changes are applied in
     partition order, which for one key is Debezium's `total_order`: the rows of one key are
     in one partition, and a transaction's changes all get one number. `END` events are in
     commit order, and so are the transactions emitted (`END` records join their offset
     ranges, so a restart re-reads those of transactions not yet committed).
  3. id change (neither; needs `isolation.level=read_committed`): when every partition it was
     read from has since delivered a record of another id, or reached its end.
  An upstream transaction still incomplete `upstream_timeout_ms` after its first record is
  never emitted: its records go to the dead-letter topic (an aborted transaction the broker
  did not hide, lost records, or a poison record whose id could not be read).

Limits. Aborted upstream transactions: with `read_committed`, Apache Kafka never delivers
them; a broker that does (librdkafka's mock) is covered only while the aborted transaction is
incomplete by the rule (a count not reached, no end marker), which then dead-letters it at the
timeout. Rules 2 and 3 trust the fetch order: a partition fetched late can deliver records of a
transaction after the marker, or after the other partitions moved on, was read; rule 3 also
assumes a transaction's records are contiguous in each partition (one producer writing one
transaction after the other, as Debezium does). Such late records are never emitted as a second
transaction with the same id: they are dead-lettered with the reason and counted
(`late_upstream_records`). Partitions added to a topic while running are picked up at restart.

Numbers are assigned when transactions close, in order of completion. Each transaction records
its upstream id and the offset range of its records per partition (`Transaction.ranges`,
`Transaction.log_entry()`). `state()` is the state through the last committed transaction: the
next number, the upsert rows, the safe offsets and the ids of upstream transactions already
emitted whose records lie beyond those offsets. `restore(state, replay=log entries of the
transactions emitted after it)` resumes there: the replayed transactions are rebuilt from the
same records with the same numbers, and nothing before them is emitted twice.
"""

from __future__ import annotations

import heapq
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from pydantic import BaseModel, ConfigDict, Field

from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.schemas.sources import BatchPolicy, SourceSpec, SourceSpecError
from txstream.sources.kafka_source import (
    BOOKKEEPING,
    DIFF,
    SEQ,
    TXCOUNT,
    TXEND,
    TXID,
    BadRecord,
    DeadLetterWriter,
    KafkaSourceError,
    SourceDecoder,
)
from txstream.sources.upsert import UpsertState

log = logging.getLogger(__name__)

_KEY = "_key"  # the open transaction a pending row belongs to
_PARTITION = "_partition"
_OFFSET = "_offset"
_INTERNAL = frozenset({*BOOKKEEPING, _KEY, _PARTITION, _OFFSET})
_TP = tuple[str, int]
_LATE_WINDOW = 10_000
_METADATA_WAIT_S = 10.0
# How the service's consumer fetches. librdkafka stops fetching a partition once
# `queued.min.messages` (100,000) records wait in its local queue and then, by default, waits
# `fetch.queue.backoff.ms` = 1,000 ms before fetching again, although a backlog's queue drains
# in a fraction of that: reading a backlog then idles most of each second (measured: 168k
# records/s on the embedded broker, 640k with 10 ms). The queue stays bounded by
# `queued.min.messages` and `queued.max.messages.kbytes` (64 MiB per partition) either way.
FETCH_SETTINGS: dict[str, int] = {"fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10}
Offsets = dict[str, dict[int, int]]
Ranges = dict[str, dict[int, tuple[int, int]]]


class Transaction(BaseModel):
    """One closed stream transaction."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    number: int
    # Source name -> its columns + time (= number) + diff, consolidated; every source present.
    changes: dict[str, pa.Table]
    # Topic -> partition -> next offset to consume once this transaction is done.
    offsets: Offsets
    upstream_id: str | None = None
    # Topic -> partition -> [first, last + 1) offsets of this transaction's records.
    ranges: Ranges = Field(default_factory=dict)

    def log_entry(self) -> TransactionLogEntry:
        """What to record (before the sinks see it) to rebuild this transaction after a crash."""
        return TransactionLogEntry(number=self.number, upstream_id=self.upstream_id,
                                   ranges=self.ranges)


class TransactionLogEntry(BaseModel):
    """A transaction's identity: rebuilt from the same records with the same number on replay
    (a mini-batch by its offset ranges, an upstream transaction by its id)."""

    number: int
    upstream_id: str | None
    ranges: Ranges


class IngestStats(BaseModel):
    events: int = 0  # records consumed
    bad_records: int = 0  # records dead-lettered as undecodable or invalid
    transactions: int = 0  # transactions closed
    absent_deletes: int = 0  # upsert deletes of keys without a current row
    unchanged_upserts: int = 0  # upserts equal to the current row
    ignored_tombstones: int = 0  # Debezium compaction tombstones
    incomplete_upstream: int = 0  # upstream transactions dead-lettered after the timeout
    replayed_skipped: int = 0  # records of transactions emitted before a restart
    late_upstream_records: int = 0  # records of an upstream transaction already emitted


class SourceState(BaseModel):
    """What the builder needs to resume exactly where the last transaction it closed ended."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    next_number: int
    offsets: Offsets
    upsert_rows: dict[str, pa.Table] = Field(default_factory=dict)
    # Upstream transactions already emitted whose records may lie beyond `offsets`.
    emitted_upstream_ids: list[str] = Field(default_factory=list)

    def save(self, directory: Path) -> None:
        """`state.json` plus one Parquet file per upsert source."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, rows in self.upsert_rows.items():
            pq.write_table(rows, directory / f"upsert-{name}.parquet")
        meta = self.model_dump(mode="json", exclude={"upsert_rows"})
        meta["upsert_sources"] = sorted(self.upsert_rows)
        (directory / "state.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, directory: Path) -> SourceState:
        meta = json.loads((directory / "state.json").read_text())
        names = meta.pop("upsert_sources")
        rows = {n: pq.read_table(directory / f"upsert-{n}.parquet") for n in names}
        return cls.model_validate({**meta, "upsert_rows": rows})


@dataclass
class _Open:
    """An open transaction: a mini-batch ("b:<n>"), an upstream transaction ("u:<id>") or a
    mini-batch being replayed ("r:<number>")."""

    key: str
    started: float
    upstream_id: str | None = None
    number: int | None = None  # fixed by a replay
    due: dict[_TP, int] | None = None  # replayed mini-batch: complete once read up to these
    seen: int = 0
    expected: int | None = None
    awaits_end: bool = False  # its source marks the last record of a transaction
    ended: bool = False  # that marker was read
    first: dict[_TP, int] = field(default_factory=dict)
    last: dict[_TP, int] = field(default_factory=dict)
    last_seq: int = -1


def consolidate(changes: pa.Table, columns: list[str]) -> pa.Table:
    """Sum the diffs of equal (row, time) and drop zeros."""
    if changes.num_rows == 0:
        return changes
    summed = changes.group_by([*columns, "time"], use_threads=False).aggregate(
        [("diff", "sum")]
    )
    summed = summed.rename_columns([*columns, "time", "diff"])
    return summed.filter(pc.not_equal(summed.column("diff"), 0)).select([*columns, "time", "diff"])


class TransactionBuilder:
    """Consumes the sources' topics and groups their records into numbered transactions.

    Not thread-safe: one service loop calls `poll`, then `commit` once sinks hold a transaction.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        sources: list[SourceSpec],
        *,
        group_id: str,
        policy: BatchPolicy,
        dead_letter_topic: str | None = None,
        first_number: int = 1,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        if not sources:
            raise SourceSpecError("a pipeline needs at least one source")
        names = [s.name for s in sources]
        topics = [s.topic for s in sources]
        for label, values in (("source names", names), ("topics", topics)):
            dupes = sorted({v for v in values if values.count(v) > 1})
            if dupes:
                raise SourceSpecError(f"duplicate {label}: {', '.join(dupes)}; give each "
                                      "source its own name and topic")
        if policy.isolation_level != "read_committed":
            by_change = [s.name for s in sources if s.upstream and s.upstream.count is None
                         and not s.upstream.needs_end]
            if by_change:
                raise SourceSpecError(
                    f"sources {by_change} close upstream transactions on id changes, which is "
                    "only sound with isolation_level='read_committed'; set it, or carry counts"
                )
        self._policy = policy
        self._sources = {s.name: s for s in sources}
        self._by_topic = {s.topic: s for s in sources}
        # Debezium transaction metadata topic -> data collection -> source.
        self._collections: dict[str, dict[str, str]] = {}
        for spec in sources:
            up = spec.upstream
            if up is None or up.metadata_topic is None or up.data_collection is None:
                continue
            if up.metadata_topic in self._by_topic:
                raise SourceSpecError(f"topic {up.metadata_topic!r} is both a source and the "
                                      f"transaction metadata topic of source {spec.name!r}")
            named = self._collections.setdefault(up.metadata_topic, {})
            if up.data_collection in named:
                raise SourceSpecError(
                    f"sources {named[up.data_collection]!r} and {spec.name!r} both read data "
                    f"collection {up.data_collection!r}; give each its own table")
            named[up.data_collection] = spec.name
        self._decoders = {s.name: SourceDecoder(s) for s in sources}
        self._upsert = {
            s.name: UpsertState(s.table_schema) for s in sources if s.semantics == "upsert"
        }
        self._dead = (
            DeadLetterWriter(bootstrap_servers, dead_letter_topic, security=security)
            if dead_letter_topic else None
        )
        self._consumer = Consumer(client_settings(bootstrap_servers, security, **{
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": policy.isolation_level,
            "enable.partition.eof": True,
            **FETCH_SETTINGS,
        }))
        self._next_number = first_number
        self._seq = 0
        self._positions: dict[_TP, int] = {}
        self._assigned: set[_TP] = set()
        self._eof: set[_TP] = set()
        self._last_key: dict[_TP, str] = {}
        self._open: dict[str, _Open] = {}
        self._pending: dict[str, list[pa.Table]] = {s.name: [] for s in sources}
        self._batch_no = 0
        self._batch_fill = 0
        self._batch_started = 0.0
        self._skip_ids: set[str] = set()
        # Upstream id -> (number, last offset per partition) of emitted upstream transactions.
        self._emitted: dict[str, tuple[int, dict[_TP, int]]] = {}
        # Returned by `poll`, not yet passed to `commit`: `state()` is taken before them.
        self._uncommitted: list[Transaction] = []
        self._committed_number = first_number - 1
        self._committed_offsets: Offsets = {}
        self._stats = IngestStats()
        self._assign(None)

    # ---- consumer assignment -------------------------------------------------------------

    def _assign(self, offsets: Offsets | None) -> None:
        """Assign every partition of every source topic: at `offsets` when restoring, else at
        the group's committed offsets, else at the beginning."""
        tps: list[TopicPartition] = []
        for topic in [*self._by_topic, *self._collections]:
            tps += [TopicPartition(topic, p) for p in self._partitions(topic)]
        if offsets is None:
            try:
                tps = self._consumer.committed(tps, timeout=10)
            except KafkaException as exc:
                raise KafkaSourceError(f"could not read the committed offsets of group "
                                       f"partitions {tps}: {exc}") from exc
        else:
            for tp in tps:
                tp.offset = offsets.get(tp.topic, {}).get(tp.partition, OFFSET_BEGINNING)
        for tp in tps:
            if tp.offset < 0:
                tp.offset = OFFSET_BEGINNING
            else:
                self._positions[(tp.topic, tp.partition)] = tp.offset
                self._committed_offsets.setdefault(tp.topic, {})[tp.partition] = tp.offset
        self._assigned = {(tp.topic, tp.partition) for tp in tps}
        self._consumer.assign(tps)

    def _partitions(self, topic: str) -> list[int]:
        """The topic's partitions; a topic created just before may take a moment to appear in
        the metadata of every broker, so this waits up to `_METADATA_WAIT_S` for it."""
        deadline = time.monotonic() + _METADATA_WAIT_S
        while True:
            try:
                meta = self._consumer.list_topics(topic, timeout=10).topics.get(topic)
            except KafkaException as exc:
                raise KafkaSourceError(f"cannot read the metadata of topic {topic!r}: "
                                       f"{exc}; check bootstrap_servers") from exc
            if meta is not None and meta.error is None and meta.partitions:
                return sorted(meta.partitions)
            if time.monotonic() > deadline:
                raise KafkaSourceError(
                    f"topic {topic!r} does not exist or has no partitions "
                    f"({meta.error if meta else 'unknown topic'}); create it before starting"
                )
            time.sleep(0.2)

    # ---- polling -------------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Transaction]:
        """Consume for at most `timeout` seconds (less when an open mini-batch is due) and
        return the transactions closed so far, in order."""
        if self._batch_fill:
            due = self._batch_started + self._policy.max_delay_ms / 1000 - time.monotonic()
            timeout = max(0.0, min(timeout, due))
        try:
            messages = self._consumer.consume(self._policy.max_poll_records, timeout)
        except KafkaException as exc:
            raise KafkaSourceError(f"Kafka consumer failed: {exc}") from exc
        now = time.monotonic()
        if self._batch_fill and now - self._batch_started >= self._policy.max_delay_ms / 1000:
            self._seal_batch()
        records, ends = records_and_ends(messages)
        # Read once per record: each is a call into the client, and a backlog is millions.
        n = len(records)
        topics = np.array(list(map(Message.topic, records)), dtype=object)
        partitions = np.fromiter(map(Message.partition, records), np.int64, n)
        offsets = np.fromiter(map(Message.offset, records), np.int64, n)
        advance(self._positions, self._eof, topics, partitions, offsets, ends)
        if not records:
            self._seal_if_caught_up()
            return self._close_ready(now)
        is_event = np.zeros(n, dtype=bool)
        for topic in self._collections:
            is_event |= topics == topic
        if is_event.any():
            data = np.flatnonzero(~is_event)
            if len(data):
                self._ingest([records[i] for i in data], topics[data], partitions[data],
                             offsets[data], now)
            self._announce([records[i] for i in np.flatnonzero(is_event)], now)
        else:
            self._ingest(records, topics, partitions, offsets, now)
        self._seal_if_caught_up()
        return self._close_ready(now)

    def _seal_batch(self) -> None:
        self._batch_no += 1
        self._batch_fill = 0

    def _seal_if_caught_up(self) -> None:
        """Nothing more to read now: the open mini-batch need not wait for more records."""
        if self._batch_fill and self._policy.close_when_caught_up and self._caught_up():
            self._seal_batch()

    def _caught_up(self) -> bool:
        def high_watermark(tp: _TP) -> int:
            return self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]

        return caught_up(self._assigned, self._eof, self._positions, high_watermark)

    def _ingest(self, records: list[Message], topics: np.ndarray, partitions: np.ndarray,
                 offsets: np.ndarray, now: float) -> None:
        """Decode `records` (with their topics, partitions and offsets) into pending rows and
        track the transactions they belong to."""
        n = len(records)
        seq0 = self._seq
        self._seq += n
        self._stats.events += n
        by_topic = {t: np.flatnonzero(topics == t) for t in self._by_topic}
        batches = np.full(n, -1, dtype=np.int64)
        replayed = np.full(n, -1, dtype=np.int64)
        txids = np.full(n, None, dtype=object)
        counts = np.full(n, -1, dtype=np.int64)
        ends = np.zeros(n, dtype=bool)

        decoded = {}
        for topic, idx in by_topic.items():
            if not len(idx):
                continue
            spec = self._by_topic[topic]
            of_topic = records if len(idx) == n else [records[i] for i in idx]
            batch = self._decoders[spec.name].decode(of_topic, seq0 + idx)
            self._stats.ignored_tombstones += batch.ignored_tombstones
            local = batch.rows.column(SEQ).to_numpy() - seq0
            if spec.upstream is not None:
                txids[local] = batch.rows.column(TXID).to_numpy(zero_copy_only=False)
                counts[local] = pc.fill_null(batch.rows.column(TXCOUNT), -1).to_numpy()
                ends[local] = batch.rows.column(TXEND).to_numpy()
                for b in batch.bad:  # rare: let a bad record count towards its transaction
                    if b.upstream_id is not None:
                        i = b.seq - seq0
                        txids[i], counts[i], ends[i] = (b.upstream_id, b.upstream_count or -1,
                                                        b.upstream_end)
            decoded[spec.name] = (batch, local)
        # Also records of Debezium sources outside any transaction (snapshot reads).
        batched = np.concatenate([
            np.zeros(0, dtype=np.int64),
            *(ix for t, ix in by_topic.items() if self._by_topic[t].upstream is None),
            *(ix[_without_id(txids[ix])] for t, ix in by_topic.items()
              if (up := self._by_topic[t].upstream) is not None and up.metadata_topic),
        ])
        batched = np.sort(batched[self._replay_batches(batched, topics, partitions, offsets,
                                                       replayed)])
        # Records of sources without upstream ids fill mini-batches in consumption order.
        if len(batched):
            if self._batch_fill == 0:
                self._batch_started = now
            slots = self._batch_fill + np.arange(len(batched))
            batches[batched] = self._batch_no + slots // self._policy.max_events
            total = self._batch_fill + len(batched)
            self._batch_no += total // self._policy.max_events
            self._batch_fill = total % self._policy.max_events
            if total >= self._policy.max_events and self._batch_fill:
                self._batch_started = now

        bad = self._drop_seen(txids, records, seq0,
                              {b.seq for batch, _ in decoded.values() for b in batch.bad})
        keys = _keys(batches, replayed, txids)

        for name, (batch, local) in decoded.items():
            rows = batch.rows
            row_keys = keys.take(pa.array(local, pa.int64()))
            kept = pc.is_valid(row_keys)
            rows = rows.append_column(_KEY, row_keys)
            rows = rows.append_column(_PARTITION, pa.array(partitions[local]))
            rows = rows.append_column(_OFFSET, pa.array(offsets[local])).filter(kept)
            if rows.num_rows:
                self._pending[name].append(rows)
            bad += batch.bad
        self._dead_letter(bad)
        awaits_end = np.zeros(n, dtype=bool)
        for topic, idx in by_topic.items():
            upstream = self._by_topic[topic].upstream
            awaits_end[idx] = upstream is not None and upstream.needs_end
        self._track(keys, counts, ends, awaits_end, topics, partitions, offsets, seq0, now)

    def _announce(self, events: list[Message], now: float) -> None:
        """Debezium transaction metadata: an `END` event sets its transaction's expected count
        to the records it announces for the pipeline's tables. `BEGIN` events, and `END` events
        of transactions already emitted or touching none of these tables, change nothing."""
        bad: list[BadRecord] = []
        for message in events:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            seq = self._seq
            self._seq += 1
            try:
                uid, counts = _end_event(message.value())
            except ValueError as exc:
                bad.append(BadRecord(
                    source=f"transaction metadata {topic}", topic=topic, partition=partition,
                    offset=offset, seq=seq, key=message.key(), value=message.value(),
                    headers=list(message.headers() or []), error=str(exc)))
                continue
            if uid is None or uid in self._skip_ids or uid in self._emitted:
                continue
            expected = sum(counts.get(c, 0) for c in self._collections[topic])
            if expected <= 0:
                continue
            key = f"u:{uid}"
            txn = self._open.get(key)
            if txn is None:
                txn = self._open[key] = _Open(key=key, started=now, upstream_id=uid)
            txn.expected = expected
            tp = (topic, partition)
            txn.first[tp] = min(txn.first.get(tp, offset), offset)
            txn.last[tp] = max(txn.last.get(tp, offset), offset)
            txn.last_seq = max(txn.last_seq, seq)
        self._dead_letter(bad)

    def _replay_batches(
        self, idx: np.ndarray, topics: np.ndarray, partitions: np.ndarray, offsets: np.ndarray,
        replayed: np.ndarray,
    ) -> np.ndarray:
        """Marks records of mini-batches being replayed (by their recorded offset ranges) in
        `replayed`; returns the mask of `idx` records left for new mini-batches."""
        free = np.ones(len(idx), dtype=bool)
        for txn in self._open.values():
            if txn.due is None or txn.number is None:
                continue
            for (topic, partition), first in txn.first.items():
                hit = ((topics[idx] == topic) & (partitions[idx] == partition)
                       & (offsets[idx] >= first) & (offsets[idx] < txn.due[(topic, partition)]))
                replayed[idx[hit]] = txn.number
                free &= ~hit
        return free

    def _drop_seen(self, txids: np.ndarray, records: list[Message], seq0: int,
                   already_bad: set[int]) -> list[BadRecord]:
        """Records of upstream transactions already emitted leave `txids` (so they join no
        transaction): silently when emitted before a restore (replayed input), and to the
        dead-letter topic when emitted by this builder (the rule closed the transaction before
        this record was read; see the limits above) rather than as a second transaction."""
        ids = pa.array(txids, pa.string())
        skipped = _member(ids, self._skip_ids)
        self._stats.replayed_skipped += int(skipped.sum())
        txids[skipped] = None
        late = _member(ids, self._emitted) & ~skipped
        bad: list[BadRecord] = []
        for i in np.flatnonzero(late):
            uid, txids[i] = txids[i], None
            self._stats.late_upstream_records += 1
            if seq0 + i in already_bad:
                continue
            message = records[i]
            decoder = self._decoders[self._by_topic[message.topic()].name]
            bad.append(decoder.bad_record(
                message, seq0 + int(i),
                f"record of upstream transaction {uid!r} read after the transaction was "
                f"emitted as #{self._emitted[uid][0]}; its partitions were read out of step: "
                "carry expected counts in the records to close transactions exactly",
            ))
        return bad

    def _track(
        self,
        keys: pa.Array,
        counts: np.ndarray,
        ends: np.ndarray,
        awaits_end: np.ndarray,
        topics: np.ndarray,
        partitions: np.ndarray,
        offsets: np.ndarray,
        seq0: int,
        now: float,
    ) -> None:
        """Per open transaction: records seen, expected count, offset range per partition.
        Grouped in Arrow; the loop runs over (transaction, partition) pairs, not records."""
        table = pa.table(
            {
                "k": keys,
                "t": pa.array(topics, pa.string()),
                "p": pa.array(partitions),
                "o": pa.array(offsets),
                "s": pa.array(np.arange(len(offsets)) + seq0),
                "c": pa.array(counts),
                "e": pa.array(ends),
                "m": pa.array(awaits_end),
            }
        ).filter(pc.is_valid(keys))
        groups = table.group_by(["k", "t", "p"], use_threads=False).aggregate(
            [("o", "min"), ("o", "max"), ("s", "max"), ("c", "max"), ("o", "count"),
             ("e", "any"), ("m", "any")]
        ).to_pylist()
        latest: dict[_TP, tuple[int, str]] = {}
        for g in groups:
            key, tp = g["k"], (g["t"], g["p"])
            txn = self._open.get(key)
            if txn is None:
                upstream = key[2:] if key.startswith("u:") else None
                txn = self._open[key] = _Open(key=key, started=now, upstream_id=upstream)
            txn.seen += g["o_count"]
            if g["c_max"] > 0:
                txn.expected = g["c_max"]
            txn.ended |= g["e_any"]
            txn.awaits_end |= g["m_any"]
            txn.first[tp] = min(txn.first.get(tp, g["o_min"]), g["o_min"])
            txn.last[tp] = max(txn.last.get(tp, g["o_max"]), g["o_max"])
            txn.last_seq = max(txn.last_seq, g["s_max"])
            if g["o_max"] >= latest.get(tp, (-1, ""))[0]:
                latest[tp] = (g["o_max"], key)
        for tp, (_, key) in latest.items():
            self._last_key[tp] = key

    # ---- closing -------------------------------------------------------------------------

    def _complete(self, txn: _Open) -> bool:
        if txn.due is not None:
            return all(self._positions.get(tp, 0) >= end for tp, end in txn.due.items())
        if txn.upstream_id is None:
            return int(txn.key[2:]) < self._batch_no
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
        return all(self._last_key.get(tp) != txn.key or tp in self._eof for tp in txn.last)

    def _close_ready(self, now: float) -> list[Transaction]:
        timeout = self._policy.upstream_timeout_ms / 1000
        expired = [t for t in self._open.values()
                   if t.upstream_id is not None and now - t.started > timeout
                   and not self._complete(t)]
        for txn in expired:
            self._abandon(txn)
        # Replayed transactions go first, in their recorded order; new ones wait for them.
        replays = sorted((t for t in self._open.values() if t.number is not None),
                         key=lambda t: t.number or 0)
        ready: list[_Open] = []
        for txn in replays:
            if not self._complete(txn):
                break
            ready.append(txn)
        if len(ready) == len(replays):
            fresh = self._emission_order([t for t in self._open.values() if t.number is None])
            for txn in fresh:
                txn.number = self._next_number
                self._next_number += 1
            ready += fresh
        if not ready:
            return []
        numbers: dict[str, int] = {}
        for txn in ready:
            del self._open[txn.key]
            numbers[txn.key] = txn.number or 0
        per_source = {name: self._take(name, numbers) for name in self._sources}
        out: list[Transaction] = []
        # Offsets are safe up to the first record of any transaction still open then: those
        # open now, and those closing after it in this call (pins[i]).
        pins: list[dict[_TP, int]] = []
        pin = _first_offsets(self._open.values())
        for txn in reversed(ready):
            pins.append(pin)
            pin = {tp: min(pin.get(tp, o), o) for tp, o in (pin | txn.first).items()}
        for txn, pin in zip(ready, reversed(pins), strict=True):
            number = numbers[txn.key]
            ranges: Ranges = {}
            for tp, first in txn.first.items():
                ranges.setdefault(tp[0], {})[tp[1]] = (first, txn.last[tp] + 1)
            changes = {name: _slice_time(table, number) for name, table in per_source.items()}
            out.append(Transaction(number=number, changes=changes,
                                   offsets=self._safe_offsets(pin),
                                   upstream_id=txn.upstream_id, ranges=ranges))
            if txn.upstream_id is not None:
                self._emitted[txn.upstream_id] = (number, dict(txn.last))
        self._stats.transactions += len(out)
        self._uncommitted += out
        return out

    def _emission_order(self, candidates: list[_Open]) -> list[_Open]:
        """The complete ones of `candidates`, in emission order. Within a partition records are
        in commit order, so a transaction goes after every transaction with a record before its
        first one in a partition they share, and an incomplete one holds back those behind it.
        Among free ones, the one completed earliest goes first. (Kahn's topological sort over
        per-partition queues: O(k log k) for k transactions.)"""
        complete = {t.key for t in candidates if self._complete(t)}
        queues: dict[_TP, list[_Open]] = {}
        for txn in candidates:
            for tp in txn.first:
                queues.setdefault(tp, []).append(txn)
        for tp, queue in queues.items():
            queue.sort(key=lambda t, tp=tp: t.first[tp])
        heads = dict.fromkeys(queues, 0)

        def free(txn: _Open) -> bool:
            return txn.key in complete and all(queues[tp][heads[tp]] is txn for tp in txn.first)

        by_key = {t.key: t for t in candidates}
        heap = [(t.last_seq, t.key) for t in candidates if free(t)]
        heapq.heapify(heap)
        pushed = {key for _, key in heap}
        order: list[_Open] = []
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
        if len(order) < len(candidates) == len(complete):
            # Every one is complete, yet some wait for each other: their partitions disagree on
            # the commit order (never so for one Debezium connector). Held back, they would
            # never close; emitted in the order they completed, they go on.
            stuck = sorted((t for t in candidates if t.key not in pushed),
                           key=lambda t: t.last_seq)
            log.warning("upstream transactions %s: their partitions disagree on the commit "
                        "order; emitted in the order they completed",
                        ", ".join(repr(t.upstream_id) for t in stuck))
            order += stuck
        return order

    def _safe_offsets(self, pinned: dict[_TP, int]) -> Offsets:
        offsets: Offsets = {}
        for tp, position in self._positions.items():
            offsets.setdefault(tp[0], {})[tp[1]] = min(position, pinned.get(tp, position))
        return offsets

    def _take(self, name: str, numbers: dict[str, int]) -> pa.Table:
        """Removes the rows of the closing transactions from the source's pending rows and
        returns their changes (columns + time + diff), sorted by time."""
        spec = self._sources[name]
        schema = spec.table_schema.arrow_schema(with_changes=True)
        pending = self._pending[name]
        if not pending:
            return schema.empty_table()
        rows = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
        where = pc.index_in(rows.column(_KEY), value_set=pa.array(list(numbers), pa.string()))
        number = pc.take(pa.array(list(numbers.values()), pa.int64()), where)
        closed = pc.is_valid(number)
        rest = rows.filter(pc.invert(closed))
        self._pending[name] = [rest] if rest.num_rows else []
        rows = rows.filter(closed).append_column("time", number.filter(closed))
        if spec.semantics == "upsert":
            changes, counts = self._upsert[name].apply(rows)
            self._stats.absent_deletes += counts.absent_deletes
            self._stats.unchanged_upserts += counts.unchanged
        else:
            cols = spec.table_schema.names
            changes = consolidate(
                rows.select([*cols, "time", DIFF]).rename_columns([*cols, "time", "diff"]), cols
            ).cast(schema)
        return changes.sort_by("time")

    def _abandon(self, txn: _Open) -> None:
        """An upstream transaction that never completed: its records go to the dead-letter
        topic, never into the stream."""
        del self._open[txn.key]
        self._stats.incomplete_upstream += 1
        reason = (
            f"upstream transaction {txn.upstream_id!r} incomplete after "
            f"{self._policy.upstream_timeout_ms} ms ({txn.seen} record(s) read"
            + (f" of {txn.expected} announced" if txn.expected else "")
            + "); aborted upstream or lost records, not emitted"
        )
        log.warning(reason)
        bad: list[BadRecord] = []
        for name, pending in self._pending.items():
            if not pending:
                continue
            rows = pa.concat_tables(pending)
            mine = pc.fill_null(pc.equal(rows.column(_KEY), txn.key), False)
            self._pending[name] = [rows.filter(pc.invert(mine))]
            spec = self._sources[name]
            for row in rows.filter(mine).to_pylist():
                value = {k: v for k, v in row.items() if k not in _INTERNAL}
                bad.append(BadRecord(
                    source=name, topic=spec.topic, partition=row[_PARTITION],
                    offset=row[_OFFSET], seq=row[SEQ], key=None,
                    value=json.dumps({**value, "diff": row[DIFF]}, default=str).encode(),
                    headers=[], error=reason, upstream_id=txn.upstream_id,
                ))
        self._dead_letter(bad, count=False)

    def _dead_letter(self, bad: list[BadRecord], count: bool = True) -> None:
        for record in bad:
            log.warning("bad record in source %s at %s/%d@%d: %s", record.source, record.topic,
                        record.partition, record.offset, record.error)
            if self._dead is not None:
                self._dead.send(record)
        if count:
            self._stats.bad_records += len(bad)

    # ---- offsets, state ------------------------------------------------------------------

    def commit(self, transaction: Transaction) -> None:
        """Commit consumer offsets through `transaction` (after the sinks committed it); dead
        letters are acknowledged first, so no record is skipped without a trace."""
        if self._dead is not None:
            self._dead.flush()
        tps = [TopicPartition(t, p, o) for t, parts in transaction.offsets.items()
               for p, o in parts.items()]
        if tps:
            try:
                self._consumer.commit(offsets=tps, asynchronous=False)
            except KafkaException as exc:
                raise KafkaSourceError(f"could not commit offsets {transaction.offsets}: "
                                       f"{exc}") from exc
        self._uncommitted = [t for t in self._uncommitted if t.number > transaction.number]
        self._committed_number = transaction.number
        self._committed_offsets = transaction.offsets
        # Emitted upstream transactions entirely below the committed offsets can no longer be
        # read again after a restore; late records of the last _LATE_WINDOW ones are still
        # recognized.
        self._emitted = {
            uid: (number, last) for uid, (number, last) in self._emitted.items()
            if number > transaction.number - _LATE_WINDOW or any(
                o >= transaction.offsets.get(t, {}).get(p, 0) for (t, p), o in last.items()
            )
        }

    @property
    def stats(self) -> IngestStats:
        return self._stats.model_copy()

    @property
    def next_number(self) -> int:
        return self._next_number

    def state(self) -> SourceState:
        """The state through the last transaction passed to `commit` (transactions polled but
        not committed yet are rolled back out of it): checkpoint it with the engine's state of
        that transaction; a restore resumes right after it."""
        offsets = self._committed_offsets
        emitted = [
            uid for uid, (number, last) in self._emitted.items()
            if number <= self._committed_number
            and any(o >= offsets.get(t, {}).get(p, 0) for (t, p), o in last.items())
        ]
        rows: dict[str, pa.Table] = {}
        for name, upsert in self._upsert.items():
            later = [t.changes[name] for t in self._uncommitted]
            rows[name] = upsert.rows_before(pa.concat_tables(later)) if later else upsert.rows
        return SourceState(next_number=self._committed_number + 1, offsets=offsets,
                           upsert_rows=rows, emitted_upstream_ids=emitted)

    def restore(self, state: SourceState, replay: Sequence[TransactionLogEntry] = ()) -> None:
        """Resume from `state` (before the first poll): numbering, upsert rows, offsets.

        `replay`: the log entries (`Transaction.log_entry()`) of transactions emitted after
        `state` was taken; they are rebuilt from the same records with the same numbers, in
        order, before any new transaction."""
        if self._seq:
            raise KafkaSourceError("restore() must be called before the first poll()")
        missing = set(self._upsert) - set(state.upsert_rows)
        if missing:
            raise KafkaSourceError(f"state has no upsert rows for sources {sorted(missing)}; "
                                   "it was saved by a pipeline with other sources")
        numbers = [e.number for e in replay]
        if numbers != list(range(state.next_number, state.next_number + len(numbers))):
            raise KafkaSourceError(
                f"replay entries {numbers} do not continue the state's numbering at "
                f"{state.next_number}; pass the log of the transactions emitted after it"
            )
        for name, st in self._upsert.items():
            self._upsert[name] = UpsertState(st.schema, state.upsert_rows[name])
        self._skip_ids = set(state.emitted_upstream_ids) - {e.upstream_id for e in replay}
        now = time.monotonic()
        for entry in replay:
            spans = {(t, p): r for t, parts in entry.ranges.items() for p, r in parts.items()}
            if entry.upstream_id is not None:
                txn = _Open(key=f"u:{entry.upstream_id}", started=now,
                            upstream_id=entry.upstream_id, number=entry.number)
            else:
                txn = _Open(key=f"r:{entry.number}", started=now, number=entry.number,
                            due={tp: end for tp, (_, end) in spans.items()},
                            first={tp: start for tp, (start, _) in spans.items()})
            self._open[txn.key] = txn
        self._next_number = state.next_number + len(replay)
        self._committed_number = state.next_number - 1
        self._positions = {}
        self._eof = set()  # reported before the restore, for positions it no longer holds
        self._committed_offsets = {}
        self._assign(state.offsets)

    def close(self) -> None:
        if self._dead is not None:
            self._dead.flush()
        self._consumer.close()


def _end_event(value: bytes | None) -> tuple[str | None, dict[str, int]]:
    """A Debezium transaction metadata event (JSON, with or without the converter's `payload`
    wrapper): for an `END` event its transaction id and record count per data collection;
    for a `BEGIN` event, no id. Raises ValueError, naming what is wrong, on anything else."""
    try:
        event = json.loads(value) if value is not None else None
    except ValueError as exc:
        raise ValueError(f"transaction metadata event is not JSON: {exc}") from exc
    if isinstance(event, dict) and isinstance(event.get("payload"), dict):
        event = event["payload"]
    if not isinstance(event, dict) or event.get("status") not in ("BEGIN", "END"):
        raise ValueError("transaction metadata event without status BEGIN or END; is this "
                         "Debezium's <topic.prefix>.transaction topic?")
    if event["status"] == "BEGIN":
        return None, {}
    uid, collections = event.get("id"), event.get("data_collections")
    if uid is None or not isinstance(collections, list):
        raise ValueError("END event without 'id' or 'data_collections'")
    counts: dict[str, int] = {}
    for entry in collections:
        if not (isinstance(entry, dict) and isinstance(entry.get("data_collection"), str)
                and isinstance(entry.get("event_count"), int)):
            raise ValueError(f"END event of transaction {uid!r}: data_collections entry "
                             f"{entry!r} lacks 'data_collection' or an integer 'event_count'")
        counts[entry["data_collection"]] = counts.get(entry["data_collection"], 0) \
            + entry["event_count"]
    return str(uid), counts


def _first_offsets(transactions: Iterable[_Open]) -> dict[_TP, int]:
    """Per partition, the first offset of any of `transactions`."""
    first: dict[_TP, int] = {}
    for txn in transactions:
        for tp, offset in txn.first.items():
            first[tp] = min(first.get(tp, offset), offset)
    return first


def records_and_ends(messages: Sequence[Message]) -> tuple[list[Message], dict[_TP, int]]:
    """The records among consumed `messages`, and for each partition whose end was reported,
    how many records came before its last report (see `advance`). Client errors are logged
    (the client retries them) or raised (fatal)."""
    records: list[Message] = []
    ends: dict[_TP, int] = {}
    start = 0
    for i, message in enumerate(messages):
        error = message.error()
        if error is None:
            continue
        records += messages[start:i]
        start = i + 1
        if error.code() == KafkaError._PARTITION_EOF:
            ends[(message.topic(), message.partition())] = len(records)
        elif error.fatal():
            raise KafkaSourceError(f"fatal Kafka error: {error}")
        else:
            log.warning("Kafka consumer error (retried by the client): %s", error)
    records += messages[start:]
    return records, ends


def advance(positions: dict[_TP, int], at_end: set[_TP], topics: np.ndarray,
            partitions: np.ndarray, offsets: np.ndarray, ends: Mapping[_TP, int]) -> None:
    """Update the consumer's `positions` after consuming records (their `topics`, `partitions`
    and `offsets`, in stream order) and the partitions it has read to the end (`at_end`).
    `ends`: the partitions whose end was reported among the records, each with how many
    records came before its last report. A partition is at its end when the report came after
    its last record; a record after it means the partition grew."""
    last: dict[_TP, int] = {}
    for topic in _distinct(topics):
        in_topic = np.flatnonzero(topics == topic)
        for partition in _distinct(partitions[in_topic]):
            of_partition = in_topic[partitions[in_topic] == partition]
            last[(str(topic), int(partition))] = int(of_partition[-1])
    for tp, index in last.items():
        positions[tp] = int(offsets[index]) + 1
        at_end.discard(tp)
    at_end.update(tp for tp, before in ends.items() if last.get(tp, -1) < before)


def caught_up(assigned: Iterable[_TP], at_end: set[_TP], positions: Mapping[_TP, int],
              high_watermark: Callable[[_TP], int]) -> bool:
    """Whether every `assigned` partition is read to its end: reported at its end by the client
    (`at_end`), or read (`positions`: next offset) up to the high watermark the client holds from
    its latest fetch of it (negative: none yet). The watermark answers with the records that
    reach it; the report comes one fetch later (up to `fetch.wait.max.ms`). A transactional
    producer's commit markers, and open or aborted transactions under read_committed, take
    offsets below the watermark that no record reaches: there only the report tells."""
    return all(tp in at_end or 0 <= high_watermark(tp) <= positions.get(tp, -1)
               for tp in assigned)


def _distinct(values: np.ndarray) -> list[Any]:
    """The distinct values, in order of appearance. A consumed batch holds runs of a few
    partitions: comparing neighbours is cheaper than sorting a million topic names."""
    if not len(values):
        return []
    starts = np.flatnonzero(values[1:] != values[:-1]) + 1
    return list(dict.fromkeys(values[np.concatenate([[0], starts])].tolist()))


def _without_id(txids: np.ndarray) -> np.ndarray:
    return pc.is_null(pa.array(txids, pa.string())).to_numpy(zero_copy_only=False)


def _member(ids: pa.Array, values: Iterable[str]) -> np.ndarray:
    found = pc.is_in(ids, value_set=pa.array(list(values), pa.string()))
    return pc.fill_null(found, False).to_numpy(zero_copy_only=False)


def _keys(batches: np.ndarray, replayed: np.ndarray, txids: np.ndarray) -> pa.Array:
    """Per record, the key of its open transaction; null for a record in none (dead-lettered
    without a readable upstream id, or skipped as emitted before a restart)."""
    null = pa.scalar(None, pa.string())

    def tagged(prefix: str, values: pa.Array, valid: pa.Array) -> pa.Array:
        text = pc.binary_join_element_wise(prefix, pc.cast(values, pa.string()), "")
        return pc.if_else(valid, text, null)

    b, r, u = pa.array(batches), pa.array(replayed), pa.array(txids, pa.string())
    return pc.coalesce(
        tagged("r:", r, pc.greater_equal(r, 0)),
        tagged("b:", b, pc.greater_equal(b, 0)),
        tagged("u:", u, pc.is_valid(u)),
    )


def _slice_time(changes: pa.Table, number: int) -> pa.Table:
    times = changes.column("time").to_numpy()
    lo, hi = np.searchsorted(times, [number, number + 1])
    return changes.slice(int(lo), int(hi - lo))

