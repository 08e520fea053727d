"""Engine benchmark. Prints one JSON document (progress goes to stderr):

0. latency: the example pipeline (txstream/examples/orders.py), lone 10-event transactions after
   warm-up, against state built from 20k and from 1M order events: p50/p99 engine seconds split
   into driver planning and execution, Spark jobs and stages per batch, and the time of a
   trivial Spark job measured in the same run (batch time / trivial job travels between
   machines), all from the first 30 timed transactions, every size's taken before any
   goes on; then each goes on to `--latency-windows` windows of 30 (the first included): each
   window's p50 and the driver JVM's C2 compiler CPU, as its JIT settles, and the settled p50
   (the later half of the windows);
1. throughput, the Pathway-style workload: 1,000,000 insert events, keys = i mod 10,000, 100
   transactions of 10,000 events, group-by count and sum; events/s end to end through the
   engine (input from Arrow, consolidated output diffs collected) with 1, 10 and 100
   transactions per Spark job, one fresh engine each; and the same workload run by Pathway in
   the same run (bench/peers/pathway_groupby.py, in a virtualenv of its own), with the ratio;
2. state_cost: the time of one 1,000-change transaction (500 deletions of existing rows, 500
   insertions) against state of S rows, for a group-by with S/10 keys and an inner join with a
   static table of S rows, and how it grows from the smallest S to the largest;
3. the same transaction answered by full recompute (a plain Spark group-by over the input as
   of that transaction, collected; the join's rows counted and summed), and its ratio to the
   incremental time.

With `--workers N` the state-size part runs as the 1 GB driver of a Spark standalone cluster
on 127.0.0.1 of N one-core workers, its engines at parallelism N (`--parallelism` sets it on
any master).

Every engine result is checked against numpy. The machine is shared: ratios measured within one
run are what matter, so the load average at start and end is part of the output.

    .venv/bin/python bench/engine.py [--latency] [--throughput] [--state] (none: all three)
        [--quick] [--sizes 10k,1M,10M] [--reps 5] [--latency-sizes 20k,1M]
        [--latency-windows 8] [--no-peer]
        [--state-workloads groupby,join] [--parallelism 1] [--workers N [--worker-gb 8]]
    .venv/bin/python bench/engine.py --scale [bench/scale.py's arguments]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine, Pipeline
from txstream.engine import __file__ as engine_module
from txstream.engine import reducers as r
from txstream.engine.engine import BatchStats
from txstream.examples.order_events import as_changes, events
from txstream.examples.orders import pipeline as orders_pipeline
from txstream.schemas.tables import TableSchema
from txstream.service.spark import get_spark

# A sibling script, not a package.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_stat import Stat

EVENTS = TableSchema.of({"k": "bigint", "v": "double"})
# `a` is the changing table: grouped by `g` (S/10 groups) and joined with `b` on `k`.
A_SCHEMA = TableSchema.of({"id": "bigint", "g": "bigint", "k": "bigint", "v": "double"},
                          primary_key=["id"])
B_SCHEMA = TableSchema.of({"k": "bigint", "w": "double"}, primary_key=["k"])

# Rows are a function of their id, computed identically by numpy (engine input, expected
# results) and by Spark (the recompute's base tables, which are thus generated inside Spark
# instead of paying createDataFrame for millions of rows a second time). Odd multipliers not
# divisible by 5 are bijections modulo powers of ten, so with S a power of ten every key of `b`
# matches exactly one base row of `a` and every group holds exactly 10 rows.
K_MULT = 2_654_435_761
G_MULT = 40_503
V_MULT = 7_919
V_MOD = 10_007
# Values are multiples of 1/8 and small, so every sum is exact in float64 whatever the order of
# addition: results can be compared for equality, not approximately.
V_SCALE = 8.0

# Set in the environment of the driver `on_cluster` runs.
_ON_CLUSTER = "TXSTREAM_BENCH_ON_CLUSTER"
LOAD_BATCH_ROWS = 500_000  # bounds what a loading batch holds in the driver (input, output)
QUICK_SIZES = (10_000, 100_000, 1_000_000)
FULL_SIZES = (10_000, 1_000_000, 10_000_000)

_T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def changes(columns: dict[str, np.ndarray], time_: np.ndarray | int, diff: np.ndarray | int
            ) -> pa.Table:
    """An engine input: the columns plus `time` and `diff` (scalars broadcast to every row)."""
    n = len(next(iter(columns.values())))
    extra = {TIME: np.broadcast_to(np.int64(time_), n) if np.isscalar(time_) else time_,
             DIFF: np.broadcast_to(np.int64(diff), n) if np.isscalar(diff) else diff}
    return pa.table({name: pa.array(np.ascontiguousarray(values))
                     for name, values in {**columns, **extra}.items()})


def value_of(x: np.ndarray) -> np.ndarray:
    return ((x * V_MULT) % V_MOD).astype(np.float64) / V_SCALE


def a_rows(ids: np.ndarray, size: int) -> dict[str, np.ndarray]:
    return {"id": ids, "g": (ids * G_MULT) % groups_of(size), "k": (ids * K_MULT) % size,
            "v": value_of(ids)}


def groups_of(size: int) -> int:
    return max(size // 10, 1)


def a_frame(spark: SparkSession, size: int) -> DataFrame:
    """`a`'s base rows (ids 0..size-1), the same values as `a_rows`."""
    i = F.col("id")
    return spark.range(size).select(
        i, ((i * G_MULT) % groups_of(size)).alias("g"), ((i * K_MULT) % size).alias("k"),
        (((i * V_MULT) % V_MOD).cast("double") / F.lit(V_SCALE)).alias("v"))


