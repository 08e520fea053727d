"""Spark's hash partitioning computed on the driver (txstream/engine/hash_partitions.py) places
every row where Spark's `repartition(P, *columns)` does, for every type it computes."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from txstream.engine.hash_partitions import partition_ids, split

_ROWS = 2_000


def _values(kind: str, rng: random.Random) -> list[object]:
    def maybe(value: object) -> object:
        return None if rng.random() < 0.1 else value

    if kind == "bigint":
        return [maybe(rng.choice([rng.randint(-2**63, 2**63 - 1), rng.randint(-5, 5)]))
                for _ in range(_ROWS)]
    if kind == "int":
        return [maybe(rng.randint(-2**31, 2**31 - 1)) for _ in range(_ROWS)]
    if kind == "smallint":
        return [maybe(rng.randint(-2**15, 2**15 - 1)) for _ in range(_ROWS)]
    if kind == "boolean":
        return [maybe(rng.random() < 0.5) for _ in range(_ROWS)]
    if kind == "date":
        return [maybe(dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-40_000, 40_000)))
                for _ in range(_ROWS)]
    assert kind == "timestamp"
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return [maybe(epoch + dt.timedelta(microseconds=rng.randint(-2**54, 2**54)))
            for _ in range(_ROWS)]


_ARROW = {"bigint": pa.int64(), "int": pa.int32(), "smallint": pa.int16(),
          "boolean": pa.bool_(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC")}


@pytest.mark.parametrize("kinds", [["bigint"], ["int"], ["smallint"], ["boolean"], ["date"],
                                   ["timestamp"], ["bigint", "int", "date"],
                                   ["boolean", "timestamp"]])
def test_partitions_equal_sparks(spark: SparkSession, kinds: list[str]) -> None:
    rng = random.Random(",".join(kinds))
    names = [f"c{i}" for i in range(len(kinds))]
    table = pa.table({"row": pa.array(range(_ROWS), pa.int64()),
                      **{n: pa.array(_values(k, rng), _ARROW[k])
                         for n, k in zip(names, kinds, strict=True)}})
    frame = spark.createDataFrame(table)
    for partitions in (2, 3, 7):
        ids = partition_ids(table, names, partitions)
        assert ids is not None
        theirs = frame.repartition(partitions, *names).select(
            "row", F.spark_partition_id().alias("p")).toArrow().sort_by("row")
        assert theirs.column("p").to_pylist() == ids.tolist()


def test_other_types_are_left_to_spark() -> None:
    table = pa.table({"k": pa.array(["a", "b"]), "n": pa.array([1, 2], pa.int64())})
    assert partition_ids(table, ["n", "k"], 2) is None


def test_split_keeps_order_within_a_partition() -> None:
    table = pa.table({"v": pa.array(range(10), pa.int64())})
    ids = partition_ids(table, ["v"], 3)
    assert ids is not None
    parts = split(table, ids, 3)
    assert sum(p.num_rows for p in parts) == 10
    for i, part in enumerate(parts):
        values = part.column("v").to_pylist()
        assert values == sorted(values)
        assert all(ids[v] == i for v in values)
