"""The clock rule of DESIGN section 10 as a from-scratch recompute: what a windowed reduce with
a temporal behavior holds after transaction T, computed from transactions 1..T alone, in plain
Python. It is the oracle the engine's behaviors are to be checked against (as DuckDB is for the
rest), and it is itself checked against Pathway 0.33 (`tests/test_temporal_model.py`).

The rule, per *entry* (a row in one of its windows, with the row's transaction N and diff):

* the operator's clock after transaction N, `C(N)`, is the largest event time of the entries
  of transactions 1..N (deletions too; `C(0)` is below every time), each transaction's changes
  consolidated first (a row inserted and deleted in one transaction is no entry);
* lateness (`cutoff`): an entry of transaction N is ignored when `end + cutoff <= C(N - 1)`:
  judged by the clock before N, so a row arriving with the one that closes its window counts;
* emission (`delay`): an entry is released in the first transaction M >= N with
  `C(M) >= start + delay` (N's own rows count), and counts from M on;
* `exactly_once_behavior(shift)` is `common_behavior(delay=duration + shift, cutoff=shift)`:
  every entry of a window is released in the one transaction whose rows push the clock to
  `end + shift`, and later ones are late, so the window is emitted once, never revised;
* `keep_results=False`: a window is retracted in the first transaction K with
  `C(K) >= end + cutoff` (on time; Pathway retracts it later, at its next transaction with a row
  that is not late, which this model does not copy: DESIGN section 10 asks for the exact time).

A window's result after T is the reduce (`n`: rows, `s`: the sum of `v`) of its entries that
are neither late nor unreleased by T, present while `n` is not 0. The late entries themselves,
with the clock that judged them, are `late_entries`.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from support.pathway_streams import in_stream_order

Row = tuple[int, ...]  # (id, user_id, ts, v)
Change = tuple[Row, int, int]  # (row, transaction, diff)
Result = tuple[int, ...]  # (user_id with an instance, window_start, window_end, n, s)


@dataclass(frozen=True)
class Windows:
    """`sliding(hop, duration, origin)` over integer times (tumbling: hop == duration)."""

    hop: int
    duration: int
    origin: int | None = None

    def of(self, ts: int) -> list[tuple[int, int]]:
        """The windows [start, end) holding `ts`; with an explicit origin, none before it."""
        origin = self.origin or 0
        last = math.floor((ts - origin) / self.hop)
        starts = (origin + k * self.hop for k in range(last - self.duration // self.hop - 1,
                                                         last + 1))
        return [(s, s + self.duration) for s in starts if s <= ts < s + self.duration
                and (self.origin is None or s >= self.origin)]


@dataclass(frozen=True)
class Behavior:
    """Pathway's `common_behavior(delay, cutoff, keep_results)`; see `exactly_once`."""

    delay: int | None = None
    cutoff: int | None = None
    keep_results: bool = True


def exactly_once(windows: Windows, shift: int = 0) -> Behavior:
    """Pathway's `exactly_once_behavior(shift)`, as it defines it for sliding windows."""
    return Behavior(delay=windows.duration + shift, cutoff=shift)


Entry = tuple[Row, tuple[int, int], int, int]  # (row, window, transaction, diff)


def _entries(changes: Sequence[Change], windows: Windows, through: int
             ) -> tuple[list[Entry], dict[int, float]]:
    """The entries of transactions 1..`through`, and the clock after each transaction."""
    # Consolidated per transaction, as a transaction's changes always are: a row inserted and
    # deleted in one transaction never reaches an operator, nor moves its clock.
    net: Counter[tuple[Row, int]] = Counter()
    for row, number, diff in changes:
        if number <= through:
            net[(row, number)] += diff
    entries = [(row, window, number, diff) for (row, number), diff in net.items() if diff
               for window in windows.of(row[2])]
    clock: dict[int, float] = {}
    high = -math.inf
    for number in range(1, through + 1):
        high = max([high, *(row[2] for row, _, n, _ in entries if n == number)])
        clock[number] = high
    clock[0] = -math.inf
    return entries, clock


def late_entries(changes: Sequence[Change], windows: Windows, behavior: Behavior,
                 through: int) -> list[tuple[int | float, ...]]:
    """The late entries of transactions 1..`through` as (*row, window_start, window_end, the
    clock before the entry's transaction, transaction, diff), in stream order."""
    entries, clock = _entries(changes, windows, through)
    assert behavior.cutoff is not None, "without a cutoff nothing is late"
    return in_stream_order((*row, start, end, clock[number - 1], number, diff)
                           for row, (start, end), number, diff in entries
                           if end + behavior.cutoff <= clock[number - 1])


