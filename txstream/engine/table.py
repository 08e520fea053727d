"""The Table API: pipeline authors build a DAG of tables, Pathway-style.

    p = Pipeline()
    orders = p.source("orders", TableSchema.of({...}, primary_key=["order_id"]))
    paid = orders.filter("status = 'paid'")
    totals = paid.groupby("customer_id").reduce(n=r.count(), total=r.sum("amount"))
    p.output("totals", totals)

Each operation adds nodes to the DAG (`txstream.engine.nodes`), which only refer to tables
built before them. Expressions are Spark SQL; they are type-checked when the pipeline is
compiled by the engine. Outer joins are composed from inner joins, `distinct` and null padding,
so every node kind has one incremental rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.nodes import (
    CLOCK_SOURCE,
    WALL_TIME,
    BehaviorNode,
    ConcatNode,
    DistinctNode,
    FilterNode,
    JoinHow,
    JoinNode,
    LateNode,
    NegateNode,
    Node,
    NowFilterNode,
    PadNode,
    ReduceNode,
    SelectNode,
    SessionNode,
    SourceNode,
)
from txstream.engine.reducers import Reducer
from txstream.engine.temporal import (
    WINDOW_END,
    WINDOW_START,
    Behavior,
    CommonBehavior,
    ExactlyOnceBehavior,
    Session,
    Sliding,
    session_rules,
)
from txstream.engine.temporal_joins import TemporalJoins
from txstream.schemas.tables import TableSchema

_NOW = re.compile(r"\bnow\s*\(|\bcurrent_timestamp\b", re.IGNORECASE)


class Table(TemporalJoins):
    """A table of the pipeline: a handle on a DAG node with the operations of the API."""

    def __init__(self, pipeline: Pipeline, node: Node) -> None:
        self.pipeline = pipeline
        self.node = node

    def __repr__(self) -> str:
        return f"Table({self.node.label})"

    def _derive(self, node: Node) -> Table:
        return Table(self.pipeline, node)

    def _same_pipeline(self, other: Table) -> None:
        if other.pipeline is not self.pipeline:
            raise PipelineDefinitionError(
                f"{other.node.label} belongs to another pipeline than {self.node.label}"
            )

    def select(self, *columns: str, **exprs: str) -> Table:
        """New columns from Spark SQL expressions: `select("id", total="price * qty")`."""
        pairs = tuple((c, f"`{c}`") for c in columns) + tuple(exprs.items())
        if not pairs:
            raise PipelineDefinitionError(f"select on {self.node.label} names no column")
        names = [n for n, _ in pairs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PipelineDefinitionError(
                f"select on {self.node.label} names column(s) twice: {', '.join(dupes)}"
            )
        label = f"select({', '.join(names)}) of {self.node.label}"
        return self._derive(SelectNode(label, (self.node,), exprs=pairs))

    def filter(self, predicate: str) -> Table:
        """Rows for which the Spark SQL predicate is true (null counts as false). The predicate
        may compare a column with now(), the transaction's wall time (`ts >= now() - INTERVAL
        1 HOUR`): rows then enter and leave as the wall time moves (see
        `txstream.engine.operators.now_filter`)."""
        label = f"filter({predicate}) of {self.node.label}"
        if _NOW.search(predicate):
            return self._derive(NowFilterNode(label, (self.node, self.pipeline.clock()),
                                              predicate=predicate))
        return self._derive(FilterNode(label, (self.node,), predicate=predicate))

    def join(self, other: Table, on: str | Sequence[str], how: JoinHow = "inner") -> Table:
        """Equi-join on columns of the same name on both sides (SQL `JOIN ... USING`).

        The result has the key columns, then the left's other columns, then the right's; a
        non-key column name present on both sides is an error (rename it with `select` first).
        For outer joins the key columns take the value of whichever side is present.
        """
        self._same_pipeline(other)
        keys = (on,) if isinstance(on, str) else tuple(on)
        if not keys:
            raise PipelineDefinitionError(f"join of {self.node.label} needs at least one key")
        if how not in ("inner", "left", "right", "outer"):
            raise PipelineDefinitionError(
                f"join how={how!r} is not one of inner, left, right, outer"
            )
        label = f"{how} join of {self.node.label} and {other.node.label} on {', '.join(keys)}"
        inner = JoinNode(label, (self.node, other.node), on=keys)
        parts: list[Node] = [inner]
        if how in ("left", "outer"):
            parts.append(self._unmatched(self.node, other.node, keys, "left", label))
        if how in ("right", "outer"):
            parts.append(self._unmatched(other.node, self.node, keys, "right", label))
        if len(parts) == 1:
            return self._derive(inner)
        return self._derive(ConcatNode(label, tuple(parts)))

    @staticmethod
    def _unmatched(side: Node, other: Node, keys: tuple[str, ...],
                   position: Literal["left", "right"], label: str) -> Node:
        # Rows of `side` with no partner: side - (side semijoin distinct(keys of other)).
        other_keys = DistinctNode(
            f"distinct keys of {other.label}",
            (SelectNode(f"keys of {other.label}", (other,),
                        exprs=tuple((k, f"`{k}`") for k in keys)),),
        )
        matched = JoinNode(f"rows of {side.label} with a partner", (side, other_keys), on=keys)
        # The semijoin lays the keys out first; bring back the side's own column order.
        unmatched = ConcatNode(
            f"rows of {side.label} without a partner",
            (side, NegateNode(f"minus matched rows of {side.label}", (matched,))),
        )
        return PadNode(f"{position} padding of {label}", (unmatched, other), on=keys,
                       side=position)

    def groupby(self, *keys: str) -> GroupedTable:
        if not keys:
            raise PipelineDefinitionError(
                f"groupby on {self.node.label} needs at least one column"
            )
        return GroupedTable(self, tuple(keys))

    def windowby(self, time: str, *, window: Sliding | Session,
                 instance: str | Sequence[str] = (), behavior: Behavior | None = None
                 ) -> GroupedTable:
        """Group by `instance` (columns) and the event-time windows of `window`
        (`txstream.temporal`'s `tumbling`, `sliding` or `session`) the column `time` falls in;
        `.reduce(...)` gives `*instance, window_start, window_end` and the reducers. A row
        becomes a row of each of its windows (a select and a filter per hop back, concatenated;
        for sessions, an operator of its own), and the reduce after it is exact as any reduce
        is (see `txstream.engine.temporal`). A `behavior` (`common_behavior`,
        `exactly_once_behavior`) decides when those rows reach the reduce and when closed
        windows leave it."""
        if not isinstance(window, Sliding | Session):
            raise PipelineDefinitionError(
                f"windowby on {self.node.label}: window={window!r} is not a window (use "
                "txstream.temporal.tumbling, sliding or session)")
        if behavior is not None and not isinstance(behavior,
                                                   CommonBehavior | ExactlyOnceBehavior):
            raise PipelineDefinitionError(
                f"windowby on {self.node.label}: behavior={behavior!r} is not a behavior (use "
                "txstream.temporal.common_behavior or exactly_once_behavior)")
        keys = (instance,) if isinstance(instance, str) else tuple(instance)
        self.pipeline.event_time(self.node, time)
        label = f"{window.describe()} windows of {self.node.label} by {time}"
        if isinstance(window, Session):
            rules = (session_rules(behavior, window, self.node.label) if behavior is not None
                     else None)
            if rules is not None:
                label = f"{label} under {behavior.describe()}"  # type: ignore[union-attr]
            sessions = SessionNode(label, (self.node,), time=time, instance=keys, window=window,
                                   behavior=rules)
            return GroupedTable(self._derive(sessions), (*keys, WINDOW_START, WINDOW_END),
                                late=self._late(sessions) if rules is not None else None)
        quoted = f"`{time}`"
        parts = []
        for back in range(window.windows_per_row):
            start, end = window.bounds(quoted, back)
            bounded = SelectNode(f"{label}: bounds {back} hop(s) back", (self.node,),
                                 exprs=((WINDOW_START, start), (WINDOW_END, end)),
                                 keep_input=True)
            parts.append(FilterNode(f"{label}: rows {back} hop(s) back", (bounded,),
                                    predicate=window.holds(quoted)))
        windowed = parts[0] if len(parts) == 1 else ConcatNode(label, tuple(parts))
        grouped = GroupedTable(self._derive(windowed), (*keys, WINDOW_START, WINDOW_END))
        if behavior is not None:
            resolved = behavior.resolved(window, self.node.label)
            node = BehaviorNode(f"{label} under {behavior.describe()}", (windowed,), time=time,
                                timed=window.timed, behavior=resolved)
            # Without a cutoff no row is ever late.
            late = self._late(node) if resolved.cutoff is not None else None
            grouped = GroupedTable(self._derive(node), grouped.keys, late=late)
        return grouped

    def _late(self, node: Node) -> LateNode:
        """The late rows' table of the temporal behavior `node`, counted by the engine."""
        late = LateNode(f"late rows of {node.label}", (node,))
        self.pipeline.late.append(late)
        return late

    def concat(self, *others: Table) -> Table:
        """Union all: the same columns (names and types, in order) on every side."""
        for o in others:
            self._same_pipeline(o)
        nodes = (self.node, *(o.node for o in others))
        return self._derive(ConcatNode(f"concat of {', '.join(n.label for n in nodes)}", nodes))

    def distinct(self) -> Table:
        return self._derive(DistinctNode(f"distinct of {self.node.label}", (self.node,)))


class GroupedTable:
    def __init__(self, table: Table, keys: tuple[str, ...], late: LateNode | None = None
                 ) -> None:
        self.table = table
        self.keys = keys
        self._late = late

    def late_rows(self) -> Table:
        """The rows the temporal behavior found late, as a table to route to any sink: the
        row, its window (`window_start`, `window_end`), `late_clock` (the clock before the
        row's transaction, of the time column's type) and `late_operator` (the windowed
        table's label). Each late change is one change of it, at its transaction."""
        if self._late is None:
            raise PipelineDefinitionError(
                f"late_rows of {self.table.node.label}: only a behavior with a cutoff finds "
                "rows late; give windowby a behavior with one")
        return self.table._derive(self._late)

    def reduce(self, **reducers: Reducer) -> Table:
        """One row per group: the key columns, then one column per reducer."""
        if not reducers:
            raise PipelineDefinitionError(
                f"reduce of {self.table.node.label} names no reducer"
            )
        clash = sorted(set(reducers) & set(self.keys))
        if clash:
            raise PipelineDefinitionError(
                f"reduce of {self.table.node.label}: reducer name(s) {', '.join(clash)} "
                "are also group-by columns"
            )
        for name, red in reducers.items():
            if not isinstance(red, Reducer):
                raise PipelineDefinitionError(
                    f"reduce of {self.table.node.label}: {name}={red!r} is not a reducer "
                    "(use txstream.engine.reducers: count, sum, avg, min, max, count_distinct)"
                )
        label = f"groupby({', '.join(self.keys)}).reduce of {self.table.node.label}"
        node = ReduceNode(label, (self.table.node,), keys=self.keys,
                          reducers=tuple(reducers.items()))
        return self.table._derive(node)


@dataclass(frozen=True)
class Output:
    name: str
    node: Node
    primary_key: tuple[str, ...] | None


class Pipeline:
    """Sources, the tables computed from them, and the named outputs."""

    def __init__(self) -> None:
        self.sources: dict[str, SourceNode] = {}
        self.outputs: dict[str, Output] = {}
        # The late rows' table of every temporal behavior defined: the engine counts them
        # (`late_rows`) whether or not an output shows them.
        self.late: list[LateNode] = []
        self._clock: SourceNode | None = None
        # Source -> its columns a temporal operator reads as event time, where the operator's
        # input passes the column on unchanged: a record whose event time is null is a dead
        # letter rather than a row in no window.
        self.event_times: dict[str, set[str]] = {}

    def event_time(self, node: Node, column: str) -> None:
        """Note `column` of `node` as an event time, and the source column it is, if any."""
        while not isinstance(node, SourceNode):
            passed = isinstance(node, FilterNode | NowFilterNode) or (
                isinstance(node, SelectNode)
                and ((node.keep_input and column not in dict(node.exprs))
                     or (column, f"`{column}`") in node.exprs))
            if not passed:
                return  # computed: a null there is the pipeline's, not the record's
            node = node.inputs[0]
        if node.name != CLOCK_SOURCE:
            self.event_times.setdefault(node.name, set()).add(column)

    def clock(self) -> SourceNode:
        """The wall clock's source (made on first use): one row per transaction, its wall
        time, which the engine is given with the batch rather than read from Kafka."""
        if self._clock is None:
            self._clock = SourceNode("wall clock", (), name=CLOCK_SOURCE,
                                     schema=TableSchema.of({WALL_TIME: "timestamp"}))
        return self._clock

    def source(self, name: str, schema: TableSchema) -> Table:
        if name in self.sources:
            raise PipelineDefinitionError(f"source {name!r} is defined twice")
        if name.startswith("__"):
            raise PipelineDefinitionError(
                f"source {name!r}: names starting with '__' are the engine's (its wall clock is "
                f"{CLOCK_SOURCE!r}); rename it")
        node = SourceNode(f"source {name}", (), name=name, schema=schema)
        self.sources[name] = node
        return Table(self, node)

    def output(self, name: str, table: Table, primary_key: Sequence[str] | None = None) -> None:
        """Name a table as an output; `primary_key` overrides the key the engine infers."""
        if table.pipeline is not self:
            raise PipelineDefinitionError(f"output {name!r}: table belongs to another pipeline")
        if name in self.outputs:
            raise PipelineDefinitionError(f"output {name!r} is defined twice")
        self.outputs[name] = Output(name, table.node,
                                    tuple(primary_key) if primary_key is not None else None)

    def nodes(self) -> Iterator[Node]:
        """Every node the outputs depend on, each once, inputs before the nodes using them;
        then the late rows' tables of the temporal behaviors among them."""
        seen: set[int] = set()
        order: list[Node] = []

        def visit(node: Node) -> None:
            # Iterative-enough: DAG depth is the pipeline's, not the data's.
            if node.id in seen:
                return
            for i in node.inputs:
                visit(i)
            seen.add(node.id)
            order.append(node)

        for out in self.outputs.values():
            visit(out.node)
        for late in self.late:  # after the outputs': no other node's number moves
            if late.inputs[0].id in seen:
                visit(late)
        return iter(order)
