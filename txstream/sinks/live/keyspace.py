"""Row keys for a sorted table (see `txstream.updates`): a row keeps its key while it lives,
keys follow the sort order, and new rows take free keys between their neighbours. Where a gap
has too few free keys, the rows after it move up (a shift) to widen it to `spacing` keys per
row. Pure functions, no state."""

from __future__ import annotations

import itertools

import numpy as np

from txstream.updates import Shift


def allocate(slots: np.ndarray, spacing: int) -> tuple[np.ndarray, tuple[Shift, ...]]:
    """Keys for the rows of a table in their new sort order. `slots[i]` is the current key of
    the row now at position `i`, or -1 for a new row; current keys must increase along the
    order. Returns every row's key after the update (increasing, non-negative) and the shifts
    that move the surviving rows there."""
    if spacing < 1:
        raise ValueError("spacing must be at least 1")
    n = len(slots)
    keys = slots.astype(np.int64, copy=True)
    survivors = np.flatnonzero(slots >= 0)
    if len(survivors) > 1 and not (np.diff(slots[survivors]) > 0).all():
        raise ValueError("the surviving rows' keys do not follow the new sort order")
    new = np.flatnonzero(slots < 0)
    moves = np.zeros(len(survivors), dtype=np.int64)
    if len(new):
        # Runs of new rows, each between two survivors (or at an end), in order.
        run_of = np.searchsorted(survivors, new)
        starts = np.flatnonzero(np.diff(np.concatenate([[-1], run_of])) != 0)
        bounds = [*starts.tolist(), len(new)]
        shift = 0
        done = 0  # survivors before the current run already moved by their shift
        for lo, hi in itertools.pairwise(bounds):
            run = int(run_of[lo])
            moves[done:run] = shift
            done = run
            m = hi - lo
            left = int(keys[survivors[run - 1]]) + int(moves[run - 1]) if run else -1
            if run == len(survivors):  # after the last row: room is unbounded
                keys[new[lo:hi]] = left + spacing * np.arange(1, m + 1, dtype=np.int64)
                continue
            right = int(slots[survivors[run]]) + shift
            if right - left < m + 1:
                shift += (m + 1) * spacing - (right - left)
                right = int(slots[survivors[run]]) + shift
            span = right - left
            keys[new[lo:hi]] = left + (np.arange(1, m + 1, dtype=np.int64) * span) // (m + 1)
        moves[done:] = shift
    keys[survivors] = slots[survivors] + moves
    return keys, _shifts(slots[survivors], moves) if n else ()


def _shifts(old: np.ndarray, moves: np.ndarray) -> tuple[Shift, ...]:
    """Shifts for survivors at `old` keys moving by `moves`: one per run of equal, non-zero
    moves."""
    if not len(old):
        return ()
    change = np.flatnonzero(np.diff(moves) != 0) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change - 1, [len(old) - 1]])
    return tuple(Shift(int(old[s]), int(old[e]), int(moves[s]))
                 for s, e in zip(starts, ends, strict=True) if moves[s])