def results_after(changes: Sequence[Change], windows: Windows, behavior: Behavior | None,
                  instance: bool, through: int) -> Counter[Result]:
    """Every window's result after transaction `through` (see the module doc)."""
    behavior = behavior or Behavior()
    entries, clock = _entries(changes, windows, through)
    sums: dict[tuple[int, ...], list[int]] = {}
    for row, (start, end), number, diff in entries:
        if behavior.cutoff is not None and end + behavior.cutoff <= clock[number - 1]:
            continue  # late
        if behavior.delay is not None and clock[through] < start + behavior.delay:
            continue  # not released yet (the clock only grows: released by `through` or not)
        key = ((row[1],) if instance else ()) + (start, end)
        acc = sums.setdefault(key, [0, 0])
        acc[0] += diff
        acc[1] += diff * row[3]
    result: Counter[Result] = Counter()
    for key, (n, s) in sums.items():
        end = key[-1]
        closed = (behavior.cutoff is not None and not behavior.keep_results
                  and clock[through] >= end + behavior.cutoff)
        if n and not closed:
            result[(*key, n, s)] += 1
    return result


def update_stream(changes: Sequence[Change], windows: Windows, behavior: Behavior | None,
                  instance: bool, transactions: int) -> list[tuple[int, ...]]:
    """The diffs between consecutive results, as (*result, transaction, diff), in stream
    order."""
    stream = []
    before: Counter[Result] = Counter()
    for number in range(1, transactions + 1):
        after = results_after(changes, windows, behavior, instance, number)
        for row in set(before) | set(after):
            diff = after[row] - before[row]
            if diff:
                stream.append((*row, number, diff))
        before = after
    return in_stream_order(stream)


def rising_changes(rng: random.Random, transactions: int) -> list[Change]:
    """Inserts, updates and deletes whose event times rise with the transaction, a few of them
    far behind (late for a closed window)."""
    live: dict[int, tuple[int, ...]] = {}
    changes: list[Change] = []
    next_id = 0
    for number in range(1, transactions + 1):
        for _ in range(rng.randint(1, 3)):
            kind = rng.random()
            if kind < 0.6 or not live:
                behind = rng.choice((0, 0, 0, 2, 5, 15))
                row = (next_id, rng.randint(1, 2), 2 * number - behind + rng.randint(-1, 1),
                       rng.choice((1, 5, 10)))
                live[next_id] = row
                next_id += 1
                changes.append((row, number, 1))
            else:
                key = rng.choice(sorted(live))
                old = live.pop(key)
                changes.append((old, number, -1))
                if kind < 0.85:  # an update: the same id, another value
                    new = (key, old[1], old[2], old[3] + 1)
                    live[key] = new
                    changes.append((new, number, 1))
    return changes


def session_results(changes: Sequence[Change], gap: int, cutoff: int, keep_results: bool,
                    at_close: bool, through: int
                    ) -> tuple[Counter[Result], list[tuple[int | float, ...]]]:
    """Per-user sessions (`max_gap` `gap`) under a behavior with `cutoff`, transaction by
    transaction from scratch (the rules of `txstream.engine.operators.session`): a row late
    when its time plus the cutoff is at or below the clock before its transaction; a session
    closed once the clock reaches its last time plus the gap and the cutoff, its result then
    kept, retracted, or (`at_close`) shown only then. Returns the results after `through`
    (user_id, window_start, window_end, n, s) and the late rows (*row, the clock before their
    transaction, transaction, diff)."""
    net: Counter[tuple[Row, int]] = Counter()
    for row, number, diff in changes:
        if number <= through:
            net[(row, number)] += diff
    rows: Counter[Row] = Counter()  # on time, in open sessions
    kept: Counter[Result] = Counter()  # closed sessions' results that stay
    late: list[tuple[int | float, ...]] = []
    clock = -math.inf
    for number in range(1, through + 1):
        mine = [(row, diff) for (row, n), diff in net.items() if n == number and diff]
        before, clock = clock, max([clock, *(row[2] for row, _ in mine)])
        for row, diff in mine:
            if row[2] + cutoff <= before:
                late.append((*row, before, number, diff))
            else:
                rows[row] += diff
        for session in _sessions(rows, gap):
            if session[-1][2] + gap + cutoff <= clock:  # closed: its rows leave
                if keep_results or at_close:
                    kept[_result(session, rows)] += 1
                for row in session:
                    del rows[row]
    open_results = Counter() if at_close else Counter(
        _result(session, rows) for session in _sessions(rows, gap))
    return kept + open_results, in_stream_order(late)


def _sessions(rows: Counter[Row], gap: int) -> list[list[Row]]:
    """Each user's rows present, sorted by time, cut where the gap is at least `gap`."""
    out: list[list[Row]] = []
    for user in sorted({row[1] for row, n in rows.items() if n > 0}):
        mine = sorted((row for row, n in rows.items() if n > 0 and row[1] == user),
                      key=lambda row: row[2])
        for row in mine:
            if out and out[-1][0][1] == user and row[2] - out[-1][-1][2] < gap:
                out[-1].append(row)
            else:
                out.append([row])
    return out


def _result(session: list[Row], rows: Counter[Row]) -> Result:
    return (session[0][1], session[0][2], session[-1][2],
            sum(rows[row] for row in session), sum(rows[row] * row[3] for row in session))
