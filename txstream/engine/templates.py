"""Plan templates: a batch's plans, built once per shape, planned once, rebound to each later
batch's leaves.

Building a batch's plans through the DataFrame API costs the driver about a second on the
example pipeline (thousands of calls into the JVM, each new frame analyzed), and optimizing and
planning them a tenth more, the same every batch: the plans differ only in their leaves. A
batch's shape (which sources have changes; per state, whether it has streamed runs and whether
indexed ones) decides every plan, so the first batch of a shape is built by the operators and
its optimized plans are recorded, their leaves replaced by placeholders (empty RDDs). The first
batch rebound to the template has Spark plan those once (`ready`); it and every later batch of
the shape rebind the physical plans' scans to their own leaves: the sources' changes, each
state's streamed runs and index files, the runs a state merges. The frames a batch
materializes (shared frames, new runs) are recorded in order with the plans they come from,
and are materialized again from those plans, rebound to the leaves before them.

A rebound plan reaches Spark as a frame whose planner takes it as it is
(`spark_internals.frame_over`): the optimizer and the planner do not run on it again, only
Spark's preparation for execution (the exchanges its partitionings need, as for every plan),
which saved a lone transaction of the example pipeline 0.04-0.05 s of its 0.28-0.33 s of
planning. Spark's planner chooses no join or aggregate by the size of a leaf here (no
broadcasts; a delta is the hash side of its joins by hint, `frames.build_side`), so plans made
over placeholders are those it makes over a batch's leaves. With adaptive execution on (not
the service's session), no template is recorded.

A template holds placeholders, never a batch's data, so it keeps no state version alive: the
physical plans are made from the placeholders' plans, not from the batch that recorded them,
since Spark's planner links every physical node to the logical one it came from. A plan with a
leaf the template could not rebind (one the engine did not make, or any leaf of a subquery's
plan, which Spark's transforms do not reach: a rebound batch would read the recording batch's
leaf there) is not used: its shape is then built by the operators every batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession

from txstream.engine.batch import BatchPlan
from txstream.engine.runs import Merge, Run
from txstream.engine.spark_input import SourceRows
from txstream.engine.spark_internals import (
    Clustering,
    LeafKey,
    Occurrence,
    Replacement,
    cached_relation,
    cached_rows,
    cached_scan,
    frame_of,
    frame_over,
    id_of,
    leaf_key,
    occurrences,
    optimized,
    physical_plan,
    rdd_node,
    rdd_of,
    reads_subqueries,
    rebind,
    replace_leaves,
    rows_scan,
    scans,
    union_rdd,
)
from txstream.engine.state import StagedRuns, ZSetState

# What a leaf of a recorded plan stands for: a source's changes, a state's streamed runs, the
# runs a batch merges into a state's new run, or the list of a state's index files.
Role = (tuple[Literal["source"], str] | tuple[Literal["state", "merged"], ZSetState]
        | tuple[Literal["index"], ZSetState])


@dataclass
class _Plan:
    """A recorded plan: optimized, over placeholders (`logical`), and the physical plan Spark
    made of that (`physical`, with its scans `found`), once a batch has been rebound to it."""

    logical: JavaObject
    physical: JavaObject | None = None
    found: list[Occurrence] | None = None


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
    plan reads a leaf the template could not rebind (one inside a subquery included), or
    adaptive execution would re-plan the recorded plans (see the module doc)."""
    if spark.conf.get("spark.sql.adaptive.enabled", "true") == "true":
        return None
    roles: dict[LeafKey, Role] = {leaf_key(f): ("source", name) for name, f in sources.items()}
    for state in states:
        current = state.frame(batch.parallelism)
        if current is not None:
            roles[leaf_key(current)] = ("state", state)
        files = state.index_frame()
        if files is not None:
            roles[leaf_key(files)] = ("index", state)
    for merged, state in batch.merged:
        roles[leaf_key(merged)] = ("merged", state)
    known = set(roles)
    made = []
    for m in [*batch.materialized, None]:
        plan = optimized(final if m is None else m.source)
        found = occurrences(plan)
        if reads_subqueries(spark, plan) or any(o.key not in known for o in found):
            return None
        key = None if m is None else leaf_key(m.leaf)
        if key is not None:
            known.add(key)
        made.append((m, plan, found, key))
    # Placeholders for every leaf: the template holds no data.
    empty = {key: union_rdd(spark, []) for key in known}
    placeholders: dict[LeafKey, Replacement] = {
        key: (lambda occ, rdd=rdd: rdd_node(spark, occ.output, rdd)) for key, rdd in empty.items()}
    renamed = {key: ("rdd", id_of(rdd)) for key, rdd in empty.items()}
    steps = [_Step(m.kind, _Plan(rebind(spark, plan, found, placeholders)), renamed[key],
                   m.state, m.clustering) for m, plan, found, key in made if m is not None]
    _, plan, found, _ = made[-1]
    return Template({renamed[k]: role for k, role in roles.items()}, steps,
                    _Plan(rebind(spark, plan, found, placeholders)), tuple(outputs))


def ready(spark: SparkSession, template: Template) -> bool:
    """Whether the template's physical plans are made (now, at the first batch rebound to it,
    so that the shape's first batch pays only its own planning): planned by Spark from the
    recorded plans, whose leaves are placeholders, so that no physical node links to a
    batch's data. False when one has a leaf the template could not rebind (one inside a
    subquery included: Spark optimizes the recorded plans again): its shape is then built by
    the operators."""
    known = {*template.roles, *(s.key for s in template.steps)}
    for plan in [*(s.plan for s in template.steps), template.final]:
        if plan.physical is None:
            physical = physical_plan(frame_of(spark, plan.logical))
            found = scans(physical)
            if (found is None or reads_subqueries(spark, physical)
                    or any(o.key not in known for o in found)):
                return False
            plan.physical, plan.found = physical, found
    return True


def instantiate(spark: SparkSession, template: Template, sources: Mapping[str, SourceRows],
                weight: int, planned: int) -> tuple[DataFrame, list[StagedRuns]]:
    """The batch's final frame and staged runs, for `sources` (name -> its changes) and a
    batch of `weight` input rows planned for `planned` partitions (part of its shape), from
    the template of its shape (`ready`): each recorded
    physical plan over this batch's leaves (`frame_over`), neither optimized nor planned
    again."""
    merges: dict[int, Merge] = {}

    def merge_of(state: ZSetState) -> Merge:
        if id(state) not in merges:
            merges[id(state)] = Merge.of(state.runs, weight)
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
        assert plan.physical is not None and plan.found is not None, "ready() first"
        pairs = [(o.node, bindings[o.key](o)) for o in plan.found]
        return frame_over(spark, plan.logical, replace_leaves(spark, plan.physical, pairs))

    staged = []
    for step in template.steps:
        if step.kind == "shared":
            relation = cached_relation(frame(step.plan))
            rows = cached_rows(spark, relation, step.clustering)
            bindings[step.key] = (cached_scan(spark, relation) if rows is None
                                  else rows_scan(spark, rows, step.clustering))
            continue
        assert step.state is not None
        run = step.state.checkpoint(frame(step.plan), planned)
        bindings[step.key] = rows_scan(spark, rdd_of(run))
        merge = merge_of(step.state)
        staged.append(StagedRuns(step.state, (*merge.kept, Run(run, merge.new_weight))))
    return frame(template.final), staged
