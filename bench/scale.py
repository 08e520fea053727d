"""Scale benchmark (issue 28): does the engine's throughput grow with cores and executors?
Prints one JSON document (progress goes to stderr); `bench/engine.py --scale` runs it.

Two workloads, each in large batches (10 transactions of 10,000 events per Spark job):
- `orders`: the example pipeline (txstream/examples/orders.py: a join, two group-bys, a left
  join, a distinct) over `--events` order events of txstream/examples/order_events.py (10,000
  customers first, then orders created, updated and deleted);
- `groupby`: Pathway's workload, `--events` insertions, keys i mod 10,000, count and sum.

Each runs at parallelism 1 and 2 on `local[2]`, and on a Spark standalone cluster on
127.0.0.1 (tests/support/spark_standalone.py) of one worker of one core at parallelism 1 and
of two such workers at parallelism 2. Every run is a driver process of its own (one SparkContext per
process) that builds all its input first, runs the first batch untimed (planning, code
generation and the JVM's warm-up), then times `Engine.process` of every later batch: events/s
is the events of those batches over that time, from the first call to the last result
collected. `cpu_s` is the CPU time the run's processes took meanwhile (the driver, and on the
cluster its executors, with the Python workers of both; a process that ended meanwhile is not
counted), by kind of thread: JIT compilers, garbage collectors, task threads, the JVMs' other
threads (planning, scheduling, shuffles; and threads that ended), Python. `cores_busy` is their
sum over the wall time: the cores the run kept busy on average. A fresh JVM compiles for
minutes, which at P = 2 finds no idle core; and on two cores a run at P = 1 busy `cores_busy`
cores can go at most 2 / `cores_busy` times as fast at P = 2, if P = 2 costs at least as much
CPU for the same events (its exchanges add to it). Apache Flink runs the same workloads at
parallelism 1 and 2 (bench/flink_peer.py: PyFlink in a virtualenv of its own, Flink SQL in
streaming mode; its job start excluded), and with `--warm-s` on a warm JVM too
(`flink_warm_P1/P2`: the same job run untimed for as many seconds first, in the same JVM).

With `--warm-s S`, the local[2] runs and the cluster runs are also measured on warm JVMs
(`local2_warm_P1/P2`, `cluster_warm_1w/2w`): scratch engines run the same batches for S seconds
first, and the measured engine, new, builds its plans anew on JVMs (driver and executors) whose
JIT has compiled most of what a long-running service's have. Not all of it after a minute: at
P = 2 on local[2] the driver JVM's JIT still compiled 500-1,600 methods per 100,000-event batch
after 40 s of warm-up and 20-140 after 180 s (`cpu_s` shows its CPU time, `jit`).

Also lone 10-event transactions of the example pipeline (state of 20,000 order events) at
parallelism 1 and 2 on `local[2]`: p50 of `Engine.process`.

The machine is shared: compare figures of one run only; the load average is printed.

    .venv/bin/python bench/scale.py [--events 1000000] [--workloads orders,groupby]
        [--no-cluster] [--no-local] [--no-peer] [--warm-s 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Sibling scripts (proc_stat here, flink_peer in `main`), not a package.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_stat import Stat, read

HERE = Path(__file__).resolve().parent
TRANSACTION_EVENTS = 10_000
TRANSACTIONS_PER_JOB = 10
CUSTOMERS = 10_000
KEYS = 10_000
# Of each one-core worker's 2 GiB: at parallelism 1 a batch of the example pipeline runs every
# operator's hash tables in one task, which the tests' 512 MiB executors cannot hold
# (UNABLE_TO_ACQUIRE_MEMORY) at 100,000 events a batch.
EXECUTOR_MEMORY = "1536m"


def log(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


def _orders_batches(events: int) -> list[dict[str, Any]]:
    import pyarrow as pa

    from txstream.changes import consolidate
    from txstream.examples.order_events import as_changes
    from txstream.examples.order_events import events as order_events

    stream = order_events(random.Random(28), CUSTOMERS)
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    batches = []
    time_ = 1
    for _ in range(0, events, TRANSACTION_EVENTS * TRANSACTIONS_PER_JOB):
        parts: dict[str, list[Any]] = {}
        for _ in range(TRANSACTIONS_PER_JOB):
            txn = as_changes([next(stream) for _ in range(TRANSACTION_EVENTS)], rows, time_)
            for source, table in txn.items():
                parts.setdefault(source, []).append(table)
            time_ += 1
        batches.append({s: consolidate(pa.concat_tables(t), [c for c in t[0].column_names
                                                              if c not in ("time", "diff")])
                        for s, t in parts.items()})
    return batches


def _groupby_batches(events: int) -> list[dict[str, Any]]:
    import numpy as np
    import pyarrow as pa

    from txstream.changes import consolidate

    per_job = TRANSACTION_EVENTS * TRANSACTIONS_PER_JOB
    batches = []
    for lo in range(0, events, per_job):
        i = np.arange(lo, min(lo + per_job, events), dtype=np.int64)
        table = pa.table({"k": i % KEYS, "v": (i * 7919) % 1000,
                          "time": i // TRANSACTION_EVENTS + 1,
                          "diff": np.ones(len(i), dtype=np.int64)})
        batches.append({"events": consolidate(table, ["k", "v"])})
    return batches


def _pipeline(workload: str) -> Any:
    from txstream import Pipeline, TableSchema
    from txstream import reducers as r
    from txstream.examples.orders import pipeline

    if workload == "orders":
        return pipeline()
    p = Pipeline()
    events = p.source("events", TableSchema.of({"k": "bigint", "v": "bigint"}))
    p.output("sums", events.groupby("k").reduce(n=r.count(), s=r.sum("v")))
    return p


def run_one(workload: str, parallelism: int, events: int, warm_s: float = 0
            ) -> dict[str, Any]:
    """One measured run in this process (a driver of its own): see the module doc. With
    `warm_s`, scratch engines first run the same batches, one whole pass after another, until
    that many seconds have passed: the measured engine then runs on a JVM that has compiled
    what a long-running service's has (its own plans are still built anew)."""
    from txstream.engine import Engine
    from txstream.service.spark import get_spark

    started = time.perf_counter()
    spark = get_spark()
    spark_start_s = time.perf_counter() - started
    batches = (_orders_batches if workload == "orders" else _groupby_batches)(events)
    warming = time.perf_counter()
    while time.perf_counter() - warming < warm_s:
        scratch = Engine(_pipeline(workload), spark, parallelism=parallelism)
        for batch in batches:
            scratch.process(batch)
        del scratch
    warmed_s = time.perf_counter() - warming
    engine = Engine(_pipeline(workload), spark, parallelism=parallelism)
    engine.process(batches[0])
    timed = batches[1:]
    stages = []
    app_id = spark.sparkContext.applicationId
    cpu_before = _cpu_by_kind(app_id)
    start = time.perf_counter()
    for batch in timed:
        engine.process(batch)
        assert engine.last_batch is not None
        stages.append(engine.last_batch.stages)
    seconds = time.perf_counter() - start
    cpu_after = _cpu_by_kind(app_id)
    timed_events = sum(TRANSACTION_EVENTS * TRANSACTIONS_PER_JOB for _ in timed)
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
    return {"workload": workload, "parallelism": parallelism,
            "master": spark.sparkContext.master, "block_managers": executors,
            "events": timed_events, "seconds": round(seconds, 2),
            "events_per_s": round(timed_events / seconds),
            "stages_per_batch": max(stages), "spark_start_s": round(spark_start_s, 1),
            "warm_up_s": round(warmed_s, 1), **_cpu_report(cpu_before, cpu_after, seconds)}


