"""The plumbing between the runner's stages: bounded queues and signals (`Stages`), retrying
an unavailable dependency (`Retrying`), and fault injection for the crash tests
(`CrashPoints`). What the stages do is in `txstream.service.runner`."""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from txstream.service.checkpoint_storage import CheckpointStorageError
from txstream.sinks.sink import SinkWriteError
from txstream.sources.kafka_source import KafkaSourceError
from txstream.sources.source_state import SourceState
from txstream.sources.transaction_batch import TransactionBatch

if TYPE_CHECKING:
    from txstream.changes import Changes
    from txstream.engine import EngineVersion
    from txstream.service.health import Readiness
    from txstream.service.input import Input

# Seconds, monotonic: what `Stages` measures the backlog wait with (a test hands in its own).
Clock = Callable[[], float]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Fault injection for the crash tests: `TXSTREAM_CRASH_AT=<point>:<n>` kills the process with
# SIGKILL the n-th time it reaches <point>: `log` (batch logged, nothing written), `sink_write`
# (the first sink of a batch written, the others not), `commit` (sinks written, offsets not
# committed), `checkpoint` (checkpoint data written, manifest not), `checkpointed` (right
# after a checkpoint).
CRASH_ENV = "TXSTREAM_CRASH_AT"


class ShutdownRequested(Exception):
    """A stop was requested while a stage waited for an unavailable dependency: the current
    batch is abandoned (recovery replays it)."""


class CrashPoints:
    """The points of `CRASH_ENV`'s `spec` (None: no crash)."""

    def __init__(self, spec: str | None) -> None:
        self._point, self._countdown = None, 0
        if spec:
            point, _, n = spec.partition(":")
            self._point, self._countdown = point, int(n or "1")

    def reached(self, point: str) -> None:
        if point == self._point:
            self._countdown -= 1
            if self._countdown == 0:
                log.warning("%s=%s: killing the process", CRASH_ENV, os.environ.get(CRASH_ENV))
                os.kill(os.getpid(), signal.SIGKILL)


class Retrying:
    """Runs work that needs a dependency, retrying with exponential backoff (from `initial_s`
    up to `max_s`) while it is unavailable; the service is not ready meanwhile."""

    def __init__(self, readiness: Readiness, stop: threading.Event, initial_s: float,
                 max_s: float) -> None:
        self._readiness = readiness
        self._stop = stop
        self._initial_s = initial_s
        self._max_s = max_s

    def __call__(self, dependency: str, work: Callable[[], _T]) -> _T:
        """`work()`, retried while `dependency` is unavailable (a SinkWriteError,
        KafkaSourceError or CheckpointStorageError); ShutdownRequested if a stop is requested
        while waiting."""
        delay = self._initial_s
        while True:
            try:
                result = work()
            except (SinkWriteError, KafkaSourceError, CheckpointStorageError) as exc:
                self._readiness.fail(dependency, str(exc).splitlines()[0])
                log.warning("%s unavailable, retrying in %.1fs: %s", dependency, delay, exc)
                if self._stop.wait(delay):
                    raise ShutdownRequested(f"stopped while {dependency} was unavailable"
                                            ) from exc
                delay = min(delay * 2, self._max_s)
            else:
                self._readiness.ok(dependency)
                return result


@dataclass(frozen=True)
class Computed:
    """A batch the engine computed, on its way to the sinks, with the engine's state after it."""

    batch: TransactionBatch
    outputs: Mapping[str, Changes]
    version: EngineVersion


