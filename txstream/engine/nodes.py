"""The nodes of a pipeline's DAG: one kind per incremental rule (an operator each,
`txstream.engine.operators`), immutable, each referring only to the nodes it is computed from,
so that a cycle cannot be built. The Table API (`txstream.engine.table`) makes them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

from txstream.engine.reducers import Reducer
from txstream.engine.temporal import WINDOW_END, WINDOW_START, Resolved, Session
from txstream.schemas.tables import TableSchema

# The wall clock's source: the transactions' wall times, as the engine is given them
# (`Engine.process`), read by every filter that calls now(); no user's source can have its name.
CLOCK_SOURCE, WALL_TIME = "__now", "wall_time"
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
    # Under a behavior with a cutoff (both inputs its outputs): the cutoff in the times' units,
    # by which right rows no row can reach any more are dropped.
    cutoff: int | float | None = None


@dataclass(frozen=True, eq=False)
class AsofNowJoinNode(Node):
    """Each row inserted into `inputs[0]` with the rows of `inputs[1]` of the same `on` columns
    present at its transaction, once (`txstream.engine.operators.asof_now_join`); columns as
    a `JoinNode`'s."""

    on: tuple[str, ...] = ()
    how: AsofHow = "inner"


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
class UnmatchedNode(Node):
    """The rows of a join's side (`inputs[0]`, a temporal behavior's output or not) that have
    no pair among the join's pairs (`inputs[1]`, which hold the side's columns): the outer part
    of an interval join (`txstream.engine.operators.unmatched`). `on`: the join's keys. Under a
    behavior with a cutoff: the side's event-time column `time` (`timed`: a timestamp), and the
    cutoff in its units, after which a row is closed and its count forgotten."""

    on: tuple[str, ...] = ()
    time: str = ""
    timed: bool = False
    cutoff: int | float | None = None


@dataclass(frozen=True, eq=False)
class BehaviorNode(Node):
    """A table's rows as a temporal behavior lets them through, by the clock of the event-time
    column `time` (`txstream.engine.operators.behavior`); `timed`: a timestamp column, the
    behavior's lengths in microseconds. `bounds`: the columns a row's release and close are
    reckoned from (a window's start and end; for a join's side, its time twice). `forgets`:
    whether released rows leave at close (not for the right side of an as-of join, whose rows
    the join itself drops once no row can reach them)."""

    time: str = ""
    timed: bool = False
    behavior: Resolved = field(default_factory=lambda: Resolved(None, None))
    bounds: tuple[str, str] = (WINDOW_START, WINDOW_END)
    forgets: bool = True


@dataclass(frozen=True, eq=False)
class SessionNode(Node):
    """The input's rows, each with its session (`window_start`, `window_end`) among the rows of
    its `instance` by the event-time column `time` (`txstream.engine.operators.session`)."""

    time: str = ""
    instance: tuple[str, ...] = ()
    window: Session = field(default_factory=lambda: Session(1))
    # A behavior's rules for sessions (`txstream.engine.temporal.session_rules`), if any.
    behavior: Resolved | None = None


@dataclass(frozen=True, eq=False)
class ReduceNode(Node):
    keys: tuple[str, ...] = ()
    reducers: tuple[tuple[str, Reducer], ...] = ()


@dataclass(frozen=True, eq=False)
class LateNode(Node):
    """The rows a temporal behavior (`inputs[0]`, a `BehaviorNode` or a `SessionNode` with a
    behavior) found late: the windowed
    row, `late_clock` (the clock before its transaction) and `late_operator` (the behavior's
    label)."""
