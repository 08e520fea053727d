"""Plan templates: a batch's plans, built once per shape, rebound to each later batch's leaves.

Building a batch's plans through the DataFrame API costs the driver about a second on the
example pipeline (thousands of calls into the JVM, each new frame analyzed), the same every
batch: the plans differ only in their leaves. A batch's shape (which sources have changes;
per state, whether it has streamed runs and whether indexed ones) decides every plan, so the
first batch of a shape is built by the operators and recorded, and later batches of that shape
rebind the recorded plans to their own leaves (`spark_internals.rebind`): the sources' changes, each
state's streamed runs and index files, the runs a state merges. The frames a batch materializes
(shared frames, new runs) are recorded in order with the plans they come from, and are
materialized again from those plans, rebound to the leaves before them.

Templates hold optimized plans: Spark runs its optimizer again on every rebound plan (a frame
always passes it), and on a plan it has optimized already each rule finds nothing to do at
its first pass, which saves a sixth of a lone transaction's planning (0.05 of 0.30 s on the
example pipeline).

A recorded plan holds placeholders (empty RDDs), never a batch's data, so a template keeps no
state version alive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession

from txstream.engine.batch import BatchPlan
from txstream.engine.spark_internals import (
    Clustering,
    LeafKey,
    Occurrence,
    Replacement,
    SourceRows,
    cached_reader,
    cached_relation,
    frame_of,
    id_of,
    leaf_key,
    occurrences,
    optimized,
    rdd_node,
    rdd_of,
    rebind,
    union_rdd,
)
from txstream.engine.state import Merge, Run, StagedRuns, ZSetState

# What a leaf of a recorded plan stands for: a source's changes, a state's streamed runs, the
# runs a batch merges into a state's new run, or the list of a state's index files.
Role = (tuple[Literal["source"], str] | tuple[Literal["state", "merged"], ZSetState]
        | tuple[Literal["index"], ZSetState])


@dataclass(frozen=True)
class _Step:
    kind: Literal["shared", "run"]
    plan: JavaObject
    found: list[Occurrence]
    key: LeafKey  # of the leaf that reads what this step materializes
    state: ZSetState | None
    clustering: Clustering | None = None  # that leaf declares (see `BatchPlan.shared`)


@dataclass(frozen=True)
class Template:
    roles: dict[LeafKey, Role]
    steps: list[_Step]
    final: JavaObject
    found: list[Occurrence]
    outputs: tuple[str, ...]  # the outputs the final plan holds changes of


def record(spark: SparkSession, batch: BatchPlan, sources: Mapping[str, DataFrame],
           states: Sequence[ZSetState], final: DataFrame, outputs: Sequence[str]
           ) -> Template | None:
    """The template of a batch just built (before its state is installed), or None when a
    plan reads a leaf the template could not rebind."""
    roles: dict[LeafKey, Role] = {leaf_key(f): ("source", name) for name, f in sources.items()}
    for state in states:
        current = state.frame()
        if current is not None:
            roles[leaf_key(current)] = ("state", state)
        files = state.index_frame()
        if files is not None:
            roles[leaf_key(files)] = ("index", state)
    for merged, state in batch.merged:
        roles[leaf_key(merged)] = ("merged", state)
    known = set(roles)
    steps = []
    for m in batch.materialized:
        plan = optimized(m.source)
        found = occurrences(plan)
        if any(o.key not in known for o in found):
            return None
        key = leaf_key(m.leaf)
        known.add(key)
        steps.append(_Step(m.kind, plan, found, key, m.state, m.clustering))
    plan = optimized(final)
    found = occurrences(plan)
    if any(o.key not in known for o in found):
        return None
    # Placeholders for every leaf: the template holds no data.
    empty = {key: union_rdd(spark, []) for key in known}
    placeholders: dict[LeafKey, Replacement] = {
        key: (lambda out, rdd=rdd: rdd_node(spark, out, rdd)) for key, rdd in empty.items()}
    renamed = {key: ("rdd", id_of(rdd)) for key, rdd in empty.items()}

    def neutral(plan: JavaObject, found: list[Occurrence]) -> tuple[JavaObject, list[Occurrence]]:
        plan = rebind(spark, plan, found, placeholders)
        return plan, occurrences(plan)

    recorded = []
    for step in steps:
        plan_, found_ = neutral(step.plan, step.found)
        recorded.append(_Step(step.kind, plan_, found_, renamed[step.key], step.state,
                              step.clustering))
    final_plan, final_found = neutral(plan, found)
    return Template({renamed[k]: role for k, role in roles.items()}, recorded, final_plan,
                    final_found, tuple(outputs))


def instantiate(spark: SparkSession, template: Template, sources: Mapping[str, SourceRows],
                weight: int) -> tuple[DataFrame, list[StagedRuns]]:
    """The batch's final frame and staged runs, for `sources` (name -> its changes) and a
    batch of `weight` input rows, from the template of its shape."""
    merges: dict[int, Merge] = {}

    def merge_of(state: ZSetState) -> Merge:
        if id(state) not in merges:
            merges[id(state)] = state.merge(weight)
        return merges[id(state)]

    def reading(rdd: JavaObject, clustering: Clustering | None = None) -> Replacement:
        return lambda out: rdd_node(spark, out, rdd, clustering)

    bindings: dict[LeafKey, Callable[[JavaObject], JavaObject]] = {}
    for key, role in template.roles.items():
        if role[0] == "index":
            bindings[key] = role[1].index_node
        elif role[0] == "source":
            bindings[key] = reading(sources[role[1]].rdd, sources[role[1]].clustering)
        else:
            state = role[1]
            runs = state.streamed() if role[0] == "state" else merge_of(state).merged
            bindings[key] = lambda out, state=state, runs=runs: state.node(spark, out, runs)
    staged = []
    for step in template.steps:
        frame = frame_of(spark, rebind(spark, step.plan, step.found, bindings))
        if step.kind == "shared":
            bindings[step.key] = cached_reader(spark, cached_relation(frame), step.clustering)[0]
            continue
        assert step.state is not None
        run = step.state.checkpoint(frame)
        bindings[step.key] = reading(rdd_of(run))
        merge = merge_of(step.state)
        staged.append(StagedRuns(step.state, (*merge.kept, Run(run, merge.new_weight))))
    return frame_of(spark, rebind(spark, template.final, template.found, bindings)), staged
