"""The engine's structural costs and exactness, deterministic where timings are not: the Spark
jobs one batch runs, sums of doubles that come back exactly, and a failed batch that leaves the
state as it was."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from time import sleep

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import process

from txstream.engine import Engine, ExpressionError, Pipeline, PipelineDefinitionError, codegen
from txstream.engine import reducers as r
from txstream.engine.operators import SourceOp, rowwise
from txstream.engine.operators.join import JoinOp
from txstream.engine.operators.reduce import ReduceOp
from txstream.engine.spark_internals import key_of, leaves
from txstream.examples.groupby import pipeline as groupby_pipeline
from txstream.examples.order_events import REGIONS, Event, as_changes, events
from txstream.examples.orders import pipeline as orders_pipeline
from txstream.schemas.tables import TableSchema


def test_a_lone_transaction_of_the_example_runs_one_spark_job(spark: SparkSession) -> None:
    engine = Engine(orders_pipeline(), spark)
    stream = events(random.Random(7), 50)
    rows: dict[str, dict[int, dict[str, object]]] = {}
    process(engine, as_changes([next(stream) for _ in range(2_000)], rows, 1))
    for time in range(2, 5):  # warm-up: the first batches after a load merge state runs
        process(engine, as_changes([next(stream) for _ in range(10)], rows, time))
    sc = spark.sparkContext
    sc.setJobGroup("test-outside-the-engine", "jobs the engine runs outside its one action")
    try:
        for time in range(5, 8):
            process(engine, as_changes([next(stream) for _ in range(10)], rows, time))
            assert engine.last_batch is not None
            assert 1 <= engine.last_batch.jobs <= 3, engine.last_batch
            # One partition throughout: no shuffle, so the job is a single stage.
            assert engine.last_batch.stages == 1, engine.last_batch
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert sc.statusTracker().getJobIdsForGroup("test-outside-the-engine") == []


def test_a_jvms_first_batch_that_would_generate_code_is_interpreted_when_small(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cold JVM compiling generated code costs more than it saves (txstream.engine.codegen):
    the first batch of `interpreted_rows` or more is interpreted below `cold_interpreted_rows`,
    the next generates code; a larger first batch generates code at once."""
    monkeypatch.setattr(codegen, "_past_first", set())  # as in a new JVM
    stream = events(random.Random(5), 50)
    rows: dict[str, dict[int, dict[str, object]]] = {}
    engine = Engine(orders_pipeline(), spark, cold_interpreted_rows=3_000)
    process(engine, as_changes([next(stream) for _ in range(2)], rows, 1))
    assert engine.last_batch is not None and engine.last_batch.interpreted  # fewer than 500
    for time, interpreted in [(2, True), (3, False), (4, False)]:
        process(engine, as_changes([next(stream) for _ in range(1_000)], rows, time))
        assert engine.last_batch.interpreted == interpreted, time
    # Per JVM, not per engine: another engine's first batch generates code.
    other = Engine(orders_pipeline(), spark, cold_interpreted_rows=3_000)
    stream = events(random.Random(7), 50)
    process(other, as_changes([next(stream) for _ in range(1_000)], {}, 1))
    assert other.last_batch is not None and not other.last_batch.interpreted
    monkeypatch.setattr(codegen, "_past_first", set())
    engine = Engine(orders_pipeline(), spark, cold_interpreted_rows=3_000)
    stream = events(random.Random(6), 50)
    process(engine, as_changes([next(stream) for _ in range(4_000)], {}, 1))
    assert engine.last_batch is not None and not engine.last_batch.interpreted


def _cached_rdds(spark: SparkSession) -> int:
    """RDDs Spark keeps in memory once every unreferenced one is collected and cleaned."""
    jvm, sc = spark._jvm, spark.sparkContext._jsc.sc()
    assert jvm is not None
    counts = []
    for _ in range(20):  # the context cleaner frees blocks asynchronously, after a GC
        gc.collect()
        jvm.System.gc()
        counts.append(len(sc.getRDDStorageInfo()))
        if len(counts) > 2 and counts[-1] == counts[-2] == counts[-3]:
            break
        sleep(0.25)
    return counts[-1]