# Thread names of a JVM, by kind: HotSpot's and Spark's own names, as Linux keeps them (their
# first 15 characters: "C2 CompilerThre", "Executor task l").
_THREAD_KINDS = (("jit", ("CompilerThre",)), ("gc", ("GC Thread", "G1 ")),
                 ("tasks", ("Executor task",)))


def _run_processes(app_id: str) -> list[int]:
    """The processes of this run on this machine: this driver and its descendants (its JVM,
    the Python workers that JVM starts), and on a standalone cluster of 127.0.0.1 the
    executors of application `app_id` and their descendants."""
    parents, roots = {}, {os.getpid()}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = Stat.of(entry / "stat").parent
                if app_id in read(entry / "cmdline"):
                    roots.add(int(entry.name))
            except OSError:  # the process ended
                continue
    found = set(roots)
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            return sorted(found)
        found |= more


@dataclass(frozen=True)
class _Usage:
    """CPU ticks so far of one process of a run: its live threads of a kind of
    `_THREAD_KINDS` (by thread id: kind, ticks), and its total, whose rest is of kind `rest`."""

    threads: dict[int, tuple[str, int]]
    total: int
    rest: str  # "jvm_other" for a JVM (planning, Py4J, shuffle, block manager), else "python"


def _cpu_by_kind(app_id: str) -> dict[tuple[int, int], _Usage] | None:
    """The CPU ticks so far of each of the run's processes (`_run_processes`), by pid and start
    time; from Linux's /proc, None elsewhere."""
    if not Path(f"/proc/{os.getpid()}/task").is_dir():
        return None
    found = {}
    for pid in _run_processes(app_id):
        threads = {}
        try:
            java = read(Path(f"/proc/{pid}/comm")).strip() == "java"
            for thread in Path(f"/proc/{pid}/task").iterdir() if java else ():
                try:
                    stat = Stat.of(thread / "stat")
                except OSError:  # the thread ended: its time is in the process's total
                    continue
                kind = next((k for k, marks in _THREAD_KINDS
                             if any(m in stat.name for m in marks)), None)
                if kind is not None:
                    threads[int(thread.name)] = (kind, stat.ticks)
            process = Stat.of(Path(f"/proc/{pid}/stat"))  # after its threads: the larger
        except OSError:  # the process ended
            continue
        found[pid, process.start] = _Usage(threads, process.ticks,
                                           "jvm_other" if java else "python")
    return found


