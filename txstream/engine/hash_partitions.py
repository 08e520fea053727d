"""Spark's hash partitioning of Arrow data, computed on the driver.

    changes (Arrow)  --partition_ids-->  [0, 1, 1, 0, ...]  --split-->  one table per partition

Spark places a row of `repartition(P, c1, c2)` (and of every exchange the planner adds for a
join or an aggregate by those columns) in partition `pmod(murmur3(c1, c2), P)`: Murmur3 x86 32
with seed 42, each column hashed with the running hash as its seed, a null leaving it as it
was. A source's changes split that way on the driver enter Spark already clustered as the
first operator reading them needs, so the batch's job does not shuffle its largest delta
(`txstream.engine.operators.rowwise.SourceOp`).

Only types whose hash Spark takes from their integer value are computed here: integers,
booleans, dates and timestamps (microseconds). For another type (strings hash their UTF-8 bytes
with a rule of Spark's own for the trailing bytes) `partition_ids` answers None, and the
planner's exchange does the work instead. tests/test_hash_partitions.py checks every type
against the partition Spark's `repartition` gives each row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SEED = 42  # Spark's Murmur3Hash seed for partitioning
_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: int) -> np.ndarray:
    h1 = h1 ^ np.uint32(length)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * np.uint32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def _hash_int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Murmur3_x86_32.hashInt: `values` as 32-bit ints."""
    return _fmix(_mix_h1(seed, _mix_k1(values.astype(np.int32).view(np.uint32))), 4)


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Murmur3_x86_32.hashLong: the low 32 bits, then the high 32 bits."""
    unsigned = values.astype(np.int64).view(np.uint64)
    low = (unsigned & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (unsigned >> np.uint64(32)).astype(np.uint32)
    return _fmix(_mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high)), 8)


def _as_integers(column: pa.ChunkedArray) -> tuple[np.ndarray, bool] | None:
    """The column's values as Spark hashes them (nulls as 0), and whether as a long; None for a
    type hashed otherwise."""
    t = column.type
    if pa.types.is_boolean(t):
        column, wide = pc.cast(column, pa.int32()), False
    elif pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        wide = False
    elif pa.types.is_int64(t):
        wide = True
    elif pa.types.is_date32(t):
        column, wide = column.cast(pa.int32()), False
    elif pa.types.is_timestamp(t) and t.unit == "us":
        column, wide = column.cast(pa.int64()), True
    else:
        return None
    return column.fill_null(0).to_numpy(), wide


def partition_ids(table: pa.Table, columns: list[str], partitions: int) -> np.ndarray | None:
    """The partition of each row of `table` in Spark's `repartition(partitions, *columns)`, or
    None when a column's type is not computed here (see the module doc)."""
    hashed = np.full(table.num_rows, _SEED, dtype=np.uint32)
    for name in columns:
        column = table.column(name)
        values = _as_integers(column)
        if values is None:
            return None
        array, wide = values
        mixed = _hash_long(array, hashed) if wide else _hash_int(array, hashed)
        if column.null_count:
            # A null leaves the running hash as it was.
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            mixed = np.where(valid, mixed, hashed)
        hashed = mixed
    # Spark's pmod of the signed hash; numpy's `%` of a positive divisor is never negative.
    return hashed.view(np.int32).astype(np.int64) % partitions


def split(table: pa.Table, ids: np.ndarray, partitions: int) -> list[pa.Table]:
    """`table`'s rows by partition: table i holds the rows whose id is i, in their order."""
    order = np.argsort(ids, kind="stable")
    bounds = np.searchsorted(ids[order], np.arange(partitions + 1))
    ordered = table.take(pa.array(order))
    return [ordered.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(partitions)]