def _example_after(spark: SparkSession, seed: int, first: int, lone: int
                   ) -> tuple[Engine, Iterator[Event], dict[str, dict[int, dict[str, object]]]]:
    """The example pipeline's engine after a first batch of `first` order events and `lone`
    10-event transactions (times 1 to `lone` + 1); the event stream and rows, to go on."""
    engine = Engine(orders_pipeline(), spark)
    stream = events(random.Random(seed), 50)
    rows: dict[str, dict[int, dict[str, object]]] = {}
    process(engine, as_changes([next(stream) for _ in range(first)], rows, 1))
    for t in range(2, lone + 2):
        process(engine, as_changes([next(stream) for _ in range(10)], rows, t))
    return engine, stream, rows


def test_lone_transactions_keep_no_earlier_batch_in_memory(spark: SparkSession) -> None:
    """What a batch caches is freed once no state version needs it: a run that kept its plan
    alive would keep every earlier batch's frames, a dozen cached RDDs per batch."""
    engine, stream, rows = _example_after(spark, 3, 2_000, 10)
    before = _cached_rdds(spark)
    for t in range(12, 52):
        process(engine, as_changes([next(stream) for _ in range(10)], rows, t))
    after = _cached_rdds(spark)
    assert after < before + 200, f"{after - before} more cached RDDs after 40 batches"


def test_templates_hold_no_batch_of_data(spark: SparkSession) -> None:
    """A template's physical plans read placeholders only, and so do the logical plans their
    nodes link to (Spark's planner tags each physical node with the logical one it came from):
    a template made from a batch's own plans would keep that batch's state runs and inputs
    alive for as long as the template lives."""
    engine, _, _ = _example_after(spark, 5, 500, 3)
    assert engine.last_batch is not None and engine.last_batch.rebound
    template = next(t for t in engine._templates.values() if t.final.physical is not None)
    checked = 0
    for plan in [*(s.plan.physical for s in template.steps), template.final.physical]:
        nodes = [plan.apply(i) for i in range(plan.numberedTreeString().count("\n"))]
        links = [n.logicalLink() for n in nodes if n is not None]
        for node in [*nodes, *(link.get() for link in links if link.isDefined())]:
            for leaf in leaves(node):
                key = key_of(leaf)
                if key is not None and key[0] == "rdd":  # a LogicalRDD or its scan
                    checked += 1
                    assert leaf.rdd().getNumPartitions() == 0, leaf.toString()
    assert checked > 0


def test_lookups_probe_the_index_of_a_large_run(spark: SparkSession) -> None:
    """A run of `index_rows` rows or more is indexed once, by a job of its own; a run that
    weighs as much but holds fewer rows is built once, found small, and streamed; later lone
    transactions probe the index through reused plans, in their one job, with the same output
    as an engine that streams every run."""
    indexed = Engine(orders_pipeline(), spark, index_rows=300)
    streamed = Engine(orders_pipeline(), spark)
    stream = events(random.Random(11), 50)
    rows: dict[str, dict[int, dict[str, object]]] = {}

    def same(changes: dict[str, pa.Table]) -> bool:
        """Both engines' outputs, each in one order (an engine orders only by time and diff)."""
        a, b = process(indexed, changes), process(streamed, changes)
        return all(a[n].sort_by([(c, "ascending") for c in a[n].column_names])
                   == b[n].sort_by([(c, "ascending") for c in b[n].column_names]) for n in a)

    assert same(as_changes([next(stream) for _ in range(2_000)], rows, 1))
    assert indexed.last_batch is not None and streamed.last_batch is not None
    # Every state's run weighs the batch's ~3,000 rows: each is built (a job), and only the
    # run of all live orders (customer_stats' join) holds 300 rows and is kept; the paid
    # orders, the 50 customers, the regions and the statuses hold fewer.
    assert indexed.last_batch.jobs == streamed.last_batch.jobs + 11
    assert indexed.index_bytes > 0
    for t in range(2, 20):
        assert same(as_changes([next(stream) for _ in range(10)], rows, t)), f"transaction {t}"
        batch = indexed.last_batch
        assert batch is not None and batch.indexes == 1, batch
        if t >= 8:  # the small runs' shapes have repeated by then; no run is built again
            assert batch.rebound and batch.jobs == 1 and batch.stages == 1, batch


