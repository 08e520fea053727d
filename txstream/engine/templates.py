"""Plan templates: a batch's physical plans, made once per shape, rebound to each later batch's
leaves.

Building a batch's plans through the DataFrame API costs the driver about a second on the
example pipeline (thousands of calls into the JVM, each new frame analyzed), and optimizing and
planning them a tenth more, the same every batch: the plans differ only in their leaves. A
batch's shape (which sources have changes; per state, whether it has streamed runs and whether
indexed ones) decides every plan, so the first batch of a shape is built by the operators and
its physical plans are recorded (as Spark's planner made them, before the exchanges its
preparation adds), and later batches of that shape rebind the recorded plans' scans to their
own leaves (`spark_internals.rebind_physical`): the sources' changes, each state's streamed runs
and index files, the runs a state merges. The frames a batch materializes (shared frames, new
runs) are recorded in order with the plans they come from, and are materialized again from
those plans, rebound to the leaves before them.

A rebound plan reaches Spark as a frame whose planner takes it as it is
(`spark_internals.frame_over`): neither the optimizer nor the planner runs on it again (Spark
still prepares it for execution, adding exchanges, as every plan), which saved a lone
transaction of the example pipeline 0.04-0.05 s of its 0.28-0.33 s of planning. The plans are
those of the shape's first batch, whose leaves declare the same partitionings as any later
batch's, and Spark's planner chooses no join or aggregate by the size of a leaf here (no
broadcasts; a delta is the hash side of its joins by hint, `frames.build_side`).

A recorded plan holds placeholders (empty RDDs), never a batch's data, so a template keeps no
state version alive. A plan with a scan the template could not rebind (a leaf the engine did
not make) is not recorded: its shape is then built by the operators every batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession

from txstream.engine.batch import BatchPlan, Materialization
from txstream.engine.spark_internals import (
    Clustering,
    LeafKey,
    Occurrence,
    Replacement,
    SourceRows,
    attributes,
    cached_relation,
    cached_rows,
    cached_scan,
    frame_over,
    id_of,
    leaf_key,
    physical_plan,
    rdd_node,
    rdd_of,
    rdd_scan,
    rebind_physical,
    rows_scan,
    scans,
    union_rdd,
)
from txstream.engine.state import Merge, Run, StagedRuns, ZSetState

# What a leaf of a recorded plan stands for: a source's changes, a state's streamed runs, the
# runs a batch merges into a state's new run, or the list of a state's index files.
Role = (tuple[Literal["source"], str] | tuple[Literal["state", "merged"], ZSetState]
        | tuple[Literal["index"], ZSetState])


@dataclass(frozen=True)
class _Plan:
    """A recorded physical plan, its leaves `found`, and a leaf of its attributes (`logical`,
    see `frame_over`)."""

    logical: JavaObject
    physical: JavaObject
    found: list[Occurrence]


@dataclass(frozen=True)
class _Step:
    kind: Literal["shared", "run"]
    plan: _Plan
    key: LeafKey  # of the leaf that reads what this step materializes
    state: ZSetState | None
    clustering: Clustering | None = None  # that leaf declares (see `BatchPlan.shared`)


@dataclass(frozen=True)
class Template:
    roles: dict[LeafKey, Role]
    steps: list[_Step]
    final: _Plan
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
    frames: list[tuple[Materialization | None, DataFrame]] = []
    for m in batch.materialized:
        frames.append((m, m.source))
        known.add(leaf_key(m.leaf))
    frames.append((None, final))
    # The physical plans the batch made (or makes now: the final frame's, which its action
    # then runs), with their leaves.
    made = []
    for m, frame in frames:
        physical = physical_plan(frame)
        found = scans(physical)
        if found is None or any(o.key not in known for o in found):
            return None
        # The attributes of the frame as analyzed: those of its checkpoint or relation (a
        # physical plan can say some are never null where the analyzed plan does not).
        made.append((m, attributes(frame), physical, found))
    # Placeholders for every leaf: the template holds no data.
    empty = {key: union_rdd(spark, []) for key in known}
    renamed = {key: ("rdd", id_of(rdd)) for key, rdd in empty.items()}
    nothing = union_rdd(spark, [])

    def neutral(output: JavaObject, physical: JavaObject, found: list[Occurrence]) -> _Plan:
        placed = [Occurrence(rdd_scan(spark, o.output, empty[o.key]), renamed[o.key], o.output,
                             o.columns) for o in found]
        pairs = [(o.node, p.node) for o, p in zip(found, placed, strict=True)]
        return _Plan(rdd_node(spark, output, nothing), rebind_physical(spark, physical, pairs),
                     placed)

    steps = [_Step(m.kind, neutral(output, physical, found), renamed[leaf_key(m.leaf)],
                   m.state, m.clustering)
             for m, output, physical, found in made if m is not None]
    _, output, physical, found = made[-1]
    return Template({renamed[k]: role for k, role in roles.items()}, steps,
                    neutral(output, physical, found), tuple(outputs))


def instantiate(spark: SparkSession, template: Template, sources: Mapping[str, SourceRows],
                weight: int) -> tuple[DataFrame, list[StagedRuns]]:
    """The batch's final frame and staged runs, for `sources` (name -> its changes) and a
    batch of `weight` input rows, from the template of its shape: each recorded physical plan
    over this batch's leaves (`frame_over`), neither optimized nor planned again."""
    merges: dict[int, Merge] = {}

    def merge_of(state: ZSetState) -> Merge:
        if id(state) not in merges:
            merges[id(state)] = state.merge(weight)
        return merges[id(state)]

    bindings: dict[LeafKey, Replacement] = {}
    for key, role in template.roles.items():
        if role[0] == "index":
            bindings[key] = role[1].index_scan()
        elif role[0] == "source":
            bindings[key] = rows_scan(spark, sources[role[1]].rdd, sources[role[1]].clustering)
        else:
            state = role[1]
            runs = state.streamed() if role[0] == "state" else merge_of(state).merged
            bindings[key] = state.scan(spark, runs)

    def frame(plan: _Plan) -> DataFrame:
        pairs = [(o.node, bindings[o.key](o)) for o in plan.found]
        return frame_over(spark, plan.logical, rebind_physical(spark, plan.physical, pairs))

    staged = []
    for step in template.steps:
        if step.kind == "shared":
            relation = cached_relation(frame(step.plan))
            rows = cached_rows(spark, relation, step.clustering)
            bindings[step.key] = (cached_scan(spark, relation) if rows is None
                                  else rows_scan(spark, rows, step.clustering))
            continue
        assert step.state is not None
        run = step.state.checkpoint(frame(step.plan))
        bindings[step.key] = rows_scan(spark, rdd_of(run))
        merge = merge_of(step.state)
        staged.append(StagedRuns(step.state, (*merge.kept, Run(run, merge.new_weight))))
    return frame(template.final), staged
