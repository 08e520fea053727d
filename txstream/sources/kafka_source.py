"""What the Kafka source's records become: the raw records one poll read of a topic
(`RawRecords`, plain sequences: no client objects), the decoded rows of a source with their
bookkeeping columns (`DecodedBatch`), and the records that cannot be decoded (`BadRecord`).
`txstream.sources.decoder` turns the first into the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from txstream.schemas.sources import SourceSpec

# Bookkeeping columns of a decoded rows table, next to the source's own columns. User columns
# may not start with "__" (TableSchema refuses them), so these never clash with one.
SEQ = "__seq"  # position of the record in the pipeline's consumption order
SIGN = "__sign"  # +1 / -1 (append_only, insert_delete); +1 for upserts
DELETE = "__delete"  # upsert: the record deletes its key
UPSTREAM_ID = "__upstream_id"  # upstream transaction id (null without upstream transactions)
UPSTREAM_COUNT = "__upstream_count"  # expected record count of the upstream transaction
UPSTREAM_END = "__upstream_end"  # the record carries the upstream transaction's end marker
# upsert: the record (a Debezium truncate) deletes every row of the source; its columns are null
TRUNCATE = "__truncate"
BOOKKEEPING = (SEQ, SIGN, DELETE, UPSTREAM_ID, UPSTREAM_COUNT, UPSTREAM_END, TRUNCATE)

Headers = list[tuple[str, bytes]]


def bookkeeping(seq: Any, sign: Any, delete: Any, upstream_id: Any, upstream_count: Any,
                upstream_end: Any, truncate: Any = False) -> dict[str, Any]:
    """The bookkeeping columns of decoded rows (values or arrays) by name."""
    return {SEQ: seq, SIGN: sign, DELETE: delete, UPSTREAM_ID: upstream_id,
            UPSTREAM_COUNT: upstream_count, UPSTREAM_END: upstream_end, TRUNCATE: truncate}


class KafkaSourceError(RuntimeError):
    """The Kafka input side cannot go on (broker error, missing topic, dead-letter failure)."""


@dataclass(frozen=True)
class RawRecords:
    """Records of one topic as the consumer read them, in consumption order. Each field is a
    sequence with one item per record: a list, an array, or a view that reads an item only when
    asked (the consumer's records are read that way: keys, headers and timestamps are rarely
    needed, and a backlog is millions of records)."""

    topic: str
    partitions: Sequence[int]
    offsets: Sequence[int]
    values: Sequence[bytes | None]
    keys: Sequence[bytes | None]
    headers: Sequence[Headers | None]
    # (type, milliseconds) as Kafka gives them; type 0 is TIMESTAMP_NOT_AVAILABLE.
    timestamps: Sequence[tuple[int, int]]

    @classmethod
    def of(cls, topic: str, values: Sequence[bytes | None],
           keys: Sequence[bytes | None] | None = None,
           headers: Sequence[Headers | None] | None = None, partition: int = 0,
           first_offset: int = 0) -> RawRecords:
        """Records of one partition at consecutive offsets, without timestamps."""
        n = len(values)
        return cls(topic=topic, partitions=np.full(n, partition, dtype=np.int64),
                   offsets=np.arange(first_offset, first_offset + n, dtype=np.int64),
                   values=values, keys=keys if keys is not None else [None] * n,
                   headers=headers if headers is not None else [None] * n,
                   timestamps=[(0, 0)] * n)

    def __len__(self) -> int:
        return len(self.values)


class BadRecord(BaseModel):
    """A record that could not be decoded or validated, with everything needed to replay it."""

    model_config = ConfigDict(frozen=True)

    source: str
    topic: str
    partition: int
    offset: int
    seq: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    error: str
    # Known when the id is in a header or the value is JSON despite the failure: the record
    # still counts towards its upstream transaction's expected count.
    upstream_id: str | None = None
    upstream_count: int | None = None
    upstream_end: bool = False


@dataclass
class DecodedBatch:
    rows: pa.Table  # the source's columns + BOOKKEEPING, records in consumption order
    bad: list[BadRecord]
    ignored_tombstones: int  # Debezium's compaction tombstones after deletes (no row in them)
    # Consumption positions of the records that join no transaction (ignored tombstones and
    # events), and of the upsert deletes read from Debezium tombstones (kept only if their key
    # has a row).
    skipped: list[int] = field(default_factory=list)
    tombstones: list[int] = field(default_factory=list)
    # Debezium's records that change no row: heartbeats, schema changes, logical decoding
    # messages (`txstream.sources.debezium.events`); in `skipped` too.
    ignored_events: int = 0
    # Per record given (by index), when a Debezium change event says it happened (ms since the
    # epoch), -1 where it says not; None for other formats, and unless the decoder was asked
    # (`SourceDecoder(wall_times=True)`). A transaction's wall time.
    wall_ms: np.ndarray | None = None


def rows_schema(spec: SourceSpec) -> pa.Schema:
    """The decoded rows of `spec`: its columns, then the bookkeeping columns."""
    return pa.schema(
        [pa.field(c.name, c.type.arrow) for c in spec.table_schema.columns]
        + [
            pa.field(SEQ, pa.int64()),
            pa.field(SIGN, pa.int64()),
            pa.field(DELETE, pa.bool_()),
            pa.field(UPSTREAM_ID, pa.string()),
            pa.field(UPSTREAM_COUNT, pa.int64()),
            pa.field(UPSTREAM_END, pa.bool_()),
            pa.field(TRUNCATE, pa.bool_()),
        ]
    )