def _cpu_report(before: dict[tuple[int, int], _Usage] | None,
                after: dict[tuple[int, int], _Usage] | None, seconds: float) -> dict[str, Any]:
    """`cpu_s`, the CPU seconds of each kind of thread between `before` and `after` (of the
    processes alive at the end: one that ended meanwhile is not counted; a thread of a kind
    that ended meanwhile counts as its process's rest), and `cores_busy`, their sum over the
    wall time `seconds`. On two cores, a run at P = 1 that keeps `cores_busy` cores busy can go
    at most 2 / `cores_busy` times as fast at P = 2, as long as P = 2 costs at least as much
    CPU for the same events."""
    if before is None or after is None:
        return {"cpu_s": None, "cores_busy": None}
    spent: Counter[str] = Counter()
    for process, now in after.items():
        was = before.get(process, _Usage({}, 0, now.rest))
        classified = 0
        for thread, (kind, ticks) in now.threads.items():
            used = ticks - was.threads.get(thread, (kind, 0))[1]
            spent[kind] += used
            classified += used
        spent[now.rest] += now.total - was.total - classified
    per_s = os.sysconf("SC_CLK_TCK")
    return {"cpu_s": {kind: round(t / per_s, 1) for kind, t in sorted(spent.items())},
            "cores_busy": round(sum(spent.values()) / per_s / seconds, 2)}


def lone_latency(parallelism: int, transactions: int = 30) -> dict[str, Any]:
    """Lone 10-event transactions of the example pipeline against the state of 20,000 order
    events, after ten untimed ones: p50 of `Engine.process` (planning and execution)."""
    import statistics

    from txstream.changes import consolidate
    from txstream.engine import Engine
    from txstream.examples.order_events import as_changes
    from txstream.examples.order_events import events as order_events
    from txstream.service.spark import get_spark

    spark = get_spark()
    engine = Engine(_pipeline("orders"), spark, parallelism=parallelism)
    stream = order_events(random.Random(11), 200)
    rows: dict[str, dict[int, dict[str, Any]]] = {}

    def process(events: int, time_: int) -> None:
        txn = as_changes([next(stream) for _ in range(events)], rows, time_)
        engine.process({s: consolidate(t, [c for c in t.column_names
                                           if c not in ("time", "diff")])
                        for s, t in txn.items()})

    for time_ in range(1, 3):
        process(10_000, time_)
    seconds, stages = [], []
    for i in range(10 + transactions):
        process(10, 3 + i)
        assert engine.last_batch is not None
        if i >= 10:
            seconds.append(engine.last_batch.planning_s + engine.last_batch.execution_s)
            stages.append(engine.last_batch.stages)
    return {"workload": "lone_transaction", "parallelism": parallelism,
            "p50_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3),
            "stages_per_batch": max(stages)}


