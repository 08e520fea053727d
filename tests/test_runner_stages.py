"""The runner's stages without a broker, Spark or PostgreSQL: an input in memory, an engine that
passes its input through (or fails on a poisoned row, or counts its calls), a file sink and a
checkpoint store on the local disk. What is asserted is the runner's own rules:

* a batch's transactions are logged before the engine runs them, and delivered and committed
  in order, each committed only after the sinks have it;
* an `ExpressionError` is narrowed to its transaction: those before it are applied and
  delivered, the failing one is raised, nothing after it runs;
* under a backlog that holds a batch, compute waits for the batch to fill, at most the backlog
  wait (a clock the test moves);
* a warm-up step under way is cut short by a transaction to compute;
* once idle for `checkpoint_when_idle_s` (the test's clock), the last committed transaction is
  checkpointed, once.

No test sleeps: the input blocks in `poll` as Kafka's does, and the test waits on conditions."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from support.runner import Background

from txstream.changes import DIFF, TIME, Changes
from txstream.engine.errors import ExpressionError
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import SourceSpec
from txstream.schemas.tables import TableSchema
from txstream.service.checkpoint import CheckpointStore, PipelineIdentity
from txstream.service.checkpoint_storage import LocalStorage
from txstream.service.input_reports import InputReports
from txstream.service.runner import PipelineRunner
from txstream.sources.source_state import IngestStats, SourceState
from txstream.sources.transaction_batch import (
    Transaction,
    TransactionBatch,
    TransactionLogEntry,
)

SCHEMA = TableSchema.of({"id": "bigint", "v": "text"})
POISON = "poison"


class MemoryInput:
    """The runner's input (`txstream.service.input.Input`) in memory: the test adds
    transactions, `poll` hands out what was added, blocking up to its timeout as Kafka's does."""

    name = "memory"

    def __init__(self, state: SourceState, replay: Sequence[TransactionLogEntry],
                 reports: InputReports) -> None:
        assert not replay, "these tests start from scratch"
        self._added: deque[TransactionBatch] = deque()
        self._changed = threading.Condition()
        self._next = state.next_number
        self._stats = IngestStats()
        self.waiting = 0  # records "not read yet", as a broker's fetches would report them
        self.committed: list[int] = []
        self.polls = 0
        self.closed = False

    def add(self, *values: str) -> None:
        """One transaction per value, each inserting one row."""
        with self._changed:
            numbers = list(range(self._next, self._next + len(values)))
            self._next += len(values)
            table = pa.table({"id": pa.array(numbers, pa.int64()), "v": list(values),
                              TIME: pa.array(numbers, pa.int64()),
                              DIFF: pa.array([1] * len(values), pa.int64())})
            self._added.append(TransactionBatch.of(
                [Transaction(number=n, offsets={"t": {0: n}}) for n in numbers],
                {"s": Changes(table)}))
            self._changed.notify_all()

    def poll(self, timeout: float) -> TransactionBatch | None:
        with self._changed:
            self.polls += 1
            if not self._added:
                self._changed.wait(timeout)
            if not self._added:
                return None
            batch = self._added.popleft()
        self._stats = self._stats.model_copy(update={
            "events": self._stats.events + batch.rows,
            "transactions": self._stats.transactions + len(batch)})
        return batch

    @property
    def stats(self) -> IngestStats:
        return self._stats

    def commit(self, batch: TransactionBatch, commit_time: float, with_state: bool
               ) -> SourceState | None:
        self.committed.extend(t.number for t in batch.transactions)
        return self.state() if with_state else None

    def state(self) -> SourceState:
        last = self.committed[-1] if self.committed else 0
        return SourceState(next_number=last + 1, offsets={"t": {0: last}}, upsert_rows={})

    def read_to_end(self) -> bool:
        with self._changed:
            return not self._added and self.waiting == 0

    def waiting_records(self) -> int:
        return self.waiting

    def lag(self) -> int:
        return len(self._added)

    def close(self) -> None:
        self.closed = True


