"""An engine's state on disk: written as of a version, read back into an engine of the same
pipeline (`Engine.save_state`, `Engine.load_state` compose these with the engine's own parts).

    <path>/<state name>/   one operator state's consolidated collection, as Parquet
    <path>/_manifest       written last: a state without it is incomplete

The rule: a saved state is read back only by the pipeline that wrote it. The manifest holds
each operator's output schema and state layout (the engine's fingerprint), and a state saved
by another pipeline definition or engine version is refused with the first difference, never
misread. Each state's collection is written consolidated, in its row type (a sum of an int
column of the runs would be a long), with the row type and the input rows it summarizes in the
manifest: reading it back then needs no job to find the type, and a large state stays weighed
as large (small batches after a restore do not rewrite it). Whatever parallelism wrote it, a
state is read back into the reading engine's partitions, all states in one Spark job. The
states are written by Spark jobs submitted at once, the manifest without one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from txstream.engine.errors import EngineStateError
from txstream.engine.runs import Run, Runs
from txstream.engine.spark_internals import materialize, rdd_of
from txstream.engine.state import ZSetState

_FORMAT = 1
_MANIFEST = "_manifest"
# Jobs writing states submitted at once (each a few tasks; Spark queues what it cannot run).
_WRITING = 16


def save(spark: SparkSession, path: str, fingerprint: Sequence[str],
         version: Mapping[str, tuple[ZSetState, Runs]]) -> None:
    """Write `version` (each state's name -> the state and its runs as of the version) under
    `path`, a new directory (local or any Hadoop-compatible URI), for a pipeline of
    `fingerprint`; the manifest last."""
    saved = {name: (state, runs) for name, (state, runs) in version.items() if runs}
    _write_states(path, saved)
    weights = {name: sum(run.weight for run in runs) for name, (_, runs) in saved.items()}
    row_types = {}
    for name, (state, _) in saved.items():
        assert state.row_type is not None  # fixed by the rows the runs hold
        row_types[name] = state.row_type.jsonValue()
    manifest = json.dumps({"format": _FORMAT, "operators": list(fingerprint),
                           "states": list(saved), "weights": weights, "row_types": row_types})
    _write_manifest(spark, f"{path}/{_MANIFEST}", manifest)


def _write_states(path: str, states: Mapping[str, tuple[ZSetState, Runs]]) -> None:
    """Write each state's runs under `path`/<its name>, in Spark jobs submitted together: one
    after the other, a small state's checkpoint (at a stop, while nothing else runs) waited
    out each job's fixed cost in turn (planning it, starting its tasks, committing its files),
    not the data, for most of its time."""
    if not states:
        return
    with ThreadPoolExecutor(min(len(states), _WRITING), thread_name_prefix="save-state") as pool:
        writes = [pool.submit(_write_state, f"{path}/{name}", state, runs)
                  for name, (state, runs) in states.items()]
        for write in writes:
            write.result()  # the first failure, once every write has ended


def _write_state(location: str, state: ZSetState, runs: Runs) -> None:
    # Outside any batch: read in the state's own partitions (a lone run needs no aggregate).
    whole = state.consolidated(runs, planned=state.partitions)
    assert whole is not None  # of runs
    state.typed(whole).write.parquet(location)


def _write_manifest(spark: SparkSession, path: str, text: str) -> None:
    """`text` as the one file of the directory `path` (what `spark.read.text(path)` reads
    back), through Hadoop's file system API: a Spark job writing it took seconds in a JVM that
    had not written text before (a first checkpoint, at a stop)."""
    sc = spark.sparkContext
    jvm = sc._jvm
    assert jvm is not None, "a SparkSession has a JVM gateway"
    file = jvm.org.apache.hadoop.fs.Path(f"{path}/part-00000.txt")
    fs = file.getFileSystem(sc._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    out = fs.create(file, False)  # overwrite=false: a state is saved into a new directory
    try:
        out.write(bytearray(text.encode()))
    finally:
        out.close()


def load(spark: SparkSession, path: str, fingerprint: Sequence[str],
         states: Mapping[str, ZSetState], index_rows: int) -> dict[str, Runs]:
    """The runs of each of `states` (by name) that `save` wrote at `path`, computed (one Spark
    job), each state's in one run; a state saved empty is left out. `index_rows`: the rows from
    which a run is indexed, which a saved weight must not make a run look large enough for."""
    try:
        text = spark.read.text(f"{path}/{_MANIFEST}").first()
    except AnalysisException as exc:
        raise EngineStateError(f"no complete engine state at {path}: {exc}") from exc
    if text is None:
        raise EngineStateError(f"no complete engine state at {path}: empty manifest")
    manifest = json.loads(text[0])
    mine = list(fingerprint)
    if manifest.get("operators") != mine:
        theirs = manifest.get("operators", [])
        diff = next((f"{a!r} vs now {b!r}" for a, b in zip(theirs, mine, strict=False)
                     if a != b), f"{len(theirs)} operators vs now {len(mine)}")
        raise EngineStateError(
            f"the state at {path} was saved by a different pipeline definition or "
            f"engine version (first difference: {diff}); start from empty state instead"
        )
    saved = set(manifest.get("states", []))
    # The runs' weights as saved, where they cannot make the run look large enough for an
    # index (a weight counts input rows, not the rows left): a state written before they
    # were, or one that may be large, is counted (a job).
    weights = {name: weight for name, weight in manifest.get("weights", {}).items()
               if weight < index_rows}
    # The row types, saved since manifests hold them (earlier ones: read from the files).
    row_types = {name: StructType.fromJson(value)
                 for name, value in manifest.get("row_types", {}).items()}
    restored = {}
    for name, state in states.items():
        if name in saved:
            location = f"{path}/{name}"
            row_type = row_types.get(name)
            # Given the type, Spark needs no job reading it from the files.
            reader = spark.read if row_type is None else spark.read.schema(row_type)
            # A lazy local checkpoint, computed below, after which the files may be deleted.
            restored[name] = state.new_run(reader.parquet(location))
    # One Spark job, not one or two per state (but a state saved without weight: counted).
    materialize(spark, [rdd_of(frame) for frame in restored.values()])
    # Weighed (by its rows, or the input rows it summarizes), so that small batches after a
    # restore do not rewrite it.
    return {name: (Run(frame, frame.count() if name not in weights else weights[name]),)
            for name, frame in restored.items()}
