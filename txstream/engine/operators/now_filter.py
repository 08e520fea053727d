"""A filter that calls now(): rows enter and leave as the transactions' wall time moves
(Materialize's temporal filters, with `mz_now()` spelled `now()`).

    rows       --+--> [ predicate(row, now) at every transaction ] --> rows in force
    wall clock --+

The rule: now() at transaction t is the largest wall time of the transactions up to t (the
engine is given one per transaction, `Engine.process`), so it never moves back. The output at
t is the input's rows for which the predicate, now() being that time, is true (null counts as
false). now() may appear only compared directly with an expression of the row, alone or with
an interval added or subtracted (`ts >= now() - INTERVAL 1 HOUR`, `now() < expires`), in
comparisons ANDed with the rest of the predicate: then whether a row can ever pass again is
known, which bounds the state.

Delta rule: a change at transaction u counts at u if the predicate holds then; at every later
transaction t of the batch where now() moved, it counts the difference of the predicate at
now(t) and at now(t - 1). The rows held before the batch are changes at BEFORE_BATCH, so they
enter and leave as now() moves too (linear: no row is rebuilt from its changes).

State: the input's rows that may pass now or later, and the clock (now() after the last
transaction). A row that fails an upper bound (`now() < x`, `x >= now() - ...`) fails it for
good, since now() only grows, and so does a row that fails a conjunct without now(): from then
on it leaves the state (its later deletion is no change of the output either). A row that
passes every such conjunct and waits for a lower bound (`ts <= now()`: a row from its time on)
stays, however long, as any filter's input does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from py4j.java_gateway import JavaObject
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType, TimestampType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import build_side, col, join, prefixed, union_all
from txstream.engine.nodes import WALL_TIME, NowFilterNode
from txstream.engine.operators.base import (
    Clustered,
    Delta,
    Key,
    Operator,
    check_predicate,
    first_line,
)
from txstream.engine.operators.clocks import BEFORE, CLOCK, advance, clock_state, running
from txstream.engine.state import ZSetState

# now() inside the predicate once it is parsed: a column of the rows it is evaluated on.
NOW = "__now"
# Within one batch's plans: the clocks' columns when joined, a change's own transaction,
# whether the predicate holds at a transaction and before it, and whether a row fails a
# lasting conjunct.
_CLOCKS, _SINCE = "__clocks_", "__since"
_HOLDS, _HELD, _EXPIRED = "__holds", "__held", "__expired"
_COMPARISONS = {"LessThan": "<", "LessThanOrEqual": "<=", "GreaterThan": ">",
                "GreaterThanOrEqual": ">="}
_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_NOW_FUNCTIONS = ("now()", "current_timestamp()", "current_timestamp")


@dataclass(frozen=True)
class NowPredicate:
    """A predicate with now() written as the column `NOW`: the whole of it (`condition`) and
    the conjuncts that, once false for a row, stay false as now() grows (`lasting`: its upper
    bounds on now(), and those without now())."""

    condition: str
    lasting: tuple[str, ...]


def _children(expression: JavaObject) -> list[JavaObject]:
    children = expression.children()
    return [children.apply(i) for i in range(children.size())]


def _kind(expression: JavaObject) -> str:
    return str(expression.getClass().getSimpleName())


def _calls_now(expression: JavaObject) -> bool:
    if expression.sql().lower() in _NOW_FUNCTIONS:
        return True
    return any(_calls_now(c) for c in _children(expression))


def _now_term(expression: JavaObject) -> str | None:
    """`expression` as SQL over `NOW` if it is now() alone or with a constant added or
    subtracted (so it grows with now()); None otherwise."""
    if expression.sql().lower() in _NOW_FUNCTIONS:
        return f"`{NOW}`"
    if _kind(expression) in ("Add", "Subtract"):
        left, right = _children(expression)
        if left.sql().lower() in _NOW_FUNCTIONS and not _calls_now(right) \
                and not right.references().nonEmpty() and _kind(right) == "Literal":
            return f"(`{NOW}` {'+' if _kind(expression) == 'Add' else '-'} {right.sql()})"
    return None


def parse(spark: SparkSession, predicate: str, label: str) -> NowPredicate:
    """`predicate` with now() as the column `NOW`, checked to call it only as the module doc
    allows (`PipelineDefinitionError` naming `label` otherwise)."""
    try:
        parsed = spark._jsparkSession.sessionState().sqlParser().parseExpression(predicate)
    except Exception as exc:
        raise PipelineDefinitionError(f"{label}: {first_line(exc)}") from exc
    conjuncts, pending = [], [parsed]
    while pending:
        e = pending.pop()
        if _kind(e) == "And":
            pending += reversed(_children(e))
        else:
            conjuncts.append(e)
    parts, lasting = [], []
    for e in conjuncts:
        if not _calls_now(e):
            parts.append(f"({e.sql()})")
            lasting.append(parts[-1])
            continue
        op = _COMPARISONS.get(_kind(e))
        sides = _children(e) if op is not None else []
        terms = [_now_term(s) for s in sides]
        if op is None or sum(t is not None for t in terms) != 1 \
                or any(_calls_now(s) for s, t in zip(sides, terms, strict=True) if t is None):
            raise PipelineDefinitionError(
                f"{label}: now() must be compared directly with an expression of the row, "
                f"alone or plus or minus an interval (ts >= now() - INTERVAL 1 HOUR), in "
                f"comparisons ANDed with the rest of the predicate; not in {e.sql()}")
        left, right = sides
        if terms[0] is not None:
            written, now_op = f"({terms[0]} {op} ({right.sql()}))", op
        else:
            written, now_op = f"(({left.sql()}) {op} {terms[1]})", _MIRRORED[op]
        parts.append(written)
        if now_op in ("<", "<="):
            lasting.append(written)
    return NowPredicate(" AND ".join(parts), tuple(lasting))


class NowFilterOp(Operator):
    node: NowFilterNode

    def expressions(self) -> list[str]:
        return [self.node.predicate]

    def key(self, inputs: Sequence[Key]) -> Key:
        return inputs[0]

    def _resolve(self) -> StructType:
        rows = self.input_schemas[0]
        self.predicate = parse(self.spark, self.node.predicate, self.node.label)
        check_predicate(self.node, self._empty(StructType([*rows.fields,
                                                           StructField(NOW, TimestampType())])),
                        self.predicate.condition)
        self.rows = ZSetState(rows.names, [DIFF], placement=self.placement)
        self.clock = clock_state(self.placement)
        return rows

    def states(self) -> dict[str, ZSetState]:
        return {"rows": self.rows, "clock": self.clock}

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [wanted, None]

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d, walls = deltas
        if walls is None:
            assert d is None, "the engine gives a wall time with every transaction"
            return None
        planned = batch.parallelism
        names = self.input_schemas[0].names

        # now() after each transaction of the batch, and before it (BEFORE_BATCH: the clock).
        before = self.clock.whole(planned)
        clocks = running(walls.groupBy(col(TIME))
                         .agg(F.max(F.unix_micros(col(WALL_TIME))).alias(CLOCK)), before, batch)

        changes = [d.select(*[col(n) for n in names], col(TIME), col(DIFF))] \
            if d is not None else []
        held = self.rows.whole(planned)
        if held is not None:
            changes.append(held.select(*[col(n) for n in names],
                                       F.lit(BEFORE_BATCH).cast("long").alias(TIME), col(DIFF)))
        if not changes:
            advance(self.clock, before, clocks, batch)
            return None
        changed = batch.shared(union_all(changes, planned))

        # Each change at its own transaction and at every later one where now() moved.
        c = build_side(prefixed(clocks, _CLOCKS))
        at, then = c[f"`{_CLOCKS}{TIME}`"], changed[f"`{TIME}`"]
        moved = c[f"`{_CLOCKS}{CLOCK}`"] != c[f"`{_CLOCKS}{BEFORE}`"]
        pairs = join(changed, c, ((then == at) & (at != BEFORE_BATCH)) | ((then < at) & moved),
                     "inner", planned)
        condition = self.predicate.condition
        now_then = pairs.select(*[col(n) for n in names], col(TIME).alias(_SINCE),
                                col(f"{_CLOCKS}{TIME}").alias(TIME), col(DIFF),
                                F.timestamp_micros(col(f"{_CLOCKS}{CLOCK}")).alias(NOW),
                                F.timestamp_micros(col(f"{_CLOCKS}{BEFORE}")).alias(BEFORE))
        holds = F.coalesce(F.expr(condition), F.lit(False)).cast("long")
        with_now = now_then.select("*", holds.alias(_HOLDS))
        held_before = with_now.select(
            *[col(n) for n in names], col(_SINCE), col(TIME), col(DIFF), col(_HOLDS),
            col(BEFORE).alias(NOW)).select("*", holds.alias(_HELD))
        diff = F.when(col(_SINCE) == col(TIME), col(_HOLDS) * col(DIFF)) \
            .otherwise((col(_HOLDS) - col(_HELD)) * col(DIFF))
        out = held_before.select(*[col(n) for n in names], col(TIME), diff.alias(DIFF)) \
            .where(col(DIFF) != 0)

        # The rows that fail a lasting conjunct at the batch's last now() leave the state.
        last = clocks.agg(F.max(col(CLOCK)).alias(CLOCK))
        expired = self._expired(changed, last, planned)
        batch.append(self.rows, expired.select(
            *[col(n) for n in names],
            F.when(col(TIME) == BEFORE_BATCH, F.when(col(_EXPIRED), -col(DIFF)))
            .otherwise(F.when(~col(_EXPIRED), col(DIFF))).alias(DIFF))
            .where(col(DIFF).isNotNull()))
        advance(self.clock, before, clocks, batch)
        return batch.consolidated(out, self.columns, self.readers_cluster_by)

    def _expired(self, changed: DataFrame, last: DataFrame, planned: int) -> DataFrame:
        """`changed` with `__expired`: whether the row fails a lasting conjunct (see
        `NowPredicate`) at `last`'s clock."""
        if not self.predicate.lasting:
            return changed.select("*", F.lit(False).alias(_EXPIRED))
        fails = " OR ".join(f"NOT coalesce({u}, false)" for u in self.predicate.lasting)
        now = build_side(last.select(F.timestamp_micros(col(CLOCK)).alias(NOW)))
        return join(changed, now, F.lit(True), "inner", planned).select(
            *[col(n) for n in changed.columns], F.expr(f"({fails})").alias(_EXPIRED))
