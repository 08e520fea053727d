"""The incremental engine: a Table API over a DAG, compiled to Spark plans over delta
DataFrames carrying `time` and `diff`.

Defining a pipeline (no Spark job):
    table              the Table API: Pipeline, Table, GroupedTable
    temporal_joins     the Table API's joins by time: asof_join, asof_now_join, interval_join
    nodes              the DAG's immutable nodes, one kind per incremental rule
    reducers           count, sum, avg, min, max, count_distinct for groupby(...).reduce(...)
    temporal           event-time windows (tumbling, sliding, session) and temporal behaviors
                       (common_behavior, exactly_once_behavior) for windowby(...).reduce(...)
    wall_clock         the transactions' wall times, which filters calling now() read
    exact_sums         exact sums of decimals and doubles, kept as two longs
    errors             what a bad definition, a bad input, a saved state or an expression raises
Compiling it and running its batches:
    compiled           CompiledPipeline: the DAG's operators, told once what their readers need
    operators/         one incremental rule per node kind: base (what every operator is),
                       rowwise (source, select, filter, negate, concat), join (inner joins and
                       the padding of outer ones), reduce (group-by), distinct, behavior
                       (when windowed rows reach a reduce, and leave), late (a behavior's late
                       rows as a table), session (session windows, and their behaviors),
                       asof_join (the nearest row in time), asof_now_join
                       (the right side as of a row's insertion), now_filter (rows as of the wall
                       time), clocks (a temporal operator's clock)
    engine             Engine: a batch in two phases, planned then computed by one Spark action
    batch              BatchPlan: what a batch's job computes besides the outputs
    frames             DataFrame helpers, given the partitions a batch is planned for
    consolidation      summing the diffs of equal (row, time) pairs inside a plan
    results            the batch's one result, cut into each output's changes
    templates          a batch shape's plans recorded once, rebound to later batches' leaves
    codegen            whether a batch's expressions run interpreted or as generated code
    columns            the columns the engine adds, and its helper columns' prefix
    warmup             warming_up, warm_up: made-up batches through a fresh engine, forgotten
    java_garbage       JavaGarbage: the JVM objects Python's reference cycles pin, freed on a
                       schedule
Operator state:
    state              ZSetState: a Z-set in versions of runs, read and staged in its partitions
    runs               Run: a lazy local checkpoint on `replicas` executors; size-tier merges
    indexed_runs       which of a state's runs have an index, probed instead of streamed
    run_index          one run's index: sorted files the executors write and search
    indexing           StateIndexes: which runs an engine indexes, and where the files go
    replicas           every state block kept on `replicas` executors across executors' losses
    persistence        the engine's state on disk: a manifest, each state's Parquet, the restore
Spark's internal API and the driver's side of Spark (checked on a Spark upgrade):
    spark_internals    the plans' leaves: built, declared partitioned, rebound
    spark_input        a source's changes into the JVM as rows, split by partition
    spark_expressions  Catalyst expressions pyspark does not expose
    hash_partitions    Spark's hash partitioning of Arrow data, computed on the driver
    sparkjobs          counting the Spark jobs and stages a piece of driver code runs
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txstream.engine.errors import (
    EngineInputError,
    EngineStateError,
    ExpressionError,
    InvariantError,
    PipelineDefinitionError,
)

if TYPE_CHECKING:
    from txstream.engine import reducers, temporal
    from txstream.engine.compiled import OutputTable
    from txstream.engine.engine import Engine, EngineVersion
    from txstream.engine.table import GroupedTable, Pipeline, Table

# Imported on first use, not with the package: they load Spark, which a module that needs only
# the engine's errors (the service's runner) must not.
_LAZY = {"Engine": "engine", "EngineVersion": "engine", "OutputTable": "compiled",
         "GroupedTable": "table", "Pipeline": "table", "Table": "table", "reducers": None,
         "temporal": None}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'txstream.engine' has no attribute {name!r}")
    module = _LAZY[name]
    if module is None:
        return importlib.import_module(f"txstream.engine.{name}")
    return getattr(importlib.import_module(f"txstream.engine.{module}"), name)


__all__ = [
    "Engine",
    "EngineInputError",
    "EngineStateError",
    "EngineVersion",
    "ExpressionError",
    "GroupedTable",
    "InvariantError",
    "OutputTable",
    "Pipeline",
    "PipelineDefinitionError",
    "Table",
    "reducers",
    "temporal",
]
