"""Operator state: Z-sets held in Spark as a few consolidated runs (a log-structured merge).

A batch appends its consolidated delta as a new run, weighed by the batch's size; a run is
merged into the one before it while that one weighs no more than what is being merged (size
tiers, a binary counter when batches are equal). Each row is rewritten O(log) times, the number
of runs stays logarithmic, and a small batch never rewrites a large state: appending costs
O(delta) amortized, not O(state). Every run is local-checkpointed, which materializes it once and
cuts its lineage, so plans do not grow with the number of batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.engine.frames import col, null_safe_on, prefixed, union_all


@dataclass
class _Run:
    frame: DataFrame
    weight: int  # rows of input the run summarizes (an estimate of its size, never counted)


class ZSetState:
    """Rows `keys + weights`; the collection is the sum of the weights of equal keys.

    `empty_when` is a SQL predicate on the summed weights that says a key holds nothing (for
    group accumulators: the row count is 0 even if float sums kept a residue). It is applied
    only when a merge produces the whole collection; a partial run keeps any non-zero weight.
    """

    def __init__(self, keys: Sequence[str], weights: Sequence[str], empty_when: str | None = None
                 ) -> None:
        self.keys = list(keys)
        self.weights = list(weights)
        self._empty_when = empty_when
        self._runs: list[_Run] = []

    @property
    def is_empty(self) -> bool:
        return not self._runs

    def _consolidate(self, frame: DataFrame, whole: bool) -> DataFrame:
        summed = frame.groupBy(*[col(k) for k in self.keys]).agg(
            *[F.sum(col(w)).alias(w) for w in self.weights]
        )
        nonzero = " OR ".join(f"`{w}` != 0" for w in self.weights)
        summed = summed.where(nonzero)
        if whole and self._empty_when:
            summed = summed.where(f"NOT ({self._empty_when})")
        return summed

    def append(self, delta: DataFrame, weight: int) -> None:
        """Add a batch's changes (columns `keys + weights`, not necessarily consolidated);
        `weight` is the batch's size (its input rows), which decides what merges with what."""
        frames = [delta.select(*[col(c) for c in self.keys + self.weights])]
        weight = max(1, weight)
        while self._runs and self._runs[-1].weight <= weight:
            run = self._runs.pop()
            frames.append(run.frame)
            weight += run.weight
        merged = self._consolidate(union_all(frames), whole=not self._runs)
        self._runs.append(_Run(merged.localCheckpoint(eager=True), weight))

    def frame(self) -> DataFrame | None:
        """All runs, unconsolidated: equal keys may appear in several runs (sum their weights)."""
        if not self._runs:
            return None
        return union_all([r.frame for r in self._runs])

    def consolidated(self) -> DataFrame | None:
        whole = self.frame()
        return None if whole is None else self._consolidate(whole, whole=True)

    def lookup(self, probe: DataFrame, on: Sequence[str]) -> DataFrame | None:
        """The consolidated rows whose `on` columns equal (nulls equal) a row of `probe`."""
        whole = self.frame()
        if whole is None:
            return None
        wanted = prefixed(probe.select(*[col(c) for c in on]).distinct(), "__p_")
        hit = whole.join(F.broadcast(wanted),
                         null_safe_on(whole, wanted, on, [f"__p_{c}" for c in on]), "left_semi")
        return self._consolidate(hit, whole=True)

    def save(self, path: str) -> None:
        """Write the consolidated collection as Parquet under `path` (any Hadoop-compatible
        location Spark can write)."""
        whole = self.consolidated()
        if whole is not None:
            whole.write.parquet(path)

    def load(self, spark: SparkSession, path: str | None) -> None:
        """Replace the collection with the one saved at `path` (None: empty). The data is
        copied into Spark's memory, so the files may be deleted afterwards."""
        self._runs = []
        if path is not None:
            frame = spark.read.parquet(path).select(*[col(c) for c in self.keys + self.weights])
            loaded = frame.localCheckpoint(eager=True)
            # Weighed by its size, so small batches after a restore do not rewrite it.
            self._runs.append(_Run(loaded, loaded.count()))
