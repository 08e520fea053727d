"""Event-time windows: `Table.windowby(time, window=tumbling(...) | sliding(...), instance=...)`,
then an ordinary `reduce`, with Pathway's names and meanings (`pathway.stdlib.temporal`).

    views.windowby("ts", window=t.tumbling(timedelta(minutes=1)), instance="user_id")
         .reduce(views=r.count())
    # -> user_id, window_start, window_end, views

The rule: a window is a group key. `sliding(hop, duration, origin)` gives a row with event time
`ts` every window `[start, start + duration)` with `start = origin + k * hop` (k any integer)
and `start <= ts < start + duration`: half-open, so a row on a boundary belongs to the window it
starts. `tumbling(duration, origin)` is `sliding(duration, duration, origin)`: exactly one
window per row. Assigning windows is row-wise (each row of a change becomes a change of each
of its windows, with the same time and diff), so the windowed table is a composition of
select, filter and concat, and the reduce after it is the engine's own: no new delta rule, and
exact at every batch size and parallelism by construction.

Types follow the time column's, as in Pathway: `timedelta` durations (and a `datetime`
origin, naive meaning UTC) for a `timestamp` column, numbers for a numeric one. The origin
defaults to Pathway's: 1973-01-01 00:00 UTC for timestamps (a Monday, so week windows start
on Mondays), 0 for numbers. An origin given explicitly also drops the windows that start before
it, as Pathway's does. A row whose time is null is in no window.

Temporal behaviors (`behavior=` of `windowby`) say when a window's rows reach the reduce and
when they leave it, by one clock per windowed table: the largest event time of its rows so far
(`txstream.engine.operators.behavior` has the rule, transaction by transaction):

* `common_behavior(delay, cutoff, keep_results)`: a window's rows count from the transaction
  whose rows move the clock to `window_start + delay`; rows of a window with
  `window_end + cutoff` at or below the clock before their transaction are late and ignored;
  once the clock reaches `window_end + cutoff` the window is closed: its state leaves memory and
  the checkpoint, its result stays (`keep_results=True`) or is retracted then (False);
* `exactly_once_behavior(shift)`: `common_behavior(delay=duration + shift, cutoff=shift)`, each
  window emitted once, in the transaction whose rows move the clock to `window_end + shift`,
  never revised.

Without a behavior a window's group lives as long as any group of an ordinary `groupby`: its
state is never dropped.

`session(max_gap)`: per instance, the rows sorted by event time, a new session wherever the gap
to the previous row is at least `max_gap` (so rows closer than it are in one session, Pathway's
strict `<`); `window_start` and `window_end` are the session's first and last time (a closed
interval, as Pathway's), so a row that bridges two sessions retracts both and inserts the
merged one, in its transaction. Sessions are a function of the rows an instance holds, not of
the rows' windows, so they are computed by their own operator
(`txstream.engine.operators.session`) before the ordinary reduce. Behaviors apply to sessions
as DESIGN section 10 asks (Pathway ignores them there): with a cutoff, a row is late when its
time plus the cutoff is at or below the clock before its transaction, and a session closes once
the clock reaches its last time plus `max_gap` plus the cutoff (no row on time can join it
then); `exactly_once_behavior(shift)` shows each session once, when it closes with cutoff
`shift`. A delay has no meaning for sessions (their start moves) and is refused.

As-of joins (`Table.asof_join`, `txstream.engine.operators.asof_join`) pair rows by nearest
time; they need no window. As-of-now joins (`Table.asof_now_join`,
`txstream.engine.operators.asof_now_join`) look each inserted row up in the other side as of
its transaction, once. A filter may compare a column with now(), the transaction's wall
time (`txstream.engine.operators.now_filter`). Interval joins (`Table.interval_join`,
`interval(lower_bound, upper_bound)`) are an equi-join and a filter on the difference of the
times (left, right and outer ones add the rows that have no pair in the output,
`txstream.engine.operators.unmatched`): exact as those are. A `common_behavior` on an as-of or
interval join applies to each side by its own clock (`BehaviorNode` with the side's time as
both bounds; the join reads each row's fate: `txstream.engine.operators.join`, `asof_join`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from txstream.engine.errors import PipelineDefinitionError

WINDOW_START = "window_start"
WINDOW_END = "window_end"
# Pathway's origin for datetimes: a Monday, so that week windows start on Mondays.
_DEFAULT_ORIGIN = datetime(1973, 1, 1, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Length = timedelta | int | float
Origin = datetime | int | float


@dataclass(frozen=True)
class Sliding:
    """Windows `[origin + k * hop, origin + k * hop + duration)` for every integer k (see the
    module doc); build with `sliding` or `tumbling`."""

    hop: Length
    duration: Length
    origin: Origin | None = None

    def __post_init__(self) -> None:
        lengths = (self.hop, self.duration)
        timed = [isinstance(x, timedelta) for x in lengths]
        if any(timed) and not all(timed):
            raise PipelineDefinitionError(
                f"window hop {self.hop!r} and duration {self.duration!r}: both timedelta (a "
                "timestamp column) or both numbers (a numeric one)")
        if any(isinstance(x, bool) or not isinstance(x, timedelta | int | float)
               for x in lengths):
            raise PipelineDefinitionError(
                f"window hop {self.hop!r} and duration {self.duration!r} must be timedelta or "
                "numbers")
        if not all(_positive(x) for x in lengths):
            raise PipelineDefinitionError(
                f"window hop {self.hop!r} and duration {self.duration!r} must be positive")
        if self.origin is not None and isinstance(self.origin, datetime) != all(timed):
            raise PipelineDefinitionError(
                f"window origin {self.origin!r}: a datetime with timedelta lengths, a number "
                "with numeric ones")

    @property
    def timed(self) -> bool:
        """Whether the windows are over a timestamp column (timedelta lengths)."""
        return isinstance(self.hop, timedelta)

    @property
    def windows_per_row(self) -> int:
        """The most windows one row can be in: ceil(duration / hop)."""
        return math.ceil(_number(self.duration) / _number(self.hop))

    def describe(self) -> str:
        """The window as a pipeline author wrote it, for labels and messages."""
        if self.hop == self.duration:
            shown = f"tumbling({self.duration}"
        else:
            shown = f"sliding(hop={self.hop}, duration={self.duration}"
        return shown + (f", origin={self.origin})" if self.origin is not None else ")")

    def bounds(self, time: str, back: int) -> tuple[str, str]:
        """Spark SQL of the start and end of the window `back` hops before the latest one that
        starts at or before the time column `time` (quoted)."""
        if self.timed:
            assert isinstance(self.hop, timedelta) and isinstance(self.duration, timedelta)
            origin = self.origin if self.origin is not None else _DEFAULT_ORIGIN
            assert isinstance(origin, datetime)
            at, hop, offset = f"unix_micros({time})", _micros(self.hop), _origin_micros(origin)
            # pmod is never negative: the start is the latest window start at or before `at`,
            # in exact integer arithmetic (microseconds), whichever side of the origin.
            start = f"({at} - pmod({at} - {offset}, {hop}) - {back * hop})"
            return (f"timestamp_micros({start})",
                    f"timestamp_micros({start} + {_micros(self.duration)})")
        origin = self.origin if self.origin is not None else 0
        start = f"({time} - pmod({time} - {origin!r}, {self.hop!r}) - {back * self.hop!r})"
        return start, f"({start} + {self.duration!r})"

    def holds(self, time: str) -> str:
        """Spark SQL: whether the window of a row (its columns `window_start`, `window_end`)
        holds the row's time column `time` (quoted): the end is exclusive, and an explicit
        origin drops the windows that start before it."""
        held = f"{time} < `{WINDOW_END}`"
        if isinstance(self.origin, datetime):
            return held + f" AND `{WINDOW_START}` >= timestamp_micros(" \
                f"{_origin_micros(self.origin)})"
        if self.origin is not None:
            return held + f" AND `{WINDOW_START}` >= {self.origin!r}"
        return held


@dataclass(frozen=True)
class Session:
    """Session windows: rows closer than `max_gap` in event time are in one session (see the
    module doc); build with `session`."""

    max_gap: Length

    def __post_init__(self) -> None:
        if isinstance(self.max_gap, bool) or not isinstance(self.max_gap,
                                                            timedelta | int | float):
            raise PipelineDefinitionError(
                f"session max_gap {self.max_gap!r} must be a timedelta (a timestamp column) or "
                "a number (a numeric one)")
        if not _positive(self.max_gap):
            raise PipelineDefinitionError(f"session max_gap {self.max_gap!r} must be positive")

    @property
    def timed(self) -> bool:
        """Whether the sessions are over a timestamp column (a timedelta gap)."""
        return isinstance(self.max_gap, timedelta)

    @property
    def gap(self) -> int | float:
        """The gap in the operator's units: microseconds for timestamp columns."""
        return _in_units(self.max_gap)

    def describe(self) -> str:
        """The window as a pipeline author wrote it, for labels and messages."""
        return f"session(max_gap={self.max_gap})"


