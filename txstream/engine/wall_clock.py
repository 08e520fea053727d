"""The transactions' wall times as the changes of the wall clock's source, which every filter
calling now() reads (`txstream.engine.operators.now_filter`).

The rule: a pipeline that calls now() is given a wall time with every transaction of a batch
(`Engine.process(..., wall_times=...)`): each transaction with changes, and tick transactions
(no changes: the wall time alone moves, so rows can enter and leave a filter while the input
is idle). Each becomes one inserted row `(wall_time)` at its transaction; never retracted, as
the clock only reads the latest. The wall times are part of a transaction's identity, so a
replay that gives the same ones computes the same output.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from txstream.changes import DIFF, TIME, Changes
from txstream.engine.errors import EngineInputError
from txstream.engine.nodes import WALL_TIME
from txstream.schemas.tables import TableSchema


def clock_changes(schema: TableSchema, wall_times: Mapping[int, datetime] | None,
                  changes: Mapping[str, Changes]) -> Changes:
    """The wall clock's changes (its source's `schema`) for a batch of `changes`, given the
    transactions' `wall_times`: every transaction with changes needs one."""
    given = dict(wall_times or {})
    times: set[int] = set()
    for c in changes.values():
        if c.num_rows:
            times.update(pc.unique(c.table[TIME]).to_pylist())
    missing = sorted(times - set(given))
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise EngineInputError(
            f"the pipeline calls now(), so every transaction needs its wall time: none given for "
            f"transaction(s) {shown}; pass wall_times={{number: datetime}} to process")
    naive = sorted(n for n, w in given.items() if w.tzinfo is None)
    if naive:
        raise EngineInputError(
            f"wall times of transaction(s) {naive[:5]} have no time zone; give aware datetimes "
            "(UTC)")
    numbers = sorted(given)
    return Changes(pa.table({
        WALL_TIME: [given[n].astimezone(UTC) for n in numbers],
        TIME: numbers,
        DIFF: [1] * len(numbers),
    }, schema=schema.arrow_schema(with_changes=True)))
