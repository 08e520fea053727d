"""The Table API: pipeline authors build a DAG of tables, Pathway-style.

    p = Pipeline()
    orders = p.source("orders", TableSchema.of({...}, primary_key=["order_id"]))
    paid = orders.filter("status = 'paid'")
    totals = paid.groupby("customer_id").reduce(n=r.count(), total=r.sum("amount"))
    p.output("totals", totals)

Nodes are immutable and only refer to tables built before them, so a cycle cannot be built.
Expressions are Spark SQL; they are type-checked when the pipeline is compiled by the engine.
Outer joins are composed from inner joins, `distinct` and null padding, so every node kind
below has one incremental rule.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.reducers import Reducer
from txstream.engine.temporal import (
    WINDOW_END,
    WINDOW_START,
    Behavior,
    CommonBehavior,
    ExactlyOnceBehavior,
    Resolved,
    Session,
    Sliding,
)
from txstream.schemas.tables import TableSchema

# The wall clock's source: the transactions' wall times, as the engine is given them
# (`Engine.process`), read by every filter that calls now(); no user's source can have its name.
CLOCK_SOURCE, WALL_TIME = "__now", "wall_time"
_NOW = re.compile(r"\bnow\s*\(|\bcurrent_timestamp\b", re.IGNORECASE)
JoinHow = Literal["inner", "left", "right", "outer"]
AsofHow = Literal["inner", "left"]
Direction = Literal["backward", "forward", "nearest"]
_ids = itertools.count(1)


@dataclass(frozen=True, eq=False)
class Node:
    """One table of the DAG. `inputs` are the tables it is computed from."""

    label: str
    inputs: tuple[Node, ...]
    id: int = field(default_factory=lambda: next(_ids), init=False)


@dataclass(frozen=True, eq=False)
class SourceNode(Node):
    name: str = ""
    schema: TableSchema | None = None


@dataclass(frozen=True, eq=False)
class SelectNode(Node):
    exprs: tuple[tuple[str, str], ...] = ()  # (output name, Spark SQL expression)
    # The input's columns first, as they are, then `exprs` (new names only): a row-wise
    # extension of a table whose columns the definition does not know (window bounds).
    keep_input: bool = False


@dataclass(frozen=True, eq=False)
class FilterNode(Node):
    predicate: str = ""


@dataclass(frozen=True, eq=False)
class NowFilterNode(Node):
    """Rows of `inputs[0]` for which `predicate`, which calls now(), is true as of each
    transaction's wall time (`inputs[1]`, the wall clock's source;
    `txstream.engine.operators.now_filter`)."""

    predicate: str = ""


@dataclass(frozen=True, eq=False)
class ConcatNode(Node):
    pass


@dataclass(frozen=True, eq=False)
class NegateNode(Node):
    """Every diff negated: the `-` of Z-set algebra, used to build outer joins."""


@dataclass(frozen=True, eq=False)
class JoinNode(Node):
    """Inner equi-join; columns: the keys, the left's other columns, the right's other columns."""

    on: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class AsofJoinNode(Node):
    """Each row of `inputs[0]` with the row of `inputs[1]` of the same `on` columns whose time
    (`right_time`) is the nearest to its own (`left_time`) in `direction`
    (`txstream.engine.operators.asof_join`); columns as a `JoinNode`'s."""

    left_time: str = ""
    right_time: str = ""
    on: tuple[str, ...] = ()
    how: AsofHow = "inner"
    direction: Direction = "backward"


@dataclass(frozen=True, eq=False)
class PadNode(Node):
    """The rows of `inputs[0]` laid out as a join's output, the other side's columns null.

    `inputs[1]` is the other side (only its schema is used). `side` says where the input
    stands in the join's column order.
    """

    on: tuple[str, ...] = ()
    side: Literal["left", "right"] = "left"


@dataclass(frozen=True, eq=False)
class DistinctNode(Node):
    pass


@dataclass(frozen=True, eq=False)
class BehaviorNode(Node):
    """A windowed table's rows as a temporal behavior lets them through, by the clock of the
    event-time column `time` (`txstream.engine.operators.behavior`); `timed`: a timestamp
    column, the behavior's lengths in microseconds."""

    time: str = ""
    timed: bool = False
    behavior: Resolved = field(default_factory=lambda: Resolved(None, None))


@dataclass(frozen=True, eq=False)
class SessionNode(Node):
    """The input's rows, each with its session (`window_start`, `window_end`) among the rows of
    its `instance` by the event-time column `time` (`txstream.engine.operators.session`)."""

    time: str = ""
    instance: tuple[str, ...] = ()
    window: Session = field(default_factory=lambda: Session(1))


@dataclass(frozen=True, eq=False)
class ReduceNode(Node):
    keys: tuple[str, ...] = ()
    reducers: tuple[tuple[str, Reducer], ...] = ()


@dataclass(frozen=True, eq=False)
class LateNode(Node):
    """The rows a temporal behavior (`inputs[0]`, a `BehaviorNode`) found late: the windowed
    row, `late_clock` (the clock before its transaction) and `late_operator` (the behavior's
    label)."""


class Table:
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

    def asof_join(self, other: Table, self_time: str, other_time: str,
                  on: str | Sequence[str] = (), how: AsofHow = "inner",
                  direction: Direction = "backward") -> Table:
        """Each row of this table with the row of `other` with the same `on` columns whose
        `other_time` is nearest its `self_time`: the greatest at or before it (`backward`), the
        least at or after it (`forward`), or the closest (`nearest`, a tie going forward), as
        Pathway's `asof_join`; right rows of equal time are told apart by their other columns
        (the least first). `how="left"` keeps a row with no such partner, the right's columns
        null. Exact under inserts, updates and deletes on either side, as of each transaction.
        Columns as `join`'s: the `on` columns, the left's others, the right's others."""
        self._same_pipeline(other)
        keys = (on,) if isinstance(on, str) else tuple(on)
        if how not in ("inner", "left"):
            raise PipelineDefinitionError(
                f"asof_join how={how!r} is not one of inner, left (a right row is not matched "
                "to one left row, so right and outer as-of joins have no meaning here)")
        if direction not in ("backward", "forward", "nearest"):
            raise PipelineDefinitionError(
                f"asof_join direction={direction!r} is not one of backward, forward, nearest")
        label = (f"{how} {direction} asof_join of {self.node.label} and {other.node.label} by "
                 f"{self_time}, {other_time}" + (f" on {', '.join(keys)}" if keys else ""))
        return self._derive(AsofJoinNode(label, (self.node, other.node), left_time=self_time,
                                         right_time=other_time, on=keys, how=how,
                                         direction=direction))

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
        label = f"{window.describe()} windows of {self.node.label} by {time}"
        if isinstance(window, Session):
            if behavior is not None:
                raise PipelineDefinitionError(
                    f"windowby on {self.node.label}: session windows take no behavior yet (a "
                    "session's end moves with its rows; Pathway ignores behaviors there); "
                    "drop behavior=, or use tumbling or sliding windows")
            sessions = SessionNode(label, (self.node,), time=time, instance=keys, window=window)
            return GroupedTable(self._derive(sessions), (*keys, WINDOW_START, WINDOW_END))
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
            late = None
            if resolved.cutoff is not None:  # without one no row is ever late
                late = LateNode(f"late rows of {node.label}", (node,))
                self.pipeline.late.append(late)
            grouped = GroupedTable(self._derive(node), grouped.keys, late=late)
        return grouped

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
