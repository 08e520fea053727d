"""Which of a state's runs have an index: built when a large run is installed, kept by the run's
RDD id, dropped when the run is merged away, listed as files for a plan to probe.

The rule: an index is only an optimization, and every run without one is streamed. A lookup
streams a state's runs past a hash table of the batch's keys, which costs every row of them (at
P > 1, a partition's rows per task). A large run (at least `index_rows` rows) therefore gets an
index on the state's lookup columns once it is installed: its partitions sorted by a hash of
those columns and written as files by the executors (one job, `txstream.engine.run_index`),
probed by binary search in every later lookup, and deleted when the run is merged away. A run's
weight (rows of input) bounds its rows, so only runs that weigh `index_rows` are built; one
whose build counts fewer rows (a group-by's few groups) is dropped at once and stays streamed,
as does one whose index cannot be written. Size tiers (`txstream.engine.runs`) keep the
streamed runs' weight below about twice `index_rows`, or their rows below `index_rows` each,
so a lookup costs O(delta + index_rows) rows, not O(state), at any P; the driver holds a path
per partition of an index, never its rows. Which runs an engine indexes, and where the files
go, is `txstream.engine.indexing`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pyarrow as pa
from py4j.java_gateway import JavaObject
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from txstream.engine import run_index
from txstream.engine.run_index import RunIndex
from txstream.engine.runs import Run, Runs
from txstream.engine.spark_input import input_rows

log = logging.getLogger(__name__)


class IndexedRuns:
    """The indexes of one state's runs on its `lookup_on` columns (None: never looked up,
    never indexed). Each method is given the state's current version (`runs`)."""

    def __init__(self, lookup_on: Sequence[str] | None) -> None:
        self._lookup_on = list(lookup_on) if lookup_on is not None else None
        self._indexes: dict[int, RunIndex] = {}  # by the run's RDD id
        self._unindexed: set[int] = set()  # runs whose build found fewer than index_rows rows
        # The indexed runs the last file listing was made of, by RDD id, with the leaf's
        # session, attributes and rows.
        self._files: tuple[tuple[int, ...], SparkSession, JavaObject, JavaObject] | None = None

    def streamed(self, runs: Runs) -> Runs:
        """The runs without an index: lookups stream their rows."""
        return tuple(r for r in runs if r.rdd_id not in self._indexes)

    def indexed(self, runs: Runs) -> Runs:
        return tuple(r for r in runs if r.rdd_id in self._indexes)

    def bytes(self, runs: Runs) -> int:
        """What the files of the runs' indexes hold."""
        return sum(self._indexes[r.rdd_id].bytes for r in self.indexed(runs))

    def refresh(self, runs: Runs, index_rows: int, directory: Callable[[], str]) -> bool:
        """Index the runs of at least `index_rows` rows (a Spark job each, writing files under
        `directory()`), and drop the indexes of runs no longer among `runs`. A run that cannot
        be indexed stays streamed, with a warning. Whether runs moved between streamed and
        indexed."""
        current = {r.rdd_id for r in runs}
        before = set(self._indexes)
        for rdd_id in [i for i in self._indexes if i not in current]:
            self._indexes.pop(rdd_id).drop()
        self._unindexed &= current
        if self._lookup_on is not None:
            for run in runs:
                if (run.weight >= index_rows and run.rdd_id not in self._indexes
                        and run.rdd_id not in self._unindexed):
                    self._index(run, self._lookup_on, index_rows, directory)
        return set(self._indexes) != before

    def _index(self, run: Run, lookup_on: list[str], index_rows: int,
               directory: Callable[[], str]) -> None:
        try:
            index = run_index.build(run.frame, lookup_on, directory())
        except (Py4JJavaError, PySparkException, OSError) as exc:
            # Only an optimization: a run that cannot be indexed (its files not written, a
            # lost executor) is streamed, as a small one is.
            log.warning("state run of %s rows of input stays unindexed, lookups stream it: %s",
                        f"{run.weight:,}", str(exc)[:300])
            self._unindexed.add(run.rdd_id)
            return
        if index.rows < index_rows:
            index.drop()
            self._unindexed.add(run.rdd_id)
            return
        log.info("indexed a state run of %s rows: %.0f MiB of files under %s",
                 f"{index.rows:,}", index.bytes / 2**20, index.directory)
        self._indexes[run.rdd_id] = index

    def drop(self) -> None:
        """Delete every index: lookups stream every run."""
        for index in self._indexes.values():
            index.drop()
        self._indexes.clear()

    def copied(self, run: Run, copy: Run) -> None:
        """`copy` holds `run`'s rows (a replica made anew): it keeps the run's index, or its
        being unindexed."""
        if run.rdd_id in self._indexes:
            self._indexes[copy.rdd_id] = self._indexes.pop(run.rdd_id)
        if run.rdd_id in self._unindexed:
            self._unindexed.add(copy.rdd_id)

    def files(self, runs: Runs) -> tuple[SparkSession, JavaObject, JavaObject] | None:
        """The session, attributes and rows of a leaf listing the files of the indexed runs
        among `runs` (one row per file, see `run_index.FILES_TYPE`; made again when they
        change), or None when none is indexed."""
        indexed = self.indexed(runs)
        if not indexed:
            return None
        ids = tuple(r.rdd_id for r in indexed)
        if self._files is None or self._files[0] != ids:
            spark = indexed[0].frame.sparkSession
            paths = pa.table({run_index.PATH: pa.array(
                [f for i in ids for f in self._indexes[i].files], pa.string())})
            self._files = (ids, spark,
                           *input_rows(spark, paths, run_index.FILES_TYPE, columnar=False))
        return self._files[1:]
