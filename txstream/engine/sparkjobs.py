"""Counting the Spark jobs and stages a piece of driver code runs: a batch's fixed cost is
paid per job and per stage, so these counts are the engine's first performance figures."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from pyspark import SparkContext

T = TypeVar("T")
_groups = itertools.count(1)


@dataclass(frozen=True)
class JobCount:
    jobs: int
    stages: int  # stages of those jobs, skipped ones (shuffle output reused) included


def counted(sc: SparkContext, fn: Callable[[], T]) -> tuple[T, JobCount]:
    """Run `fn` and count the jobs it started from this thread (a job group of its own;
    other threads' jobs, a background checkpoint's for instance, are not counted)."""
    group = f"txstream-{next(_groups)}"
    previous = sc.getLocalProperty("spark.jobGroup.id")
    sc.setLocalProperty("spark.jobGroup.id", group)
    try:
        result = fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", previous)  # type: ignore[arg-type]
    tracker = sc.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    infos = [tracker.getJobInfo(j) for j in jobs]
    return result, JobCount(len(jobs), sum(len(i.stageIds) for i in infos if i is not None))


@contextlib.contextmanager
def call_site(sc: SparkContext, name: str) -> Iterator[None]:
    """Name the call site of the RDDs and jobs this thread creates, instead of Spark finding
    it: every RDD walks the driver's stack through a dozen regular expressions per frame for
    it, a tenth of the driver's time in a lone transaction, whose plans create a few hundred
    RDDs."""
    keys = ("callSite.short", "callSite.long")
    previous = [sc.getLocalProperty(k) for k in keys]
    for key in keys:
        sc.setLocalProperty(key, name)
    try:
        yield
    finally:
        for key, value in zip(keys, previous, strict=True):
            sc.setLocalProperty(key, value)  # type: ignore[arg-type]