@dataclass(frozen=True)
class Interval:
    """Pathway's `interval(lower_bound, upper_bound)` for `Table.interval_join`: a pair when
    `lower_bound <= other_time - self_time <= upper_bound` (both ends closed)."""

    lower_bound: Length
    upper_bound: Length

    def __post_init__(self) -> None:
        bounds = (self.lower_bound, self.upper_bound)
        timed = [isinstance(b, timedelta) for b in bounds]
        if any(isinstance(b, bool) or not isinstance(b, timedelta | int | float)
               for b in bounds) or (any(timed) and not all(timed)):
            raise PipelineDefinitionError(
                f"interval({self.lower_bound!r}, {self.upper_bound!r}): both timedelta (timestamp "
                "columns) or both numbers (numeric ones)")
        if _number(self.lower_bound) > _number(self.upper_bound):
            raise PipelineDefinitionError(
                f"interval({self.lower_bound!r}, {self.upper_bound!r}): the lower bound is above "
                "the upper one")

    @property
    def timed(self) -> bool:
        """Whether the interval is of timestamps (timedelta bounds)."""
        return isinstance(self.lower_bound, timedelta)

    def holds(self, self_time: str, other_time: str) -> str:
        """Spark SQL: whether the times (columns, unquoted) are within the interval."""
        if isinstance(self.lower_bound, timedelta):
            assert isinstance(self.upper_bound, timedelta)
            gap = f"(unix_micros(`{other_time}`) - unix_micros(`{self_time}`))"
            return (f"{gap} BETWEEN {_micros(self.lower_bound)} "
                    f"AND {_micros(self.upper_bound)}")
        return (f"(`{other_time}` - `{self_time}`) BETWEEN {self.lower_bound!r} "
                f"AND {self.upper_bound!r}")


