"""An executor's loss is survived: kill -9 executor JVMs of a running pipeline, twice.

A real standalone cluster of two workers of one core each (support/spark_standalone.py) runs
the example pipeline at parallelism 2 with every state block replicated on both executors
(`state_replicas=2`). The driver is this file run as a script (the test session already holds a
local SparkContext): it processes a change log batch by batch, writes every output change and,
after each batch, its progress. Runs of `INDEX_ROWS` rows or more are indexed: their files,
written by the executors (`txstream.engine.run_index`), outlive them, and lookups after each
loss search them from the replacement. The test kills an executor mid-stream, waits until
the worker's replacement has registered and a batch has copied the state to it again (the
engine does so after a loss), kills the other one, and then checks that the driver went on
without a failed batch and that its output is the from-scratch one: every transaction's
changes exactly once.

The two processes meet through files: the driver starts batch n only once `allowed` says n (so
it cannot run out of batches while the test waits for a replacement executor) and reports each
finished batch in `progress`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from support.replay_events import generate_events
from support.spark_standalone import StandaloneCluster, standalone_cluster

from txstream.engine import Engine
from txstream.engine.replicas import fewest_copies
from txstream.examples.orders import pipeline
from txstream.service.replay import change_lines, read_batches, replay
from txstream.service.spark import get_spark

WORKERS = 2  # of one core each: one executor each
TRANSACTIONS = 200
BATCH_TRANSACTIONS = 10  # 20 batches, each a job of many stages at parallelism 2
FIRST_KILL = 2  # killed once this many batches are done, while the next runs
INDEX_ROWS = 50  # the largest runs of the later batches hold more
# Seconds for any one step: the first batch alone (plans, code generation, cold JVMs) takes
# about a minute on a loaded machine of two cores.
WAIT = 180.0


def _write_json(path: Path, value: object) -> None:
    """Replace `path` at once: the other process never reads half a file."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    partial.replace(path)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


# --- the driver (this file run as a script) ----------------------------------------------------

def drive(events: Path, output: Path, progress: Path, allowed: Path) -> None:
    """Run the change log through the example pipeline at parallelism 2 on `SPARK_MASTER`,
    every batch spread over both executors (`spread_rows=0`) and every state block on both.
    Prints each batch's start and end (wall clock, comparable with the test's kill times)."""
    spark = get_spark(app_name="txstream-executor-loss")
    # Warnings too: the lost executors and the retried tasks and stages are the point.
    spark.sparkContext.setLogLevel("WARN")
    app_id = spark.sparkContext.applicationId
    example = pipeline()
    engine = Engine(example, spark, parallelism=2, state_replicas=2, spread_rows=0,
                    index_rows=INDEX_ROWS)
    batches: list[tuple[float, float]] = []
    indexes: list[int] = []  # indexed runs each batch's lookups searched
    _write_json(progress, {"app_id": app_id, "batches": 0})
    with events.open() as log, output.open("w") as out:
        for n, batch in enumerate(read_batches(log, example, BATCH_TRANSACTIONS), 1):
            deadline = time.monotonic() + 2 * WAIT
            while (_read_json(allowed) or 0) < n:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"batch {n} not allowed within {2 * WAIT:.0f} s")
                time.sleep(0.05)
            started = time.time()
            results = engine.process(batch.changes, batch.wall_times)
            batches.append((started, time.time()))
            assert engine.last_batch is not None
            indexes.append(engine.last_batch.indexes)
            out.writelines(line + "\n" for name in results
                           for _, line in change_lines(name, results[name]))
            out.flush()
            _write_json(progress, {"app_id": app_id, "batches": n,
                                   "replications": engine.state_replications})
    # Where the driver's block manager master says the last version's blocks are.
    runs = [run.rdd for _, state_runs in engine.version().states.values() for run in state_runs]
    print(json.dumps({"app_id": app_id, "batches": batches, "indexes": indexes,
                      "index_rows": engine.index_rows,
                      "fewest_copies": min(fewest_copies(spark, runs))}))
    spark.stop()


# --- the test ----------------------------------------------------------------------------------

def _lines(path: Path) -> Counter[str]:
    """Output lines as a multiset, canonical: the order of a transaction's changes is not part
    of the contract."""
    return Counter(json.dumps(json.loads(line), sort_keys=True)
                   for line in path.read_text().splitlines() if line.strip())


