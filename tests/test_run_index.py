"""State run indexes written and probed by the executors (`txstream.engine.run_index`): the
probe on its own, over files `write` made; and engines that index every run against engines
that stream them, on keys that hash or compare in special ways (-0.0 and 0.0, NaN, nulls,
strings)."""

from __future__ import annotations

import gc
import math
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import process

from txstream.engine import Engine, Pipeline
from txstream.engine import reducers as r
from txstream.engine.indexing import StateIndexes
from txstream.engine.run_index import HASH, PATH, UNREADABLE, probe, write
from txstream.schemas.tables import TableSchema


def _file(directory: Path, hashes: list[int]) -> str:
    """An index file of rows (v = position) with these sorted hashes, as `write` makes it."""
    rows = pa.record_batch({"v": pa.array(range(len(hashes)), pa.int64()),
                            HASH: pa.array(hashes, pa.int64())})
    (written,) = write(str(directory), iter([rows.slice(0, 2), rows.slice(2)]))
    return str(written.column(0)[0])


def _requests(hashes: list[int], paths: list[str]) -> pa.RecordBatch:
    return pa.record_batch({HASH: pa.array([*hashes, *[None] * len(paths)], pa.int64()),
                            PATH: pa.array([*[None] * len(hashes), *paths], pa.string())})


def test_the_probe_takes_every_row_of_each_wanted_hash_from_every_file(tmp_path: Path) -> None:
    first = _file(tmp_path, [-5, 3, 3, 3, 8, 12])
    second = _file(tmp_path, [3, 9])
    found = pa.Table.from_batches(list(probe(iter([
        _requests([3, 12], []), _requests([7, 3, 100], [first, second])]))))
    # Rows 1-3 and 5 of the first file, row 0 of the second; 7 and 100 are in neither.
    assert sorted(found.column("v").to_pylist()) == [0, 1, 2, 3, 5]
    assert found.column_names == ["v"]
    assert list(probe(iter([_requests([4], [first])]))) == []
    assert list(probe(iter([]))) == []


def test_a_missing_file_names_the_setting_to_fix(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=f"{UNREADABLE}.*index_dir"):
        list(probe(iter([_requests([1], [str(tmp_path / "gone.arrow")])])))


KEYS = TableSchema.of({"id": "bigint", "x": "double", "s": "string", "v": "bigint"},
                      primary_key=["id"])
OTHER = TableSchema.of({"uid": "bigint", "x": "double", "s": "string", "w": "bigint"},
                       primary_key=["uid"])


def _pipeline() -> Pipeline:
    """Group-bys by a double and by a string, which may be null, and a join on both."""
    p = Pipeline()
    t = p.source("t", KEYS)
    p.output("by_x", t.groupby("x").reduce(n=r.count(), total=r.sum("v")))
    p.output("by_s", t.groupby("s").reduce(n=r.count()))
    p.output("pairs", t.join(p.source("u", OTHER), on=["x", "s"], how="inner"))
    return p


_XS = [0.0, -0.0, 1.5, math.nan, None, 2.0 ** 60, -1.5]
_SS = ["a", "b", None, "", "ä"]


def _batch(rng: random.Random, live: dict[str, dict[int, tuple[object, ...]]], time: int,
           n: int) -> dict[str, pa.Table]:
    """`n` random inserts and deletes per source at `time`."""
    tables = {}
    for name, rows in live.items():
        changes: list[tuple[object, ...]] = []
        for _ in range(n):
            if rows and rng.random() < 0.4:
                row = rows.pop(rng.choice(sorted(rows)))
                changes.append((*row, time, -1))
            else:
                row = (rng.randrange(10**9), rng.choice(_XS), rng.choice(_SS), rng.randrange(9))
                rows[row[0]] = row
                changes.append((*row, time, 1))
        columns = list(zip(*changes, strict=True))
        key, value = ("id", "v") if name == "t" else ("uid", "w")
        tables[name] = pa.table({key: pa.array(columns[0], pa.int64()),
                                 "x": pa.array(columns[1], pa.float64()),
                                 "s": pa.array(columns[2], pa.string()),
                                 value: pa.array(columns[3], pa.int64()),
                                 "time": pa.array(columns[4], pa.int64()),
                                 "diff": pa.array(columns[5], pa.int64())})
    return tables


