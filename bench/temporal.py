"""Event-time windows through the engine: state that stays bounded, and the speed of getting it.

Workload: page views over a simulated day, `--events` of them (default 10M) from `--users`
users (default 100,000), event times rising with the stream (the day spread evenly) and
`--late` of them (default 1%) 2 to 30 minutes behind; transactions of `--per-transaction`
events (default 10,000), `--per-batch` transactions per engine call (default 10, as under a
backlog). Two pipelines, each on a fresh engine, each a per-user count in tumbling one-minute
windows (`windowby("ts", window=tumbling(1 min), instance="user_id").reduce(views=count())`):

* `exactly_once`: with `exactly_once_behavior()`, and the late rows' table as an output too;
* `no_behavior`: the same windows without a behavior (today's group-by semantics);
* `sessions`: per-user sessions of views less than 5 minutes apart
  (`window=session(max_gap=5 min)`) with `exactly_once_behavior()`: each session counted once,
  when the clock passes its last view plus 5 minutes, and its rows forgotten then.

Measured per pipeline: events/s through the engine (Arrow in, consolidated changes out, the
events generated before the clock starts); after the first `--first` events (default 1M) and
at the end: the rows every state holds (`Engine.state_rows`) and the JVM's heap in use after a
full GC, Python's then the JVM's (local mode: driver and executor are one JVM), neither
timed. Checked, with numpy:
the integrated output equals the windows' counts from scratch under the clock rule (exactly
once: the windows the clock has closed, without the rows late by the clock before their
transaction; without a behavior: every window; sessions: the closed sessions of the views on
time, a view late when its time is at or below the clock before its transaction), and the late
rows counted (`Engine.late_rows`) are those numpy finds late.

Pathway 0.33 runs the `exactly_once` pipeline on the same views in the same run
(bench/peers/pathway_windows.py, in its own virtualenv; one Pathway time per transaction, fed
from Python as bench/peers/pathway_groupby.py's input is), its integrated output checked against
the same recompute; `pathway_ratio` is txstream's events/s over Pathway's. Pathway ignores
behaviors on session windows, so it has no run like `sessions`.

Apache Flink 2.3 runs the same views in the same run (bench/flink_peer.py, PyFlink in its own
virtualenv, parallelism 1, a cold JVM): `exactly_once` as a `TUMBLE` window table-valued
function and `sessions` as a `SESSION` one, per user, counted, with the watermark at the
largest event time so far (a window emitted once, when it passes the window's end; a view
behind it dropped), read from CSV files and written to a blackhole sink; timed from its first
task running to the job's end, as bench/peers/flink_workloads.py says. Its output is not
checked (its watermark moves every 200 ms of processing, not per transaction, so which views
it finds late differs). `flink_ratio` is txstream's events/s over Flink's.

Exactly-once windows Kafka to PostgreSQL, as services, beside Pathway's (a stream of its own,
whose late views are an hour or more behind): bench/temporal_end_to_end.py.

Prints one JSON object; progress on stderr.

    .venv/bin/python bench/temporal.py [--events 10000000] [--first 1000000] [--users 100000]
        [--late 0.01] [--per-transaction 10000] [--per-batch 10]
        [--only exactly_once,no_behavior,sessions]
        [--no-peer] [--no-flink]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine, Pipeline
from txstream.engine import reducers as r
from txstream.engine import temporal as t
from txstream.schemas.tables import TableSchema
from txstream.service.spark import get_spark

VIEWS = TableSchema.of({"view_id": "bigint", "user_id": "bigint", "ts": "timestamp"},
                       primary_key=["view_id"])
DAY = datetime(2026, 12, 1, tzinfo=UTC)
MINUTE_US = 60_000_000
DAY_US = 86_400_000_000
GAP_US = 5 * MINUTE_US  # the sessions' max_gap


def log(message: str) -> None:
    print(f"[temporal {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def page_views(events: int, users: int, late: float, seed: int = 1) -> dict[str, np.ndarray]:
    """`view_id`, `user_id` and `ts` (microseconds since the epoch) of the day's views."""
    rng = np.random.default_rng(seed)
    ids = np.arange(events, dtype=np.int64)
    start = int((DAY - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    ts = start + ids * (DAY_US // events) + rng.integers(0, 1_000_000, events)
    behind = rng.random(events) < late
    ts[behind] -= rng.integers(2 * MINUTE_US, 30 * MINUTE_US, int(behind.sum()))
    return {"view_id": ids, "user_id": rng.integers(0, users, events), "ts": ts}


def pipeline(name: str) -> Pipeline:
    """The case `name`'s pipeline (see the module doc): its counts are the output `per_window`."""
    p = Pipeline()
    views = p.source("views", VIEWS)
    window = (t.session(max_gap=timedelta(microseconds=GAP_US)) if name == "sessions"
              else t.tumbling(timedelta(minutes=1)))
    behavior = None if name == "no_behavior" else t.exactly_once_behavior()
    grouped = views.windowby("ts", window=window, instance="user_id", behavior=behavior)
    p.output("per_window", grouped.reduce(views=r.count()))
    if behavior is not None:
        p.output("late_views", grouped.late_rows())
    return p


def heap_mb(spark: SparkSession) -> float:
    """The JVM's heap in use once its garbage is collected, in MiB. Python's collector runs
    first: it frees the JVM objects its reference cycles pin (`txstream.engine.java_garbage`).
    Then the JVM's, again each second until the figure stops falling (at most four times):
    Spark's context cleaner drops the cached blocks of the state versions a collection found
    unreachable on a thread of its own, after that collection, so a single one still counts
    them (sessions, 3M views: 285, then 248, then 102 MB)."""
    gc.collect()
    jvm = spark.sparkContext._jvm
    runtime = jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
    used = float("inf")
    for collection in range(4):
        if collection:
            time.sleep(1)
        jvm.java.lang.System.gc()  # type: ignore[union-attr]
        now = (runtime.totalMemory() - runtime.freeMemory()) / 2**20
        if now > 0.99 * used:
            break
        used = now
    return round(min(used, now), 1)


def expected(views: dict[str, np.ndarray], transaction: np.ndarray, name: str
             ) -> tuple[dict[tuple[int, int], int], int]:
    """The integrated output, {(user_id, window start in us): views}, and the late rows:
    numpy's own account of the clock rule (the clock before a transaction is the largest event
    time of the transactions before it; exactly once: a row is late when its window ends at or
    below it, and a window is shown once the clock reaches its end; sessions: a row is late
    when its time is at or below it, and a session is shown once the clock reaches its last
    time plus the gap)."""
    ts, users = views["ts"], views["user_id"]
    count = int(transaction.max()) + 1
    peak = np.full(count, np.iinfo(np.int64).min)
    np.maximum.at(peak, transaction, ts)
    after = np.maximum.accumulate(peak)
    before = np.concatenate([[np.iinfo(np.int64).min], after[:-1]])[transaction]
    if name == "sessions":
        return _sessions(users, ts, ts > before, after[-1]), int((ts <= before).sum())
    start = ts - np.mod(ts - _origin_us(), MINUTE_US)
    keep = np.ones(len(ts), dtype=bool)
    late = 0
    if name == "exactly_once":
        on_time = start + MINUTE_US > before
        late = int((~on_time).sum())
        keep = on_time & (start + MINUTE_US <= after[-1])
    pairs, counts = np.unique(np.stack([users[keep], start[keep]]), axis=1, return_counts=True)
    return {(int(u), int(s)): int(c) for (u, s), c in zip(pairs.T, counts, strict=True)}, late


def _sessions(users: np.ndarray, ts: np.ndarray, on_time: np.ndarray, clock: int
              ) -> dict[tuple[int, int], int]:
    """{(user_id, session start): views} of the sessions of the views `on_time` that the final
    `clock` has closed (none on time can join them any more)."""
    order = np.lexsort((ts[on_time], users[on_time]))
    u, t_ = users[on_time][order], ts[on_time][order]
    new = np.ones(len(u), dtype=bool)
    new[1:] = (u[1:] != u[:-1]) | (t_[1:] - t_[:-1] >= GAP_US)
    session = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(u)) - 1
    views = np.bincount(session)
    closed = t_[last] + GAP_US <= clock
    return {(int(u[f]), int(t_[f])): int(n)
            for f, n, c in zip(first, views, closed, strict=True) if c}


def _origin_us() -> int:
    return int((datetime(1973, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC))
               / timedelta(microseconds=1))


def integrated(outputs: list[pa.Table]) -> dict[tuple[int, int], int]:
    """The output's changes summed into its rows: {(user_id, window start in us): views} (a
    window's start names it among its user's, a session's too)."""
    rows: dict[tuple[int, int, int], int] = {}
    for table in outputs:
        starts = pc.cast(table["window_start"], pa.int64()).to_pylist()
        for user, begin, n, diff in zip(table["user_id"].to_pylist(), starts,
                                        table["views"].to_pylist(), table[DIFF].to_pylist(),
                                        strict=True):
            rows[(user, begin, n)] = rows.get((user, begin, n), 0) + diff
    got: dict[tuple[int, int], int] = {}
    for (user, begin, n), weight in rows.items():
        if weight:
            assert weight == 1 and (user, begin) not in got, "one row per window"
            got[(user, begin)] = n
    return got


PEER = Path(__file__).with_name("peers") / "pathway_windows.py"


def pathway_peer(views: dict[str, np.ndarray], transaction: np.ndarray) -> dict[str, Any]:
    """The exactly-once pipeline run by Pathway on the same views, its output checked."""
    log("the same views through Pathway")
    with tempfile.TemporaryDirectory() as work:
        source, target = Path(work) / "views.npz", Path(work) / "out.npz"
        np.savez(source, transaction=transaction, **views)
        done = subprocess.run([sys.executable, str(PEER), str(source), str(target)],
                              capture_output=True, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"peer": "pathway", "skipped": f"exit {done.returncode}: "
                                                  f"{done.stderr[-500:]}"}
        result = json.loads(lines[-1])
        if "skipped" in result:
            return result
        out = np.load(target)
        got = {(int(u), int(w)): int(n) for u, w, n in zip(
            out["user_id"], out["window_start"], out["views"], strict=True)}
    want, _ = expected(views, transaction, "exactly_once")
    assert got == want, f"pathway: {len(got)} windows, {len(want)} expected"
    return {**result, "verified": True}


def flink_peer(views: dict[str, np.ndarray], name: str) -> dict[str, Any]:
    """The case `name` (`exactly_once` or `sessions`) run by Flink on the same views."""
    from flink_peer import run_flink, write_views

    workload = "sessions" if name == "sessions" else "windows"
    log(f"the same views through Flink ({workload})")
    return run_flink(workload, 1, len(views["ts"]),
                     write=partial(write_views, user_id=views["user_id"], ts_us=views["ts"]))


def transactions_of(events: int, per_transaction: int) -> np.ndarray:
    return np.arange(events, dtype=np.int64) // per_transaction + 1


def run(spark: SparkSession, name: str, views: dict[str, np.ndarray], args: argparse.Namespace
        ) -> dict[str, Any]:
    engine = Engine(pipeline(name), spark)
    events = len(views["ts"])
    transaction = transactions_of(events, args.per_transaction)
    table = pa.table({"view_id": views["view_id"], "user_id": views["user_id"],
                      "ts": pa.array(views["ts"], pa.timestamp("us", tz="UTC")),
                      TIME: transaction, DIFF: np.ones(events, dtype=np.int64)},
                     schema=VIEWS.arrow_schema(with_changes=True))
    rows = args.per_transaction * args.per_batch
    outputs: list[pa.Table] = []
    samples = []
    computing = 0.0
    done = 0
    for lo in range(0, events, rows):
        chunk = table.slice(lo, rows)
        started = time.perf_counter()
        out = engine.process({"views": Changes(chunk)})
        computing += time.perf_counter() - started
        outputs.append(out["per_window"].table)
        done += chunk.num_rows
        if done in (min(args.first, events), events):
            samples.append(sample(spark, engine, name, done, computing))
    want, late = expected(views, transaction, name)
    got = integrated(outputs)
    assert got == want, f"{name}: {len(got)} windows, {len(want)} expected"
    assert sum(engine.late_rows.values()) == late, (engine.late_rows, late)
    return {"events": events, "seconds": round(computing, 2),
            "events_per_s": round(events / computing), "windows_out": len(got),
            "late_rows": late, **growth(samples), "verified": True}


def sample(spark: SparkSession, engine: Engine, name: str, done: int, computing: float
           ) -> dict[str, Any]:
    """The rows every state holds and the heap after a full GC, `done` events in."""
    states = engine.state_rows()
    log(f"{name}: {done:,} events, {sum(states.values()):,} state rows, "
        f"{done / computing:,.0f} events/s")
    return {"events": done, "state_rows": sum(states.values()), "by_state": states,
            "jvm_heap_mb_after_gc": heap_mb(spark), "events_per_s_so_far": round(done / computing)}


def growth(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The samples, and the last one's state rows and heap over the first one's."""
    first, last = samples[0], samples[-1]
    return {"samples": samples,
            "state_rows_growth": round(last["state_rows"] / max(first["state_rows"], 1), 3),
            "heap_growth": round(last["jvm_heap_mb_after_gc"]
                                 / first["jvm_heap_mb_after_gc"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--first", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--late", type=float, default=0.01)
    parser.add_argument("--per-transaction", type=int, default=10_000)
    parser.add_argument("--per-batch", type=int, default=10)
    parser.add_argument("--only", default="exactly_once,no_behavior")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-flink", action="store_true")
    args = parser.parse_args()
    views = page_views(args.events, args.users, args.late)
    spark = get_spark()
    results: dict[str, Any] = {name: run(spark, name, views, args)
                               for name in args.only.split(",")}
    if not args.no_peer:
        peer = pathway_peer(views, transactions_of(args.events, args.per_transaction))
        results["pathway"] = peer
        if "events_per_s" in peer and "exactly_once" in results:
            results["pathway_ratio"] = round(results["exactly_once"]["events_per_s"]
                                             / peer["events_per_s"], 2)
    if not args.no_flink:
        for name in ("exactly_once", "sessions"):
            if name in results:
                peer = flink_peer(views, name)
                results[f"flink_{name}"] = peer
                if "events_per_s" in peer:
                    results[f"flink_{name}_ratio"] = round(
                        results[name]["events_per_s"] / peer["events_per_s"], 2)
    shown = {k: v for k, v in vars(args).items() if k not in ("only", "no_peer", "no_flink")}
    print(json.dumps({"workload": shown, "date": datetime.now(UTC).isoformat(timespec="seconds"),
                      **results}, indent=1))


if __name__ == "__main__":
    main()