def test_a_change_of_columns_no_reader_reads_cancels_before_the_join(spark: SparkSession
                                                                      ) -> None:
    """A customer's new region pairs with no order in the example's left join, whose one reader
    (customer_stats, by customer) reads no region: it cancels before the join, so the join's
    state of customers gets no row either. The paid orders' join reads the region: there the
    change joins the state, a retraction and an insertion per customer."""
    engine = Engine(orders_pipeline(), spark)
    stream = events(random.Random(3), 20)
    rows: dict[str, dict[int, dict[str, object]]] = {}
    process(engine, as_changes([next(stream) for _ in range(500)], rows, 1))
    joins = {op.node.label.split(" of ")[0]: op for op in engine.compiled.operators
             if isinstance(op, JoinOp)}
    left, paid = joins["left join"], joins["inner join"]

    def customers_rows() -> tuple[int, int]:
        return tuple(sum(run.frame.count() for run in state.runs)  # type: ignore[return-value]
                     for state in (left.left_state, paid.right_state))

    def moved(row: dict[str, object]) -> dict[str, object]:
        return {**row, "region": next(r for r in REGIONS if r != row["region"])}

    before = customers_rows()
    changes: list[Event] = [("customers", c, moved(rows["customers"][c])) for c in range(1, 11)]
    out = process(engine, as_changes(changes, rows, 2))
    assert customers_rows() == (before[0], before[1] + 2 * len(changes))
    assert out["customer_stats"].num_rows == 0
    assert out["paid_orders"].num_rows > 0


def test_changes_are_consolidated_where_they_are_read_so(spark: SparkSession) -> None:
    """A join's pairs read only by a group-by (customer_stats: a customer's change pairs with
    every order of it) are left as they come, which the group-by sums by group anyway; an
    output, and what a distinct reads, are consolidated."""
    engine = Engine(orders_pipeline(), spark)
    consolidated = {f"{type(op).__name__}: {op.node.label.split(' of ')[0]}":
                    op.consolidate_output for op in engine.compiled.operators
                    if not isinstance(op, SourceOp)}
    assert consolidated == {
        "FilterOp: filter(status = 'paid')": False,
        "JoinOp: inner join": False,  # read by a select, which consolidates what it keeps
        "SelectOp: select(order_id, customer_id, region, amount)": True,  # paid_orders
        "ReduceOp: groupby(region).reduce": True,
        "SelectOp: select(order_id, customer_id, amount)": False,
        "JoinOp: left join": False,
        "SelectOp: keys": True,  # read by a distinct
        "DistinctOp: distinct keys": False,
        "JoinOp: rows": False,
        "NegateOp: minus matched rows": False,
        "ConcatOp: rows": False,
        "PadOp: left padding": False,
        "ConcatOp: left join": False,
        "ReduceOp: groupby(customer_id, name).reduce": False,
        "SelectOp: select(customer_id, name, n_orders, total)": True,
        "SelectOp: select(status)": True,
        "DistinctOp: distinct": True,
    }


@pytest.mark.parametrize("how", ["concat", "left join"])
def test_a_union_with_one_input_in_a_batch_consolidates_an_output(spark: SparkSession,
                                                                   how: str) -> None:
    """A select that drops a column makes an update of it a -1 and a +1 of one row, left
    unconsolidated for a union; the union (an outer join holds two) with nothing from its
    other input in a batch must still consolidate what it outputs."""
    p = Pipeline()
    t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint", "v": "bigint"},
                                     primary_key=["id"]))
    u = p.source("u", TableSchema.of({"k": "bigint", "w": "bigint"}))
    kept = t.select("id", "k")
    p.output("o", kept.concat(u.select(id="k", k="w")) if how == "concat"
             else kept.join(u, on="k", how="left"))
    engine = Engine(p, spark)

    def batch(v: list[int], diff: list[int], time: int) -> pa.Table:
        n = len(v)
        return process(engine, {"t": pa.table({"id": [1] * n, "k": [1] * n, "v": v,
                                                "time": [time] * n, "diff": diff})})["o"]

    assert batch([1], [1], 1).num_rows == 1
    assert batch([1, 2], [-1, 1], 2).num_rows == 0  # v updated: the output row unchanged


