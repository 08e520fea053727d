"""The plumbing between the runner's stages (`txstream.service.stages`), without a broker or
Spark: adaptive batches taken from what ingest made ready, split at transaction boundaries,
fuller under a backlog; backpressure on ingest; the first failure kept; retries of an
unavailable dependency."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from txstream.changes import DIFF, TIME, Changes
from txstream.service.health import Readiness
from txstream.service.metrics import Metrics
from txstream.service.stages import Retrying, ShutdownRequested, Stages
from txstream.sinks.sink import SinkWriteError
from txstream.sources.transaction_batch import Transaction, TransactionBatch


def batch(first: int, count: int) -> TransactionBatch:
    """Transactions `first`.. (`count` of them), each changing one row of source `s`."""
    numbers = list(range(first, first + count))
    changes = Changes.of(pa.table({"id": numbers, TIME: numbers, DIFF: [1] * count}))
    return TransactionBatch.of([Transaction(number=n, offsets={"t": {0: n}}) for n in numbers],
                               {"s": changes})


def numbers(taken: TransactionBatch | None) -> list[int]:
    assert taken is not None
    assert taken.changes["s"].times.to_pylist() == [t.number for t in taken.transactions]
    return [t.number for t in taken.transactions]


def test_compute_takes_what_is_ready_up_to_a_batch_split_at_transaction_boundaries() -> None:
    stages = Stages(batch_transactions=4, serving=False)
    assert stages.take_batch(timeout=0.01) is None and stages.idle()
    assert stages.offer(batch(1, 1))
    assert numbers(stages.take_batch(timeout=0.01)) == [1]  # low load: one at a time
    assert stages.offer(batch(2, 2)) and stages.offer(batch(4, 7))
    assert not stages.offer(batch(11, 1)), "a batch's worth is ready: ingest waits"
    assert not stages.idle()
    assert numbers(stages.take_batch(timeout=0.01)) == [2, 3, 4, 5]  # joined, then split
    assert numbers(stages.take_batch(timeout=0.01)) == [6, 7, 8, 9]
    assert stages.offer(batch(11, 1))
    assert numbers(stages.take_batch(timeout=0.01)) == [10, 11]
    assert stages.idle()


def test_a_backlog_that_holds_a_batch_fills_it_before_compute_takes_it() -> None:
    """The records not read yet would fill the batch: compute waits for a full batch. Fewer
    than that (a rate the service keeps up with, a backlog's tail), it takes what is ready."""
    stages = Stages(batch_transactions=4, serving=False, backlog_wait_s=60)
    stages.backlog(waiting=1999, per_transaction=1000)  # 3 missing: 2 more to read, 1 forming
    assert stages.offer(batch(1, 1))
    assert numbers(stages.take_batch(timeout=0.01)) == [1], "the backlog cannot fill a batch"
    stages.backlog(waiting=2000, per_transaction=1000)
    assert stages.offer(batch(2, 1))
    assert stages.take_batch(timeout=0.01) is None, "the backlog fills the batch first"
    assert stages.offer(batch(3, 2))
    stages.backlog(waiting=999, per_transaction=1000)  # less than the last one
    assert numbers(stages.take_batch(timeout=0.01)) == [2, 3, 4]
    stages.backlog(waiting=5000, per_transaction=1000)
    assert stages.offer(batch(5, 1))
    assert stages.take_batch(timeout=0.01) is None
    assert stages.offer(batch(6, 3))
    assert numbers(stages.take_batch(timeout=0.01)) == [5, 6, 7, 8], "a full batch at once"
    stages.backlog(waiting=0, per_transaction=1000)  # read to the end
    assert stages.offer(batch(9, 1))
    assert numbers(stages.take_batch(timeout=0.01)) == [9]


class Clock:
    """Monotonic seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_backlog_holds_ready_transactions_at_most_the_backlog_wait() -> None:
    clock = Clock()
    stages = Stages(batch_transactions=100, serving=False, backlog_wait_s=1.0, clock=clock)
    stages.backlog(waiting=10**6, per_transaction=1000)
    assert stages.offer(batch(1, 2))
    assert stages.take_batch(timeout=0) is None
    clock.now += 0.99
    assert stages.take_batch(timeout=0) is None
    clock.now += 0.01
    assert numbers(stages.take_batch(timeout=0)) == [1, 2], "the first ready one waited 1 s"


def test_the_rest_of_a_split_batch_waits_from_the_take() -> None:
    """What a take leaves begins the next batch then: it waits for the backlog from there,
    not from when it arrived."""
    clock = Clock()
    stages = Stages(batch_transactions=2, serving=False, backlog_wait_s=1.0, clock=clock)
    stages.backlog(waiting=10**6, per_transaction=1000)
    assert stages.offer(batch(1, 3))
    clock.now += 0.8
    assert numbers(stages.take_batch(timeout=0)) == [1, 2], "full: taken at once"
    clock.now += 0.5  # counted from its arrival, the rest's wait would be over
    assert stages.take_batch(timeout=0) is None, "the rest waits for the backlog"
    assert stages.offer(batch(4, 1))
    assert numbers(stages.take_batch(timeout=0)) == [3, 4]


def test_a_take_waits_for_an_offer_up_to_its_timeout() -> None:
    """Compute blocks in `take_batch` until ingest offers, not for a fixed time."""
    stages = Stages(batch_transactions=4, serving=False)
    threading.Timer(0.05, lambda: stages.offer(batch(1, 1))).start()
    assert numbers(stages.take_batch(timeout=30)) == [1]


def test_without_a_backlog_wait_compute_takes_what_is_ready() -> None:
    stages = Stages(batch_transactions=100, serving=False)  # backlog_wait_s=0
    stages.backlog(waiting=10**6, per_transaction=1000)
    assert stages.offer(batch(1, 2))
    assert numbers(stages.take_batch(timeout=0.01)) == [1, 2]


def test_the_first_failure_stops_every_stage() -> None:
    stages = Stages(batch_transactions=1, serving=False)
    first, second = RuntimeError("first"), RuntimeError("second")
    stages.guard(lambda: (_ for _ in ()).throw(first))()
    stages.fail(second)
    assert stages.failure is first


def test_an_unavailable_dependency_is_retried_until_it_answers_or_a_stop() -> None:
    readiness, stop = Readiness(max_lag=10), threading.Event()
    readiness.started.set()
    retrying = Retrying(readiness, stop, initial_s=0.001, max_s=0.002)
    answers = iter([SinkWriteError("down"), SinkWriteError("still down"), "written"])

    def work() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            assert not readiness.up("postgresql") or answer.args == ("down",)
            raise answer
        return answer

    assert retrying("postgresql", work) == "written"
    assert readiness.up("postgresql") and readiness.problems(Metrics()) == []
    stop.set()

    def failing() -> None:
        raise SinkWriteError("down for good")

    with pytest.raises(ShutdownRequested, match="stopped while postgresql was unavailable"):
        retrying("postgresql", failing)
    assert readiness.problems(Metrics()) == ["postgresql unavailable: down for good"]
