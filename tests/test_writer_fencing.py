"""One writer per pipeline, against the real PostgreSQL fixture: the lease (an advisory lock a
standby waits for) and the writer epoch that fences an instance another one took over from."""

from __future__ import annotations

import threading
import time

import pytest
from support.postgres_outputs import batch, lease, mark, outputs, query, wait_to_take, writer

from txstream.service.embedded.postgres import PostgresEndpoint
from txstream.service.health import HealthServer, Readiness, metrics_text
from txstream.service.leadership import Leadership
from txstream.service.metrics import Metrics
from txstream.sinks.postgres.writers import (
    WriterEpoch,
    WriterFencedError,
    WritersTable,
)


def test_a_standby_waits_for_the_holder_then_takes_the_next_epoch(
        postgres: PostgresEndpoint, pg_schema: str) -> None:
    active, standby = (lease(postgres.url, pg_schema, "a", 11),
                       lease(postgres.url, pg_schema, "b", 22))
    try:
        taken = active.try_take()
        assert taken is not None and taken.epoch == 1
        assert standby.try_take() is None
        assert standby.holder() == (1, writer("a", 11))  # what the standby reports
        assert active.renew()
        active.close()  # the holder's session ends (a process killed closes it too)
        assert wait_to_take(standby, timeout_s=5) < 2
        assert standby.holder() == (2, writer("b", 22))
        assert query(postgres.url, "SELECT pipeline, epoch, host, pid FROM {}", pg_schema,
                     "txstream_writers") == [("p", 2, "b", 22)]
    finally:
        active.close()
        standby.close()


def test_a_silent_holder_loses_its_lease_to_the_server_timeout(postgres: PostgresEndpoint,
                                                               pg_schema: str) -> None:
    """A paused holder cannot renew: PostgreSQL ends its session after the lease time."""
    paused, standby = (lease(postgres.url, pg_schema, "a", 11, lease_s=1.0),
                       lease(postgres.url, pg_schema, "b", 22))
    try:
        assert paused.try_take() is not None
        assert wait_to_take(standby, timeout_s=10) >= 0.5
        assert not paused.renew()  # it wakes up: the lease is gone, someone else holds it
    finally:
        paused.close()
        standby.close()


def test_an_instance_taken_over_from_writes_nothing_more(postgres: PostgresEndpoint,
                                                         pg_schema: str) -> None:
    old, new = (lease(postgres.url, pg_schema, "old-host", 11, lease_s=1.0),
                lease(postgres.url, pg_schema, "new-host", 22))
    old_epoch = old.try_take()
    assert old_epoch is not None
    group, *sinks = outputs(postgres.url, pg_schema, fence=old_epoch)
    try:
        group.write(batch(1, 2), [mark(1), mark(2)])
        group.check_writer()
        wait_to_take(new, timeout_s=10)  # the old one was paused past its lease
        with pytest.raises(WriterFencedError, match="was fenced by epoch 2") as fenced:
            group.write(batch(3, 3), [mark(3)])
        assert "epoch 1" in str(fenced.value) and "taken by host new-host, pid 22" in str(
            fenced.value)
        assert fenced.value.holder == writer("new-host", 22)
        with pytest.raises(WriterFencedError):
            group.check_writer()  # what the checkpoint stage asks before publishing
        assert query(postgres.url, 'SELECT "transaction" FROM {}', pg_schema,
                     "txstream_progress") == [(2,)]
        assert query(postgres.url, 'SELECT max("time") FROM {}', pg_schema, "log") == [(2,)]
    finally:
        group.close()
        for sink in sinks:
            sink.close()
        old.close()
        new.close()


def test_the_service_waits_as_a_standby_then_takes_over(postgres: PostgresEndpoint,
                                                        pg_schema: str) -> None:
    readiness, metrics, stop = Readiness(max_lag=100), Metrics(), threading.Event()
    health = HealthServer(0, metrics, readiness).start()
    active = lease(postgres.url, pg_schema, "a", 11)
    standby = Leadership(postgres.url, WritersTable(pg_schema, "p"), readiness, metrics, stop)
    taken: list[WriterEpoch | None] = []
    waiting = threading.Thread(target=lambda: taken.append(standby.wait_for_turn()))
    try:
        assert active.try_take() is not None
        waiting.start()
        deadline = time.monotonic() + 5
        while readiness.public_problems(metrics) != ["standby"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert health.answer("/readyz")[:2] == (503, "not ready: standby\n")
        assert health.answer("/healthz")[0] == 200
        active.close()
        waiting.join(timeout=5)
        assert [t.epoch if t else None for t in taken] == [2]
        assert readiness.public_problems(metrics) == ["starting"]  # the runner comes next
        standby.fenced(WriterFencedError("p", 2, (3, writer("c", 33))))
        assert "txstream_fenced_total 1" in metrics_text(metrics, readiness)
        # Fenced, it waits again (`fenced`) for the lease, until told to stop.
        again = threading.Thread(target=lambda: taken.append(standby.wait_for_turn("fenced")))
        assert active.try_take() is not None
        again.start()
        deadline = time.monotonic() + 5
        while readiness.public_problems(metrics) != ["fenced"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stop.set()
        again.join(timeout=5)
        assert taken[-1] is None
    finally:
        stop.set()
        standby.release()
        active.close()
        health.stop()
