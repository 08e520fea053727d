"""Viewport subscriptions: a sorted view of a served table, and per transaction the part of
the view's update that the subscriber of a range of its positions needs.

A sorted view is a `LiveTable` of the served table's rows in the viewport's order, so its row
keys follow that order and position p holds its p-th smallest key. A subscriber holds the
keys at its positions (`Window.held`). Delta rule, given the view's update U and its keys
after it:

- removed: the held keys U removes, and those that U's shifts move out of the positions;
- shifts: U's shifts of the held keys that stay;
- added: the keys now at the positions that the subscriber does not hold (rows inserted there,
  or pushed in when rows before the positions were inserted or removed);
- modified: the held keys that stay and that U modifies, with U's modified columns;
- rows: those of the added and modified keys, as the view holds them now.

Moving the positions is the same rule with an empty U. Each result passes
`TableUpdate.validate` against the subscriber's keys, so a client mirrors the viewport with the
same `Mirror` as a whole table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from txstream.changes import DIFF, TIME
from txstream.sinks.live.table import LiveTable
from txstream.updates import ROW_KEY, Shift, TableUpdate, shifted, within
from txstream.viewports import Viewport, ViewportError

_EMPTY = np.zeros(0, dtype=np.int64)


def sorted_view(base: LiveTable, viewport: Viewport) -> LiveTable:
    """A view of `base`'s rows in `viewport`'s order, as of `base`'s transaction."""
    missing = [c for c, _ in viewport.sort if c not in base.schema.names]
    if missing:
        raise ViewportError(f"table {base.name!r} has no column(s) {missing} to sort by; its "
                            f"columns: {', '.join(base.schema.names)}")
    order = [c for c, _ in viewport.sort]
    view = LiveTable(f"{base.name} sorted by {viewport.sort}", base.schema, base.primary_key,
                     base.spacing, order=order,
                     descending=[c for c, d in viewport.sort if d == "desc"])
    if base.table.num_rows:
        rows = base.table.append_column(TIME, pa.array(np.full(base.table.num_rows,
                                                               base.transaction)))
        view.apply(rows.append_column(DIFF, pa.array(np.ones(rows.num_rows, np.int64))),
                   base.transaction)
    view.transaction = base.transaction
    return view


class Window:
    """One subscriber's positions `first`..`last` of `view`, and the keys it holds there."""

    def __init__(self, view: LiveTable, viewport: Viewport) -> None:
        self.view = view
        self.viewport = viewport
        self.held = _EMPTY

    @property
    def sort(self) -> tuple[tuple[str, str], ...]:
        return self.viewport.sort

    def _keys(self) -> np.ndarray:
        return self.view.keys[self.viewport.first:self.viewport.last + 1]

    def _rows(self, keys: np.ndarray) -> pa.Table:
        at = np.searchsorted(self.view.keys, keys)
        rows = self.view.table.take(pa.array(at, pa.int64()))
        return rows.add_column(0, ROW_KEY, pa.array(keys, pa.int64()))

    def snapshot(self) -> TableUpdate:
        """The rows at the positions now, replacing whatever the subscriber held."""
        self.held = self._keys().copy()
        return TableUpdate(self.view.transaction, _EMPTY, (), self.held, _EMPTY, {},
                           self._rows(self.held), snapshot=True, **self._where())

    def _where(self) -> dict[str, int]:
        return {"first": self.viewport.first, "size": len(self.view.keys)}

    def follow(self, update: TableUpdate) -> TableUpdate:
        """The subscriber's part of the view's `update` (just applied to the view)."""
        if update.snapshot:  # the view was keyed anew
            return self.snapshot()
        return self._since(update.transaction, update.removed, update.shifts, update.modified,
                           update.modified_columns)

    def move(self, first: int, last: int) -> TableUpdate:
        """What changes for the subscriber when its positions become `first`..`last`."""
        self.viewport = self.viewport.moved(first, last)
        return self._since(self.view.transaction, _EMPTY, (), _EMPTY, {})

    def _since(self, transaction: int, removed: np.ndarray, shifts: tuple[Shift, ...],
               modified: np.ndarray, modified_columns: dict[str, np.ndarray]) -> TableUpdate:
        now = self._keys()
        held = self.held
        kept = ~within(held, removed)
        kept[np.flatnonzero(kept)[~within(shifted(held[kept], shifts), now)]] = False
        staying = held[kept]
        sent_shifts = tuple(s for s in shifts
                            if np.searchsorted(staying, s.end, side="right")
                            > np.searchsorted(staying, s.start))
        moved = shifted(staying, sent_shifts)
        added = now[~within(now, moved)]
        changed = moved[within(moved, modified)]
        columns = {c: k[within(k, changed)] for c, k in modified_columns.items()}
        sent = np.sort(np.concatenate([added, changed]))
        self.held = now.copy()
        return TableUpdate(transaction, held[~kept], sent_shifts, added, changed,
                           {c: k for c, k in columns.items() if len(k)}, self._rows(sent),
                           **self._where())
