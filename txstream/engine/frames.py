"""Small DataFrame helpers shared by the operators; those whose plan depends on partitions
(`union_all`, `join`, `semi_join`) are given the parallelism P of the batch being planned
(`BatchPlan.parallelism`, which the caller passes on).

The rule: at P = 1 every frame of a batch lives in one partition, and the helpers keep it there
(a narrow coalesce, a bounded join), so no join, aggregate or window needs an exchange and a
batch is one stage. At P > 1 they leave partitioning to Spark's planner, which adds an exchange
wherever an operator needs its input clustered by key; state leaves declare their hash
partitioning (see `txstream.engine.state`), so those exchanges move deltas, not state, as long
as a delta that meets state in a union was clustered the same way first
(`BatchPlan.clustered`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType


def null(field: StructField) -> Column:
    """A null of the field's type, named as the field."""
    return F.lit(None).cast(field.dataType).alias(field.name)


@cache
def col(name: str) -> Column:
    """A column by name. Columns are immutable and every `F.col` is a round trip to the JVM,
    of which a batch's plans would make hundreds: made once per name."""
    return F.col(f"`{name}`")


def union_all(frames: Sequence[DataFrame], parallelism: int) -> DataFrame:
    """The frames' rows; at P = 1 in one partition. Spark's union reports a known partitioning
    only when its inputs report the very same one (a join's pair of partitionings does not
    qualify), and an unknown one would make every later aggregate shuffle: the narrow coalesce
    says it."""
    union = reduce(lambda a, b: a.unionByName(b), frames)
    return union.coalesce(1) if parallelism == 1 else union


def null_safe_on(left: DataFrame, right: DataFrame, left_cols: Sequence[str],
                 right_cols: Sequence[str]) -> Column:
    """Join condition matching nulls to nulls: group keys and whole rows compare this way."""
    conds = [left[f"`{lc}`"].eqNullSafe(right[f"`{rc}`"]) for lc, rc in
             zip(left_cols, right_cols, strict=True)]
    return reduce(lambda a, b: a & b, conds)


def struct_key(frame: DataFrame, columns: Sequence[str], types: StructType | None = None
               ) -> Column:
    """`frame`'s `columns` as one struct (cast to the types of the same-placed fields of
    `types`, if given, and named as those are; structs compare only when their fields' types
    are equal): equal to another such struct when each field is, nulls equal, as group keys
    must match. The field names are the columns' (or `types`'s): a frame clustered by the
    struct of its columns then serves a join on it with no exchange, since a partitioning by
    a struct is matched to a join's with the field names."""
    fields = [frame[f"`{c}`"] for c in columns]
    if types is not None:
        fields = [f.cast(t.dataType).alias(t.name)
                  for f, t in zip(fields, types.fields, strict=True)]
    return F.struct(*fields)


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


def join(left: DataFrame, right: DataFrame, on: Column, how: str, parallelism: int
         ) -> DataFrame:
    """`left.join(right, on, how)`; at P = 1 in one partition, with no exchange.

    Spark keeps a join of single-partition inputs in one partition only while each input's
    estimated size is at most `spark.sql.maxSinglePartitionBytes` (SPARK-41986); a join's
    estimate is the product of its inputs', so a few joins in exceed any bound. A limit's
    estimate is its row count times the row size: the inputs are bounded that way. The output
    is coalesced because an inner join reports its two inputs' partitionings, which Spark does
    not take for one partition at the next join."""
    if parallelism > 1:  # a limit would gather each input into one partition
        return left.join(right, on, how)
    return left.limit(_ROWS_BOUND).join(right.limit(_ROWS_BOUND), on, how).coalesce(1)


def semi_join(frame: DataFrame, probe: DataFrame, on: Sequence[str], struct_types: StructType,
              parallelism: int) -> DataFrame:
    """The rows of `frame` whose `on` columns equal (nulls equal) a row of `probe`. Written as
    an inner join with the distinct probe keys: Spark plans a semi join between
    single-partition inputs with two exchanges. `struct_types`: the types of `frame`'s `on`
    columns, by whose struct `frame` declares its partitioning too (a state leaf,
    `spark_internals.rdd_node`)."""
    keys = build_side(prefixed(probe.select(*[col(c) for c in on]).distinct(), "__p_"))
    probe_cols = [f"__p_{c}" for c in on]
    if parallelism > 1:
        # Structs compare field by field with nulls equal, and `frame` is partitioned by the
        # struct of `on`: joined on it, `frame` is read in place and only the probe's distinct
        # keys are exchanged (cast to `frame`'s types after `distinct`, which keeps the
        # probe's partitioning). Spark would plan `<=>` as an equi-join on
        # (coalesce(c, default), isnull(c)), which no partitioning of `frame` satisfies.
        cond = struct_key(frame, on) == struct_key(keys, probe_cols, struct_types)
    else:
        cond = null_safe_on(frame, keys, on, probe_cols)
    return join(frame, keys, cond, "inner", parallelism).select(
        *[frame[f"`{c}`"] for c in frame.columns])