class PassThrough:
    """An engine whose one output `o` is its source `s` as is; it fails like a pipeline
    expression on a row whose `v` is `POISON`. It remembers the transactions of each call and
    what the transaction log held then."""

    def __init__(self, checkpoints: CheckpointStore) -> None:
        self.outputs = {"o": SimpleNamespace(schema=SCHEMA)}
        self.sources = {"s"}
        self.totals = SimpleNamespace(jobs=0, stages=0)
        self.index_bytes = 0
        self.nets_exactly = True
        self.uses_wall_clock = False
        self.late_rows: dict[str, int] = {}
        self.calls: list[list[int]] = []
        self.logged_at_call: list[int] = []
        self._checkpoints = checkpoints
        self._version = 0

    def process(self, changes: Mapping[str, Changes],
                wall_times: Mapping[int, datetime] | None = None) -> dict[str, Changes]:
        assert not wall_times, "the pipeline calls no now()"
        source = changes["s"]
        self.calls.append(sorted(set(source.times.to_pylist())))
        latest = self._checkpoints.latest()  # the log before it is deleted with older ones
        after = latest.transaction if latest is not None else 0
        self.logged_at_call.append(max(
            (e.number for e in self._checkpoints.logged_after(after)), default=after))
        if POISON in source.table.column("v").to_pylist():
            raise ExpressionError(f"o: v = {POISON!r} cannot be computed")
        self._version += 1
        return {"o": source}

    def version(self) -> int:
        return self._version

    def load_state(self, uri: str) -> None:
        raise AssertionError("these tests start from scratch")

    def save_state(self, uri: str, version: int | None) -> None:
        Path(uri).mkdir(parents=True, exist_ok=True)
        (Path(uri) / "version").write_text(str(version))


class Clock:
    """Monotonic seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Runner(Background):
    """A runner over a `MemoryInput` and a `PassThrough` engine into the file `out`, run in a
    thread."""

    def __init__(self, tmp_path: Path, *, clock: Callable[[], float] = time.monotonic,
                 warm_up: Callable[[], Any] | None = None, **settings: Any) -> None:
        self.out = tmp_path / "o.jsonl"
        self.config = PipelineConfig(
            pipeline="txstream.examples.orders:pipeline",
            sources=[SourceSpec(name="s", topic="t", schema=SCHEMA)],
            sinks=[SinkConfig.model_validate({"output": "o", "kind": "file",
                                              "path": str(self.out)})],
            kafka_bootstrap_servers="unused:9092", checkpoint_dir=str(tmp_path / "ck"),
            **{"warm_up_rows": 0, "backlog_wait_ms": 0, **settings})
        self.checkpoints = CheckpointStore(
            LocalStorage(Path(self.config.checkpoint_location)),
            PipelineIdentity(pipeline=self.config.pipeline, sources={"s": "t"}, outputs=["o"]))
        self.engine = PassThrough(self.checkpoints)
        inputs: list[MemoryInput] = []

        def open_input(*args: Any) -> MemoryInput:
            inputs.append(MemoryInput(*args))
            return inputs[0]

        runner = PipelineRunner(self.config, engine=self.engine,  # type: ignore[arg-type]
                                checkpoints=self.checkpoints, open_input=open_input,
                                warm_up=warm_up, clock=clock)
        super().__init__(runner)
        self.input = inputs[0]

    def failure(self) -> BaseException | None:
        """What ended the run, which ends by itself."""
        self._thread.join(30)
        assert not self._thread.is_alive(), "the run goes on"
        return self.error

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        assert not self._thread.is_alive(), "the run did not stop"
        self.runner.close()

    def checkpointed(self) -> tuple[int, int | None]:
        """How many checkpoints were written, and the newest one's transaction."""
        metrics = self.runner.metrics.checkpoint
        return metrics.checkpoints, metrics.last_transaction

    def written(self) -> list[tuple[int, str]]:
        """The (time, v) of every change the file sink holds, in its order."""
        if not self.out.exists():
            return []
        rows = [json.loads(line) for line in self.out.read_text().splitlines()]
        return [(row[TIME], row["v"]) for row in rows]


def test_batches_are_logged_before_compute_and_delivered_and_committed_in_order(
        tmp_path: Path) -> None:
    with Runner(tmp_path, batch_transactions=3) as run:
        for value in "abcdefgh":
            run.input.add(value)
        run.input.add("i", "j", "k", "l")  # one poll, more than a batch: split
        run.wait("12 committed", lambda: len(run.input.committed) == 12)
    assert run.input.committed == list(range(1, 13))
    assert run.written() == list(enumerate("abcdefghijkl", start=1))
    calls = run.engine.calls
    assert [n for call in calls for n in call] == list(range(1, 13))
    assert all(len(call) <= 3 for call in calls)
    assert all(logged >= call[-1] for call, logged in zip(calls, run.engine.logged_at_call,
                                                           strict=True)), \
        "every transaction is logged before the engine runs it"


