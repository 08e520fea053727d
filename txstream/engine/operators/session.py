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
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, Window
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType, StructField, StructType, TimestampType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import BEFORE_BATCH, DIFF, TIME
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import build_side, col, join, null_safe_on, prefixed, union_all
from txstream.engine.operators.base import Clustered, Delta, Key, Operator
from txstream.engine.state import ZSetState
from txstream.engine.table import SessionNode
from txstream.engine.temporal import WINDOW_END, WINDOW_START, event_micros

# Within one batch's plans: a version's transaction and the next version's of its instance,
# a row's session number within its version, the versions' columns when joined, and a row's
# entry or exit.
_AS_OF, _NEXT, _SESSION, _VERSION = "__as_of", "__next", "__session", "__version_"
_MOVE = "__move"


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
        self.state = ZSetState(src.names, [DIFF], lookup=self.node.instance or None,
                               placement=self.placement)
        return StructType([*src.fields, StructField(WINDOW_START, kind, True),
                           StructField(WINDOW_END, kind, True)])

    def states(self) -> dict[str, ZSetState]:
        return {"state": self.state}

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
            return None
        planned = batch.parallelism
        instance = list(self.node.instance)
        names = self.input_schemas[0].names
        time = self.node.time
        # A row whose time is null is in no session, now or ever: neither kept nor shown.
        d = d.where(col(time).isNotNull())
        if instance:
            d = batch.clustered(d, instance)  # at P > 1 partitioned as the state is
        d = batch.shared(d, instance or None)
        held = (self.state.lookup(d, instance, planned) if instance
                else self.state.whole(planned))

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
        timeline = [d.select(*[col(n) for n in names], col(TIME), col(DIFF))]
        if held is not None:
            timeline.append(held.select(*[col(n) for n in names],
                                        F.lit(BEFORE_BATCH).cast("long").alias(TIME), col(DIFF)))
        changes = union_all(timeline, planned)
        up_to = changes[f"`{TIME}`"] <= versions[f"`{_VERSION}{_AS_OF}`"]
        if instance:
            up_to = null_safe_on(changes, versions, instance,
                                 [f"{_VERSION}{c}" for c in instance]) & up_to
        as_of = [col(f"{_VERSION}{_AS_OF}").alias(_AS_OF), col(f"{_VERSION}{_NEXT}").alias(_NEXT)]
        rows = (join(changes, versions, up_to, "inner", planned)
                .groupBy(*[col(n) for n in names], *as_of).agg(F.sum(col(DIFF)).alias(DIFF))
                .where(col(DIFF) > 0))

        # Each version cut into sessions: a new one wherever the gap to the previous row is at
        # least max_gap; its bounds the first and last time in it.
        version = [*[col(c) for c in instance], col(_AS_OF)]
        ordered = Window.partitionBy(*version).orderBy(col(time))
        gap = self._at(time) - F.lag(self._at(time)).over(ordered)
        starts = F.when(F.coalesce(gap >= F.lit(self.node.window.gap), F.lit(True)), 1) \
            .otherwise(0)
        numbered = rows.select("*", F.sum(starts).over(
            ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias(_SESSION))
        session = Window.partitionBy(*version, col(_SESSION))
        windowed = numbered.select(
            *[col(n) for n in names], F.min(col(time)).over(session).alias(WINDOW_START),
            F.max(col(time)).over(session).alias(WINDOW_END), col(_AS_OF), col(_NEXT),
            col(DIFF))

        # A version's rows enter at its transaction and leave at the next one's.
        moves = F.explode(F.array(
            F.struct(col(_AS_OF).alias(TIME), col(DIFF).alias(DIFF)),
            F.struct(col(_NEXT).alias(TIME), (-col(DIFF)).alias(DIFF))))
        out = (windowed.select(*[col(n) for n in self.columns], moves.alias(_MOVE))
               .select(*[col(n) for n in self.columns], col(_MOVE).getField(TIME).alias(TIME),
                       col(_MOVE).getField(DIFF).alias(DIFF))
               .where(col(TIME).isNotNull() & (col(TIME) != BEFORE_BATCH)))
        batch.append(self.state, d)
        # Consolidated always: most of an instance's rows keep their session, and their entry
        # and exit cancel here rather than in every reader.
        return batch.consolidated(out, self.columns, self.readers_cluster_by)