def b_frame(spark: SparkSession, size: int) -> DataFrame:
    k = F.col("id")
    return spark.range(size).select(
        k.alias("k"), (((k * V_MULT) % V_MOD).cast("double") / F.lit(V_SCALE)).alias("w"))


def engine_input(tables: dict[str, pa.Table]) -> dict[str, Changes]:
    """Tables of changes as the engine takes them, wrapped as they are (the engine
    consolidates its input, in the time measured, as the service's input is)."""
    return {name: Changes.of(table) for name, table in tables.items()}


def seconds_of(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# --- 0. latency ---------------------------------------------------------------------------

LOAD_EVENTS_PER_BATCH = 50_000


def trivial_job_s(spark: SparkSession, reps: int = 15) -> float:
    """The median time of Spark's smallest job here: the unit a batch's time is worth."""
    frame = spark.range(1)
    times = [seconds_of(frame.count)[0] for _ in range(reps)]
    return statistics.median(times)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def jit_cpu_s(spark: SparkSession) -> float | None:
    """CPU seconds the driver JVM's C2 compiler threads have used so far (Linux; None where
    /proc or the JVM's process is not at hand): while they keep working, the driver's code
    is still being compiled and a batch is slower than it will be."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    tasks = Path(f"/proc/{getattr(proc, 'pid', 0)}/task")
    if proc is None or not tasks.is_dir():
        return None
    ticks = 0
    for task in tasks.iterdir():
        try:
            stat = Stat.of(task / "stat")
        except OSError:  # the thread ended meanwhile
            continue
        if stat.name.startswith("C2 CompilerThre"):  # the 15 characters Linux keeps
            ticks += stat.ticks
    return ticks / os.sysconf("SC_CLK_TCK")


def _total(window: list[BatchStats]) -> list[float]:
    return [s.planning_s + s.execution_s for s in window]


def _window(spark: SparkSession, lone: Callable[[], BatchStats], transactions: int
            ) -> tuple[list[BatchStats], float | None]:
    """`transactions` lone transactions, and the C2 compiler's CPU seconds meanwhile."""
    compiled = jit_cpu_s(spark)
    stats = [lone() for _ in range(transactions)]
    done = jit_cpu_s(spark)
    return stats, None if compiled is None or done is None else round(done - compiled, 1)


@dataclass
class Latency:
    """A latency run (`latency`): its figures so far, and the engine that goes on."""

    result: dict[str, Any]
    lone: Callable[[], BatchStats]
    first: list[BatchStats]
    first_jit_s: float | None  # the C2 compiler's CPU during the first window

    def settle(self, spark: SparkSession, windows: int) -> None:
        """`windows - 1` more windows of lone transactions after the first (`result["windows"]`):
        each window's p50 and the C2 compiler's CPU during it, and the settled p50, that of the
        transactions of the later half of the windows together (a window is noisy)."""
        measured, jit = [self.first], [self.first_jit_s]
        for _ in range(windows - 1):
            stats, compiled_s = _window(spark, self.lone, len(self.first))
            measured.append(stats)
            jit.append(compiled_s)
        later = [s for window in measured[len(measured) // 2:] for s in window]
        settled = statistics.median(_total(later))
        log(f"latency S={self.result['state_events']:,}: settled p50 {settled:.3f} s")
        self.result["windows"] = {
            "p50_s": [round(statistics.median(_total(w)), 3) for w in measured],
            "jit_compiler_cpu_s": jit,
            "settled_p50_s": round(settled, 3),
            "settled_planning_p50_s": round(statistics.median(s.planning_s for s in later), 3),
            "settled_execution_p50_s": round(statistics.median(s.execution_s for s in later),
                                             3),
        }


def latency(spark: SparkSession, state_events: int, transactions: int) -> Latency:
    """Lone transactions after ten of warm-up: the figures of the first `transactions` (the
    engine then goes on, `Latency.settle`)."""
    engine = Engine(orders_pipeline(), spark)
    stream = events(random.Random(11), 200)
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    time_ = 1
    start = time.perf_counter()
    for lo in range(0, state_events, LOAD_EVENTS_PER_BATCH):
        size = min(LOAD_EVENTS_PER_BATCH, state_events - lo)
        engine.process(engine_input(as_changes([next(stream) for _ in range(size)], rows,
                                               time_)))
        time_ += 1
    load_s = time.perf_counter() - start
    log(f"latency S={state_events:,}: loaded in {load_s:.1f} s")

    def lone() -> BatchStats:
        nonlocal time_
        engine.process(engine_input(as_changes([next(stream) for _ in range(10)], rows, time_)))
        time_ += 1
        assert engine.last_batch is not None
        return engine.last_batch

    for _ in range(10):  # warm-up (and the merge of the loaded runs)
        lone()
    stats, compiled_s = _window(spark, lone, transactions)
    total = _total(stats)
    trivial = trivial_job_s(spark)
    p50 = statistics.median(total)
    log(f"latency S={state_events:,}: p50 {p50:.3f} s")
    return Latency({
        "state_events": state_events, "live_orders": len(rows.get("orders", {})),
        "live_customers": len(rows.get("customers", {})), "load_s": round(load_s, 1),
        "transactions": transactions, "events_per_transaction": 10,
        "p50_s": round(p50, 3), "p99_s": round(percentile(total, 0.99), 3),
        "planning_p50_s": round(statistics.median(s.planning_s for s in stats), 3),
        "execution_p50_s": round(statistics.median(s.execution_s for s in stats), 3),
        "spark_jobs_per_batch": max(s.jobs for s in stats),
        "spark_stages_per_batch": max(s.stages for s in stats),
        "interpreted_batches": sum(s.interpreted for s in stats),
        "trivial_job_s": round(trivial, 4), "p50_over_trivial_job": round(p50 / trivial, 1),
    }, lone, stats, compiled_s)


# --- 1. throughput ------------------------------------------------------------------------


def throughput(spark: SparkSession, events: int, keys: int, transactions: int,
               per_job: list[int]) -> dict[str, Any]:
    i = np.arange(events, dtype=np.int64)
    per_txn = events // transactions
    table = changes({"k": i % keys, "v": value_of(i)}, i // per_txn, 1)
    want_n = np.bincount(i % keys, minlength=keys)
    want_s = np.bincount(i % keys, weights=value_of(i), minlength=keys)
    runs = []
    for batch in per_job:
        p = Pipeline()
        p.output("sums", p.source("events", EVENTS).groupby("k")
                 .reduce(n=r.count(), s=r.sum("v")))
        engine = Engine(p, spark)
        rows = batch * per_txn
        chunks = [table.slice(lo, rows) for lo in range(0, events, rows)]
        job_s = []
        outputs = []
        spark_jobs = []
        start = time.perf_counter()
        for chunk in chunks:
            t0 = time.perf_counter()
            outputs.append(engine.process(engine_input({"events": chunk}))["sums"].table)
            job_s.append(time.perf_counter() - t0)
            assert engine.last_batch is not None
            spark_jobs.append(engine.last_batch.jobs)
        elapsed = time.perf_counter() - start
        check_integrated(pa.concat_tables(outputs), want_n, want_s)
        runs.append({"transactions_per_job": batch, "jobs": len(chunks),
                     "seconds": round(elapsed, 3), "events_per_s": round(events / elapsed),
                     "median_job_s": round(statistics.median(job_s), 3),
                     "spark_jobs_per_batch": max(spark_jobs),
                     "output_rows": sum(o.num_rows for o in outputs)})
        log(f"throughput: {batch} transactions/job: {elapsed:.1f} s, "
            f"{events / elapsed:,.0f} events/s")
    return {"events": events, "keys": keys, "transactions": transactions,
            "events_per_transaction": per_txn, "runs": runs, "verified": True}


PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "pathway_groupby.py")


def pathway_peer(events: int, keys: int, transactions: int) -> dict[str, Any]:
    """The same workload run by Pathway, in a virtualenv of its own (created on first use)."""
    log("throughput: the same workload in Pathway")
    done = subprocess.run(
        [sys.executable, PEER, "--events", str(events), "--keys", str(keys),
         "--transactions", str(transactions)],
        capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"peer": "pathway", "skipped": f"exit {done.returncode}: {done.stderr[-500:]}"}
    return json.loads(lines[-1])


def check_integrated(diffs: pa.Table, want_n: np.ndarray, want_s: np.ndarray) -> None:
    """Summing the diff stream must leave exactly one row per key, equal to numpy's totals."""
    net = diffs.to_pandas().groupby(["k", "n", "s"], as_index=False)[DIFF].sum()
    net = net[net[DIFF] != 0].sort_values("k")
    assert (net[DIFF] == 1).all(), "integrated output has multiplicities other than 1"
    assert np.array_equal(net["k"].to_numpy(), np.arange(len(want_n))), "wrong set of keys"
    assert np.array_equal(net["n"].to_numpy(), want_n), "wrong counts"
    assert np.array_equal(net["s"].to_numpy(), want_s), "wrong sums"


# --- 2 and 3. cost versus state, incremental and recompute -------------------------------


@dataclass(frozen=True)
class Truth:
    """Numpy's view of `a` as of a transaction: per-group counts and sums, the join's size and
    its sum of `w`."""

    counts: np.ndarray
    sums: np.ndarray
    rows: int
    w_total: float

    @classmethod
    def base(cls, size: int) -> Truth:
        rows = a_rows(np.arange(size, dtype=np.int64), size)
        return cls(np.bincount(rows["g"], minlength=groups_of(size)),
                   np.bincount(rows["g"], weights=rows["v"], minlength=groups_of(size)),
                   size, float(value_of(rows["k"]).sum()))

    def after(self, txn: pa.Table) -> Truth:
        g, v, k = (txn[c].to_numpy() for c in ("g", "v", "k"))
        d = txn[DIFF].to_numpy()
        return Truth(
            self.counts + np.bincount(g, weights=d, minlength=len(self.counts)).astype(np.int64),
            self.sums + np.bincount(g, weights=v * d, minlength=len(self.sums)),
            self.rows + int(d.sum()), self.w_total + float((value_of(k) * d).sum()))


def transactions(size: int, count: int, first_time: int, seed: int) -> list[pa.Table]:
    """`count` transactions of 500 deletions of distinct base rows and 500 new rows."""
    rng = np.random.default_rng(seed)
    deleted = rng.choice(size, 500 * count, replace=False).astype(np.int64)
    out = []
    for j in range(count):
        ids = np.concatenate([deleted[500 * j:500 * (j + 1)],
                              np.arange(size + 500 * j, size + 500 * (j + 1), dtype=np.int64)])
        diff = np.repeat(np.array([-1, 1], dtype=np.int64), 500)
        out.append(changes(a_rows(ids, size), first_time + j, diff))
    return out


def check_groupby_delta(out: pa.Table, txn: pa.Table, before: Truth, after: Truth) -> None:
    """The transaction's output retracts the touched groups' old rows and inserts new ones."""
    touched = np.unique(txn["g"].to_numpy())
    g, n, s = (out[c].to_numpy() for c in ("g", "n", "s"))
    d = out[DIFF].to_numpy()
    plus, minus = d == 1, d == -1
    assert (plus | minus).all() and np.isin(g, touched).all(), "diff or group out of place"
    assert len(np.unique(g[plus])) == plus.sum() and len(np.unique(g[minus])) == minus.sum()
    assert np.array_equal(n[plus], after.counts[g[plus]]), "wrong new counts"
    assert np.array_equal(s[plus], after.sums[g[plus]]), "wrong new sums"
    assert np.array_equal(n[minus], before.counts[g[minus]]), "wrong retracted counts"
    assert np.array_equal(s[minus], before.sums[g[minus]]), "wrong retracted sums"
    silent = np.setdiff1d(touched, np.union1d(g[plus], g[minus]))
    assert np.array_equal(before.counts[silent], after.counts[silent]) and \
        np.array_equal(before.sums[silent], after.sums[silent]), "a changed group not emitted"


def check_join_delta(out: pa.Table, txn: pa.Table) -> None:
    """Every changed row of `a` matches exactly one row of `b`: the output is the changes."""
    got = out.sort_by("id")
    want = txn.sort_by("id")
    for c in ("id", "k", "g", "v", DIFF):
        assert np.array_equal(got[c].to_numpy(), want[c].to_numpy()), f"join output: {c}"
    assert np.array_equal(got["w"].to_numpy(), value_of(want["k"].to_numpy())), "join output: w"


def recompute(spark: SparkSession, query: Callable[[DataFrame], DataFrame], a_base: DataFrame,
              applied: list[pa.Table]) -> pa.Table:
    """`query`'s whole result from scratch, on `a` as of the last applied transaction."""
    net = pa.concat_tables(applied)
    is_del = pc.equal(net[DIFF], -1)
    deleted = spark.createDataFrame(net.filter(is_del).select(["id"]), schema="id BIGINT")
    inserted = spark.createDataFrame(net.filter(pc.invert(is_del))
                                     .select(["id", "g", "k", "v"]),
                                     schema="id BIGINT, g BIGINT, k BIGINT, v DOUBLE")
    return query(a_base.join(F.broadcast(deleted), "id", "left_anti").unionByName(inserted)
                 ).toArrow()


def check_recompute(workload: str, result: pa.Table, truth: Truth) -> None:
    if workload == "groupby":
        got = result.sort_by("g")
        live = np.flatnonzero(truth.counts > 0)
        assert np.array_equal(got["g"].to_numpy(), live), "recompute: wrong groups"
        assert np.array_equal(got["n"].to_numpy(), truth.counts[live]), "recompute: counts"
        assert np.array_equal(got["s"].to_numpy(), truth.sums[live]), "recompute: sums"
    else:
        assert result["rows"][0].as_py() == truth.rows, "recompute: join size"
        assert math.isclose(result["w"][0].as_py(), truth.w_total,
                            rel_tol=1e-12), "recompute: join sum of w"


def load(engine: Engine, source: str, schema_rows: Callable[[np.ndarray], dict[str, np.ndarray]],
         size: int, first_time: int) -> int:
    """Feeds ids 0..size-1 in a few large transactions; returns the next free time."""
    batches = max(2, math.ceil(size / LOAD_BATCH_ROWS))
    for j, ids in enumerate(np.array_split(np.arange(size, dtype=np.int64), batches)):
        engine.process(engine_input({source: changes(schema_rows(ids), first_time + j, 1)}))
    return first_time + batches


def state_cost(spark: SparkSession, workload: str, size: int, reps: int, parallelism: int = 1
               ) -> dict[str, Any]:
    p = Pipeline()
    a = p.source("a", A_SCHEMA)
    cached: list[DataFrame] = []
    query: Callable[[DataFrame], DataFrame]
    if workload == "groupby":
        p.output("out", a.groupby("g").reduce(n=r.count(), s=r.sum("v")))

        def query(a_now: DataFrame) -> DataFrame:
            return a_now.groupBy("g").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))
    else:
        p.output("out", a.join(p.source("b", B_SCHEMA), on="k", how="inner"))
        b_base = b_frame(spark, size).cache()
        cached.append(b_base)

        def query(a_now: DataFrame) -> DataFrame:
            # Its size and sum of w, which the check needs: collecting 10M rows would time the
            # driver's memory, and a 1 GB driver (--workers) cannot hold them.
            return a_now.join(b_base, "k").agg(F.count(F.lit(1)).alias("rows"),
                                               F.sum("w").alias("w"))
    engine = Engine(p, spark, parallelism=parallelism)

    start = time.perf_counter()
    next_time = 0
    if workload == "join":
        # `b` first: while `a` loads, each of its batches is joined with the whole of `b`.
        next_time = load(engine, "b", lambda k: {"k": k, "w": value_of(k)}, size, next_time)
    next_time = load(engine, "a", lambda ids: a_rows(ids, size), size, next_time)
    load_s = time.perf_counter() - start
    # Recompute reads its inputs from Spark's memory, as a batch system's tables would be.
    a_base = a_frame(spark, size).cache()
    cached.append(a_base)
    for frame in cached:
        frame.count()
    log(f"{workload} S={size:,}: loaded in {load_s:.1f} s")

    truth = Truth.base(size)
    # The first transaction warms this engine's plans and is not reported.
    txns = transactions(size, reps + 1, next_time, seed=size)
    incremental: list[float] = []
    full: list[float] = []
    jobs: list[int] = []
    indexes: list[int] = []  # indexed state runs each transaction's lookups probed
    for j, txn in enumerate(txns):
        before, truth = truth, truth.after(txn)
        elapsed, result = seconds_of(
            lambda txn=txn: engine.process(engine_input({"a": txn}))["out"].table)
        assert engine.last_batch is not None
        n_jobs = engine.last_batch.jobs
        probed = engine.last_batch.indexes
        if workload == "groupby":
            check_groupby_delta(result, txn, before, truth)
        else:
            check_join_delta(result, txn)
        # Interleaved with the incremental runs, so both see the same machine load.
        redo_s, redone = seconds_of(lambda j=j: recompute(spark, query, a_base, txns[:j + 1]))
        check_recompute(workload, redone, truth)
        if j > 0:
            incremental.append(elapsed)
            full.append(redo_s)
            jobs.append(n_jobs)
            indexes.append(probed)
    for frame in cached:
        frame.unpersist()
    inc, redo = statistics.median(incremental), statistics.median(full)
    log(f"{workload} S={size:,}: incremental {inc:.3f} s, recompute {redo:.3f} s")
    return {"load_transactions": next_time, "load_s": round(load_s, 1),
            # The median is a typical transaction; the maximum shows the transactions that
            # also merge state runs, and the mean their cost spread over the others.
            "incremental_s": round(inc, 3), "incremental_max_s": round(max(incremental), 3),
            "incremental_mean_s": round(statistics.mean(incremental), 3),
            "incremental_all_s": [round(x, 3) for x in incremental],
            "spark_jobs_per_transaction": statistics.median(jobs),
            "indexed_runs_probed": statistics.median(indexes),
            "index_mib": round(engine.index_bytes / 2**20, 1),
            "recompute_s": round(redo, 3), "recompute_all_s": [round(x, 3) for x in full],
            "recompute_over_incremental": round(redo / inc, 2), "verified": True}


# --- main -----------------------------------------------------------------------------


def parse_size(text: str) -> int:
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def git(*args: str) -> str:
    """Runs git in the checkout the engine was imported from (empty output outside one)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(engine_module))))
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False,
                          cwd=root).stdout.strip()


def engine_version() -> str:
    """The last commit of the imported txstream/engine/, `+dirty` when the working tree differs."""
    dirty = "+dirty" if git("status", "--porcelain", "txstream/engine/") else ""
    return git("log", "-1", "--format=%h %cd", "--date=format:%H:%M", "--", "txstream/engine/") \
        + dirty


def state_costs(spark: SparkSession, sizes: list[int], reps: int, workloads: list[str],
                parallelism: int) -> dict[str, Any]:
    cost: dict[str, Any] = {"parallelism": parallelism, "changes_per_transaction": 1_000,
                            "change_mix": "500 deletions of existing rows, 500 insertions",
                            "groupby": "a.groupby(g).reduce(count, sum(v)), S/10 groups",
                            "join": "a inner join b on k, b static with S rows, 1 match per row",
                            "timed_transactions": reps, "statistic": "median",
                            "sizes": {}}
    for size in sizes:
        cost["sizes"][str(size)] = {}
        for workload in workloads:
            cost["sizes"][str(size)][workload] = state_cost(spark, workload, size, reps,
                                                            parallelism)
            # Drops the finished engine's state frames, so Spark's cleaner frees their blocks.
            gc.collect()
    small, large = cost["sizes"][str(sizes[0])], cost["sizes"][str(sizes[-1])]
    for figure in ("incremental_s", "incremental_max_s", "recompute_s"):
        cost[f"ratio_{sizes[-1]}_over_{sizes[0]}_{figure}"] = {
            w: round(large[w][figure] / small[w][figure], 2) for w in workloads}
    return cost


def on_cluster(workers: int, gib: int) -> None:
    """This command again, as the driver (1 GB) of a standalone cluster of `workers` one-core
    workers of `gib` GiB each (`_ON_CLUSTER` tells the driver it is the one)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, os.pardir, "tests"))
    from support.spark_standalone import standalone_cluster

    executor = f"{gib * 1024 - 512}m"
    with tempfile.TemporaryDirectory() as workdir, standalone_cluster(
            Path(workdir), workers=workers, cores=1, memory=f"{gib}g",
            executor_memory=executor) as cluster:
        env = {**cluster.driver_env(), _ON_CLUSTER: "1"}  # SPARK_DRIVER_MEMORY 1g
        log(f"standalone cluster {cluster.master_url}: {workers} workers, executors {executor}")
        subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env,
                       check=True)