class Stages:
    """The queues and signals between the stages of one run.

    ingest -> compute: closed transactions ready, taken by compute up to `batch_transactions`
    at a time (a poll's batch is accepted while fewer than that are ready), or fewer, once
    they are ready, unless a backlog is filling the batch (see `take_batch`); compute ->
    deliver: at most one computed batch; deliver -> checkpoint: a queue of checkpoints to
    write, one at a time. The input is not thread-safe: while the ingest thread serves, the
    other stages' calls to it (`call_input`) run there, between two polls."""

    def __init__(self, batch_transactions: int, serving: bool, backlog_wait_s: float = 0.0,
                 clock: Clock = time.monotonic) -> None:
        """`serving`: whether an ingest thread will run the other stages' calls to the input.
        `backlog_wait_s`: how long compute may wait for a backlog to fill a batch, as `clock`
        measures it."""
        self._clock = clock
        self.batch_transactions = batch_transactions
        self.backlog_wait_s = backlog_wait_s
        self._ready: deque[TransactionBatch] = deque()
        self._ready_count = 0  # transactions in `_ready`
        self._first_ready_at = 0.0  # when `_ready` last became non-empty
        # The input after its latest poll: records not read yet, records per transaction.
        self._waiting = 0
        self._per_transaction = 0.0
        self._room = threading.Condition()  # guards `_ready`, signals it changed
        self._computed: queue.Queue[Computed] = queue.Queue(maxsize=1)
        self._in_flight = 0  # handed over to deliver and not yet committed
        self._lock = threading.Lock()
        self.checkpoint_jobs: queue.Queue[tuple[int, SourceState, EngineVersion | None]] = \
            queue.Queue()
        self.checkpointing = threading.Event()  # a checkpoint is queued or being written
        self.computing_done = threading.Event()
        self.halt = threading.Event()  # every stage but ingest is done
        self.failure: BaseException | None = None
        self._calls: queue.Queue[tuple[Callable[[Input], Any], Future[Any]]] = \
            queue.Queue()
        self._serving = serving

    def guard(self, work: Callable[[], None]) -> Callable[[], None]:
        """`work` for a stage's thread: its failure stops every stage."""
        def guarded() -> None:
            try:
                work()
            except BaseException as exc:
                self.fail(exc)
        return guarded

    def fail(self, exc: BaseException) -> None:
        """The first failure stops every stage; `run` raises it."""
        with self._lock:
            if self.failure is None:
                self.failure = exc

    # ingest -> compute

    def offer(self, batch: TransactionBatch) -> bool:
        """Make `batch` ready for compute, unless a batch's worth of transactions is ready
        already and stays so for a moment (False: offer it again)."""
        with self._room:
            if not self._room.wait_for(
                    lambda: self._ready_count < self.batch_transactions, timeout=0.02):
                return False
            if not self._ready:
                self._first_ready_at = self._clock()
            self._ready.append(batch)
            self._ready_count += len(batch)
            self._room.notify_all()
        return True

    def backlog(self, waiting: int, per_transaction: float) -> None:
        """After a poll, before its transactions are offered: the input has `waiting` records
        not read yet (as of its latest fetches), and its transactions held `per_transaction`
        records each so far. Compute reads it when next it looks (an offer, or within its
        take's timeout), not now: woken before the offer, it would count the poll's records
        neither waiting nor ready, and could take a batch short."""
        with self._room:
            self._waiting, self._per_transaction = waiting, per_transaction

    def _filling(self) -> bool:
        """Whether a backlog is filling the batch: fewer than `batch_transactions` are ready,
        the records not read yet would fill the rest (one transaction may be forming from
        records already read; at least one transaction's worth, so that a commit marker not
        yet reported read holds nothing), and the first ready one has waited less than
        `backlog_wait_s`. A batch's cost is mostly fixed, and where ingest and compute share
        the cores every batch computed while ingest reads takes CPU from it (what the wait
        gained on a million-event backlog: docs/benchmarks.md, "History"). At a rate the
        service keeps up with, the records not read yet are far fewer than a batch's: nothing
        waits."""
        missing = self.batch_transactions - self._ready_count
        return (missing > 0 and self._per_transaction > 0
                and self._waiting >= max(missing - 1, 1) * self._per_transaction
                and self._clock() < self._first_ready_at + self.backlog_wait_s)

    def take_batch(self, timeout: float) -> TransactionBatch | None:
        """Every transaction ready, up to a batch's worth, once at least one is and no backlog
        is filling the batch (`_filling`): adaptive batching, one transaction at low load,
        more under a backlog, a full batch when the backlog holds one. A ready batch too large
        for it is split at a transaction boundary, its rest taken next time. None: nothing to
        take after waiting once, until an offer or at most `timeout` (less when the backlog
        wait ends first); the caller asks again."""
        taken: list[TransactionBatch] = []
        with self._room:
            if not self._ready or self._filling():
                wait = timeout
                if self._ready:  # filling, until at most the backlog wait is over
                    wait = min(wait, self._first_ready_at + self.backlog_wait_s - self._clock())
                self._room.wait(max(wait, 0.0))
                if not self._ready or self._filling():
                    return None
            count = 0
            while self._ready and count < self.batch_transactions:
                head, rest = self._ready.popleft().split(self.batch_transactions - count)
                if rest is not None:
                    self._ready.appendleft(rest)
                taken.append(head)
                count += len(head)
            self._ready_count -= count
            if self._ready:  # the rest begins the next batch now
                self._first_ready_at = self._clock()
            self._room.notify_all()
        return TransactionBatch.join(taken)

    def has_ready(self) -> bool:
        """Whether a transaction is ready for compute."""
        with self._room:
            return bool(self._ready)

    # compute -> deliver

    def hand_over(self, computed: Computed) -> None:
        with self._lock:
            self._in_flight += 1
        while True:
            if self.failure is not None:
                raise self.failure
            try:
                self._computed.put(computed, timeout=0.1)
                return
            except queue.Full:
                continue

    def next_computed(self, timeout: float) -> Computed | None:
        try:
            return self._computed.get(timeout=timeout)
        except queue.Empty:
            return None

    def delivered(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def idle(self) -> bool:
        with self._lock, self._room:
            return self._in_flight == 0 and not self._ready

    # other stages -> the input, through ingest

    def call_input(self, source: Input, work: Callable[[Input], _T]) -> _T:
        """`work(source)`, run by the ingest thread between two polls while it serves calls,
        else here (no other thread uses the input then)."""
        done: Future[_T] = Future()
        with self._lock:
            serving = self._serving
            if serving:
                self._calls.put((work, done))
        return done.result() if serving else work(source)

    def serve_input(self, source: Input) -> None:
        while True:
            try:
                work, done = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                done.set_result(work(source))
            except BaseException as exc:
                done.set_exception(exc)

    def stop_serving(self, source: Input) -> None:
        with self._lock:
            self._serving = False
        self.serve_input(source)