def _sums_engine(spark: SparkSession) -> Engine:
    p = Pipeline()
    t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint", "v": "double"},
                                     primary_key=["id"]))
    p.output("s", t.groupby("k").reduce(n=r.count(), s=r.sum("v"), a=r.avg("v")))
    return Engine(p, spark)


def _rows(changes: list[tuple[int, float, int]], time: int) -> dict[str, pa.Table]:
    return {"t": pa.table({"id": [c[0] for c in changes], "k": [1] * len(changes),
                           "v": [c[1] for c in changes], "time": [time] * len(changes),
                           "diff": [c[2] for c in changes]})}


def test_double_sums_are_exact_and_invertible(spark: SparkSession) -> None:
    engine = _sums_engine(spark)
    # Summed as longs (below 1e9, the sum then exact in a double, or not: 7654321.1...) and as
    # decimals (from 1e9 to 1e19).
    values = [1751.37, 0.1, 0.2, 0.3, 1e-9, 123456789.987654321, 7654321.123456789, -2.5e12,
              3e15 + 0.5]
    process(engine, _rows([(0, values[0], 1)], 1))
    for i, v in enumerate(values[1:], start=1):  # up, one value per transaction...
        process(engine, _rows([(i, v, 1)], 1 + i))
    for i, v in enumerate(values[1:], start=1):  # ...and back down
        out = process(engine, _rows([(i, v, -1)], 10 + i))["s"]
    last = out.filter(pc.equal(out["diff"], 1)).to_pylist()
    assert last[0]["s"] == 1751.37 and last[0]["a"] == 1751.37
    # Present values sum exactly: the result is the double nearest the decimal sum.
    out = process(engine, _rows([(i, v, 1) for i, v in enumerate(values[1:], start=1)], 20))["s"]
    exact = float(sum(Decimal(repr(v)) for v in values))
    assert out.filter(pc.equal(out["diff"], 1))["s"].to_pylist() == [exact]
    # The same values removed and inserted again (other rows): nothing changed, nothing emitted.
    swapped = [(i, v, -1) for i, v in enumerate(values[1:], start=1)] \
        + [(100 + i, v, 1) for i, v in enumerate(values[1:], start=1)]
    assert process(engine, _rows(swapped, 21))["s"].num_rows == 0


def test_double_sums_count_infinities_and_nan(spark: SparkSession) -> None:
    engine = _sums_engine(spark)

    def after(changes: list[tuple[int, float, int]], time: int) -> float:
        out = process(engine, _rows(changes, time))["s"]
        return out.filter(pc.equal(out["diff"], 1))["s"][0].as_py()

    assert after([(0, 2.5, 1), (1, float("inf"), 1)], 1) == float("inf")
    assert str(after([(2, float("-inf"), 1)], 2)) == "nan"
    assert after([(1, float("inf"), -1)], 3) == float("-inf")
    assert str(after([(3, float("nan"), 1)], 4)) == "nan"
    assert after([(2, float("-inf"), -1), (3, float("nan"), -1), (4, 1e300, 1)], 5) \
        == 1e300 + 2.5
    assert after([(4, 1e300, -1)], 6) == 2.5


@pytest.mark.parametrize("precision", [18, 20])  # summed as longs, and as decimals
def test_decimal_reducers_are_exact(spark: SparkSession, precision: int) -> None:
    p = Pipeline()
    t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint",
                                      "v": f"decimal({precision},4)"}, primary_key=["id"]))
    p.output("s", t.groupby("k").reduce(n=r.count(), s=r.sum("v"), a=r.avg("v"),
                                        lo=r.min("v"), hi=r.max("v")))
    engine = Engine(p, spark)
    out_types = {f.name: str(f.type) for f in engine.outputs["s"].schema.arrow_schema()}
    assert (out_types["s"], out_types["a"], out_types["lo"]) == \
        (f"decimal128({precision + 10}, 4)", f"decimal128({precision + 4}, 8)",
         f"decimal128({precision}, 4)")
    largest = Decimal(10) ** (precision - 4) - Decimal("0.0001")
    values = [Decimal("1751.3700"), Decimal("0.0001"), -largest, largest, Decimal("0.3333")]
    live: dict[int, Decimal] = {}
    rng = random.Random(5)
    for time in range(1, 16):
        changes = []
        for i in rng.sample(range(8), 3):
            if i in live:
                changes.append((i, live.pop(i), -1))
            else:
                live[i] = rng.choice(values)
                changes.append((i, live[i], 1))
        out = process(engine, {"t": pa.table({
            "id": [c[0] for c in changes], "k": [1] * len(changes),
            "v": pa.array([c[1] for c in changes], pa.decimal128(precision, 4)),
            "time": [time] * len(changes), "diff": [c[2] for c in changes]})})["s"]
        row = out.filter(pc.equal(out["diff"], 1)).to_pylist()
        if not live:
            assert row == []
            continue
        total = sum(live.values(), Decimal(0))
        mean = (total / len(live)).quantize(Decimal("1e-8"), rounding=ROUND_HALF_UP)
        assert (row[0]["n"], row[0]["s"], row[0]["a"], row[0]["lo"], row[0]["hi"]) == \
            (len(live), total, mean, min(live.values()), max(live.values()))


