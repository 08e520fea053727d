"""Indexes of large state runs, written and probed by the executors: one sorted file per
partition, searched by binary search.

    a state run (P partitions, in the executors' block managers)
      | __hash = xxhash64 of the lookup columns; sorted by it within each partition
      v
    `build`: each executor writes its partitions as Arrow IPC files  <directory>/part-<i>-<id>.arrow
             and their sorted hashes as arrays      <directory>/part-<i>-<id>.hashes.npy
             (one Spark job; the driver gets their paths, rows and bytes)

    a batch's lookup (`lookups`), one task:
      the probe's distinct keys, hashed --+
      the state's index files (a leaf) ---+--> `probe` in a Python worker: per file, memory-mapped
                                               once per worker with its hashes, the keys' hashes
                                               searched in those, the rows of equal hashes
                                               taken --> candidates
      candidates joined with the keys (nulls equal): the run rows of those keys

Why files and not Spark's broadcast hash table (what the engine built before): a broadcast is
built and held in the driver's memory, 110-120 bytes per row, so the largest state was what the
driver could hold (a 10M-row join needed a 12 GB driver). Here the driver holds a path per
partition; the rows stay with the executors, on disk and in the OS page cache, and a file
outlives the executor that wrote it (the run's blocks do not: see `runs.kept`). The
files must be where every executor reads and writes them at the same path: the system's
temporary directory serves `local[N]` and executors on the driver's own filesystem; executors
in other containers or hosts need a volume they all mount (`Engine(index_dir=)`,
docs/deploying.md; what happens without one: `txstream.engine.indexing`).

A file is immutable and its path unique (a new index never reuses one), so a worker may keep
it open across tasks; the newest `_OPEN_FILES` are kept, and files deleted since (runs merged
away) are let go. A hash equal to a key's is a
candidate, never a match: the join with the keys after the probe decides, so a collision costs
a row, never a wrong one. Keys hash as Spark compares them: its xxhash64 takes -0.0 for 0.0
and every NaN for one, as its joins and aggregates do.
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

HASH = "__hash"  # a row's hash of its lookup columns, by which index files are sorted
PATH = "__path"  # an index file, in the rows `probe` reads
FILES_TYPE = StructType([StructField(PATH, StringType(), True)])
_WRITTEN = "path string, rows long, bytes long"
_OPEN_FILES = 64
# Begins the error of a probe that cannot read a file: the engine then stops indexing
# (`txstream.engine.indexing`).
UNREADABLE = "state index file not readable on this executor"


@dataclass(frozen=True)
class RunIndex:
    """The index files of one run: where they are, and the rows and bytes they hold."""

    directory: str
    files: tuple[str, ...]
    rows: int
    bytes: int

    def drop(self) -> None:
        """Delete the files (a worker that has one open keeps its pages until it lets go)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def build(run: DataFrame, lookup: Sequence[str], parent: str) -> RunIndex:
    """Index `run` (rows of the state's row type) by its `lookup` columns: one Spark job, in
    which each task sorts its partition by hash and writes it as a file under a new directory
    in `parent`."""
    directory = Path(parent) / f"run-{uuid.uuid4().hex}"
    directory.mkdir(parents=True, exist_ok=True)
    sorted_rows = run.withColumn(HASH, F.xxhash64(*[run[f"`{c}`"] for c in lookup])) \
        .sortWithinPartitions(HASH)
    try:
        written = sorted_rows.mapInArrow(functools.partial(write, str(directory)),
                                         _WRITTEN).collect()
    except Exception:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return RunIndex(str(directory), tuple(sorted(w.path for w in written)),
                    sum(w.rows for w in written), sum(w.bytes for w in written))