@dataclass(frozen=True)
class CommonBehavior:
    """Pathway's `common_behavior` (see the module doc); build with `common_behavior`."""

    delay: Length | None = None
    cutoff: Length | None = None
    keep_results: bool = True

    def describe(self) -> str:
        """The behavior as a pipeline author wrote it, for labels and messages."""
        given = [f"{name}={value}" for name, value in (("delay", self.delay),
                                                       ("cutoff", self.cutoff))
                 if value is not None]
        if not self.keep_results:
            given.append("keep_results=False")
        return f"common_behavior({', '.join(given)})"

    def resolved(self, window: Sliding | Session, table: str) -> Resolved:
        """The behavior in the window's units (microseconds for timestamp windows), checked
        against the window: lengths of its kind, not negative, a cutoff to close by."""
        return self.in_units(window.timed, f"windowby on {table}",
                             f"window {window.describe()}: a timedelta for timestamp windows, "
                             "a number for numeric ones")

    def in_units(self, timed: bool | None, where: str, kinds: str) -> Resolved:
        """The behavior in its times' units (microseconds for timestamps; `timed` None: the
        kind its own lengths say, one for all), checked: lengths of that kind (`kinds` says
        which, in a message), not negative, a cutoff to close by. `where`: what it is a
        behavior of, for messages."""
        if not self.keep_results and self.cutoff is None:
            raise PipelineDefinitionError(
                f"{where}: keep_results=False retracts results when the clock passes them by "
                "the cutoff, so it needs a cutoff; give one")
        given = [(name, length) for name, length in (("delay", self.delay),
                                                      ("cutoff", self.cutoff))
                 if length is not None]
        for name, length in given:
            if isinstance(length, bool) or not isinstance(length, timedelta | int | float):
                raise PipelineDefinitionError(
                    f"{where}: behavior {name}={length!r} must be a timedelta or a number")
            if timed is None:
                timed = isinstance(length, timedelta)
            if isinstance(length, timedelta) != timed:
                raise PipelineDefinitionError(
                    f"{where}: behavior {name}={length!r} and {kinds}")
            if not (_positive(length) or _number(length) == 0):
                raise PipelineDefinitionError(
                    f"{where}: behavior {name}={length!r} must not be negative")
        return Resolved(*(None if x is None else _in_units(x) for x in (self.delay, self.cutoff)),
                        keep_results=self.keep_results)

    @property
    def timed(self) -> bool | None:
        """Whether its lengths are timedeltas (for timestamps); None: it has none."""
        given = [x for x in (self.delay, self.cutoff) if x is not None]
        return isinstance(given[0], timedelta) if given else None


