"""Small DataFrame helpers shared by the operators."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F


@cache
def col(name: str) -> Column:
    """A column by name. Columns are immutable and every `F.col` is a round trip to the JVM,
    of which a batch's plans would make hundreds: made once per name."""
    return F.col(f"`{name}`")


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    """The frames' rows in one partition. Spark's union reports a known partitioning only when
    its inputs report the very same one (a join's pair of partitionings does not qualify), and
    an unknown one would make every later aggregate shuffle: the narrow coalesce says it."""
    return reduce(lambda a, b: a.unionByName(b), frames).coalesce(1)


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


def build_side(frame: DataFrame) -> DataFrame:
    """Mark the small side of a join (a batch's delta, a set of probe keys) as the side the
    hash table is built from: the other side, state, is streamed past it and never sorted or
    broadcast (a broadcast is a Spark job of its own)."""
    return frame.hint("shuffle_hash")


# More rows than one partition can hold: a limit that never cuts, only bounds the estimate.
_ROWS_BOUND = 2**31 - 1


def join(left: DataFrame, right: DataFrame, on: Column, how: str) -> DataFrame:
    """`left.join(right, on, how)` in one partition, with no exchange.

    Spark keeps a join of single-partition inputs in one partition only while each input's
    estimated size is at most `spark.sql.maxSinglePartitionBytes` (SPARK-41986); a join's
    estimate is the product of its inputs', so a few joins in exceed any bound. A limit's
    estimate is its row count times the row size: the inputs are bounded that way. The output
    is coalesced because an inner join reports its two inputs' partitionings, which Spark does
    not take for one partition at the next join."""
    return left.limit(_ROWS_BOUND).join(right.limit(_ROWS_BOUND), on, how).coalesce(1)


def semi_join(frame: DataFrame, probe: DataFrame, on: Sequence[str], anti: bool = False
              ) -> DataFrame:
    """The rows of `frame` whose `on` columns equal (nulls equal) a row of `probe` (with
    `anti`: equal none). Written as an inner or outer join with the distinct probe keys:
    Spark plans a semi or anti join between single-partition inputs with two exchanges."""
    keys = build_side(prefixed(probe.select(*[col(c) for c in on]).distinct(), "__p_")
                      .withColumn("__p_hit", F.lit(True)))
    cond = null_safe_on(frame, keys, on, [f"__p_{c}" for c in on])
    if anti:
        return join(frame, keys, cond, "left").where(F.col("__p_hit").isNull()) \
            .select(*[frame[f"`{c}`"] for c in frame.columns])
    return join(frame, keys, cond, "inner").select(*[frame[f"`{c}`"] for c in frame.columns])
