"""Consolidation: sum the diffs of equal `(row, time)` pairs and drop the zeros.

A consolidated batch has each `(row, time)` at most once and no zero diff; every stream the
engine emits is consolidated. Two forms: in Spark (inside a batch's plan) and in Arrow (input
batches, before they enter Spark, so no Spark stage is spent on them).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream.engine.columns import DIFF, TIME
from txstream.engine.frames import col


def consolidate(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """`df`'s `columns + time + diff`, consolidated (nulls are equal to nulls)."""
    return (
        df.groupBy(*[col(c) for c in columns], col(TIME))
        .agg(F.sum(col(DIFF)).alias(DIFF))
        .where(col(DIFF) != 0)
    )


def consolidate_arrow(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The same on an Arrow table holding `columns + time + diff`, in that column order."""
    keys = [*columns, TIME]
    # Renamed first: the sum's output name must not clash with a user column.
    weights = "__diff"
    named = table.select([*keys, DIFF]).rename_columns([*keys, weights])
    summed = named.group_by(keys, use_threads=False).aggregate([(weights, "sum")])
    summed = summed.select([*keys, f"{weights}_sum"]).rename_columns([*keys, DIFF])
    return summed.filter(pc.not_equal(summed[DIFF], 0))
