"""The vocabulary of changes, the bottom layer every other module imports.

A table's changes are its rows, each with `time` (the number of the transaction that made the
change, or of the last transaction of a batch netted into one: `Changes.net`) and `diff` (its
weight: +1 inserted, -1 deleted; larger magnitudes for multisets):

    order_id | amount | time | diff
    ---------+--------+------+-----
        7    | 10.00  |  12  |  -1     <- deletions of a transaction first
        7    | 12.50  |  12  |  +1     <- then its insertions
        8    |  3.00  |  13  |  +1

`Changes` is that table with its invariants stated as methods (the way Deephaven's
`TableUpdate` states its own): *consolidated* (no `(row, time)` twice, no zero diff) and
*ordered* (by time, deletions before insertions within a time). Sources build it, the engine
takes and returns it, and every sink writes it; `validate()` checks the invariants where a
`Changes` arrives from outside the process (a file, a test) rather than from `consolidate`.

Only this module and the SQL that names columns spell `"time"` and `"diff"`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TIME = "time"
DIFF = "diff"
_INT64 = pa.int64()
CHANGE_TYPES = {TIME: _INT64, DIFF: _INT64}
# The sum's name inside `consolidate`: it must not clash with a user column, and user columns
# may not start with "__" (TableSchema refuses them).
_SUMMED = "__diff_sum"


class ChangesError(ValueError):
    """A table that is not a valid `Changes`: its `time` and `diff` columns missing, misplaced
    or not int64 (checked when a `Changes` is built), or an invariant broken (`validate`)."""


def change_fields(columns: pa.Schema) -> pa.Schema:
    """`columns` (a table's own) followed by `time` and `diff`."""
    return pa.schema([*columns, *(pa.field(n, t, nullable=False) for n, t in
                                  CHANGE_TYPES.items())])


@dataclass(frozen=True)
class Changes:
    """A table's changes: its columns, then `time` and `diff` (see the module doc).

    Build one with `consolidate` (which establishes both invariants) or `Changes.of` when the
    table already holds them (rows from a consolidated Spark result, a checked file)."""

    table: pa.Table

    def __post_init__(self) -> None:
        # Every Changes is built here, many per batch: the check looks at the schema's last two
        # fields and two name lookups, never at the rows (those are `validate`'s).
        schema = self.table.schema
        n = len(schema)
        if (n < 2 or schema.get_field_index(TIME) != n - 2
                or schema.get_field_index(DIFF) != n - 1
                or not schema.field(n - 2).type.equals(_INT64)
                or not schema.field(n - 1).type.equals(_INT64)):
            raise ChangesError(_column_problem(schema))

    @classmethod
    def of(cls, table: pa.Table) -> Changes:
        """`table` as Changes, `time` and `diff` moved after its own columns, its columns
        checked (not its rows: see `validate`)."""
        names = table.column_names
        if names[-2:] != [TIME, DIFF] and names.count(TIME) == names.count(DIFF) == 1:
            table = table.select([*_own(names), TIME, DIFF])
        return cls(table)

    @classmethod
    def empty(cls, columns: pa.Schema) -> Changes:
        return cls(change_fields(columns).empty_table())

    @property
    def columns(self) -> list[str]:
        """The table's own columns (without `time` and `diff`)."""
        return _own(self.table.column_names)

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def times(self) -> pa.ChunkedArray:
        return self.table[TIME]

    def time_range(self) -> tuple[int, int] | None:
        """The first and last transaction with a change (None when there is none)."""
        if not self.num_rows:
            return None
        bounds = pc.min_max(self.table[TIME]).as_py()
        return bounds["min"], bounds["max"]

    def validate(self) -> Changes:
        """Raise ChangesError unless the changes are consolidated and ordered; return self."""
        t = self.table
        if not t.num_rows:
            return self
        zeros = pc.sum(pc.equal(t[DIFF], 0)).as_py()
        if zeros:
            raise ChangesError(f"{zeros} change(s) have diff 0: consolidate the changes first")
        time, diff = t[TIME].to_numpy(), t[DIFF].to_numpy()
        # Ordered: time never decreases, and within one time a deletion never follows an
        # insertion.
        back = (time[1:] < time[:-1]) | ((time[1:] == time[:-1]) & (diff[1:] < 0)
                                          & (diff[:-1] > 0))
        if back.any():
            at = int(back.argmax()) + 1
            raise ChangesError(f"changes out of order at row {at} (time {time[at]}, diff "
                               f"{diff[at]}): order by time, deletions first")
        if consolidate(t, self.columns).num_rows != t.num_rows:
            raise ChangesError("changes are not consolidated: a (row, time) appears more than "
                               "once")
        return self

    def after(self, time: int | None) -> Changes:
        """The changes of transactions after `time` (all of them for None): what a destination
        holding every transaction through `time` still lacks."""
        if time is None or not self.num_rows:
            return self
        return Changes(self.table.filter(pc.greater(self.table[TIME], time)))

    def at(self, time: int) -> Changes:
        """The changes of transaction `time` alone."""
        return Changes(self.table.filter(pc.equal(self.table[TIME], time)))

    def net(self, time: int) -> Changes:
        """These changes as one transaction `time` (their last or a later one): every change
        moved to `time`, then consolidated, so changes that cancel (a row inserted and deleted
        again, an update undone) are gone. Integrated through `time` it is the same table; the
        states between are lost, which is all a destination that shows only `time`'s state
        needs."""
        if not self.num_rows:
            return self
        at = self.table.set_column(self.table.column_names.index(TIME),
                                   self.table.schema.field(TIME),
                                   pa.array(np.full(self.num_rows, time), pa.int64()))
        # In the schema it came in (the sum makes `diff` nullable): netted changes are
        # concatenated with changes that are not (`txstream.service.net_groups`).
        netted = consolidate(at, self.columns).table.select(self.table.column_names)
        return Changes(netted.cast(self.table.schema))

    def last_time(self) -> int | None:
        bounds = self.time_range()
        return None if bounds is None else bounds[1]

    def non_unit_diffs(self) -> int:
        """How many changes weigh other than +1/-1. A keyed table holds a key at most once, so
        its consolidated changes are single insertions and deletions: none."""
        unit = pc.is_in(self.table[DIFF], pa.array([-1, 1], pa.int64()))
        return int(pc.sum(pc.invert(unit)).as_py() or 0)

    def concat(self, others: Sequence[Changes]) -> Changes:
        """These changes followed by `others`' (all of later transactions than these)."""
        return Changes(pa.concat_tables([self.table, *(o.table for o in others)]))


def consolidate(table: pa.Table, columns: Sequence[str]) -> Changes:
    """`table`'s `columns`, `time` and `diff`, consolidated (the diffs of equal `(row, time)`
    summed, nulls equal to nulls, zeros dropped) and ordered (time, then deletions first)."""
    keys = [*columns, TIME]
    if not table.num_rows:
        return Changes(table.select([*keys, DIFF]))
    named = table.select([*keys, DIFF]).rename_columns([*keys, _SUMMED])
    summed = named.group_by(keys, use_threads=False).aggregate([(_SUMMED, "sum")])
    summed = summed.select([*keys, f"{_SUMMED}_sum"]).rename_columns([*keys, DIFF])
    summed = summed.filter(pc.not_equal(summed[DIFF], 0))
    return Changes(order(summed))


def order(table: pa.Table) -> pa.Table:
    """`table` sorted by time, then by diff (deletions before insertions), stably."""
    if table.num_rows < 2:
        return table
    # Nulls (left for a sink to report) sort by two columns.
    if not (table[TIME].null_count or table[DIFF].null_count):
        times, diffs = pc.min_max(table[TIME]).as_py(), pc.min_max(table[DIFF]).as_py()
        diff_span = diffs["max"] - diffs["min"] + 1
        if (times["max"] - times["min"] + 1) * diff_span < 2**63:
            # The same order by one integer column: Arrow sorts by two columns several times
            # slower (a 2M-row output of a batch: 0.38 s against 0.10 s).
            rank = pc.add(pc.multiply(pc.subtract(table[TIME], times["min"]), diff_span),
                          pc.subtract(table[DIFF], diffs["min"]))
            return table.take(pc.sort_indices(rank))
    return table.sort_by([(TIME, "ascending"), (DIFF, "ascending")])


def _own(names: Sequence[str]) -> list[str]:
    return [n for n in names if n not in (TIME, DIFF)]


def _column_problem(schema: pa.Schema) -> str:
    """What is wrong with the columns of `schema` as changes, and what to do about it."""
    names = schema.names
    got = f"got columns {', '.join(names) or '(none)'}"
    for name in (TIME, DIFF):
        if names.count(name) != 1:
            return (f"changes need exactly one {name!r} column (int64) after the table's own; "
                    f"{got}: {'add it' if name not in names else 'rename the others'}")
    if names[-2:] != [TIME, DIFF]:
        return (f"changes hold {TIME!r} then {DIFF!r} as their last two columns; {got}: build "
                f"them with Changes.of, which moves them there")
    wrong = [f"{name!r} is {schema.field(name).type}" for name in (TIME, DIFF)
             if not schema.field(name).type.equals(_INT64)]
    return f"changes' {TIME!r} and {DIFF!r} are int64, but {' and '.join(wrong)}: cast them"
