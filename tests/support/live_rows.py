"""A keyed table's rows changed in memory, with the changes they make: for the tests of live
tables and the update model."""

from __future__ import annotations


def change_row(state: dict[int, tuple[int, str | None, int | None]],
               new: tuple[int, str | None, int | None], delete: bool,
               batch: list[tuple[tuple[int, str | None, int | None], int]]) -> None:
    """Delete the row held for `new`'s key (if `delete`), else update it to `new`, or insert
    `new` if none is held: in `state`, and as changes appended to `batch`."""
    k = new[0]
    if k in state and delete:
        batch.append((state.pop(k), -1))
    elif k in state:
        if new != state[k]:
            batch += [(state[k], -1), (new, 1)]
            state[k] = new
    else:
        batch.append((new, 1))
        state[k] = new
