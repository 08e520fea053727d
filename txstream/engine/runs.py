"""A state's runs: what a run is, where its rows are kept, and which runs a batch merges.

A run is a lazy local checkpoint of consolidated rows, weighed by the rows of input it
summarizes (an estimate of its size, never counted): computed once, by the job that first reads
it, then read from the executors' block managers with its lineage cut, so plans do not grow
with the number of batches. Having no lineage, a block lost with its executor is lost for good
unless another executor holds a copy (`kept` with `replicas` above 1; `txstream.engine.replicas`
keeps them so).

The rule of merging is size tiers, a log-structured merge: a batch's changes become a new run,
merged into the run before it while that one weighs no more than what is being merged (a binary
counter when batches are equal). Each row is rewritten O(log) times, the number of runs stays
logarithmic, and a small batch never rewrites a large state: appending costs O(delta)
amortized, not O(state).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from py4j.java_gateway import JavaObject
from pyspark import StorageLevel
from pyspark.sql import DataFrame

from txstream.engine.spark_internals import id_of, rdd_of


@dataclass(frozen=True)
class Run:
    frame: DataFrame  # a local checkpoint: its plan is a LogicalRDD
    weight: int  # rows of input the run summarizes (an estimate of its size, never counted)

    @cached_property
    def rdd(self) -> JavaObject:
        return rdd_of(self.frame)

    @cached_property
    def rdd_id(self) -> int:
        return id_of(self.rdd)


Runs = tuple[Run, ...]


@dataclass(frozen=True)
class Merge:
    """What adding a batch of `weight` rows does to a version: its runs split into those kept
    and those merged with the batch's changes into one new run of `new_weight`."""

    kept: Runs
    merged: Runs
    new_weight: int

    @staticmethod
    def of(runs: Runs, weight: int) -> Merge:
        """The merge a batch of `weight` input rows makes of `runs` (size tiers: a run merges
        into the one before it while that one weighs no more than what is being merged)."""
        remaining = list(runs)
        weight = max(1, weight)
        merged: list[Run] = []
        while remaining and remaining[-1].weight <= weight:
            run = remaining.pop()
            merged.insert(0, run)
            weight += run.weight
        return Merge(tuple(remaining), tuple(merged), weight)


def kept(frame: DataFrame, replicas: int, eager: bool) -> DataFrame:
    """`frame` checkpointed into the executors' block managers: a local checkpoint has no
    lineage, so a block lost with its executor is lost for good (Spark fails the job,
    CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND) unless a replica exists. With `replicas` above 1 each
    block is also copied to other executors, from which a task reads it when its own is gone
    (Spark's `spark.storage.replication.proactive` then copies it again); rows stay
    deserialized, as the default level keeps them."""
    if replicas == 1:
        return frame.localCheckpoint(eager=eager)
    return frame.localCheckpoint(eager=eager, storageLevel=StorageLevel(
        useDisk=True, useMemory=True, useOffHeap=False, deserialized=True,
        replication=replicas))
