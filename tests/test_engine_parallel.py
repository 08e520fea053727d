"""The engine at parallelism above 1: every state run is hash-partitioned as its leaf declares,
batches small and large give the stream of parallelism 1, a saved state resumes at another
parallelism (rescaling), and a source's changes enter split as their reader clusters them. The
DuckDB suite (tests/test_engine_correctness.py) runs at P = 2 too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from support.engine_oracle import process
from support.example_batches import CUSTOMERS, FIRST, SECOND
from support.example_batches import sorted_rows as _sorted

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream.engine import Engine
from txstream.engine.operators import rowwise
from txstream.engine.spark_internals import cached_relation, cached_rows
from txstream.examples.groupby import pipeline as groupby_pipeline
from txstream.examples.orders import pipeline


def _misplaced(engine: Engine) -> dict[str, int]:
    """Per state, the rows of its runs in another partition than their key's (hash as
    `repartition(P, *partition_on)` places them), plus runs of another partition count: one
    Spark job for all of them."""
    counts = []
    wrong_partitions: dict[str, int] = {}
    for name, (state, runs) in engine.version().states.items():
        wrong_partitions[name] = sum(abs(run.rdd.getNumPartitions() - engine.parallelism)
                                     for run in runs)
        keys = [F.col(f"`{c}`") for c in state.partition_on]
        for run in runs:
            wrong = F.spark_partition_id() != F.pmod(F.hash(*keys), F.lit(engine.parallelism))
            counts.append(run.frame.select(F.lit(name).alias("state"),
                                           wrong.cast("long").alias("wrong")))
    rows = reduce(DataFrame.unionByName, counts).groupBy("state").sum("wrong").collect()
    return {row[0]: row[1] + wrong_partitions[row[0]] for row in rows}


@pytest.mark.parametrize("spread_rows", [0, 10**9], ids=["spread", "small"])
def test_runs_are_partitioned_as_declared(spark: SparkSession, spread_rows: int) -> None:
    """Batches spread over the partitions (`spread`) and batches planned in one task over
    the partitioned state (`small`) both stage runs hash-partitioned by the state's lookup
    columns, and give the stream of parallelism 1."""
    one = Engine(pipeline(), spark)
    two = Engine(pipeline(), spark, parallelism=2, spread_rows=spread_rows)
    for batch in ({"customers": CUSTOMERS, "orders": FIRST}, {"orders": SECOND}):
        assert _sorted(process(two, batch)) == _sorted(process(one, batch))
    assert set(_misplaced(two).values()) == {0}
    assert two.last_batch is not None and two.last_batch.jobs == 1


def test_lone_transaction_stays_one_stage(spark: SparkSession) -> None:
    """A small batch at P = 2 is planned in one partition and its new runs split into P
    partitions without an exchange: one job of one stage, as at P = 1; a large one exchanges
    its deltas (a stage each)."""
    engine = Engine(pipeline(), spark, parallelism=2)
    for batch in ({"customers": CUSTOMERS, "orders": FIRST}, {"orders": SECOND}):
        process(engine, batch)
        assert engine.last_batch is not None
        assert (engine.last_batch.jobs, engine.last_batch.stages) == (1, 1)
    spread = Engine(pipeline(), spark, parallelism=2, spread_rows=0)
    process(spread, {"customers": CUSTOMERS, "orders": FIRST})
    assert spread.last_batch is not None and spread.last_batch.stages > 1


@pytest.mark.parametrize(("saved", "resumed"), [(1, 2), (2, 1), (2, 3)])
def test_state_resumes_at_another_parallelism(spark: SparkSession, tmp_path: Path, saved: int,
                                              resumed: int) -> None:
    straight = Engine(pipeline(), spark)
    process(straight, {"customers": CUSTOMERS, "orders": FIRST})
    expected = _sorted(process(straight, {"orders": SECOND}))

    first = Engine(pipeline(), spark, parallelism=saved, spread_rows=0)
    process(first, {"customers": CUSTOMERS, "orders": FIRST})
    first.save_state(str(tmp_path / "state"))
    again = Engine(pipeline(), spark, parallelism=resumed, spread_rows=0)
    again.load_state(str(tmp_path / "state"))
    if resumed > 1:
        assert set(_misplaced(again).values()) == {0}
    assert _sorted(process(again, {"orders": SECOND})) == expected
    assert any(expected.values())


@pytest.mark.parametrize("columnar", [False, True], ids=["rows", "arrow"])
def test_input_enters_split_as_its_readers_cluster_it(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch, columnar: bool) -> None:
    """At P = 2 a source's changes are split on the driver by the group-by's key, so the batch's
    job does not exchange them, and its lookups of the groups' state need no exchange either
    (shared frames declare their clustering by the key's struct too): one stage, against two
    when Spark must exchange the input; the same changes as at P = 1, as rows converted on the
    driver and as Arrow batches."""
    n = 3_000
    i = pa.array(range(3 * n), pa.int64())
    inserts = pa.table({"k": pc.subtract(pc.divide(i, 7), 100), "v": i,
                        "time": pc.add(pc.divide(i, 1_000), 1),
                        "diff": pa.array([1] * (3 * n), pa.int64())})
    batches = [{"events": inserts.slice(lo, n)} for lo in range(0, 3 * n, n)]
    monkeypatch.setattr(rowwise, "ARROW_INPUT_ROWS", 0 if columnar else 10 * n)
    one = Engine(groupby_pipeline(), spark)
    want = [_sorted(process(one, batch)) for batch in batches]
    stages = {}
    for split in (True, False):
        if not split:
            monkeypatch.setattr(rowwise, "partition_ids", lambda *_: None)
        two = Engine(groupby_pipeline(), spark, parallelism=2, spread_rows=0)
        assert [_sorted(process(two, batch)) for batch in batches] == want
        assert two.last_batch is not None and two.last_batch.rebound
        stages[split] = two.last_batch.stages
        assert set(_misplaced(two).values()) == {0}
    assert stages == {True: 1, False: 2}


@pytest.mark.parametrize("columnar", [False, True], ids=["rows", "arrow"])
def test_input_split_with_an_empty_partition(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch, columnar: bool) -> None:
    """Changes of one key fill one partition of the split and leave the other empty."""
    monkeypatch.setattr(rowwise, "ARROW_INPUT_ROWS", 0 if columnar else 10**9)
    n = 500
    batches = [{"events": pa.table({
        "k": pa.array([7] * n, pa.int64()), "v": pa.array(range(n), pa.int64()),
        "time": pa.array([t] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})}
        for t in (1, 2, 3)]
    one = Engine(groupby_pipeline(), spark)
    two = Engine(groupby_pipeline(), spark, parallelism=2, spread_rows=0)
    assert [_sorted(process(two, b)) for b in batches] == [
        _sorted(process(one, b)) for b in batches]
    assert set(_misplaced(two).values()) == {0}


def test_a_shared_join_declares_either_sides_partitioning(spark: SparkSession) -> None:
    """An inner equi-join's rows are hash-placed by either side's key (Spark reports a
    collection of both): a frame shared from it is read clustered by whichever side's key its
    readers want, where only the first member used to count (and the other side's readers
    exchanged it again)."""
    left = spark.range(100).select(F.col("id").alias("a")).repartition(2, "a")
    right = spark.range(100).select(F.col("id").alias("b")).repartition(2, "b")
    joined = left.hint("shuffle_hash").join(right, F.col("a") == F.col("b"))
    relation = cached_relation(joined)
    for position in (0, 1):
        assert cached_rows(spark, relation, ((position,), 2)) is not None
    assert cached_rows(spark, relation, ((0,), 3)) is None  # not that many partitions


def _changes(columns: dict[str, pa.Array], time: int, diff: int) -> pa.Table:
    """`columns` as changes, all at `time` with `diff`."""
    size = len(next(iter(columns.values())))
    return pa.table({**columns, "time": pa.array([time] * size, pa.int64()),
                     "diff": pa.array([diff] * size, pa.int64())})


def _grouped_join() -> Pipeline:
    """A join on `k`, grouped by `k` and a nullable column (its output is clustered by some of
    the group's keys already): by sums alone, and by min and max."""
    p = Pipeline()
    a = p.source("a", TableSchema.of({"id": "bigint", "k": "bigint", "g": "text", "v": "bigint"},
                                     primary_key=["id"]))
    b = p.source("b", TableSchema.of({"k": "bigint", "w": "bigint"}, primary_key=["k"]))
    joined = a.join(b, on="k")
    p.output("sums", joined.groupby("k", "g").reduce(
        n=r.count(), total=r.sum("w"), values=r.sum("v")))
    p.output("extremes", joined.groupby("k", "g").reduce(low=r.min("v"), high=r.max("v")))
    return p


def test_a_group_by_over_a_join_on_some_of_its_keys(spark: SparkSession) -> None:
    """A group-by of sums whose input is clustered by some of its keys (a join's output by the
    join key) aggregates it where it is, at P = 2, and exchanges only the accumulators; one
    with min and max exchanges the rows. Both give the stream of P = 1, through rows moving
    between groups (a changed `g`, null included), a changed join partner (every row of its
    key) and deletions, with nulls among the values; every run placed as declared."""
    def a_rows(rows: list[tuple[int, int, str | None, int | None]], time: int, diff: int
               ) -> pa.Table:
        ids, ks, gs, vs = zip(*rows, strict=True)
        return _changes({"id": pa.array(ids, pa.int64()), "k": pa.array(ks, pa.int64()),
                         "g": pa.array(gs, pa.string()), "v": pa.array(vs, pa.int64())},
                        time, diff)

    def b_rows(rows: list[tuple[int, int]], time: int, diff: int) -> pa.Table:
        ks, ws = zip(*rows, strict=True)
        return _changes({"k": pa.array(ks, pa.int64()), "w": pa.array(ws, pa.int64())}, time,
                        diff)

    first = [(i, i % 40, [None, "x", "y"][i % 3], None if i % 11 == 0 else i % 17)
             for i in range(600)]
    moved = [(i, k, "y" if g != "y" else None, v) for i, k, g, v in first[:90]]
    partners = [(k, k * 10) for k in range(40)]
    batches = [
        {"a": a_rows(first, 1, 1), "b": b_rows(partners, 1, 1)},
        # Rows change groups (g), one partner changes (every row of k = 3 changes), a row goes.
        {"a": pa.concat_tables([a_rows(first[:90] + first[100:101], 2, -1),
                                a_rows(moved, 2, 1)]),
         "b": pa.concat_tables([b_rows([(3, 30)], 2, -1), b_rows([(3, 31)], 2, 1)])},
        # A partner goes (its key's groups empty), and comes back in a later transaction.
        {"b": pa.concat_tables([b_rows([(5, 50)], 3, -1), b_rows([(5, 52)], 4, 1)])},
    ]
    one = Engine(_grouped_join(), spark)
    two = Engine(_grouped_join(), spark, parallelism=2, spread_rows=0)
    for batch in batches:
        assert _sorted(process(two, batch)) == _sorted(process(one, batch))
    assert set(_misplaced(two).values()) == {0}


def _new_stages(spark: SparkSession, run: Callable[[], object]) -> dict[int, tuple[int, int]]:
    """Stage id -> (tasks, rows written to shuffles) of the stages `run()` starts (Spark's
    status store, read once its listener bus has delivered every event)."""
    context = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
    no_quantiles = spark.sparkContext._gateway.new_array(spark._jvm.double, 0)  # type: ignore

    def stages() -> dict[int, tuple[int, int]]:
        context.listenerBus().waitUntilEmpty(10_000)
        found = context.statusStore().stageList(None, False, False, no_quantiles, None)
        return {found.apply(i).stageId(): (found.apply(i).numTasks(),
                                           found.apply(i).shuffleWriteRecords())
                for i in range(found.size())}

    before = stages()
    run()
    return {stage: info for stage, info in stages().items() if stage not in before}


def _rows_exchanged(spark: SparkSession, run: Callable[[], object]) -> int:
    """Rows that the stages `run()` starts write to shuffles."""
    return sum(rows for _, rows in _new_stages(spark, run).values())


def test_a_spread_batch_ends_in_p_tasks(spark: SparkSession) -> None:
    """The last stage of a spread batch's job (it unions every output and staged run, P
    partitions each) runs P tasks, not one per partition of every part: each task
    deserializes the job's plan."""
    engine = Engine(pipeline(), spark, parallelism=2, spread_rows=0)
    stages = _new_stages(spark, lambda: process(engine, {"customers": CUSTOMERS,
                                                         "orders": FIRST}))
    assert engine.last_batch is not None and engine.last_batch.jobs == 1
    assert len(stages) > 1
    assert stages[max(stages)][0] == 2


def test_an_outer_join_grouped_by_more_keys_moves_accumulators_not_pairs(
        spark: SparkSession) -> None:
    """A left join grouped by its key and a column of its left side (the example's
    `customer_stats`). At P = 2 its pairs (clustered by the join key, where the join made them)
    and its padded rows (clustered by the group's keys) are united clustered by the join key,
    so the group-by aggregates the pairs where they are and exchanges its accumulators: a
    batch that changes every partner pairs every row of the left side again and moves far
    fewer rows than that. The stream is P = 1's, keys with no partner included."""
    def pipeline_() -> Pipeline:
        p = Pipeline()
        a = p.source("a", TableSchema.of({"id": "bigint", "k": "bigint", "g": "text"},
                                         primary_key=["id"]))
        b = p.source("b", TableSchema.of({"k": "bigint", "w": "bigint"}, primary_key=["k"]))
        p.output("stats", a.join(b, on="k", how="left").groupby("k", "g").reduce(
            n=r.count(), total=r.sum("w")))
        return p

    rows = 3_000
    ids = pa.array(range(rows), pa.int64())
    a = _changes({"id": ids, "k": pc.remainder(ids, 30),
                  "g": pa.array([["x", "y", None][i % 3] for i in range(rows)], pa.string())},
                 1, 1)
    partners = pa.array(range(25), pa.int64())  # keys 25-29 have none: padded
    weights = pc.multiply(partners, 10)
    old = _changes({"k": partners, "w": weights}, 1, 1)
    retracted = _changes({"k": partners, "w": weights}, 2, -1)
    new = _changes({"k": partners, "w": pc.add(weights, 1)}, 2, 1)
    late = _changes({"k": pa.array([26], pa.int64()), "w": pa.array([7], pa.int64())}, 2, 1)
    changed = pa.concat_tables([retracted, new, late])
    one = Engine(pipeline_(), spark)
    two = Engine(pipeline_(), spark, parallelism=2, spread_rows=0)
    assert _sorted(process(two, {"a": a, "b": old})) == _sorted(process(one, {"a": a, "b": old}))
    got: list[dict[str, pa.Table]] = []
    exchanged = _rows_exchanged(spark, lambda: got.append(process(two, {"b": changed})))
    assert _sorted(got[0]) == _sorted(process(one, {"b": changed}))
    paired_again = 2 * sum(1 for i in range(rows) if i % 30 < 25)  # retracted and inserted
    assert exchanged < paired_again / 4, (exchanged, paired_again)
    assert set(_misplaced(two).values()) == {0}


def test_a_min_max_group_by_reads_its_groups_values_in_place(spark: SparkSession) -> None:
    """A group-by with min, max and a distinct count reads every value of the groups a batch
    touches (the values it does not touch decide them too). At P = 2 it reads them where the
    state holds them: one aggregate by group and value tags each value touched or not, with
    no exchange of the state's values, where a semi and an anti join on null-safe keys
    exchanged them all twice. A batch touching a few values of every group moves far fewer
    rows than those groups hold; the stream is P = 1's, with nulls among keys and values."""
    def pipeline_() -> Pipeline:
        p = Pipeline()
        events = p.source("e", TableSchema.of({"id": "bigint", "k": "text", "v": "bigint"},
                                              primary_key=["id"]))
        p.output("extremes", events.groupby("k").reduce(
            low=r.min("v"), high=r.max("v"), distinct=r.count_distinct("v")))
        return p

    keys = [None, *[f"g{i}" for i in range(19)]]
    rows = 4_000

    def table(ids: range, time: int, diff: int, shift: int = 0) -> pa.Table:
        return _changes({
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([keys[i % len(keys)] for i in ids], pa.string()),
            "v": pa.array([None if i % 13 == 0 else (i * 7 + shift) % 997 for i in ids],
                          pa.int64())}, time, diff)

    first = table(range(rows), 1, 1)
    # Three rows of every group change value, and one more goes.
    touched = range(0, 3 * len(keys))
    gone = range(3 * len(keys), 4 * len(keys))
    second = pa.concat_tables([table(touched, 2, -1), table(touched, 2, 1, shift=500),
                               table(gone, 2, -1)])
    one = Engine(pipeline_(), spark)
    two = Engine(pipeline_(), spark, parallelism=2, spread_rows=0)
    assert _sorted(process(two, {"e": first})) == _sorted(process(one, {"e": first}))
    got: list[dict[str, pa.Table]] = []
    exchanged = _rows_exchanged(spark, lambda: got.append(process(two, {"e": second})))
    assert _sorted(got[0]) == _sorted(process(one, {"e": second}))
    assert any(len(t) for t in got[0].values())
    assert exchanged < rows / 4, exchanged
    assert set(_misplaced(two).values()) == {0}