def test_decimal_sums_beyond_a_long(spark: SparkSession) -> None:
    """Sums of limbs that no long holds are built as decimals, exactly."""
    p = Pipeline()
    t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint", "v": "decimal(18,4)"},
                                     primary_key=["id"]))
    p.output("s", t.groupby("k").reduce(s=r.sum("v")))
    engine = Engine(p, spark)
    largest = Decimal("99999999999999.9999")
    for time, (diff, sign) in enumerate([(1, 1), (-1, 1), (1, -1)], start=1):
        out = process(engine, {"t": pa.table({
            "id": list(range(12)), "k": [1] * 12,
            "v": pa.array([sign * largest] * 12, pa.decimal128(18, 4)),
            "time": [time] * 12, "diff": [diff] * 12})})["s"]
        rows = out.filter(pc.equal(out["diff"], 1))["s"].to_pylist()
        assert rows == ([] if diff < 0 else [12 * sign * largest]), time


def test_sums_of_decimals_wider_than_exact_are_refused(spark: SparkSession) -> None:
    p = Pipeline()
    t = p.source("t", TableSchema.of({"k": "bigint", "v": "decimal(30,2)"}))
    p.output("s", t.groupby("k").reduce(s=r.sum("v")))
    with pytest.raises(PipelineDefinitionError, match=r"decimal\(28,2\)"):
        Engine(p, spark)


def test_a_failed_batch_leaves_the_state_as_it_was(spark: SparkSession) -> None:
    p = Pipeline()
    t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint", "d": "bigint"},
                                     primary_key=["id"]))
    ratio = t.select("id", "k", q="10 DIV d")  # ANSI mode: division by zero fails the batch
    p.output("n", ratio.groupby("k").reduce(n=r.count(), q=r.sum("q")))
    engine = Engine(p, spark)

    def batch(rows: list[tuple[int, int, int, int]], time: int) -> pa.Table:
        return process(engine, {"t": pa.table({
            "id": [x[0] for x in rows], "k": [x[1] for x in rows], "d": [x[2] for x in rows],
            "time": [time] * len(rows), "diff": [x[3] for x in rows]})})["n"]

    batch([(1, 1, 2, 1)], 1)
    with pytest.raises(ExpressionError) as info:
        batch([(2, 1, 0, 1), (3, 1, 5, 1)], 2)
    assert "table select(id, k, q) of source t (expression `10 DIV d`)" in str(info.value)
    assert "DIVIDE_BY_ZERO" in str(info.value) and "CASE WHEN" in str(info.value)
    out = batch([(3, 1, 5, 1)], 3)
    assert sorted(out.to_pylist(), key=lambda row: row["diff"]) == [
        {"k": 1, "n": 1, "q": 5, "time": 3, "diff": -1},
        {"k": 1, "n": 2, "q": 7, "time": 3, "diff": 1},
    ]


