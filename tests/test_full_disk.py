"""A full disk under the checkpoints, on a real size-limited file system (a tmpfs of a few MiB):
the transaction log refuses with a typed error and leaves no partial file; a checkpoint that
does not fit is deleted as far as it was written, the service is not ready and says why, the
checkpoint is tried again with backoff and resumes by itself once space returns. Then the
whole service: batches go on while the log fits, wait while it does not, and once space
returns everything is delivered exactly once and the checkpoint written resumes a restart.
And PostgreSQL on a full disk: the service waits, not ready, and delivers everything once the
server has space again."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from support.orders import OrderProducer
from support.runner import Background, assert_snapshots, example_config
from support.volumes import Filler, can_mount, small_volume

from txstream.schemas.config import PipelineConfig
from txstream.service.checkpoint import CheckpointStore, PipelineIdentity
from txstream.service.checkpoint_storage import CheckpointStorageError, LocalStorage
from txstream.service.checkpointing import Checkpointing
from txstream.service.compose import open_runner
from txstream.service.embedded.postgres import EmbeddedPostgres
from txstream.service.health import Readiness
from txstream.service.metrics import CheckpointMetrics, Metrics
from txstream.service.stages import CrashPoints, Stages
from txstream.sources.source_state import SourceState
from txstream.sources.transaction_batch import TransactionLogEntry

pytestmark = pytest.mark.skipif(not can_mount(), reason="mounting a size-limited tmpfs "
                                "needs root (CI runs the suite as root)")

_MIB = 1024 * 1024
_IDENTITY = PipelineIdentity(pipeline="m:f", sources={"s": "t"}, outputs=["o"])


def _state(next_number: int) -> SourceState:
    return SourceState(next_number=next_number, offsets={"t": {0: next_number}},
                       upsert_rows={"s": pa.table({"id": pa.array([1], pa.int64())})})


class _Engine:
    """Saves `size` bytes of state per checkpoint, as Spark would: file by file."""

    def __init__(self, size: int) -> None:
        self.size = size

    def save_state(self, uri: str, version: object) -> None:
        Path(uri).mkdir(parents=True)
        with open(Path(uri) / "part-0.parquet", "wb", buffering=0) as f:
            for _ in range(self.size // 65536):
                f.write(b"\1" * 65536)


class _Outputs:
    def before_checkpoint(self, number: int) -> None:
        pass

    def check_writer(self) -> None:
        pass


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _incomplete(location: Path) -> list[str]:
    return sorted(p.name for p in location.glob("ckpt-*") if not (p / "MANIFEST.json").exists())


def test_the_transaction_log_refuses_a_full_volume_with_what_to_do(tmp_path: Path) -> None:
    with small_volume(tmp_path / "vol", 1) as volume:
        store = CheckpointStore(LocalStorage(volume / "ck"), _IDENTITY)
        store.log([TransactionLogEntry(number=1, upstream_id=None, ranges={"t": {0: (0, 5)}})])
        filler = Filler(volume)
        filler.fill()
        big = [TransactionLogEntry(number=n, upstream_id=None, ranges={"t": {0: (n, n + 1)}})
               for n in range(2, 2000)]
        with pytest.raises(CheckpointStorageError, match=(
                r"cannot log transactions #2-#1999 in .*No space left on device.*Free space "
                r"there.*goes on once it is written")):
            store.log(big)
        assert sorted(p.name for p in (volume / "ck" / "txlog").iterdir()) == [
            "000000000001-000000000001.json"], "no partial file holds space"
        filler.free()
        store.log(big)  # the same write, once space returns
        assert [e.number for e in store.logged_after(0)] == list(range(1, 2000))


def test_a_checkpoint_that_does_not_fit_is_deleted_and_tried_again_with_backoff(
        tmp_path: Path) -> None:
    with small_volume(tmp_path / "vol", 4) as volume:
        location = volume / "ck"
        store = CheckpointStore(LocalStorage(location), _IDENTITY, keep=2)
        config = example_config("localhost:9", "postgresql://localhost/x", "s",
                                {"customers": "c", "orders": "o"}, "g", location,
                                checkpoint_every_batches=1, checkpoint_when_idle_s=0,
                                retry_initial_backoff_s=1.0, retry_max_backoff_s=2.0)
        clock, metrics, readiness = _Clock(), CheckpointMetrics(), Readiness(max_lag=10)
        readiness.started.set()
        checkpointing = Checkpointing(config, _Engine(_MIB), store, _Outputs(),  # type: ignore[arg-type]
                                      metrics, readiness, CrashPoints(None), 0, clock)
        stages = Stages(5, serving=False)

        def commit(number: int) -> bool:
            """Commit a batch through `number`; whether its checkpoint, if due, was written."""
            due = checkpointing.due(stages)
            checkpointing.committed(stages, number, _state(number + 1) if due else None, None)
            if not due:
                return False
            job = stages.checkpoint_jobs.get_nowait()
            try:
                return checkpointing.attempt(*job)
            finally:
                stages.checkpointing.clear()

        assert commit(1) and checkpointing.checkpointed == 1
        filler = Filler(volume)
        filler.fill(leave=256 * 1024)
        assert not commit(2), "1 MiB does not fit in 256 KiB"
        assert _incomplete(location) == [], "the failed checkpoint holds no space"
        assert Filler.free_bytes(volume) >= 192 * 1024
        assert metrics.failures == 1 and checkpointing.checkpointed == 1
        problems = readiness.problems(Metrics())
        assert len(problems) == 1 and problems[0].startswith(
            "checkpoint storage unavailable: [Errno 28] No space left on device"), problems
        assert readiness.public_problems(Metrics()) == ["checkpoint storage: unavailable"]
        # Backoff: 1 s after the first failure, then 2 s (the most), batches going on between.
        assert not commit(3)
        clock.now = 1.0
        assert not commit(4) and metrics.failures == 2
        clock.now = 2.5
        assert not commit(5) and metrics.failures == 2, "not before 2 s after the last try"
        filler.free()
        clock.now = 3.0
        assert commit(6), "resumed by itself once space returned"
        assert checkpointing.checkpointed == 6 and metrics.failures == 2
        assert readiness.problems(Metrics()) == []
        latest = store.latest()
        assert latest is not None and latest.transaction == 6
        assert _incomplete(location) == []
        # Back on the regular schedule: every batch (checkpoint_every_batches=1).
        assert commit(7)

        # A failure while the pipeline goes idle is tried again idle, even with idle
        # checkpoints off (checkpoint_when_idle_s=0), once its pause is over.
        filler.fill(leave=256 * 1024)
        assert not commit(8) and metrics.failures == 3
        filler.free()
        assert not checkpointing.when_idle(stages, lambda: _state(9))
        clock.now = 4.0
        assert checkpointing.when_idle(stages, lambda: _state(9))
        job = stages.checkpoint_jobs.get_nowait()
        assert checkpointing.attempt(*job) and checkpointing.checkpointed == 8
        stages.checkpointing.clear()
        assert readiness.problems(Metrics()) == []
        assert not checkpointing.when_idle(stages, lambda: _state(9)), "nothing left to write"


@contextmanager
def _running(config: PipelineConfig, spark: SparkSession, producer: OrderProducer,
             events: int) -> Iterator[Background]:
    """The service in the background, once `events` sent first are committed."""
    producer.send(events)
    runner = open_runner(config, spark=spark)
    try:
        with Background(runner) as loop:
            loop.wait("the first events committed", loop.drained(events))
            yield loop
    finally:
        runner.close()


def test_the_service_on_a_full_checkpoint_volume_goes_on_then_resumes_exactly(  # type: ignore[no-untyped-def]
        kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="txstream")
    with small_volume(tmp_path / "vol", 8) as volume:
        config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                                f"g-{topic_name}", volume / "ck", checkpoint_every_batches=1,
                                checkpoint_when_idle_s=0.5)
        producer = OrderProducer(kafka.bootstrap_servers, topics)
        filler = Filler(volume)
        with _running(config, spark, producer, 300) as loop:
            runner = loop.runner
            checkpoints = runner.metrics.checkpoint
            loop.wait("a checkpoint", lambda: checkpoints.checkpoints > 0)
            delivered = runner.metrics.delivery.transactions
            # Room for a few log files but no checkpoint of the engine's state.
            filler.fill(leave=48 * 1024)
            producer.send(300)
            loop.wait("a checkpoint failed: not ready, saying why", lambda: any(
                p.startswith("checkpoint storage unavailable: ")
                and "No space left on device" in p for p in loop.problems()))
            loop.wait("batches delivered while the log fits",
                      lambda: runner.metrics.delivery.transactions > delivered)
            # Then no room for the log either: the next batch waits for it.
            caplog.clear()
            filler.fill()
            producer.send(200)
            loop.wait("a batch waiting for its log entry", lambda: any(
                "cannot log transactions" in r.getMessage() for r in caplog.records))
            assert runner.lag() > 0
            written = checkpoints.checkpoints
            filler.free()
            loop.wait("every event committed", loop.drained(800))
            loop.wait("a checkpoint again", lambda: checkpoints.checkpoints > written)
            assert checkpoints.failures > 0
            assert not loop.problems()
        assert_snapshots(postgres.url, pg_schema, producer.world)
        assert _incomplete(volume / "ck" / f"g-{topic_name}") == []

        # A restart resumes from what was written; the next events are delivered once.
        producer.send(100)
        again = open_runner(config, spark=spark)
        try:
            again.run(until=lambda r: r.lag() == 0)
        finally:
            again.close()
        assert_snapshots(postgres.url, pg_schema, producer.world)


def test_the_service_waits_for_a_full_postgresql_then_delivers_exactly(  # type: ignore[no-untyped-def]
        kafka, spark, topics, topic_name, tmp_path) -> None:
    # Not under tmp_path, which PostgreSQL's user cannot reach (/tmp and a tmpfs's root can).
    mount = Path(tempfile.mkdtemp(prefix="txstream-pgvol-"))
    with small_volume(mount, 96) as volume:
        postgres = EmbeddedPostgres(volume / "data").start()
        try:
            with psycopg.connect(postgres.url, autocommit=True) as conn:
                conn.execute("CREATE SCHEMA full_disk")
            config = example_config(kafka.bootstrap_servers, postgres.url, "full_disk", topics,
                                    f"g-{topic_name}", tmp_path / "ck")
            producer = OrderProducer(kafka.bootstrap_servers, topics)
            filler = Filler(volume)
            with _running(config, spark, producer, 200) as loop:
                filler.fill()
                producer.send(600)
                loop.wait("not ready, naming PostgreSQL", lambda: any(
                    p.startswith("postgresql unavailable") and "No space left" in p
                    for p in loop.problems()))
                filler.free()
                loop.wait("every event committed", loop.drained(800))
            assert_snapshots(postgres.url, "full_disk", producer.world)
        finally:
            postgres.stop()
    mount.rmdir()