def write(directory: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side of `build`: a partition's sorted batches into one file (none for an
    empty partition), their hashes apart, as one array (`_hashes_of`), so that a probe maps
    them instead of copying them out of the file's batches; yields its path, rows and bytes
    (both files'). A retried task writes files of its own, which only the driver's list
    names."""
    context = TaskContext.get()
    part = context.partitionId() if context is not None else 0
    path = Path(directory) / f"part-{part:05d}-{uuid.uuid4().hex[:8]}.arrow"
    writer, hashes = None, []
    for batch in batches:
        rows = batch.drop_columns([HASH])
        if writer is None:
            writer = pa.ipc.new_file(str(path), rows.schema)
        writer.write_batch(rows)
        hashes.append(batch.column(HASH).to_numpy())
    if writer is not None:
        writer.close()
        sorted_hashes = np.concatenate(hashes)
        hashes_path = Path(_hashes_of(str(path)))
        np.save(hashes_path, sorted_hashes)
        size = path.stat().st_size + hashes_path.stat().st_size
        yield pa.RecordBatch.from_pydict(
            {"path": [str(path)], "rows": [len(sorted_hashes)], "bytes": [size]})


def _hashes_of(path: str) -> str:
    """The file of the sorted hashes of the index file at `path`."""
    return path.removesuffix(".arrow") + ".hashes.npy"


def lookups(keys: DataFrame, key_columns: Sequence[str], files: DataFrame,
            row_type: StructType) -> DataFrame:
    """The candidates for `keys`' `key_columns` (distinct, of the run's lookup columns'
    types) in the index files `files` lists (a frame of FILES_TYPE), in one partition: rows of
    `row_type` whose hash equals a key's (the caller keeps the rows equal to a key)."""
    requests = keys.select(F.xxhash64(*[keys[f"`{c}`"] for c in key_columns]).alias(HASH),
                           F.lit(None).cast("string").alias(PATH))
    listed = files.select(F.lit(None).cast("long").alias(HASH), files[PATH])
    return requests.unionByName(listed).coalesce(1).mapInArrow(probe, row_type)


# Executor side: index files open in this Python worker, newest last, by path: the rows and
# their sorted hashes, both memory-mapped (in the page cache, not the worker's heap).
_open: OrderedDict[str, tuple[pa.Table, np.ndarray]] = OrderedDict()


def _opened(path: str) -> tuple[pa.Table, np.ndarray]:
    if path in _open:
        _open.move_to_end(path)
        return _open[path]
    try:
        entry = (pa.ipc.open_file(pa.memory_map(path)).read_all(),
                 np.load(_hashes_of(path), mmap_mode="r"))
    except OSError as exc:
        raise OSError(f"{UNREADABLE}: {path} ({exc}); the engine's index_dir "
                      "(TXSTREAM_INDEX_DIR) must be storage every executor can read") from exc
    _open[path] = entry
    while len(_open) > _OPEN_FILES:
        _open.popitem(last=False)
    return entry


def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side of `lookups`: reads every request (hashes, and the files to search),
    then yields each file's rows whose hash is one of them."""
    hashes, paths = [], []
    for batch in batches:
        h, p = batch.column(HASH), batch.column(PATH)
        hashes.append(h.filter(pc.is_valid(h)))
        paths.append(p.filter(pc.is_valid(p)))
    # Files deleted since (runs merged away) are let go, so that their space is freed.
    for gone in [p for p in _open if not os.path.exists(p)]:
        del _open[gone]
    if not hashes:
        return
    wanted = np.unique(pa.concat_arrays(hashes).to_numpy())
    if not wanted.size:
        return
    for path in pa.concat_arrays(paths).to_pylist():
        rows, sorted_hashes = _opened(path)
        first = np.searchsorted(sorted_hashes, wanted, "left")
        end = np.searchsorted(sorted_hashes, wanted, "right")
        found = end > first
        if not found.any():
            continue
        starts, stops = first[found], end[found]
        # The positions first..end-1 of every wanted hash found, in one vector.
        lengths = stops - starts
        positions = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) \
            + np.arange(lengths.sum())
        yield from rows.take(pa.array(positions)).to_batches()
