"""The temporal joins of the Table API (`Table` inherits them): as-of, as-of-now and interval
joins, each a node or a composition of nodes; their rules are in their operators' docs
(`txstream.engine.operators.asof_join`, `asof_now_join`) and in `txstream.engine.temporal`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol, Self

from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.nodes import (
    AsofHow,
    AsofJoinNode,
    AsofNowJoinNode,
    BehaviorNode,
    ConcatNode,
    Direction,
    FilterNode,
    JoinHow,
    LateNode,
    Node,
    PadNode,
    UnmatchedNode,
)
from txstream.engine.temporal import CommonBehavior, Interval, Resolved

Side = Literal["left", "right"]


class _Pipeline(Protocol):
    """What the joins ask of `txstream.engine.table.Pipeline`."""

    def event_time(self, node: Node, column: str) -> None: ...


class TemporalJoins:
    """The joins by time of `Table` (see the module doc)."""

    pipeline: _Pipeline
    node: Node
    # Of a join under a behavior with a cutoff: each side's late rows (`late_rows`). Shared by
    # every other table, never changed: a join's table is given a dict of its own.
    _late_sides: dict[Side, LateNode] = {}

    if TYPE_CHECKING:
        def _derive(self, node: Node) -> Self: ...
        def _late(self, node: Node) -> LateNode: ...
        def _same_pipeline(self, other: Self) -> None: ...
        def join(self, other: Self, on: str | Sequence[str], how: JoinHow = "inner"
                 ) -> Self: ...
        def select(self, *columns: str, **exprs: str) -> Self: ...

    def asof_join(self, other: Self, self_time: str, other_time: str,
                  on: str | Sequence[str] = (), how: AsofHow = "inner",
                  direction: Direction = "backward",
                  behavior: CommonBehavior | None = None) -> Self:
        """Each row of this table with the row of `other` with the same `on` columns whose
        `other_time` is nearest its `self_time`: the greatest at or before it (`backward`), the
        least at or after it (`forward`), or the closest (`nearest`, a tie going forward), as
        Pathway's `asof_join`; right rows of equal time are told apart by their other columns
        (the least first). `how="left"` keeps a row with no such partner, the right's columns
        null. Exact under inserts, updates and deletes on either side, as of each transaction.
        Columns as `join`'s: the `on` columns, the left's others, the right's others.

        A `behavior` (`common_behavior`) applies to each side by its own clock, as Pathway's:
        a row is delayed until its side's clock reaches its time plus `delay`; with a `cutoff`
        a row at or below its side's clock minus the cutoff is late (ignored, `late_rows`), a
        left row is forgotten once its side's clock passes it so (its pair stays, or leaves
        with `keep_results=False`), and a right row once no row can reach it any more (what
        Pathway forgets by the right's clock alone could still be a left row's partner)."""
        self._same_pipeline(other)
        keys = self._time_keys("asof_join", on, self_time, other_time)
        if how not in ("inner", "left"):
            raise PipelineDefinitionError(
                f"asof_join how={how!r} is not one of inner, left (a right row is not matched "
                "to one left row, so right and outer as-of joins have no meaning here)")
        if direction not in ("backward", "forward", "nearest"):
            raise PipelineDefinitionError(
                f"asof_join direction={direction!r} is not one of backward, forward, nearest")
        self.pipeline.event_time(self.node, self_time)
        self.pipeline.event_time(other.node, other_time)
        label = (f"{how} {direction} asof_join of {self.node.label} and {other.node.label} by "
                 f"{self_time}, {other_time}" + (f" on {', '.join(keys)}" if keys else ""))
        rules = self._rules("asof_join", behavior, None)
        if rules is None:
            return self._derive(AsofJoinNode(label, (self.node, other.node), left_time=self_time,
                                             right_time=other_time, on=keys, how=how,
                                             direction=direction))
        resolved, timed = rules
        sides = self._behaved(other, self_time, other_time, resolved, timed, label,
                              right_forgets=False,
                              keep_timeless={"left": how == "left", "right": False})
        return self._joined(AsofJoinNode(label, sides, left_time=self_time,
                                         right_time=other_time, on=keys, how=how,
                                         direction=direction, cutoff=resolved.cutoff), sides)

    def asof_now_join(self, other: Self, on: str | Sequence[str] = (),
                      how: AsofHow = "inner") -> Self:
        """Each row inserted into this table with the rows of `other` with the same `on`
        columns present at its transaction, once: later changes of `other` do not update it,
        nor does the row's deletion (Pathway's `asof_now_join`, the right side as of the
        transaction, so a replay gives the same pairs). `how="left"` keeps an inserted row with
        no partner, the right's columns null. Only `other` is kept in state. Columns as
        `join`'s: the `on` columns, the left's others, the right's others."""
        self._same_pipeline(other)
        keys = (on,) if isinstance(on, str) else tuple(on)
        if how not in ("inner", "left"):
            raise PipelineDefinitionError(
                f"asof_now_join how={how!r} is not one of inner, left (right rows are not "
                "looked up, so right and outer as-of-now joins have no meaning)")
        label = (f"{how} asof_now_join of {self.node.label} and {other.node.label}"
                 + (f" on {', '.join(keys)}" if keys else ""))
        return self._derive(AsofNowJoinNode(label, (self.node, other.node), on=keys, how=how))

    def interval_join(self, other: Self, self_time: str, other_time: str, window: Interval,
                      on: str | Sequence[str], how: JoinHow = "inner",
                      behavior: CommonBehavior | None = None) -> Self:
        """The pairs of this table's rows and `other`'s with the same `on` columns whose times
        are within `window` (`txstream.temporal.interval`): `lower_bound <= other_time -
        self_time <= upper_bound`, Pathway's `interval_join`. Columns as `join`'s. `how="left"`
        (`"right"`, `"outer"`) adds each row of this table (of `other`, of both) while it has
        no pair in the output, the other side's columns null. An equi-join and a filter, and
        for the unmatched rows an operator counting each row's pairs
        (`txstream.engine.operators.unmatched`); without a behavior both sides' rows stay in
        state.

        A `behavior` (`common_behavior`) applies to each side by its own clock, as Pathway's:
        a row is delayed until its side's clock reaches its time plus `delay`; with a `cutoff`
        a row at or below its side's clock minus the cutoff is late (ignored, `late_rows`), and
        a row in state is forgotten once its side's clock passes it so: its pairs stay (or
        leave, with `keep_results=False`), and it pairs with no later row. A forgotten row of a
        padded side stays padded if it had no pair then, and is never padded if it had one
        (or leaves with its pairs, with `keep_results=False`)."""
        if not isinstance(window, Interval):
            raise PipelineDefinitionError(
                f"interval_join of {self.node.label}: {window!r} is not an interval (use "
                "txstream.temporal.interval)")
        if how not in ("inner", "left", "right", "outer"):
            raise PipelineDefinitionError(
                f"interval_join how={how!r} is not one of inner, left, right, outer")
        keys = self._time_keys("interval_join", on, self_time, other_time)
        self.pipeline.event_time(self.node, self_time)
        self.pipeline.event_time(other.node, other_time)
        rules = self._rules("interval_join", behavior, window.timed)
        label = ((f"{how} " if how != "inner" else "") + f"interval_join of {self.node.label} "
                 f"and {other.node.label} on {', '.join(keys)}")
        padded = {"left": how in ("left", "outer"), "right": how in ("right", "outer")}
        sides: tuple[Node, Node] = (self.node, other.node)
        # With a cutoff, rows close: the unmatched rows' counts are forgotten with them.
        timed, cutoff = False, None
        if rules is not None:
            resolved, timed = rules
            cutoff = resolved.cutoff
            sides = self._behaved(other, self_time, other_time, resolved, timed, label,
                                  right_forgets=True, keep_timeless=padded)
        pairs = self._derive(sides[0]).join(self._derive(sides[1]), keys) \
            .filter(window.holds(self_time, other_time))
        if how != "inner":
            parts = [pairs.node]
            for position, side, others, time in (("left", sides[0], other.node, self_time),
                                                 ("right", sides[1], self.node, other_time)):
                if padded[position]:
                    unmatched = UnmatchedNode(f"rows of {side.label} without a pair in time",
                                              (side, pairs.node), on=keys, time=time,
                                              timed=timed, cutoff=cutoff)
                    parts.append(PadNode(f"{position} padding of {label}",
                                         (unmatched, others), on=keys, side=position))
            pairs = self._derive(ConcatNode(label, tuple(parts)))
        return pairs if rules is None else self._joined(pairs.node, sides)

    def _time_keys(self, join: str, on: str | Sequence[str], self_time: str,
                   other_time: str) -> tuple[str, ...]:
        """The `on` columns of a join by time, which cannot hold its times."""
        keys = (on,) if isinstance(on, str) else tuple(on)
        if self_time in keys or other_time in keys:
            raise PipelineDefinitionError(
                f"{join} of {self.node.label}: the times {self_time!r} and {other_time!r} "
                "cannot be on columns (each side's time is its own column of the result)")
        return keys

    def late_rows(self, side: Side = "left") -> Self:
        """The rows of one side (`"left"`, `"right"`) that the behavior of the join making this
        table found late, as a table to route to any sink: the row, `late_clock` (its side's
        clock before the row's transaction: with a delay, the largest time released) and
        `late_operator` (the side's label)."""
        if side not in ("left", "right"):
            raise PipelineDefinitionError(
                f"late_rows of {self.node.label}: side is 'left' or 'right', not {side!r}")
        if side not in self._late_sides:
            raise PipelineDefinitionError(
                f"late_rows of {self.node.label}: only an asof_join or interval_join under a "
                "behavior with a cutoff finds rows late; call late_rows on that join's table")
        return self._derive(self._late_sides[side])

    def _rules(self, join: str, behavior: CommonBehavior | None, timed: bool | None
               ) -> tuple[Resolved, bool] | None:
        """A join's behavior in its times' units, and whether they are timestamps; None when
        there is none, or it changes nothing (no delay, no cutoff)."""
        if behavior is None:
            return None
        if not isinstance(behavior, CommonBehavior):
            raise PipelineDefinitionError(
                f"{join} of {self.node.label}: behavior={behavior!r} is not a common_behavior "
                "(exactly_once_behavior is for windows)")
        kinds = ("the interval: timedeltas for timestamps, numbers for numeric times"
                 if timed is not None else "the other length: both timedeltas or both numbers")
        resolved = behavior.in_units(timed, f"{join} of {self.node.label}", kinds)
        if resolved.delay is None and resolved.cutoff is None:
            return None
        return resolved, timed if timed is not None else bool(behavior.timed)

    def _behaved(self, other: Self, self_time: str, other_time: str, rules: Resolved,
                 timed: bool, label: str, right_forgets: bool,
                 keep_timeless: dict[Side, bool]) -> tuple[Node, Node]:
        """Each side of a join by time under the behavior `rules`, by its own clock: its time
        the bounds a row is released and closed by (`BehaviorNode`). With a delay and a cutoff,
        two nodes, as Pathway chains them: the cutoff judges the delayed rows by their clock
        (the largest time released), not by the rows' as they arrive. A row without a time
        pairs with nothing and would never be forgotten: it is left out first, but on a side
        whose rows without a partner are shown padded (`keep_timeless`)."""
        behaved = []
        for table, time, side, forgets, timeless in (
                (self, self_time, "left", True, keep_timeless["left"]),
                (other, other_time, "right", right_forgets, keep_timeless["right"])):
            node, steps = table.node, [rules]
            if not timeless:
                node = FilterNode(f"{side} rows with a time of {label}", (node,),
                                  predicate=f"`{time}` IS NOT NULL")
            if rules.delay is not None and rules.cutoff is not None:
                steps = [Resolved(rules.delay, None),
                         Resolved(None, rules.cutoff, keep_results=rules.keep_results)]
            for i, step in enumerate(steps):
                name = f"{side} side of {label}" + (" (delayed)" if i < len(steps) - 1 else "")
                node = BehaviorNode(name, (node,), time=time, timed=timed, behavior=step,
                                    bounds=(time, time), forgets=forgets)
            behaved.append(node)
        return behaved[0], behaved[1]

    def _joined(self, node: Node, sides: tuple[Node, Node]) -> Self:
        """The join `node` of the behaved `sides`, which knows their late rows' tables."""
        joined = self._derive(node)
        behavior = sides[0]
        assert isinstance(behavior, BehaviorNode)
        if behavior.behavior.cutoff is not None:
            joined._late_sides = {"left": self._late(sides[0]), "right": self._late(sides[1])}
        return joined
