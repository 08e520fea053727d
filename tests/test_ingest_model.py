"""The path from decoded records to the engine's input, without Spark or Kafka, against a
row-at-a-time model.

Random records of two upsert sources (keys updated several times within and across
transactions, deleted, written again unchanged) and an append-only one go through what the
service does with them: `PendingChanges` (rows of open transactions; transactions spanning
polls; several closing in one poll), `TransactionBatch.of` per poll, the ready queue of
`Stages` (batches taken at random moments, joined and split at `batch_transactions`), the
parts of `NetGroups` with netting on and off, and `engine_changes`. What reaches the engine
passes the input invariants (`check_engine_input`) and, integrated, equals the model's tables
after every transaction (a netted batch: after its last one, the only state it shows)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from txstream.changes import DIFF, TIME, Changes
from txstream.schemas.sources import SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.service.invariants import check_engine_input
from txstream.service.net_groups import NetGroups, engine_changes
from txstream.service.stages import Stages
from txstream.sources.kafka_source import DELETE, SEQ, SIGN
from txstream.sources.pending import PendingChanges
from txstream.sources.transaction_batch import Transaction, TransactionBatch

KV = TableSchema.of({"k": "bigint", "v": "bigint"}, primary_key=["k"])
SOURCES = [SourceSpec(name="a", topic="a", schema=KV, semantics="upsert"),
           SourceSpec(name="b", topic="b", schema=KV, semantics="upsert"),
           SourceSpec(name="log", topic="log", schema=TableSchema.of({"k": "bigint",
                                                                     "v": "bigint"}))]
UPSERT = {"a", "b"}
Record = tuple[str, int, int | None]  # source, key, value (None: a delete)


class Model:
    """The sources' tables record by record, as multisets of (k, v) after each transaction."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[int, int]] = {"a": {}, "b": {}}
        self.log: Counter[tuple[int, int]] = Counter()
        self.after: dict[int, dict[str, Counter[tuple[int, int]]]] = {}

    def apply(self, record: Record) -> None:
        source, key, value = record
        if source in UPSERT:
            if value is None:
                self.rows[source].pop(key, None)
            else:
                self.rows[source][key] = value
        else:
            assert value is not None
            self.log[(key, value)] += 1

    def closed(self, number: int) -> None:
        self.after[number] = {"a": Counter(self.rows["a"].items()),
                              "b": Counter(self.rows["b"].items()), "log": Counter(self.log)}


def _records(rng: random.Random, n: int) -> list[Record]:
    out: list[Record] = []
    for _ in range(n):
        source = rng.choice(["a", "a", "b", "log"])
        key = rng.randrange(6)
        value = None if source in UPSERT and rng.random() < 0.25 else rng.randrange(3)
        out.append((source, key, value))
    return out


def _add(pending: PendingChanges, records: list[tuple[int, Record, str]]) -> None:
    """Decoded rows as the decoders make them, each with its transaction's key."""
    for source in ("a", "b", "log"):
        mine = [(seq, r, key) for seq, r, key in records if r[0] == source]
        if not mine:
            continue
        rows = pa.table({
            "k": pa.array([r[1] for _, r, _ in mine], pa.int64()),
            "v": pa.array([r[2] for _, r, _ in mine], pa.int64()),
            SEQ: pa.array([seq for seq, _, _ in mine], pa.int64()),
            SIGN: pa.array([1] * len(mine), pa.int64()),
            DELETE: pa.array([r[2] is None for _, r, _ in mine], pa.bool_()),
        })
        pending.add(source, rows, pa.array([key for _, _, key in mine], pa.string()),
                    pa.array([0] * len(mine), pa.int64()),
                    pa.array([seq for seq, _, _ in mine], pa.int64()))


class Engine:
    """Stands for the engine: integrates what it is given, and checks it on the way in."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.tables: dict[str, Counter[tuple[int, int]]] = {s.name: Counter() for s in SOURCES}

    def process(self, batch: TransactionBatch, changes: dict[str, Changes],
                netted: bool) -> None:
        check_engine_input(changes, batch.first, batch.last.number,
                           {name: ["k"] for name in UPSERT})
        by_time: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for name, c in changes.items():
            for row in c.table.to_pylist():
                by_time.setdefault(row[TIME], []).append((name, row))
        numbers = [t.number for t in batch.transactions]
        if netted:
            assert set(by_time) <= {numbers[-1]}, "a netted batch is at its last transaction"
        for number in numbers:
            for name, row in by_time.get(number, []):
                self.tables[name][(row["k"], row["v"])] += row[DIFF]
            if not netted or number == numbers[-1]:
                now = {n: +t for n, t in self.tables.items()}
                assert all(n >= 0 for t in self.tables.values() for n in t.values())
                assert now == self.model.after[number], f"after transaction {number}"


@pytest.mark.parametrize("seed", range(60))
def test_what_reaches_the_engine_equals_a_row_at_a_time_model(seed: int) -> None:
    rng = random.Random(seed)
    model, pending = Model(), PendingChanges(SOURCES)
    stages = Stages(rng.choice([1, 2, 3, 5, 50]), serving=False)
    nets = rng.random() < 0.5
    groups = NetGroups.of(nets, [], 0, None)
    engine = Engine(model)
    records = _records(rng, rng.randrange(20, 200))
    # Transactions of consecutive records; each closes at a poll at or after its last record.
    open_: list[tuple[str, int]] = []  # key, records not read yet
    members: dict[str, list[Record]] = {}
    number, seq, at = 0, 0, 0

    def take() -> None:
        batch = stages.take_batch(timeout=0)
        if batch is None:
            return
        parts = groups.parts(batch)
        if parts:
            netted = any(p.netted for p in parts)
            engine.process(batch, engine_changes(parts, {s.name for s in SOURCES}), netted)

    while at < len(records) or open_:
        poll = records[at:at + rng.randrange(0, 9)]
        read: list[tuple[int, Record, str]] = []
        for record in poll:
            if not open_ or open_[-1][1] == 0:
                open_.append((f"t{seq}", rng.randrange(1, 7)))
            key, left = open_[-1]
            open_[-1] = (key, left - 1)
            read.append((seq, record, key))
            members.setdefault(key, []).append(record)
            seq += 1
        at += len(poll)
        if at == len(records) and open_:
            open_[-1] = (open_[-1][0], 0)  # the last transaction closes with the stream
        _add(pending, read)
        complete = [key for key, left in open_ if left == 0]
        closing = complete[:rng.randrange(len(complete) + 1)] if at < len(records) else complete
        if closing:
            numbers = {key: number + i + 1 for i, key in enumerate(closing)}
            for key in closing:  # transactions close in order: the model applies each whole
                for record in members.pop(key):
                    model.apply(record)
                model.closed(numbers[key])
            number += len(closing)
            open_ = open_[len(closing):]
            batch = TransactionBatch.of([Transaction(number=n, offsets={})
                                         for n in numbers.values()], pending.take(numbers))
            while not stages.offer(batch):
                take()
        if rng.random() < 0.5:
            take()
    while stages.has_ready():
        take()
    assert groups.held is None
    assert {n: +t for n, t in engine.tables.items()} == model.after[number]