def test_a_large_input_enters_as_arrow_batches_with_the_same_result(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    n = rowwise.ARROW_INPUT_ROWS + 10_000
    i = pa.array(range(3 * n), pa.int64())
    inserts = pa.table({"k": pc.divide(i, 7), "v": i, "time": pc.add(pc.divide(i, 20_000), 1),
                       "diff": pa.array([1] * (3 * n), pa.int64())})
    batches = [{"events": inserts.slice(lo, n)} for lo in range(0, 3 * n, n)]
    engine = Engine(groupby_pipeline(), spark)
    as_batches = [process(engine, batch)["sums"] for batch in batches]
    assert engine.last_batch is not None and engine.last_batch.rebound, \
        "a large batch reuses the plans of the one before of the same shape"
    monkeypatch.setattr(rowwise, "ARROW_INPUT_ROWS", 3 * n)
    engine = Engine(groupby_pipeline(), spark)
    as_rows = [process(engine, batch)["sums"] for batch in batches]
    assert [t.equals(r) for t, r in zip(as_batches, as_rows, strict=True)] == [True] * 3
    changes = pa.concat_tables(as_batches)
    net = changes.group_by(["k", "count", "total"]).aggregate([("diff", "sum")])
    final = net.filter(pc.equal(net["diff_sum"], 1)).select(["k", "count", "total"])
    want = inserts.group_by("k").aggregate([("v", "count"), ("v", "sum")])
    assert sorted(final.to_pylist(), key=lambda row: row["k"]) == [
        {"k": row["k"], "count": row["v_count"], "total": row["v_sum"]}
        for row in sorted(want.to_pylist(), key=lambda row: row["k"])]


def test_a_group_by_read_by_an_output_alone_comes_as_pairs(spark: SparkSession) -> None:
    """A group-by whose one reader is an output lays each change of a group out as one row of
    the batch's result, its old values beside its new ones, and the driver splits them
    (txstream.engine.results): a group inserted, updated (to a null sum and back), and
    deleted, in one batch and in batches of one transaction, gives the same changes."""
    engine = Engine(orders_pipeline(), spark)
    paired = {op.node.label.split(" of ")[0] for op in engine.compiled.operators if op.emit_pairs}
    assert paired == {"groupby(region).reduce"}  # customer_stats' group-by is read by a select

    def pipeline() -> Pipeline:
        p = Pipeline()
        t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint", "v": "bigint"},
                                         primary_key=["id"]))
        p.output("s", t.groupby("k").reduce(n=r.count(), s=r.sum("v"), lo=r.min("v")))
        return p

    changes = [(1, 1, 5, 1, 1), (2, 1, None, 1, 2), (1, 1, 5, -1, 3), (1, 1, 7, 1, 4),
               (2, 1, None, -1, 4), (1, 1, 7, -1, 5)]  # id, k, v, diff, time

    def table(rows: list[tuple[int, int, int | None, int, int]]) -> dict[str, pa.Table]:
        return {"t": pa.table({"id": [c[0] for c in rows], "k": [c[1] for c in rows],
                               "v": pa.array([c[2] for c in rows], pa.int64()),
                               "time": [c[4] for c in rows], "diff": [c[3] for c in rows]})}

    want = [(1, 1, 5, 5, 1, 1), (1, 1, 5, 5, 2, -1), (1, 2, 5, 5, 2, 1),
            (1, 2, 5, 5, 3, -1), (1, 1, None, None, 3, 1),
            (1, 1, None, None, 4, -1), (1, 1, 7, 7, 4, 1), (1, 1, 7, 7, 5, -1)]
    whole = Engine(pipeline(), spark)
    assert whole.compiled.operators[-1].emit_pairs
    out = process(whole, table(changes))["s"]
    assert [tuple(r.values()) for r in out.to_pylist()] == want
    one_by_one = Engine(pipeline(), spark)
    got = []
    for t in range(1, 6):
        got += process(one_by_one, table([c for c in changes if c[4] == t]))["s"].to_pylist()
    assert [tuple(r.values()) for r in got] == want


def test_a_group_by_downstream_of_a_join_aggregates_before_its_window(spark: SparkSession
                                                                      ) -> None:
    """A join multiplies rows (a customer's change pairs with every order of it), so a group-by
    downstream of one sums its rows by group and time before its window sorts them; one that
    reads a source's rows (Pathway's group-by workload) sorts them as they come."""
    many = {op.node.label.split(" of ")[0]: op.many_per_key
            for op in Engine(orders_pipeline(), spark).compiled.operators
            if isinstance(op, ReduceOp)}
    assert many == {"groupby(region).reduce": True, "groupby(customer_id, name).reduce": True}
    assert [op.many_per_key for op in Engine(groupby_pipeline(), spark).compiled.operators
            if isinstance(op, ReduceOp)] == [False]