def _driver(workload: str, parallelism: int, events: int, env: dict[str, str],
            warm_s: float = 0) -> dict[str, Any]:
    """`run_one` in a driver process of its own, with `env` (its SPARK_MASTER)."""
    command = [sys.executable, __file__, "--run", workload, "--parallelism", str(parallelism),
               "--events", str(events), "--warm-s", str(warm_s)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        return {"workload": workload, "parallelism": parallelism,
                "error": result.stderr.strip().splitlines()[-1:]}
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    log(f"{workload} P={parallelism}: {answer}")
    return answer


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if "events_per_s" not in a or "events_per_s" not in b:
        return None
    return round(a["events_per_s"] / b["events_per_s"], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--workloads", default="orders,groupby")
    parser.add_argument("--no-cluster", action="store_true", help="skip the standalone runs")
    parser.add_argument("--no-local", action="store_true",
                        help="skip the local[2] runs and the lone transactions")
    parser.add_argument("--no-peer", action="store_true", help="skip the Flink runs")
    parser.add_argument("--warm-s", type=float, default=0,
                        help="also measure on warm JVMs: scratch engines run the workload "
                             "for this many seconds first (local2_warm_P1/P2, cluster_warm_1w/2w)"
                             ", and so does Flink's job (flink_warm_P1/P2)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a driver process: see `_driver`
    parser.add_argument("--parallelism", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(lone_latency(args.parallelism) if args.run == "latency"
                         else run_one(args.run, args.parallelism, args.events, args.warm_s)))
        return

    load_start = os.getloadavg()
    report: dict[str, Any] = {"events": args.events,
                              "events_per_transaction": TRANSACTION_EVENTS,
                              "transactions_per_job": TRANSACTIONS_PER_JOB}
    workloads = args.workloads.split(",")
    local_env = {**os.environ, "SPARK_MASTER": "local[2]"}
    for workload in workloads:
        runs = {} if args.no_local else {
            f"local2_P{p}": _driver(workload, p, args.events, local_env) for p in (1, 2)}
        report[workload] = {"runs": runs, "local2_P2_over_P1": _ratio(
            runs.get("local2_P2", {}), runs.get("local2_P1", {}))}
        if args.warm_s and not args.no_local:
            for p in (1, 2):
                runs[f"local2_warm_P{p}"] = _driver(workload, p, args.events, local_env,
                                                    args.warm_s)
            report[workload]["local2_warm_P2_over_P1"] = _ratio(runs["local2_warm_P2"],
                                                                runs["local2_warm_P1"])
    if not args.no_local:
        report["lone_transaction"] = {f"local2_P{p}": _driver("latency", p, 0, local_env)
                                      for p in (1, 2)}
    if not args.no_cluster:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from support.spark_standalone import standalone_cluster

        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as workdir, \
                    standalone_cluster(Path(workdir), workers=workers, cores=1, memory="2g",
                                       executor_memory=EXECUTOR_MEMORY) as cluster:
                for workload in workloads:
                    report[workload]["runs"][f"cluster_{workers}w"] = _driver(
                        workload, workers, args.events, cluster.driver_env())
                    if args.warm_s:
                        report[workload]["runs"][f"cluster_warm_{workers}w"] = _driver(
                            workload, workers, args.events, cluster.driver_env(), args.warm_s)
        for workload in workloads:
            runs = report[workload]["runs"]
            for kind in ("cluster", "cluster_warm") if args.warm_s else ("cluster",):
                report[workload][f"{kind}_2w_over_1w"] = _ratio(runs[f"{kind}_2w"],
                                                                runs[f"{kind}_1w"])
    if not args.no_peer:
        from flink_peer import run_flink

        for workload in workloads:
            for p in (1, 2):
                kinds = [(f"P{p}", 0.0)] + ([(f"warm_P{p}", args.warm_s)] if args.warm_s else [])
                for kind, warm_s in kinds:
                    peer = run_flink(workload, p, args.events, warm_s)
                    report[workload]["runs"][f"flink_{kind}"] = peer
                    report[workload][f"local2_{kind}_over_flink_{kind}"] = _ratio(
                        report[workload]["runs"].get(f"local2_{kind}", {}), peer)
    report["load_average"] = {"start": load_start, "end": os.getloadavg()}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
