"""The engine reads every row of its input, however the Arrow table is chunked.

A batch's changes reach the engine as a table of many chunks (the sources' changes of each poll,
concatenated: `TransactionBatch.join`), some of them empty (a transaction whose upsert changes
are one insertion: `UpsertState` concatenates an empty table of retractions before it). Spark's
Arrow reader ends a stream at its first empty record batch, so every row after an empty chunk
was silently dropped: under load, where batches join several polls, the example pipeline lost
changes (issue "Exact under load"). Every input path is covered: rows shipped from the driver,
Arrow batches read by the task (`ARROW_INPUT_ROWS` and above), and split into partitions at
P = 2.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from txstream.changes import Changes
from txstream.engine import Engine, Pipeline
from txstream.engine import reducers as r
from txstream.engine.operators import rowwise
from txstream.schemas.tables import TableSchema


def _engine(spark, parallelism: int) -> Engine:  # type: ignore[no-untyped-def]
    p = Pipeline()
    t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint"}, primary_key=["id"]))
    p.output("rows", t.select("id", "k"))
    p.output("counts", t.groupby("k").reduce(n=r.count()))
    return Engine(p, spark, parallelism=parallelism, spread_rows=1)


def _chunked(ids: list[list[int]]) -> Changes:
    """One chunk per list (an empty list: an empty chunk), rows inserted at time 1."""
    parts = [pa.table({"id": pa.array(chunk, pa.int64()), "k": pa.array([i % 3 for i in chunk],
                                                                        pa.int64()),
                       "time": pa.array([1] * len(chunk), pa.int64()),
                       "diff": pa.array([1] * len(chunk), pa.int64())}) for chunk in ids]
    return Changes(pa.concat_tables(parts))


@pytest.mark.parametrize("layout", [
    [[1, 2], [], [3, 4, 5]],  # an empty chunk in the middle: the rows after it were lost
    [[], [1]],  # a lone insertion as UpsertState emits it
    [[1], [], [], [2], [3]],
])
@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("columnar", [False, True])
def test_every_row_of_a_chunked_input_is_read(spark, monkeypatch, layout: list[list[int]],  # type: ignore[no-untyped-def]
                                              parallelism: int, columnar: bool) -> None:
    if columnar:  # Arrow record batches converted by the task, as from 50,000 rows on
        monkeypatch.setattr(rowwise, "ARROW_INPUT_ROWS", 1)
    changes = _chunked(layout)
    assert 0 in [len(c) for c in changes.table.column("id").chunks]
    out = _engine(spark, parallelism).process({"t": changes})
    ids = sorted(i for chunk in layout for i in chunk)
    assert sorted(out["rows"].table.column("id").to_pylist()) == ids
    counts = {row["k"]: row["n"] for row in out["counts"].table.to_pylist()}
    assert counts == {k: sum(1 for i in ids if i % 3 == k) for k in {i % 3 for i in ids}}