class _Run:
    """The driver subprocess and the files it shares with the test."""

    def __init__(self, cluster: StandaloneCluster, workdir: Path, events: Path) -> None:
        self.cluster = cluster
        self.output = workdir / "cluster.jsonl"
        self.progress = workdir / "progress.json"
        self.allowed = workdir / "allowed.json"
        self.stdout = workdir / "driver.out"
        self.stderr = workdir / "driver.err"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--events", str(events), "--output",
                 str(self.output), "--progress", str(self.progress), "--allowed",
                 str(self.allowed)],
                env=cluster.driver_env(), stdout=out, stderr=err, start_new_session=True)

    def logs(self) -> str:
        err = self.stderr.read_text(errors="replace").splitlines()[-60:]
        return "--- driver stderr\n" + "\n".join(err) + "\n" + self.cluster.log_tail()

    def batches_done(self) -> int:
        return int((_read_json(self.progress) or {}).get("batches", -1))

    def replications(self) -> int:
        """The times the engine copied runs found on fewer than two executors again."""
        return int((_read_json(self.progress) or {}).get("replications", 0))

    def app_id(self) -> str:
        return str(_read_json(self.progress)["app_id"])

    def executors(self) -> dict[str, int]:
        return self.cluster.executors(self.app_id())

    def allow(self, batches: int) -> None:
        _write_json(self.allowed, batches)

    def wait(self, what: str, done: Callable[[], bool], timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.proc.poll() is not None:
                pytest.fail(f"the driver exited ({self.proc.returncode}) while waiting for "
                            f"{what}\n{self.logs()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _around(kill: float, batches: list[tuple[float, float]]) -> dict[str, Any]:
    """How the batches around a kill went: the batch running then (or the next to start), its
    time from the kill to its end, and the durations of the batches before and after."""
    hit = next(i for i, (_, end) in enumerate(batches) if end > kill)
    durations = [end - start for start, end in batches]
    return {"batch": hit + 1,
            "kill_to_caught_up_s": round(batches[hit][1] - kill, 2),
            "batch_s": round(durations[hit], 2),
            "median_before_s": round(statistics.median(durations[max(hit - 5, 0):hit]), 2),
            "next_s": [round(d, 2) for d in durations[hit + 1:hit + 4]]}


def test_executor_loss_is_survived(spark: SparkSession, tmp_path: Path) -> None:
    """Two executors, one killed mid-stream; once the worker has replaced it, the other killed.
    No batch fails, and the output is every transaction's changes exactly once."""
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n"
                              for e in generate_events(seed=28, transactions=TRANSACTIONS)))
    started = time.monotonic()
    with standalone_cluster(tmp_path / "cluster", workers=WORKERS, cores=1) as cluster:
        run = _Run(cluster, tmp_path, events)
        try:
            kills: list[dict[str, Any]] = []

            def kill(victim: str) -> None:
                kills.append({"executor": victim, "at": time.time()})
                cluster.kill_executor(run.app_id(), victim)

            run.allow(FIRST_KILL + 1)
            run.wait(f"{WORKERS} executors and the first batches",
                     lambda: run.batches_done() >= FIRST_KILL and len(run.executors()) == WORKERS)
            first = run.executors()
            # The older executor ids hold the state of the first batches.
            kill(min(first, key=int))
            run.wait("replacement executor",
                     lambda: len(run.executors()) == WORKERS and set(run.executors()) != set(first))
            # Batch by batch until one found the replacement registered (its JVM takes seconds
            # to start and register) and copied the state to it again (the engine checks each
            # block's copies before and after every batch). A second loss before that would
            # find blocks with no copy anywhere.
            for _ in range(TRANSACTIONS // BATCH_TRANSACTIONS):
                done = run.batches_done()
                run.allow(done + 1)
                run.wait(f"batch {done + 1}", lambda done=done: run.batches_done() > done)
                if run.replications() >= 1:
                    break
            else:
                pytest.fail(f"the state was never copied to the replacement\n{run.logs()}")
            # The survivor of the first kill: the only one holding the first batches' blocks
            # unless they were copied to the replacement.
            kill(min(run.executors(), key=int))
            run.allow(TRANSACTIONS // BATCH_TRANSACTIONS)
            try:
                run.proc.wait(timeout=2 * WAIT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the driver did not finish within {2 * WAIT:.0f} s\n{run.logs()}")
            assert run.proc.returncode == 0, f"the driver failed\n{run.logs()}"
        finally:
            run.stop()
    report = json.loads(run.stdout.read_text().splitlines()[-1])
    batches = [tuple(b) for b in report["batches"]]
    assert len(batches) == TRANSACTIONS // BATCH_TRANSACTIONS
    assert report["fewest_copies"] == WORKERS, "a state block ended on one executor only"
    # Indexes stayed on (an unreadable file turns them off) and were searched after both kills.
    assert report["index_rows"] == INDEX_ROWS and report["indexes"][-1] > 0, report["indexes"]
    summary = {"kills": [{"executor": k["executor"], **_around(k["at"], batches)} for k in kills],
               "median_batch_s": round(statistics.median(e - s for s, e in batches), 2),
               "test_s": round(time.monotonic() - started, 1)}
    print(json.dumps(summary))

    # From scratch: the whole log as one batch in local mode at parallelism 1.
    reference = tmp_path / "reference.jsonl"
    replay(pipeline(), spark, events, reference, batch_transactions=TRANSACTIONS)
    got, want = _lines(run.output), _lines(reference)
    assert want, "the reference produced no output"
    assert got == want, (f"missing: {list((want - got).elements())[:5]}\n"
                         f"unexpected or repeated: {list((got - want).elements())[:5]}")


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(description=drive.__doc__)
    for name in ("events", "output", "progress", "allowed"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    args = parser.parse_args()
    drive(args.events, args.output, args.progress, args.allowed)
