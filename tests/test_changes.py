"""`txstream.changes.order`: one rank column where the ranges of time and diff allow it, the
same stable order as a sort by time, then diff, in every case (nulls and huge ranges too)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.changes import DIFF, TIME, order

_VALUES = st.one_of(st.none(), st.integers(-3, 3), st.integers(-2**62, 2**62))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_VALUES, _VALUES), max_size=40))
def test_order_is_a_stable_sort_by_time_then_diff(rows: list[tuple[int | None, int | None]]
                                                  ) -> None:
    table = pa.table({"row": list(range(len(rows))),
                      TIME: pa.array([t for t, _ in rows], pa.int64()),
                      DIFF: pa.array([d for _, d in rows], pa.int64())})
    want = table.sort_by([(TIME, "ascending"), (DIFF, "ascending")])
    assert order(table).to_pydict() == want.to_pydict()
