"""Small DataFrame helpers shared by the operators."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

TIME = "time"
DIFF = "diff"


def col(name: str) -> Column:
    return F.col(f"`{name}`")


def consolidate(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Sum the diffs of equal (row, time) pairs and drop the zeros."""
    return (
        df.groupBy(*[col(c) for c in columns], col(TIME))
        .agg(F.sum(col(DIFF)).alias(DIFF))
        .where(col(DIFF) != 0)
    )


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    return reduce(lambda a, b: a.unionByName(b), frames)


def null_safe_on(left: DataFrame, right: DataFrame, left_cols: Sequence[str],
                 right_cols: Sequence[str]) -> Column:
    """Join condition matching nulls to nulls: group keys and whole rows compare this way."""
    conds = [left[f"`{lc}`"].eqNullSafe(right[f"`{rc}`"]) for lc, rc in
             zip(left_cols, right_cols, strict=True)]
    return reduce(lambda a, b: a & b, conds)


def prefixed(df: DataFrame, prefix: str, columns: Sequence[str] | None = None) -> DataFrame:
    """The frame with its columns renamed `prefix + name`, to join it without ambiguity."""
    names = columns if columns is not None else df.columns
    return df.select(*[col(c).alias(prefix + c) for c in names])