@dataclass(frozen=True)
class ExactlyOnceBehavior:
    """Pathway's `exactly_once_behavior` (see the module doc); build with
    `exactly_once_behavior`."""

    shift: Length | None = None

    def describe(self) -> str:
        """The behavior as a pipeline author wrote it, for labels and messages."""
        return f"exactly_once_behavior({'' if self.shift is None else f'shift={self.shift}'})"

    def resolved(self, window: Sliding, table: str) -> Resolved:
        shift = self.shift if self.shift is not None else (
            timedelta(0) if window.timed else 0)
        cutoff = CommonBehavior(cutoff=shift).resolved(window, table).cutoff  # checks the shift
        assert cutoff is not None
        return Resolved(delay=_in_units(window.duration) + cutoff, cutoff=cutoff)


Behavior = CommonBehavior | ExactlyOnceBehavior


def session_rules(behavior: Behavior, window: Session, table: str) -> Resolved | None:
    """`behavior` as it applies to `window`'s sessions (see the module doc): a cutoff, kept or
    retracted results, or shown at close (exactly once); None when it changes nothing."""
    if isinstance(behavior, ExactlyOnceBehavior):
        shift = behavior.shift if behavior.shift is not None else (
            timedelta(0) if window.timed else 0)
        cutoff = CommonBehavior(cutoff=shift).resolved(window, table).cutoff
        return Resolved(delay=None, cutoff=cutoff, at_close=True)
    resolved = behavior.resolved(window, table)
    if resolved.delay is not None:
        raise PipelineDefinitionError(
            f"windowby on {table}: session windows take no delay (a session's start moves as "
            "rows join it); use exactly_once_behavior to show each session once, when closed")
    return resolved if resolved.cutoff is not None else None


@dataclass(frozen=True)
class Resolved:
    """A behavior in a window's units: numbers, microseconds for timestamp windows."""

    delay: int | float | None
    cutoff: int | float | None
    keep_results: bool = True
    # Sessions under `exactly_once_behavior`: shown once, when closed (no delay applies).
    at_close: bool = False


def common_behavior(delay: Length | None = None, cutoff: Length | None = None,
                    keep_results: bool = True) -> CommonBehavior:
    """Pathway's `common_behavior`: emit a window from the clock reaching `start + delay`, ignore
    its rows once the clock passed `end + cutoff`, then keep or retract its result."""
    return CommonBehavior(delay, cutoff, keep_results)


def exactly_once_behavior(shift: Length | None = None) -> ExactlyOnceBehavior:
    """Pathway's `exactly_once_behavior`: each window emitted once, when the clock reaches its
    end plus `shift`, and closed then."""
    return ExactlyOnceBehavior(shift)


def event_micros(column: str, timed: bool) -> str:
    """Spark SQL of the time column or window bound `column` (quoted) in a behavior's units."""
    return f"unix_micros({column})" if timed else column


def interval(lower_bound: Length, upper_bound: Length) -> Interval:
    """The times an interval join pairs: `lower_bound <= other_time - self_time <= upper_bound`,
    Pathway's `interval(lower_bound, upper_bound)`."""
    return Interval(lower_bound, upper_bound)


def session(*, max_gap: Length) -> Session:
    """Session windows: per instance, rows less than `max_gap` apart in event time are in one
    session, `[first, last]`: Pathway's `session(max_gap=...)`. Pathway's other form, a
    Python `predicate` of two times, is not offered: it cannot run inside Spark's plans."""
    return Session(max_gap)


def sliding(hop: Length, duration: Length, origin: Origin | None = None) -> Sliding:
    """Windows of `duration` starting every `hop` (overlapping when hop < duration, with gaps
    when hop > duration): Pathway's `sliding(hop, duration, origin)`."""
    return Sliding(hop, duration, origin)


def tumbling(duration: Length, origin: Origin | None = None) -> Sliding:
    """Consecutive windows of `duration`, one per row: Pathway's `tumbling(duration, origin)`."""
    return Sliding(duration, duration, origin)


def _positive(length: Length) -> bool:
    return length > timedelta(0) if isinstance(length, timedelta) else length > 0


def _number(length: Length) -> float:
    return length / timedelta(microseconds=1) if isinstance(length, timedelta) else length


def _micros(length: timedelta) -> int:
    return length // timedelta(microseconds=1)


def _in_units(length: Length) -> int | float:
    return _micros(length) if isinstance(length, timedelta) else length


def _origin_micros(origin: datetime) -> int:
    aware = origin if origin.tzinfo is not None else origin.replace(tzinfo=UTC)
    return _micros(aware - _EPOCH)
