"""Operator state: Z-sets held in Spark as a few consolidated runs (a log-structured merge),
in versions.

A batch stages its consolidated delta as a new run, weighed by the batch's size; a run is
merged into the one before it while that one weighs no more than what is being merged (size
tiers, a binary counter when batches are equal). Each row is rewritten O(log) times, the number
of runs stays logarithmic, and a small batch never rewrites a large state: appending costs
O(delta) amortized, not O(state).

A state's value is an immutable tuple of runs (a version). Staging builds the next version's
plan without running anything; the engine materializes every staged run of a batch in the
batch's one Spark job and only then installs the new versions, so a failed batch leaves every
state as it was, and an older version stays readable (for a checkpoint) while later batches
run. Runs are lazy local checkpoints: computed once, by the job that first reads them, then
read from Spark's memory with their lineage cut, so plans do not grow with the number of
batches. Runs live in one partition, like every frame of a batch: see `service.engine.engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.engine.frames import col, semi_join, union_all


@dataclass(frozen=True)
class Run:
    frame: DataFrame
    weight: int  # rows of input the run summarizes (an estimate of its size, never counted)


Runs = tuple[Run, ...]


@dataclass(frozen=True)
class StagedRuns:
    """A state's next version, planned but not yet computed: `new` is the frame to
    materialize, `runs` the version to install once it is."""

    state: ZSetState
    runs: Runs

    @property
    def new(self) -> DataFrame:
        return self.runs[-1].frame


class ZSetState:
    """Rows `keys + weights`; the collection is the sum of the weights of equal keys.

    `empty_when` is a SQL predicate on the summed weights that says a key holds nothing (for
    group accumulators: the row count is 0 even if other accumulators are not). It is applied
    only when a merge produces the whole collection; a partial run keeps any non-zero weight.
    """

    def __init__(self, keys: Sequence[str], weights: Sequence[str], empty_when: str | None = None
                 ) -> None:
        self.keys = list(keys)
        self.weights = list(weights)
        self._empty_when = empty_when
        self.runs: Runs = ()

    def _consolidate(self, frame: DataFrame, whole: bool) -> DataFrame:
        summed = frame.groupBy(*[col(k) for k in self.keys]).agg(
            *[F.sum(col(w)).alias(w) for w in self.weights]
        )
        nonzero = " OR ".join(f"`{w}` != 0" for w in self.weights)
        summed = summed.where(nonzero)
        if whole and self._empty_when:
            summed = summed.where(f"NOT ({self._empty_when})")
        return summed

    def staged(self, delta: DataFrame, weight: int) -> StagedRuns:
        """The version after adding a batch's changes (columns `keys + weights`, not
        necessarily consolidated); `weight` is the batch's size (its input rows), which decides
        what merges with what. Nothing runs and the state is unchanged until `install`."""
        frames = [delta.select(*[col(c) for c in self.keys + self.weights])]
        runs = list(self.runs)
        weight = max(1, weight)
        while runs and runs[-1].weight <= weight:
            run = runs.pop()
            frames.append(run.frame)
            weight += run.weight
        merged = self._consolidate(union_all(frames), whole=not runs)
        return StagedRuns(self, (*runs, Run(merged.localCheckpoint(eager=False), weight)))

    def install(self, runs: Runs) -> None:
        self.runs = runs

    def frame(self, runs: Runs | None = None) -> DataFrame | None:
        """All runs of a version (the current one by default), unconsolidated: equal keys may
        appear in several runs (sum their weights)."""
        runs = self.runs if runs is None else runs
        return union_all([r.frame for r in runs]) if runs else None

    def consolidated(self, runs: Runs | None = None) -> DataFrame | None:
        whole = self.frame(runs)
        return None if whole is None else self._consolidate(whole, whole=True)

    def lookup(self, probe: DataFrame, on: Sequence[str]) -> DataFrame | None:
        """The consolidated rows whose `on` columns equal (nulls equal) a row of `probe`."""
        whole = self.frame()
        if whole is None:
            return None
        return self._consolidate(semi_join(whole, probe, on), whole=True)

    def save(self, path: str, runs: Runs) -> None:
        """Write a version's consolidated collection as Parquet under `path` (any
        Hadoop-compatible location Spark can write)."""
        whole = self.consolidated(runs)
        if whole is not None:
            whole.write.parquet(path)

    def load(self, spark: SparkSession, path: str | None) -> None:
        """Replace the collection with the one saved at `path` (None: empty). The data is
        copied into Spark's memory, so the files may be deleted afterwards."""
        self.runs = ()
        if path is not None:
            frame = spark.read.parquet(path).select(*[col(c) for c in self.keys + self.weights])
            loaded = frame.coalesce(1).localCheckpoint(eager=True)
            # Weighed by its size, so small batches after a restore do not rewrite it.
            self.runs = (Run(loaded, loaded.count()),)