def _sorted(table: pa.Table) -> list[tuple[object, ...]]:
    """Rows in one order; NaN as a string, since NaN != NaN."""
    return sorted((tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row)
                   for row in zip(*table.to_pydict().values(), strict=True)), key=repr)


@pytest.mark.parametrize("parallelism", [1, 2])
def test_indexed_runs_find_what_streamed_runs_do(spark: SparkSession, parallelism: int) -> None:
    """Every run indexed (`index_rows=1`) against every run streamed, on keys of -0.0 and 0.0,
    NaN, nulls and strings; large batches, then lone transactions probing the indexes. The
    files of runs merged away are deleted, and the engine's directory goes with it."""
    indexed = Engine(_pipeline(), spark, parallelism=parallelism, index_rows=1)
    streamed = Engine(_pipeline(), spark, parallelism=parallelism)
    rng = random.Random(parallelism)
    live: dict[str, dict[int, tuple[object, ...]]] = {"t": {}, "u": {}}
    for time in range(1, 13):
        batch = _batch(rng, live, time, 300 if time < 4 else 3)
        a, b = process(indexed, batch), process(streamed, batch)
        for name in a:
            assert _sorted(a[name]) == _sorted(b[name]), f"{name} at {time}"
        assert indexed.last_batch is not None
        if time > 1:
            assert indexed.last_batch.indexes > 0, indexed.last_batch
    states = indexed.compiled.states.values()
    directory = Path(indexed._indexing.directory())
    files = {Path(f) for s in states for i in s.indexes._indexes.values() for f in i.files}
    assert files == set(directory.glob("*/*.arrow")), "files of runs merged away are left"
    # The rows' files and their hashes' (`*.hashes.npy`).
    assert indexed.index_bytes == sum(f.stat().st_size for f in directory.glob("*/*"))
    del indexed, states
    gc.collect()
    assert not directory.exists()



def test_index_files_executors_cannot_read_turn_indexing_off(spark: SparkSession) -> None:
    """Files gone from under the engine (as on a host that does not share `index_dir`): the
    batch runs again streaming every run, with the same output, and indexing stays off."""
    indexed = Engine(_pipeline(), spark, index_rows=1)
    streamed = Engine(_pipeline(), spark)
    rng = random.Random(3)
    live: dict[str, dict[int, tuple[object, ...]]] = {"t": {}, "u": {}}
    for time in range(1, 5):
        if time == 3:
            assert indexed.index_bytes > 0
            for path in Path(indexed._indexing.directory()).glob("*/*.arrow"):
                path.unlink()
        batch = _batch(rng, live, time, 200)
        a, b = process(indexed, batch), process(streamed, batch)
        for name in a:
            assert _sorted(a[name]) == _sorted(b[name]), f"{name} at {time}"
    assert indexed.index_bytes == 0 and indexed.index_rows == sys.maxsize
    assert indexed.last_batch is not None and indexed.last_batch.indexes == 0


def test_a_new_index_directory_deletes_those_of_processes_gone(tmp_path: Path) -> None:
    """A killed engine's files are deleted by the next engine on its host: a process gone, or
    an earlier process of this one's id (a restarted container); a live process's, another
    host's and a directory still being made are left."""
    host = socket.gethostname()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()

    def made(name: str, owner: str | None) -> str:
        directory = tmp_path / f"txstream-index-{name}"
        (directory / "run-1").mkdir(parents=True)
        if owner is not None:
            (directory / "owner").write_text(owner)
        return directory.name

    made("gone", f"{host} {ended.pid} token")
    made("earlier", f"{host} {os.getpid()} an-earlier-process")
    kept = {made("live", f"{host} {os.getppid()} token"),
            made("elsewhere", f"another-host {ended.pid} token"), made("unowned", None)}
    indexes = StateIndexes(1, str(tmp_path))  # its directory lives as long as it does
    mine = Path(indexes.directory())
    assert {p.name for p in tmp_path.iterdir()} == kept | {mine.name}
    assert (mine / "owner").read_text().split()[:2] == [host, str(os.getpid())]