def machine_facts(spark: SparkSession, started: datetime, load_start: tuple[float, ...],
                  engine_start: str) -> dict[str, Any]:
    conf = spark.conf
    return {
        "cores": os.cpu_count(),
        "spark_version": spark.version,
        "spark_master": spark.sparkContext.master,
        "shuffle_partitions": conf.get("spark.sql.shuffle.partitions"),
        "adaptive": conf.get("spark.sql.adaptive.enabled"),
        "driver_memory": spark.sparkContext.getConf().get("spark.driver.memory"),
        "engine_at_start": engine_start,
        "engine_at_end": engine_version(),
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - _T0, 1),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", action="store_true", help="run the latency part")
    parser.add_argument("--throughput", action="store_true", help="run the throughput part")
    parser.add_argument("--state", action="store_true", help="run the state-size part")
    parser.add_argument("--quick", action="store_true",
                        help="state sizes 10k, 100k, 1M and a 100,000-event throughput run")
    parser.add_argument("--sizes", help="state sizes, e.g. 10k,1M,10M")
    parser.add_argument("--latency-sizes", default="20k,1M",
                        help="order events behind the latency runs' state")
    parser.add_argument("--latency-windows", type=int, default=8,
                        help="windows of 30 lone transactions per latency run, the first "
                             "included (the later half's p50 is the settled figure; --quick: "
                             "one window of 10)")
    parser.add_argument("--reps", type=int, default=5, help="timed transactions per size")
    parser.add_argument("--no-peer", action="store_true", help="skip the Pathway run")
    parser.add_argument("--state-workloads", default="groupby,join",
                        help="the state-size part's workloads")
    parser.add_argument("--parallelism", type=int, default=1,
                        help="the state-size part's engines' parallelism")
    parser.add_argument("--workers", type=int, default=0,
                        help="run on a Spark standalone cluster on 127.0.0.1 of this many "
                             "one-core workers (a 1 GB driver, parallelism = workers)")
    parser.add_argument("--worker-gb", type=int, default=8, help="each worker's memory, GiB")
    parser.add_argument("--scale", action="store_true",
                        help="instead: bench/scale.py (parallelism 1 vs 2, one vs two workers, "
                             "Flink), which takes the arguments after --scale")
    args, rest = parser.parse_known_args()
    if args.scale:  # driver processes of their own: nothing of this one is needed
        os.execv(sys.executable, [sys.executable, os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "scale.py"), *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.latency_windows < 1:
        parser.error("--latency-windows must be at least 1 (the first window is the headline)")
    if args.workers and not os.environ.get(_ON_CLUSTER):
        on_cluster(args.workers, args.worker_gb)
        return
    parts = {p for p in ("latency", "throughput", "state") if getattr(args, p)} \
        or {"latency", "throughput", "state"}
    sizes = sorted(parse_size(s) for s in args.sizes.split(",")) if args.sizes \
        else list(QUICK_SIZES if args.quick else FULL_SIZES)
    events_, keys = (100_000, 1_000) if args.quick else (1_000_000, 10_000)

    load_start = os.getloadavg()
    started = datetime.now(UTC)
    # The engine is imported once, at start: a run that straddles a commit measured the first.
    engine_start = engine_version()
    if "state" in parts and sizes[-1] > LOAD_BATCH_ROWS:
        # Tens of millions of rows of operator state and collected outputs.
        os.environ.setdefault("SPARK_DRIVER_MEMORY", "8g")
    spark = get_spark()
    log(f"spark {spark.version} {spark.sparkContext.master}")

    # Warm the JVM (class loading, JIT) so the first measured engine does not pay for it.
    throughput(spark, 2_000, 100, 4, [1])
    for workload in ("groupby", "join"):
        state_cost(spark, workload, 1_000, 1)
    log("warmed up")

    report: dict[str, Any] = {}
    if "latency" in parts:
        runs = [latency(spark, parse_size(s), 10 if args.quick else 30)
                for s in args.latency_sizes.split(",")]
        # Every size's first window before any settles: each is measured as it was before
        # windows existed, a few dozen transactions into the JVM's life of lone ones.
        for run in runs:
            run.settle(spark, 1 if args.quick else args.latency_windows)
        report["latency"] = [run.result for run in runs]
    if "throughput" in parts:
        report["throughput"] = throughput(spark, events_, keys, 100, [1, 10, 100])
        if not args.no_peer:
            peer = pathway_peer(events_, keys, 100)
            report["throughput"]["pathway"] = peer
            if "events_per_s" in peer:
                ours = report["throughput"]["runs"][-1]["events_per_s"]
                report["throughput"]["ratio_over_pathway_at_100_per_batch"] = \
                    round(ours / peer["events_per_s"], 2)
    if "state" in parts:
        report["state_cost"] = state_costs(spark, sizes, args.reps,
                                           args.state_workloads.split(","),
                                           args.workers or args.parallelism)
    report["machine"] = machine_facts(spark, started, load_start, engine_start)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
