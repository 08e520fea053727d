"""Invariants checked where changes cross a stage of the service, on every batch: a violation
halts the pipeline (`InvariantError`, as an expression error halts it) before a sink sees the
batch, instead of writing results known to be wrong.

    ingest ──(each source's changes)──> engine ──(each output's changes)──> sinks
             consolidated, ordered,                a keyed output's key never
             within the batch's                    goes below 0 or above 1
             transactions                          within the batch

* `check_engine_input`: each source's changes of a batch have no zero diff, no `(row, time)`
  twice, times in order with a time's deletions first (what `TransactionBatch.split` relies on),
  every time among the batch's transactions; an upsert source's, as a keyed output's below.
* `check_keyed_outputs`: an output with a primary key holds a key at most once, so its
  consolidated changes are single insertions and deletions, and per key they alternate in time
  order (a deletion, then an insertion, ...; starting with either): two insertions of a key in
  a row would hold it twice, two deletions would take it below zero.

The rows Spark reads of the engine's input are counted where they cross into the JVM
(`txstream.engine.spark_input.input_rows`). Each check is linear or a sort in the batch's
rows, with numpy and Arrow (`bench/end_to_end.py` measures the service with them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.changes import DIFF, TIME, Changes
from txstream.engine.errors import InvariantError


def check_engine_input(changes: Mapping[str, Changes], first: int, last: int,
                       keys: Mapping[str, Sequence[str]]) -> None:
    """Raise InvariantError unless every source's `changes` are consolidated, ordered, and at
    times `first`..`last` (see the module doc). `keys`: the key of each upsert source, whose
    changes are checked as a keyed output's (which implies consolidated, and costs a sort
    instead of a group-by by every column: 8 against 26 ms for 100,000 rows)."""
    for name, c in changes.items():
        stage = f"the changes of source {name!r} handed to the engine"
        t = c.table
        if not t.num_rows:
            continue
        time, diff = t[TIME].to_numpy(), t[DIFF].to_numpy()
        outside = np.flatnonzero((time < first) | (time > last))
        if len(outside):
            at = int(outside[0])
            raise InvariantError(stage, f"time {time[at]} outside the batch's transactions "
                                 f"{first}..{last}", int(time[at]), _row(t, at))
        zero = np.flatnonzero(diff == 0)
        if len(zero):
            raise InvariantError(stage, "a change of diff 0", int(time[zero[0]]),
                                 _row(t, int(zero[0])))
        back = np.flatnonzero((time[1:] < time[:-1])
                              | ((time[1:] == time[:-1]) & (diff[1:] < 0) & (diff[:-1] > 0)))
        if len(back):
            at = int(back[0]) + 1
            raise InvariantError(stage, "out of order (by time, a time's deletions first)",
                                 int(time[at]), _row(t, at))
        if keys.get(name):
            _check_keyed(stage, c, list(keys[name]))
            continue
        columns = [*c.columns, TIME]
        counts = t.select(columns).group_by(columns, use_threads=False).aggregate(
            [([], "count_all")])
        if counts.num_rows != t.num_rows:
            twice = counts.filter(pc.greater(counts["count_all"], 1))
            raise InvariantError(stage, "not consolidated: a (row, time) more than once",
                                 twice[TIME][0].as_py(), _row(twice.drop(["count_all"]), 0))


def check_keyed_outputs(outputs: Mapping[str, Changes],
                        keys: Mapping[str, Sequence[str]]) -> None:
    """Raise InvariantError unless, in each output with a primary key (`keys`: output -> its
    key columns, empty for none), every change weighs +1 or -1 and a key's changes alternate
    in time order (see the module doc)."""
    for name, c in outputs.items():
        key = list(keys.get(name, ()))
        if key and c.num_rows:
            _check_keyed(f"the changes of output {name!r} the engine emitted", c, key)


def _check_keyed(stage: str, c: Changes, key: list[str]) -> None:
    """Every change of `c` weighs +1 or -1, and a key's changes alternate in time order."""
    t = c.table
    diff = t[DIFF].to_numpy()
    heavy = np.flatnonzero(np.abs(diff) != 1)
    if len(heavy):
        at = int(heavy[0])
        raise InvariantError(stage, f"a change of diff {diff[at]} of a keyed table",
                             t[TIME][at].as_py(), _row(t, at))
    order = t.sort_by([*((k, "ascending") for k in key), (TIME, "ascending"),
                       (DIFF, "ascending")])
    d = order[DIFF].to_numpy()
    twice = np.flatnonzero(_same_as_next(order, key) & (d[1:] == d[:-1]))
    if len(twice):
        at = int(twice[0]) + 1
        what = "inserted" if d[at] > 0 else "deleted"
        raise InvariantError(stage, f"a key {what} twice in a row: its multiplicity would be "
                             f"{'2' if d[at] > 0 else '-1'}", order[TIME][at].as_py(),
                             _row(order, at))


def _same_as_next(table: pa.Table, columns: list[str]) -> np.ndarray:
    """`out[i]`: rows i and i+1 agree on `columns`, a null equal to a null."""
    n = table.num_rows
    same = np.ones(max(n - 1, 0), dtype=bool)
    for column in columns:
        a = table[column].combine_chunks()
        x, y = a.slice(0, n - 1), a.slice(1)
        equal = pc.or_kleene(pc.equal(x, y), pc.and_(pc.is_null(x), pc.is_null(y)))
        same &= pc.fill_null(equal, False).to_numpy(zero_copy_only=False)
    return same


def _row(table: pa.Table, at: int) -> dict[str, object]:
    return table.slice(at, 1).to_pylist()[0]