def test_an_expression_error_stops_at_its_transaction_after_applying_those_before(
        tmp_path: Path) -> None:
    with Runner(tmp_path, batch_transactions=10) as run:
        run.input.add("a", "b", "c", POISON, "e")
        assert isinstance(run.failure(), ExpressionError)
    assert run.engine.calls[0] == [1, 2, 3, 4, 5], "first the batch whole"
    assert run.engine.calls[1:] == [[1], [2], [3], [4]], "then one by one, up to the failing one"
    assert run.written() == [(1, "a"), (2, "b"), (3, "c")]
    assert run.input.committed == [1, 2, 3]


def test_a_backlog_fills_the_batch_at_most_the_backlog_wait(tmp_path: Path) -> None:
    clock = Clock()
    with Runner(tmp_path, clock=clock, batch_transactions=4, backlog_wait_ms=5_000) as run:
        run.input.waiting = 10_000  # far more than the batch's missing transactions hold
        run.input.add("a")
        run.wait("the first transaction polled", lambda: run.input.stats.transactions == 1)
        run.input.add("b")
        run.wait("the second transaction polled", lambda: run.input.stats.transactions == 2)
        assert run.engine.calls == [], "the backlog fills the batch first"
        clock.now += 4.9
        run.input.add("c")
        run.wait("the third transaction polled", lambda: run.input.stats.transactions == 3)
        assert run.engine.calls == [], "still within the backlog wait"
        clock.now += 0.2  # the first ready one has waited 5.1 s
        run.wait("the batch computed", lambda: run.engine.calls != [])
        assert run.engine.calls == [[1, 2, 3]], "taken short of a full batch, once waited out"
        run.input.add("d", "e", "f", "g")
        run.wait("a full batch computed", lambda: len(run.engine.calls) == 2)
        assert run.engine.calls[1] == [4, 5, 6, 7], "a full batch is taken at once"


class BlockingWarmUp:
    """A warm-up whose first step runs until it is cancelled, as a Spark job does."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.cancelled = threading.Event()
        self.closed = False

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        self.began.set()
        assert self.cancelled.wait(30), "the step was never cancelled"
        raise StopIteration

    def cancel(self) -> None:
        self.cancelled.set()

    def close(self) -> None:
        self.closed = True

    @property
    def cut_short(self) -> bool:
        return self.cancelled.is_set()


def test_a_transaction_to_compute_cuts_a_warm_up_step_short(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    warm_up = BlockingWarmUp()
    with caplog.at_level("INFO", logger="txstream.service.idle_warm_up"), \
            Runner(tmp_path, warm_up=lambda: warm_up) as run:
        run.wait("the warm-up's step under way", warm_up.began.is_set)
        assert not warm_up.cancelled.is_set()
        run.input.add("a")
        run.wait("the transaction committed", lambda: run.input.committed == [1])
    assert warm_up.cancelled.is_set()
    assert run.engine.calls == [[1]]
    assert any("cut short by a batch to compute" in r.getMessage() for r in caplog.records)


def test_an_idle_pipeline_checkpoints_its_last_committed_transaction_once(
        tmp_path: Path) -> None:
    clock = Clock()
    with Runner(tmp_path, clock=clock, checkpoint_when_idle_s=2.0) as run:
        run.input.add("a", "b")
        run.wait("2 committed", lambda: run.input.committed == [1, 2])
        clock.now += 1.9
        run.input.add("c")
        run.wait("3 committed", lambda: run.input.committed == [1, 2, 3])
        clock.now += 1.9  # idle 1.9 s since #3, 3.8 s since #2
        run.wait("a few idle loops", lambda: run.input.polls >= 10)
        assert run.checkpointed() == (0, None), "idle for less than checkpoint_when_idle_s"
        clock.now += 0.2
        run.wait("the idle checkpoint", lambda: run.checkpointed() == (1, 3))
        clock.now += 60
        polls = run.input.polls
        run.wait("a few idle loops more", lambda: run.input.polls >= polls + 10)
        assert run.checkpointed() == (1, 3), "not again for the same transaction"
        run.input.add("d")
        run.wait("4 committed", lambda: run.input.committed == [1, 2, 3, 4])
        clock.now += 2.0
        run.wait("the next idle checkpoint", lambda: run.checkpointed() == (2, 4))
    assert not run.runner.checkpoint(), "a stop after it has nothing left to checkpoint"


def test_importing_the_runner_loads_neither_kafka_nor_spark() -> None:
    import subprocess
    import sys
    code = ("import sys, txstream.service.runner\n"
            "loaded = [m for m in ('pyspark', 'confluent_kafka') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True)
