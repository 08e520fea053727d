"""Session windows: each row with its session among the rows of its instance (Pathway's
`session(max_gap)`).

    rows --> [ per instance: rows sorted by time, a new session at every gap >= max_gap ]
         --> rows + window_start, window_end --> the ordinary reduce

The rule: at any transaction, an instance's rows (those whose event time is not null) sorted
by event time are cut into sessions wherever the gap between neighbours is at least `max_gap`;
each row carries its session's first and last time as `window_start` and `window_end`. The
output is a function of the rows the instance holds, so a change to an instance can move every
row of it into another session: a row that bridges two sessions merges them, a deletion may
split one.

Delta rule: for each instance the batch touches, its versions are the rows it held before the
batch (state) and after each of the batch's transactions that touch it; each version is cut
into sessions, and the output at a transaction is its version's windowed rows minus the
previous version's, consolidated, so that only rows whose session changed are emitted. The cost
is an instance's rows per transaction touching it: sessions suit instances of bounded size (a
user, a device), not one instance for a whole table.

State: the input's rows by instance (a Z-set looked up by the instance columns).

Behaviors (Pathway ignores them on sessions; DESIGN section 10 asks to honour them), by one
clock per operator, the largest event time of its rows so far (`txstream.engine.operators.
clocks`), with a cutoff:

* late: a row (a deletion too) whose time plus the cutoff is at or below the clock before its
  transaction is ignored, shown in the late rows' table (`FATE` `LATE`, no session);
* closed: a session whose last time plus `max_gap` plus the cutoff is at or below the clock can
  never change again (a row on time is later than `clock - cutoff`, so too far from it to join
  it, and its rows' deletions are late): in that transaction its rows leave the state, and its
  result stays (`keep_results=True`: `FORGETS`, the reduce's state only) or is retracted
  (`keep_results=False`);
* `exactly_once_behavior(shift)`: a session is shown once, when it closes (cutoff `shift`,
  `SHOWN`: the reduce's output only), never before.

Delta rule under a behavior: the late rows apart, the others' moves as above (none when shown
at close); and the sessions after the batch (state plus the batch's rows on time), each closed
in the first transaction of the batch whose clock reaches its bound: a session closed in the
batch is the one it ends with, since none can change once closed. A session of an instance the
batch leaves alone closes too, when other instances' rows move the clock: the state is read
whole each batch, bounded by the open sessions.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    NumericType,
    StructField,
    StructType,
    TimestampType,
)

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import build_side, col, join, null_safe_on, prefixed, union_all
from txstream.engine.nodes import SessionNode
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.operators.behavior import COUNTS, FATE, FORGETS, LATE, LATE_CLOCK, SHOWN
from txstream.engine.operators.clocks import BEFORE, CLOCK, advance, clock_state, running
from txstream.engine.state import ZSetState
from txstream.engine.temporal import WINDOW_END, WINDOW_START, event_micros

# Within one batch's plans: a version's transaction and the next version's of its instance,
# a row's session number within its version, the versions' columns when joined, and a row's
# entry or exit.
_AS_OF, _NEXT, _SESSION, _VERSION = "__as_of", "__next", "__session", "__version_"
_MOVE = "__move"
# Under a behavior: the clocks' columns when joined, the clock a row is judged by, a session's
# close time, and the close times' columns when joined.
_CLOCKS, _JUDGED, _CLOSE, _CLOSES = "__clocks_", "__judged", "__close", "__closes_"


class SessionOp(Operator):
    node: SessionNode

    def _resolve(self) -> StructType:
        src = self.input_schemas[0]
        time, window = self.node.time, self.node.window
        self._require(src, [time, *self.node.instance], "session")
        for bound in (WINDOW_START, WINDOW_END):
            if bound in src.names:
                raise PipelineDefinitionError(
                    f"{self.node.label}: {bound} already in its input; rename it")
        kind = src[time].dataType
        if not isinstance(kind, TimestampType | NumericType):
            raise PipelineDefinitionError(
                f"{self.node.label}: the event-time column {time!r} is {kind.simpleString()}; "
                "sessions need a timestamp or a number")
        if isinstance(kind, TimestampType) != window.timed:
            raise PipelineDefinitionError(
                f"{self.node.label}: {window.describe()} over {time!r} "
                f"({kind.simpleString()}): a timedelta gap for a timestamp column, a number "
                "for a numeric one")
        # Under a behavior read whole every batch (any open session may close), else looked up
        # by the instances a batch touches.
        looked_up = self.node.instance if self.node.behavior is None else ()
        self.state = ZSetState(src.names, [DIFF], lookup=looked_up or None,
                               placement=self.placement)
        fields = [*src.fields, StructField(WINDOW_START, kind, True),
                  StructField(WINDOW_END, kind, True)]
        self.clock = None
        if self.node.behavior is not None:
            # A clock moves transaction by transaction: a batch is never netted.
            self.sees_transactions = True
            self.clock = clock_state(self.placement)
            fields += [StructField(FATE, IntegerType(), False),
                       StructField(LATE_CLOCK, kind, True)]
        return StructType(fields)

    def engine_columns(self) -> frozenset[str]:
        return frozenset({FATE, LATE_CLOCK}) if self.node.behavior is not None else frozenset()

    def states(self) -> dict[str, ZSetState]:
        return {"state": self.state} | ({"clock": self.clock} if self.clock is not None else {})

    def key(self, inputs: Sequence[Key]) -> Key:
        """The input's: a row is in one session at a time."""
        return inputs[0]

    def input_clustering(self, wanted: Clustered) -> list[Clustered]:
        return [self.node.instance or None]

    def _at(self, column: str) -> Column:
        """The time column in the gap's units (microseconds or numbers)."""
        return F.expr(event_micros(f"`{column}`", self.node.window.timed))

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None  # the clock moves with rows only: no session closes either
        instance = list(self.node.instance)
        # A row whose time is null is in no session, now or ever: neither kept nor shown.
        d = d.where(col(self.node.time).isNotNull())
        if instance:
            d = batch.clustered(d, instance)  # at P > 1 partitioned as the state is
        d = batch.shared(d, instance or None)
        if self.node.behavior is not None:
            return self._closing(d, batch)
        held = (self.state.lookup(d, instance, batch.parallelism) if instance
                else self.state.whole(batch.parallelism))
        moves = self._moves(d, held, batch.parallelism)
        batch.append(self.state, d)
        # Consolidated always: most of an instance's rows keep their session, and their entry
        # and exit cancel here rather than in every reader.
        return batch.consolidated(moves, self.columns, self.readers_cluster_by)

    def _moves(self, d: DataFrame, held: DataFrame | None, planned: int) -> DataFrame:
        """The windowed rows' changes of the instances `d` touches (the delta rule), given the
        rows `held` before the batch (of those instances, or more)."""
        instance, names = list(self.node.instance), self.input_schemas[0].names
        # The versions of each touched instance: before the batch, and after each of its
        # transactions in it, each with the next one's transaction (none for the last).
        touched = d.select(*[col(c) for c in instance], col(TIME).alias(_AS_OF)).distinct()
        versions = touched.unionByName(
            d.select(*[col(c) for c in instance]).distinct()
            .select("*", F.lit(BEFORE_BATCH).cast("long").alias(_AS_OF)))
        following = Window.partitionBy(*[col(c) for c in instance]).orderBy(col(_AS_OF))
        versions = build_side(prefixed(
            versions.select("*", F.lead(col(_AS_OF)).over(following).alias(_NEXT)), _VERSION))

        # Every version's rows: the changes up to it, summed; present while positive.
        changes = self._timeline(d, held, planned)
        up_to = changes[f"`{TIME}`"] <= versions[f"`{_VERSION}{_AS_OF}`"]
        if instance:
            up_to = null_safe_on(changes, versions, instance,
                                 [f"{_VERSION}{c}" for c in instance]) & up_to
        as_of = [col(f"{_VERSION}{_AS_OF}").alias(_AS_OF), col(f"{_VERSION}{_NEXT}").alias(_NEXT)]
        rows = (join(changes, versions, up_to, "inner", planned)
                .groupBy(*[col(n) for n in names], *as_of).agg(F.sum(col(DIFF)).alias(DIFF))
                .where(col(DIFF) > 0))
        windowed = self._cut(rows, [col(_AS_OF), col(_NEXT)])  # the next: one per version

        # A version's rows enter at its transaction and leave at the next one's.
        moves = F.explode(F.array(
            F.struct(col(_AS_OF).alias(TIME), col(DIFF).alias(DIFF)),
            F.struct(col(_NEXT).alias(TIME), (-col(DIFF)).alias(DIFF))))
        windowed_names = [*names, WINDOW_START, WINDOW_END]
        return (windowed.select(*[col(n) for n in windowed_names], moves.alias(_MOVE))
                .select(*[col(n) for n in windowed_names],
                        col(_MOVE).getField(TIME).alias(TIME),
                        col(_MOVE).getField(DIFF).alias(DIFF))
                .where(col(TIME).isNotNull() & (col(TIME) != BEFORE_BATCH)))

    def _timeline(self, d: DataFrame, held: DataFrame | None, planned: int) -> DataFrame:
        """The batch's changes and the rows `held` before it (at BEFORE_BATCH)."""
        names = self.input_schemas[0].names
        timeline = [d.select(*[col(n) for n in names], col(TIME), col(DIFF))]
        if held is not None:
            timeline.append(held.select(*[col(n) for n in names],
                                        F.lit(BEFORE_BATCH).cast("long").alias(TIME), col(DIFF)))
        return union_all(timeline, planned)

    def _cut(self, rows: DataFrame, version: list[Column]) -> DataFrame:
        """`rows` (each version's rows of an instance, with a positive `DIFF`) cut into
        sessions: a new one wherever the gap to the previous row is at least max_gap; each row
        with its session's first and last time, and its version and diff."""
        names, time = self.input_schemas[0].names, self.node.time
        within = [*[col(c) for c in self.node.instance], *version]
        ordered = Window.partitionBy(*within).orderBy(col(time))
        gap = self._at(time) - F.lag(self._at(time)).over(ordered)
        starts = F.when(F.coalesce(gap >= F.lit(self.node.window.gap), F.lit(True)), 1) \
            .otherwise(0)
        numbered = rows.select("*", F.sum(starts).over(
            ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias(_SESSION))
        session = Window.partitionBy(*within, col(_SESSION))
        return numbered.select(
            *[col(n) for n in names], F.min(col(time)).over(session).alias(WINDOW_START),
            F.max(col(time)).over(session).alias(WINDOW_END), *version, col(DIFF))

    def _closing(self, d: DataFrame, batch: BatchPlan) -> DataFrame:
        """The delta rule under a behavior (see the module doc): late rows apart, the others'
        moves (none when shown at close), and the sessions that close in the batch."""
        rules = self.node.behavior
        assert rules is not None and rules.cutoff is not None
        planned, names = batch.parallelism, self.input_schemas[0].names
        windowed = [*names, WINDOW_START, WINDOW_END]
        before = self.clock.whole(planned)
        clocks = running(d.groupBy(col(TIME)).agg(F.max(self._at(self.node.time)).alias(CLOCK)),
                         before, batch)

        # Late: the row's time plus the cutoff at or below the clock before its transaction.
        c = build_side(prefixed(clocks.select(col(TIME), col(BEFORE)), _CLOCKS))
        judged = batch.shared(join(d, c, d[f"`{TIME}`"] == c[f"`{_CLOCKS}{TIME}`"], "inner",
                                   planned).select(*[col(n) for n in names], col(TIME),
                                                   col(DIFF), col(f"{_CLOCKS}{BEFORE}")
                                                   .alias(_JUDGED)))
        late = F.coalesce(self._at(self.node.time) + F.lit(rules.cutoff) <= col(_JUDGED),
                          F.lit(False))
        kind = self.schema[LATE_CLOCK].dataType
        clock = F.timestamp_micros(col(_JUDGED)) if self.node.window.timed else col(_JUDGED)
        parts = [judged.where(late).select(
            *[col(n) for n in names], *[F.lit(None).cast(kind).alias(b)
                                        for b in (WINDOW_START, WINDOW_END)],
            F.lit(LATE).alias(FATE), clock.cast(kind).alias(LATE_CLOCK), col(TIME), col(DIFF))]
        on_time = batch.shared(judged.where(~late).select(*[col(n) for n in names], col(TIME),
                                                          col(DIFF)), self.node.instance or None)
        held = self.state.whole(planned)
        no_clock = F.lit(None).cast(kind).alias(LATE_CLOCK)
        if not rules.at_close:
            parts.append(self._moves(on_time, held, planned).select(
                *[col(n) for n in windowed], F.lit(COUNTS).alias(FATE), no_clock, col(TIME),
                col(DIFF)))

        # The sessions after the batch, and the first transaction whose clock reaches each
        # one's last time plus the gap and the cutoff: closed then, for good.
        now = (self._timeline(on_time, held, planned).groupBy(*[col(n) for n in names])
               .agg(F.sum(col(DIFF)).alias(DIFF)).where(col(DIFF) > 0))
        sessions = batch.shared(self._cut(now, []))
        bounds = [*self.node.instance, WINDOW_START, WINDOW_END]
        reach = self._at(WINDOW_END) + F.lit(self.node.window.gap) + F.lit(rules.cutoff)
        pairs = (sessions.select(*[col(b) for b in bounds]).distinct()
                 .crossJoin(clocks.where(col(TIME) != BEFORE_BATCH)))
        # A product's partitioning is unknown to Spark: at P = 1 it is said to be one partition,
        # or the aggregate would exchange it into the session's shuffle partitions and back.
        closes = build_side(prefixed(
            (pairs.coalesce(1) if planned == 1 else pairs).groupBy(*[col(b) for b in bounds])
            .agg(F.min(F.when(col(CLOCK) >= reach, col(TIME))).alias(_CLOSE))
            .where(col(_CLOSE).isNotNull()), _CLOSES))
        closed = join(sessions, closes, null_safe_on(sessions, closes, bounds,
                                                     [f"{_CLOSES}{b}" for b in bounds]),
                      "inner", planned).select(*[col(n) for n in windowed], col(DIFF),
                                               col(f"{_CLOSES}{_CLOSE}").alias(TIME))
        fate, sign = ((SHOWN, 1) if rules.at_close else (FORGETS, -1) if rules.keep_results
                      else (COUNTS, -1))
        parts.append(closed.select(*[col(n) for n in windowed], F.lit(fate).alias(FATE),
                                   no_clock, col(TIME), (F.lit(sign) * col(DIFF)).alias(DIFF)))

        # The state: the rows on time in, a closed session's rows out.
        batch.append(self.state, union_all(
            [on_time.select(*[col(n) for n in names], col(DIFF)),
             closed.select(*[col(n) for n in names], (-col(DIFF)).alias(DIFF))], planned))
        advance(self.clock, before, clocks, batch)
        return batch.consolidated(union_all(parts, planned), self.columns,
                                  self.readers_cluster_by)
