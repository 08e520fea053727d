"""The transaction builder: the consumer of every source topic of a pipeline, turning what it
reads into batches of numbered, consolidated transactions (`TransactionBatch`, one `Changes` per
source), with the consumer offsets safe to commit after each transaction.

It only polls and commits: the records go to the sources' decoders (`txstream.sources.decoder`)
as plain sequences, their coordinates to the transaction boundaries
(`txstream.sources.boundaries`, where the rules are described), the decoded rows to the pending
changes (`txstream.sources.pending`), bad records to the dead-letter topic
(`txstream.sources.dead_letters`).

`state()` is the state through the last committed transaction: the next number, the upsert
rows, the safe offsets and the ids of upstream transactions already emitted whose records lie
beyond those offsets. `restore(state, replay=log entries of the transactions emitted after it)`
resumes there: the replayed transactions are rebuilt from the same records with the same
numbers, and nothing before them is emitted twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from txstream.changes import Changes
from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.sources.boundaries import PolledRecords, TopicRule, TransactionBoundaries
from txstream.sources.consumed import raw_records, records_and_ends
from txstream.sources.dead_letters import DeadLetterWriter
from txstream.sources.debezium.metadata import end_event, expected_count
from txstream.sources.debezium.rows import resolve, resolve_updates
from txstream.sources.decoder import SourceDecoder, framed_values
from txstream.sources.kafka_source import (
    SEQ,
    UPSTREAM_COUNT,
    UPSTREAM_END,
    UPSTREAM_ID,
    BadRecord,
    DecodedBatch,
    KafkaSourceError,
    RawRecords,
)
from txstream.sources.pending import PendingChanges, originals
from txstream.sources.positions import Partition, caught_up, waiting
from txstream.sources.registry.client import RegistrySchemas
from txstream.sources.single_records import with_upstream
from txstream.sources.source_checks import check_sources, metadata_connectors
from txstream.sources.source_state import IngestStats, SourceState
from txstream.sources.transaction_batch import (
    Offsets,
    Transaction,
    TransactionBatch,
    TransactionLogEntry,
)

log = logging.getLogger(__name__)

_METADATA_WAIT_S = 10.0
# How the service's consumer fetches. librdkafka stops fetching a partition once
# `queued.min.messages` (100,000) records wait in its local queue and then, by default, waits
# `fetch.queue.backoff.ms` = 1,000 ms before fetching again, although a backlog's queue drains
# in a fraction of that: reading a backlog then idles most of each second (measured: 168k
# records/s on the embedded broker, 640k with 10 ms). The queue stays bounded by
# `queued.min.messages` and `queued.max.messages.kbytes` (64 MiB per partition) either way.
FETCH_SETTINGS: dict[str, int] = {"fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10}

class TransactionBuilder:
    """Consumes the sources' topics and groups their records into numbered transactions.

    Not thread-safe: one thread calls `poll`, then `commit` once the sinks hold a batch."""

    def __init__(
        self,
        bootstrap_servers: str,
        sources: list[SourceSpec],
        *,
        group_id: str,
        policy: BatchPolicy,
        dead_letter_topic: str | None = None,
        security: KafkaSecurity = PLAINTEXT,
        wall_clock: bool = False,
    ) -> None:
        """`wall_clock`: the pipeline calls now(), so transactions carry wall times (their
        records' latest Kafka timestamp, or a Debezium change event's own time; a flattened
        event has none) and ticks come while the input is idle (`BatchPolicy`)."""
        self._wall_clock = wall_clock
        # Debezium transaction metadata topic -> data collection -> source.
        self._collections = check_sources(sources, policy)
        self._end_connectors = metadata_connectors(sources)
        self.sources = list(sources)
        self._policy = policy
        self._by_topic = {s.topic: s for s in sources}
        self._by_name = {s.name: s for s in sources}
        # One client per Schema Registry, asked at start: a registry that does not answer
        # stops the start (SchemaRegistryUnavailable) rather than dead-letter every record.
        registries = {s.schema_registry_url: RegistrySchemas(s.schema_registry_url)
                      for s in sources if s.schema_registry_url is not None}
        for registry in registries.values():
            registry.check()
        self._decoders = {s.name: SourceDecoder(s, registries.get(s.schema_registry_url or ""),
                                                wall_times=wall_clock)
                          for s in sources}
        # Debezium writes its transaction metadata with the connector's value converter: Avro
        # (or JSON Schema, Protobuf) when the changes are.
        self._metadata_framed = {
            s.upstream.metadata_topic: framed_values(s.value_format,
                                                     registries[s.schema_registry_url])
            for s in sources if s.upstream is not None and s.upstream.metadata_topic
            and s.schema_registry_url is not None}
        self._core = TransactionBoundaries(policy, {s.topic: TopicRule.of(s) for s in sources})
        self._pending = PendingChanges(sources)
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
        # Polled, not yet passed to `commit`: `state()` is taken before them.
        self._uncommitted: list[TransactionBatch] = []
        self._stats = IngestStats()
        self._assign(None)

    # ---- consumer assignment -------------------------------------------------------------

    def _assign(self, offsets: Offsets | None) -> None:
        """Assign every partition of every source topic: at `offsets` when restoring, else at
        the group's committed offsets, else at the beginning."""
        tps: list[KafkaPartition] = []
        for topic in [*self._by_topic, *self._collections]:
            tps += [KafkaPartition(topic, p) for p in self._partitions(topic)]
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
        self._core.assign([(tp.topic, tp.partition) for tp in tps],
                          {(tp.topic, tp.partition): tp.offset for tp in tps if tp.offset >= 0})
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

    def poll(self, timeout: float) -> TransactionBatch | None:
        """Consume for at most `timeout` seconds (less when an open mini-batch is due) and
        return the transactions closed meanwhile, as one batch (None: none closed)."""
        core = self._core
        try:
            messages = self._consumer.consume(self._policy.max_poll_records,
                                              core.timeout(timeout, time.monotonic()))
        except KafkaException as exc:
            raise KafkaSourceError(f"Kafka consumer failed: {exc}") from exc
        now = time.monotonic()
        records, ends = records_and_ends(messages)
        # Read once per record: each is a call into the client, and a backlog is millions.
        n = len(records)
        topics = np.array(list(map(Message.topic, records)), dtype=object)
        partitions = np.fromiter(map(Message.partition, records), np.int64, n)
        offsets = np.fromiter(map(Message.offset, records), np.int64, n)
        core.consumed(topics, partitions, offsets, ends, now)
        if records:
            is_event = np.zeros(n, dtype=bool)
            for topic in self._collections:
                is_event |= topics == topic
            data = np.flatnonzero(~is_event) if is_event.any() else None
            if data is None:
                self._ingest(records, topics, partitions, offsets, now)
            elif len(data):
                self._ingest([records[i] for i in data], topics[data], partitions[data],
                             offsets[data], now)
            if data is not None:
                self._announce([records[i] for i in np.flatnonzero(is_event)], now)
        core.seal_if_caught_up(self._caught_up)
        closed = self._close_ready(now)
        if closed is None and self._wall_clock and self._caught_up():
            tick = core.tick(time.time_ns() // 1_000_000)
            if tick is not None:
                closed = TransactionBatch.of([tick], {})
                self._uncommitted.append(closed)
        return closed

    def read_to_end(self) -> bool:
        """Whether partitions are assigned, every one is read to its end (as of the client's
        latest fetch: no call to the broker) and every record read is in a closed
        transaction."""
        core = self._core
        return bool(core.assigned) and not core.holding and self._caught_up()

    def waiting_records(self) -> int:
        """Records of the assigned partitions not read yet, as of the client's latest fetch of
        each (no call to the broker): the backlog ahead of the consumer."""
        core = self._core
        return waiting(core.assigned, core.at_end, core.positions, self._high_watermark)

    def _caught_up(self) -> bool:
        core = self._core
        return caught_up(core.assigned, core.at_end, core.positions, self._high_watermark)

    def _high_watermark(self, tp: Partition) -> int:
        """The client's latest (negative: none yet)."""
        return self._consumer.get_watermark_offsets(KafkaPartition(*tp), cached=True)[1]

    def _ingest(self, records: list[Message], topics: np.ndarray, partitions: np.ndarray,
                 offsets: np.ndarray, now: float) -> None:
        """Decode `records` (with their topics, partitions and offsets) into pending rows and
        place them in transactions."""
        n = len(records)
        seq0 = self._core.take_seqs(n)
        self._stats.events += n
        polled = PolledRecords.of(topics, partitions, offsets, timestamps=(
            np.fromiter((m.timestamp()[1] for m in records), np.int64, n)
            if self._wall_clock else None))
        decoded = {}
        for topic, spec in self._by_topic.items():
            idx = np.flatnonzero(topics == topic)
            if not len(idx):
                continue
            raw = raw_records(records if len(idx) == n else [records[i] for i in idx], topic,
                              partitions[idx], offsets[idx])
            batch = self._decoders[spec.name].decode(raw, seq0 + idx)
            if batch.wall_ms is not None:
                said = batch.wall_ms >= 0  # the event's own time, over the Kafka timestamp
                polled.timestamps[idx[said]] = batch.wall_ms[said]
            if spec.debezium:
                batch = self._resolve(spec, batch, raw, idx, seq0)
            self._stats.ignored_tombstones += batch.ignored_tombstones
            self._stats.ignored_events += batch.ignored_events
            local = batch.rows.column(SEQ).to_numpy() - seq0
            polled.skipped[np.asarray(batch.skipped, dtype=np.int64) - seq0] = True
            if spec.upstream is not None:
                rows = batch.rows
                polled.upstream_ids[local] = rows.column(UPSTREAM_ID).to_numpy(
                    zero_copy_only=False)
                polled.expected_counts[local] = pc.fill_null(rows.column(UPSTREAM_COUNT),
                                                             -1).to_numpy()
                polled.end_markers[local] = rows.column(UPSTREAM_END).to_numpy()
                for b in batch.bad:  # rare: let a bad record count towards its transaction
                    if b.upstream_id is not None:
                        i = b.seq - seq0
                        polled.upstream_ids[i] = b.upstream_id
                        polled.expected_counts[i] = b.upstream_count or -1
                        polled.end_markers[i] = b.upstream_end
            decoded[spec.name] = (batch, local, raw, idx)
        placed = self._core.place(polled, seq0, now)
        already_bad = {b.seq for batch, *_ in decoded.values() for b in batch.bad}
        bad: list[BadRecord] = []
        for late in placed.late:
            if seq0 + late.index in already_bad:
                continue
            spec = self._by_topic[str(topics[late.index])]
            batch, _, raw, idx = decoded[spec.name]
            bad.append(self._decoders[spec.name].bad_record(
                raw, int(np.searchsorted(idx, late.index)), seq0 + late.index,
                f"record of upstream transaction {late.upstream_id!r} read after the "
                f"transaction was emitted as #{late.number}; its partitions were read out of "
                "step: carry expected counts in the records to close transactions exactly",
            ))
        for name, (batch, local, raw, idx) in decoded.items():
            at = pa.array(local, pa.int64())
            kept = (originals(raw, np.searchsorted(idx, local))  # replayable dead letters
                    if self._by_name[name].upstream is not None else None)
            self._pending.add(name, batch.rows, placed.keys.take(at),
                              pa.array(partitions[local]), pa.array(offsets[local]), kept)
            bad += batch.bad
        self._dead_letter(bad)

    def _resolve(self, spec: SourceSpec, batch: DecodedBatch, raw: RawRecords, idx: np.ndarray,
                 seq0: int) -> DecodedBatch:
        """Debezium tombstones and unchanged TOAST values, against each key's latest row of an
        upsert source, an update's old row otherwise (`txstream.sources.debezium.rows`)."""
        done = resolve(spec, batch.rows, batch.tombstones,
                       lambda keys: self._pending.latest(spec.name, keys)
                       ) if spec.semantics == "upsert" else resolve_updates(spec, batch.rows)
        decoder = self._decoders[spec.name]
        bad = [decoder.bad_record(raw, int(np.searchsorted(idx, seq - seq0)), seq, reason)
               for seq, reason in done.rejected.items()]
        if spec.upstream is not None:  # a rejected change still counts towards its transaction
            bad = [with_upstream(spec, b) for b in bad]
        return replace(batch, rows=done.rows, bad=batch.bad + bad,
                       ignored_tombstones=batch.ignored_tombstones + len(done.skipped),
                       skipped=batch.skipped + done.skipped, tombstones=[])

    def _announce(self, events: list[Message], now: float) -> None:
        """Debezium transaction metadata: an `END` event sets its transaction's expected count
        to the records it announces for the pipeline's tables."""
        bad: list[BadRecord] = []
        for message in events:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            seq = self._core.take_seqs(1)
            value, framed = message.value(), self._metadata_framed.get(topic)
            try:
                if framed is not None and value is not None:
                    value = framed.json_of(value)
                uid, counts = end_event(value, self._end_connectors.get(topic))
            except ValueError as exc:
                bad.append(BadRecord(
                    source=f"transaction metadata {topic}", topic=topic, partition=partition,
                    offset=offset, seq=seq, key=message.key(), value=message.value(),
                    headers=list(message.headers() or []), error=str(exc)))
                continue
            if uid is not None:
                self._core.announce(uid, expected_count(counts, self._collections[topic]),
                                    (topic, partition), offset, seq, now)
        self._dead_letter(bad)

    def _close_ready(self, now: float) -> TransactionBatch | None:
        closing = self._core.close_ready(now)
        for txn in closing.expired:
            reason = (
                f"upstream transaction {txn.upstream_id!r} incomplete after "
                f"{self._policy.upstream_timeout_ms} ms ({txn.seen} record(s) read"
                + (f" of {txn.expected} announced" if txn.expected else "")
                + "); aborted upstream or lost records, not emitted"
            )
            log.warning(reason)
            self._dead_letter(self._pending.drop(txn.key, txn.upstream_id, reason), count=False)
        if not closing.transactions:
            return None
        transactions = closing.transactions
        if self._wall_clock:  # records without a Kafka timestamp: the time they closed
            closed_ms = time.time_ns() // 1_000_000
            transactions = [t if t.wall_time_ms is not None
                            else t.model_copy(update={"wall_time_ms": closed_ms})
                            for t in transactions]
        batch = TransactionBatch.of(transactions, self._pending.take(closing.numbers))
        self._uncommitted.append(batch)
        return batch

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
        tps = [KafkaPartition(t, p, o) for t, parts in transaction.offsets.items()
               for p, o in parts.items()]
        if tps:
            try:
                self._consumer.commit(offsets=tps, asynchronous=False)
            except KafkaException as exc:
                raise KafkaSourceError(f"could not commit offsets {transaction.offsets}: "
                                       f"{exc}") from exc
        self._uncommitted = [b for b in self._uncommitted if b.last.number > transaction.number]
        self._core.committed(transaction)

    @property
    def stats(self) -> IngestStats:
        counts, upserts = self._core.counts, self._pending.upsert_counts
        return self._stats.model_copy(update={
            "transactions": counts.transactions,
            "incomplete_upstream": counts.incomplete_upstream,
            "replayed_skipped": counts.replayed_skipped,
            "late_upstream_records": counts.late_upstream_records,
            "absent_deletes": upserts.absent_deletes,
            "unchanged_upserts": upserts.unchanged,
        })

    def state(self) -> SourceState:
        """The state through the last transaction passed to `commit` (transactions polled but
        not committed yet are rolled back out of it): checkpoint it with the engine's state of
        that transaction; a restore resumes right after it."""
        core = self._core
        after = core.committed_number
        later: dict[str, list[Changes]] = {}
        for batch in self._uncommitted:  # the first may be committed in part
            for name, changes in batch.changes.items():
                later.setdefault(name, []).append(changes.after(after))
        return SourceState(next_number=after + 1, offsets=core.committed_offsets,
                           upsert_rows=self._pending.rows_before(later),
                           emitted_upstream_ids=core.emitted_ids())

    def restore(self, state: SourceState, replay: Sequence[TransactionLogEntry] = ()) -> None:
        """Resume from `state` (before the first poll): numbering, upsert rows, offsets.

        `replay`: the log entries (`Transaction.log_entry()`) of transactions emitted after
        `state` was taken; they are rebuilt from the same records with the same numbers, in
        order, before any new transaction."""
        if self._core.started:
            raise KafkaSourceError("restore() must be called before the first poll()")
        missing = set(self._pending.upsert) - set(state.upsert_rows)
        if missing:
            raise KafkaSourceError(f"state has no upsert rows for sources {sorted(missing)}; "
                                   "it was saved by a pipeline with other sources")
        self._core.restore(state.next_number, state.emitted_upstream_ids, replay,
                           time.monotonic())
        self._pending.restore_upsert(state.upsert_rows)
        self._assign(state.offsets)

    def close(self) -> None:
        if self._dead is not None:
            self._dead.flush()
        self._consumer.close()
