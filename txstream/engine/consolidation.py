"""Consolidation in Spark: sum the diffs of equal `(row, time)` pairs and drop the zeros.

A consolidated batch has each `(row, time)` at most once and no zero diff; every stream the
engine emits is consolidated (inside a batch's plan, an operator's changes are only where a
reader needs them so: `Operator._output`). This is the form inside a batch's plan; a source's
changes are consolidated in Arrow before they enter Spark where a reader needs them so
(`SourceOp.prepared`), so no Spark stage is spent on them.
"""

from __future__ import annotations

from collections.abc import Sequence

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
