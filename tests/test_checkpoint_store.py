"""The checkpoint store on a Hadoop file system: checkpoints published by their manifest,
the transaction log and its pruning, a store of another pipeline refused, damage reported;
two instances on one location: writer epochs fence the older one, and what it wrote after the
takeover is not part of the history."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from txstream.service.checkpoint import CheckpointStore, PipelineIdentity
from txstream.service.checkpoint_epochs import CheckpointFencedError
from txstream.service.checkpoint_storage import CheckpointError, HadoopStorage, open_storage
from txstream.sinks.postgres.writers import Writer
from txstream.sources.source_state import SourceState
from txstream.sources.transaction_batch import TransactionLogEntry


def _state(next_number: int) -> SourceState:
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    return SourceState(next_number=next_number, offsets={"t": {0: 10 * next_number}},
                       upsert_rows={"s": rows})

def _entry(number: int) -> TransactionLogEntry:
    return TransactionLogEntry(number=number, upstream_id=None,
                               ranges={"t": {0: (number * 10, number * 10 + 10)}})

def test_checkpoints_on_a_hadoop_file_system(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    identity = PipelineIdentity(pipeline="m:f", sources={"s": "t"}, outputs=["o"])
    store = CheckpointStore(open_storage(f"file://{tmp_path}/ck", spark), identity, keep=2)
    assert store.latest() is None and not store.has_history()
    store.log([_entry(1), _entry(2)])
    store.log([_entry(3)])
    assert store.has_history()
    for number in (2, 3):
        prepared = store.prepare(number, _state(number + 1))
        spark.range(number).write.parquet(store.engine_uri(prepared))
        assert store.latest() is None or store.latest().transaction < number  # type: ignore[union-attr]
        store.publish(prepared)
    # An incomplete one (killed before its manifest) is ignored, then deleted by the next.
    store.prepare(3, _state(4))
    latest = store.latest()
    assert latest is not None and latest.transaction == 3
    assert store.load_source_state(latest) == _state(4)
    assert spark.read.parquet(store.engine_uri(latest)).count() == 3
    assert [e.number for e in store.logged_after(2)] == [3]
    store.log([_entry(4)])
    prepared = store.prepare(4, _state(5))
    spark.range(1).write.parquet(store.engine_uri(prepared))
    store.publish(prepared)
    names = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("ckpt"))
    assert len(names) == 2 and names[0].startswith("ckpt-000000000003"), names
    # Log files no kept checkpoint needs are gone (those through #3, the oldest kept).
    assert sorted(p.name for p in (tmp_path / "ck" / "txlog").glob("*.json")) == [
        "000000000004-000000000004.json"]
    assert [e.number for e in store.logged_after(3)] == [4]

    other = CheckpointStore(open_storage(f"file://{tmp_path}/ck", spark), identity.model_copy(
        update={"sources": {"s": "another-topic"}}))
    with pytest.raises(CheckpointError, match="written by another pipeline"):
        other.latest()

def test_transaction_log_damage_is_reported(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = CheckpointStore(open_storage(str(tmp_path), spark), PipelineIdentity(
        pipeline="m:f", sources={}, outputs=[]))
    store.log([_entry(1)])
    store.log([_entry(3)])
    with pytest.raises(CheckpointError, match="has gaps after #0"):
        store.logged_after(0)
    store.log([TransactionLogEntry(number=3, upstream_id="x", ranges={}), _entry(4)])
    with pytest.raises(CheckpointError, match="records #3 twice with different contents"):
        store.logged_after(2)


IDENTITY = PipelineIdentity(pipeline="m:f", sources={"s": "t"}, outputs=["o"])


def _instance(spark, location: Path) -> tuple[CheckpointStore, int]:  # type: ignore[no-untyped-def]
    """A store as a starting runner sees it: what it resumes through, read before its epoch."""
    store = CheckpointStore(open_storage(str(location), spark), IDENTITY)
    latest = store.latest()
    checkpointed = latest.transaction if latest else 0
    return store, checkpointed + len(store.logged_after(checkpointed))


def _take(store: CheckpointStore, base: int, host: str) -> None:
    store.take_epoch(Writer(host=host, pid=1, started_at=datetime(2026, 11, 26, tzinfo=UTC)),
                     base)


def _checkpoint(spark, store: CheckpointStore, number: int) -> None:  # type: ignore[no-untyped-def]
    prepared = store.prepare(number, _state(number + 1))
    spark.range(number).write.parquet(store.engine_uri(prepared))
    store.publish(prepared)


def test_a_takeover_fences_the_old_writer_and_its_late_writes_are_ignored(  # type: ignore[no-untyped-def]
        spark, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    old, base = _instance(spark, ck)
    _take(old, base, "old")
    assert old.epoch == 1
    old.log([_entry(1), _entry(2)])
    _checkpoint(spark, old, 2)

    new, base = _instance(spark, ck)  # reads the history through #2 ...
    assert base == 2
    # ... and before it takes its epoch, the old one (not fenced yet) logs #3 and checkpoints
    # it: writes in flight at the takeover. The new one formed #3 itself, differently.
    late = TransactionLogEntry(number=3, upstream_id="old", ranges={})
    old.log([late])
    _checkpoint(spark, old, 3)
    _take(new, base, "new")
    assert new.epoch == 2
    assert new.latest() is not None and new.latest().transaction == 2  # type: ignore[union-attr]
    assert new.logged_after(2) == []
    new.log([_entry(3)])
    assert new.logged_after(2) == [_entry(3)]  # not "recorded twice": the late one is ignored

    # The old one, fenced, writes nothing more there.
    with pytest.raises(CheckpointFencedError, match=r"checkpoint epoch 1\) was fenced by "
                       "epoch 2, taken by host new, pid 1"):
        old.log([_entry(4)])
    prepared = old.prepare(3, _state(4))
    with pytest.raises(CheckpointFencedError):
        old.publish(prepared)
    assert not (ck / prepared.name / "MANIFEST.json").exists()

    # A third instance sees the new one's history only; the new one's checkpoint prunes
    # what the old one wrote after the takeover.
    _checkpoint(spark, new, 3)
    third, base = _instance(spark, ck)
    latest = third.latest()
    assert latest is not None and latest.manifest.epoch == 2 and base == 3
    assert [e.number for e in third.logged_after(2)] == [3]
    assert third.logged_after(2) == [_entry(3)]
    manifests = [json.loads(p.read_text()) for p in ck.glob("ckpt-*/MANIFEST.json")]
    assert sorted((m["transaction"], m["epoch"]) for m in manifests) == [(2, 1), (3, 2)]
    assert sorted(p.name for p in (ck / "txlog").glob("*.json")) == [
        "000000000003-000000000003.e2.json"]
    _take(third, base, "third")
    with pytest.raises(CheckpointFencedError):
        new.check_epoch()


def test_two_instances_taking_an_epoch_at_once_get_one_each(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    stores = [_instance(spark, tmp_path)[0] for _ in range(4)]
    with ThreadPoolExecutor(len(stores)) as pool:
        list(pool.map(lambda s: _take(s, 0, "x"), stores))
    assert sorted(s.epoch or 0 for s in stores) == [1, 2, 3, 4]
    fenced = 0
    for store in stores:
        try:
            store.check_epoch()
        except CheckpointFencedError:
            fenced += 1
    assert fenced == 3


def test_a_location_without_atomic_create_takes_no_epoch(  # type: ignore[no-untyped-def]
        spark, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Only HDFS creates a file with overwrite=false atomically among Hadoop's file systems
    (S3A, and the local one behind file://, check first, then write): such a location is not
    fenced, and says so."""
    store = CheckpointStore(open_storage(f"file://{tmp_path}/ck", spark), IDENTITY)
    with caplog.at_level(logging.WARNING, logger="txstream.service.checkpoint"):
        _take(store, 0, "a")
    assert store.epoch is None
    assert any("not fenced through it" in r.getMessage() for r in caplog.records)
    store.log([_entry(1)])
    assert [p.name for p in (tmp_path / "ck" / "txlog").iterdir()] == [
        "000000000001-000000000001.json"]
    # The create itself, through Hadoop's FileSystem, as HDFS runs it.
    storage = HadoopStorage(f"file://{tmp_path}/h", spark)
    assert storage.create_new("epochs/000000000001.json", "{}")
    assert not storage.create_new("epochs/000000000001.json", "{}")
    assert storage.read_text("epochs/000000000001.json") == "{}"
