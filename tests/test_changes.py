"""`txstream.changes.order`: one rank column where the ranges of time and diff allow it, the
same stable order as a sort by time, then diff, in every case (nulls and huge ranges too).
`Changes.net`: one transaction, integrated the same."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.changes import DIFF, TIME, consolidate, order

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


def _integrated(table: pa.Table) -> dict[int, int]:
    weights: dict[int, int] = {}
    for row, diff in zip(table["row"].to_pylist(), table[DIFF].to_pylist(), strict=True):
        weights[row] = weights.get(row, 0) + diff
    return {row: w for row, w in weights.items() if w}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6), st.sampled_from([-1, 1])),
                max_size=30))
def test_net_is_one_transaction_integrated_the_same(changes: list[tuple[int, int, int]]
                                                    ) -> None:
    table = pa.table({"row": [r for r, _, _ in changes],
                      TIME: pa.array([t for _, t, _ in changes], pa.int64()),
                      DIFF: pa.array([d for _, _, d in changes], pa.int64())})
    netted = consolidate(table, ["row"]).net(9)
    assert netted.validate().table[TIME].to_pylist() == [9] * netted.num_rows
    assert _integrated(netted.table) == _integrated(table)
    assert netted.num_rows == len(_integrated(table)), "what cancels is gone"
