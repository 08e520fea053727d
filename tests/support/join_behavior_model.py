"""The output of a join by time under a temporal behavior recomputed from scratch, the oracle of
`tests/test_join_behaviors.py` (the rule in `txstream.engine.operators.behavior` and DESIGN
section 10, Pathway's per-side behaviors).

Each side, by its own clock C(N) (the largest time of its changes up to transaction N, each
transaction's changes consolidated first), gives each change (time x, transaction N):

* late when x + cutoff <= C(N - 1): ignored;
* released at R, the first transaction from N on with C(R) >= x + delay (N without a delay);
* closed at K, the first transaction with C(K) >= x + cutoff (never without a cutoff).

With both a delay and a cutoff the cutoff judges the released changes by their own clock (the
largest time released), as Pathway chains its `_buffer` and `_freeze`/`_forget`. A change is in
its side's state from R until K, and pairs with the other side's state at R (and that
transaction's changes), and while in state with every later change of the other side up to K.
So, integrated up to transaction t:

* as-of join (the right side never forgets: the join drops only right rows no row can reach):
  each released left change paired with its match among the right rows as of min(t, K), if it
  was released before it closed, else as of R (shown once); with `keep_results=False`, only the
  changes not closed by t, matched as of t;
* interval join: each pair of released changes of the two sides, from the later release on, if
  the one released first was not closed before (both released together: always); with
  `keep_results=False`, the pairs of changes both in state at t;
* its padded rows (left, right, outer): each row a side shows at t (its changes released by t;
  with `keep_results=False`, those not yet closed) that is in none of the pairs at t.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Row = tuple[object, ...]
Change = tuple[Row, int, int]  # row, transaction, diff
NEVER = 10**9


@dataclass(frozen=True)
class Rules:
    delay: int | None = None
    cutoff: int | None = None
    keep_results: bool = True


@dataclass(frozen=True)
class Fate:
    """A change as its side's behavior lets it through."""

    row: Row
    diff: int
    released: int  # NEVER: never
    closed: int  # NEVER: never
    late_clock: int | None = None  # set on a late change


def _consolidated(changes: Sequence[Change]) -> list[Change]:
    net: Counter[tuple[Row, int]] = Counter()
    for row, number, diff in changes:
        net[row, number] += diff
    return [(row, number, diff) for (row, number), diff in net.items() if diff]


def _clocks(changes: Sequence[Change], time: int, last: int) -> list[int | None]:
    """C(0..last): the largest time of the changes up to each transaction."""
    clock: int | None = None
    clocks = [clock]
    for number in range(1, last + 1):
        times = [row[time] for row, n, _ in changes if n == number and row[time] is not None]
        if times:
            clock = max([*times, *([clock] if clock is not None else [])])  # type: ignore[type-var]
        clocks.append(clock)
    return clocks


def _first(clocks: list[int | None], start: int, threshold: int) -> int:
    return next((n for n in range(start, len(clocks))
                 if clocks[n] is not None and clocks[n] >= threshold), NEVER)  # type: ignore[operator]


def _stage(changes: Sequence[Change], time: int, last: int, delay: int | None,
           cutoff: int | None) -> list[Fate]:
    """One behavior over a side's changes (see the module doc)."""
    changes = _consolidated(changes)
    clocks = _clocks(changes, time, last)
    fates = []
    for row, number, diff in changes:
        x = row[time]
        if x is None:
            fates.append(Fate(row, diff, number, NEVER))
            continue
        before = clocks[number - 1]
        if cutoff is not None and before is not None and x + cutoff <= before:  # type: ignore[operator]
            fates.append(Fate(row, diff, NEVER, NEVER, late_clock=before))
            continue
        released = number if delay is None else _first(clocks, number, x + delay)  # type: ignore[operator]
        closed = NEVER if cutoff is None else _first(clocks, 0, x + cutoff)  # type: ignore[operator]
        fates.append(Fate(row, diff, released, closed))
    return fates


def side_fates(changes: Sequence[Change], time: int, rules: Rules, last: int) -> list[Fate]:
    """Each change of a side (its rows' time at position `time`) under `rules`."""
    if rules.delay is None or rules.cutoff is None:
        return _stage(changes, time, last, rules.delay, rules.cutoff)
    delayed = _stage(changes, time, last, rules.delay, None)
    return _stage([(f.row, f.released, f.diff) for f in delayed if f.released != NEVER], time,
                  last, None, rules.cutoff)


def asof_output(left: list[Fate], right: list[Fate], t: int, keep_results: bool,
                match: Callable[[Row, Counter[Row]], Row | None], how: str
                ) -> Counter[tuple[Row, Row | None]]:
    """The as-of join's integrated output at transaction t (see the module doc): (left row,
    its partner) -> multiplicity; `match` finds a left row's partner among right rows."""
    out: Counter[tuple[Row, Row | None]] = Counter()
    for a in left:
        if a.released > t:
            continue
        if keep_results:
            at = min(t, a.closed) if a.released < a.closed else a.released
        elif a.released < a.closed and t < a.closed:
            at = t
        else:
            continue
        rights: Counter[Row] = Counter()
        for b in right:
            if b.released <= at:
                rights[b.row] += b.diff
        partner = match(a.row, +rights)
        if partner is not None or how == "left":
            out[a.row, partner] += a.diff
    return +out


def interval_output(left: list[Fate], right: list[Fate], t: int, keep_results: bool,
                    pairs: Callable[[Row, Row], bool]) -> Counter[tuple[Row, Row]]:
    """The interval join's integrated output at transaction t (see the module doc)."""
    out: Counter[tuple[Row, Row]] = Counter()
    for a in left:
        for b in right:
            if a.released > t or b.released > t or not pairs(a.row, b.row):
                continue
            if keep_results:
                first = a if a.released < b.released else b
                formed = a.released == b.released or max(a.released, b.released) <= first.closed
            else:
                formed = t < a.closed and t < b.closed
            if formed:
                out[a.row, b.row] += a.diff * b.diff
    return +out


def shown(fates: list[Fate], t: int, keep_results: bool) -> Counter[Row]:
    """The rows a side shows at transaction t: its released changes (with `keep_results=False`,
    those not yet closed, and none closed at or before its release)."""
    rows: Counter[Row] = Counter()
    for f in fates:
        if f.released <= t and (keep_results or (f.released < f.closed and t < f.closed)):
            rows[f.row] += f.diff
    return +rows


def unmatched(rows: Counter[Row], paired: Counter[Row]) -> Counter[Row]:
    """The rows of `rows` in no pair (`paired`: each row's number of pairs)."""
    return Counter({row: n for row, n in rows.items() if not paired[row]})
