"""The checkpoint store on a Hadoop file system: checkpoints published by their manifest,
the transaction log and its pruning, a store of another pipeline refused, damage reported."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from txstream.service.checkpoint import CheckpointError, CheckpointStore, PipelineIdentity
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
    store = CheckpointStore(f"file://{tmp_path}/ck", spark, identity, keep=2)
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

    other = CheckpointStore(f"file://{tmp_path}/ck", spark, identity.model_copy(
        update={"sources": {"s": "another-topic"}}))
    with pytest.raises(CheckpointError, match="written by another pipeline"):
        other.latest()

def test_transaction_log_damage_is_reported(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = CheckpointStore(str(tmp_path), spark, PipelineIdentity(
        pipeline="m:f", sources={}, outputs=[]))
    store.log([_entry(1)])
    store.log([_entry(3)])
    with pytest.raises(CheckpointError, match="has gaps after #0"):
        store.logged_after(0)
    store.log([TransactionLogEntry(number=3, upstream_id="x", ranges={}), _entry(4)])
    with pytest.raises(CheckpointError, match="records #3 twice with different contents"):
        store.logged_after(2)
