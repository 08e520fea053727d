"""Engine state survives a save and a load into a new engine: the continued output stream is the
one an uninterrupted engine emits."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.engine_oracle import process
from support.example_batches import CUSTOMERS, FIRST, SECOND
from support.example_batches import sorted_rows as _sorted

from txstream.changes import Changes
from txstream.engine import Engine, EngineInputError, EngineStateError, Pipeline
from txstream.engine import reducers as r
from txstream.engine.sparkjobs import counted
from txstream.examples.orders import pipeline
from txstream.schemas.tables import TableSchema


def test_saved_state_continues_the_stream(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    straight = Engine(pipeline(), spark)
    process(straight, {"customers": CUSTOMERS, "orders": FIRST})
    expected = _sorted(process(straight, {"orders": SECOND}))

    first = Engine(pipeline(), spark)
    process(first, {"customers": CUSTOMERS, "orders": FIRST})
    first.save_state(str(tmp_path / "state"))
    resumed = Engine(pipeline(), spark)
    _, restore = counted(spark.sparkContext,
                         lambda: resumed.load_state(str(tmp_path / "state")))
    # One job reads the manifest and one computes every state's run: neither the rows' types
    # (saved with them) nor the runs' weights (saved, not counted) take a job per state.
    assert restore.jobs == 2
    saved = {name: sum(run.weight for run in runs)
             for name, (_, runs) in first.version().states.items() if runs}
    restored = resumed.version().states
    assert len(saved) > 2 and {name: [run.weight for run in restored[name][1]]
                               for name in saved} == {name: [w] for name, w in saved.items()}
    shutil.rmtree(tmp_path / "state")  # the state is in Spark's memory: the files may go
    assert _sorted(process(resumed, {"orders": SECOND})) == expected
    assert any(expected.values())


def test_state_rows_keep_their_keys_types(spark) -> None:  # type: ignore[no-untyped-def]
    """Only summed decimals are widened to precision 38: a key column of more than 18 digits
    would be a BigDecimal in every row of the state (hashed, compared and copied as one)."""
    p = Pipeline()
    t = p.source("t", TableSchema.of({"k": "decimal(12,2)", "v": "decimal(20,4)"}))
    p.output("s", t.groupby("k").reduce(s=r.sum("v")))
    p.output("d", t.distinct())
    engine = Engine(p, spark)
    process(engine, {"t": pa.table({"k": pa.array([1, 2], pa.decimal128(12, 2)),
                                    "v": pa.array([3, 4], pa.decimal128(20, 4)),
                                    "time": [1, 1], "diff": [1, 1]})})
    types = {(name, f.name): f.dataType.simpleString()
             for name, (state, runs) in engine.version().states.items() if runs
             for f in state.row_type.fields if f.dataType.typeName() == "decimal"}
    assert set(types.values()) == {"decimal(12,2)", "decimal(20,4)", "decimal(38,4)"}, types
    assert all(t == "decimal(12,2)" for (_, column), t in types.items() if column == "k"), types


def _edit_manifest(state: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Rewrite a saved state's manifest as an earlier revision would have written it."""
    manifest = next((state / "_manifest").glob("part-*"))
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    for checksum in (state / "_manifest").glob(".*.crc"):
        checksum.unlink()  # of the file as Spark wrote it


def test_a_state_saved_before_row_types_were_loads(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A manifest of an earlier revision names neither the rows' types nor the runs' weights:
    the types are read from the files, the rows counted."""
    first = Engine(pipeline(), spark)
    process(first, {"customers": CUSTOMERS, "orders": FIRST})
    first.save_state(str(tmp_path / "state"))
    expected = _sorted(process(first, {"orders": SECOND}))
    _edit_manifest(tmp_path / "state", lambda saved: {
        k: v for k, v in saved.items() if k not in ("row_types", "weights")})
    resumed = Engine(pipeline(), spark)
    resumed.load_state(str(tmp_path / "state"))
    assert _sorted(process(resumed, {"orders": SECOND})) == expected
    assert any(expected.values())


def test_a_state_of_another_accumulator_layout_is_refused(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A group-by's saved accumulators of an earlier engine (exact sums as one decimal, no
    layout in the manifest) would be misread as the limbs of txstream.engine.exact_sums."""
    first = Engine(pipeline(), spark)
    process(first, {"customers": CUSTOMERS, "orders": FIRST})
    first.save_state(str(tmp_path / "state"))
    _edit_manifest(tmp_path / "state", lambda saved: {**saved, "operators": [
        line.split(" __acc")[0] for line in saved["operators"]]})
    with pytest.raises(EngineStateError, match=r"engine version.*__acc0=nn:amount"):
        Engine(pipeline(), spark).load_state(str(tmp_path / "state"))


def test_state_of_another_pipeline_is_refused(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = Engine(pipeline(), spark)
    process(first, {"customers": CUSTOMERS, "orders": FIRST})
    first.save_state(str(tmp_path / "state"))
    other = Pipeline()
    t = other.source("orders", TableSchema.of({"order_id": "bigint", "amount": "double"}))
    other.output("n", t.groupby("order_id").reduce(n=r.count()))
    with pytest.raises(EngineStateError, match="different pipeline definition"):
        Engine(other, spark).load_state(str(tmp_path / "state"))
    with pytest.raises(EngineStateError, match="no complete engine state"):
        Engine(other, spark).load_state(str(tmp_path / "missing"))


def test_state_names_are_the_layout_of_a_saved_state(spark) -> None:  # type: ignore[no-untyped-def]
    """Each operator declares its states by name, and each name is a directory of a saved
    state: a renamed state would load empty from an earlier checkpoint, so they stay."""
    engine = Engine(pipeline(), spark)
    assert list(engine.version().states) == [
        "003-JoinOp-left_state", "003-JoinOp-right_state", "005-ReduceOp-acc_state",
        "005-ReduceOp-value_states.0", "007-JoinOp-left_state", "007-JoinOp-right_state",
        "009-DistinctOp-state", "010-JoinOp-left_state", "010-JoinOp-right_state",
        "015-ReduceOp-acc_state", "018-DistinctOp-state"]


def test_changes_enter_as_changes(spark) -> None:  # type: ignore[no-untyped-def]
    engine = Engine(pipeline(), spark)
    with pytest.raises(EngineInputError, match=r"must be txstream\.changes\.Changes"):
        engine.process({"orders": FIRST})  # type: ignore[dict-item]
    with pytest.raises(EngineInputError, match="lack column"):
        engine.process({"orders": Changes.of(FIRST.drop_columns(["status"]))})
