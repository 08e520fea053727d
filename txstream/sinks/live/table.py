"""A keyed output kept live: its rows sorted by primary key, each with a row key
(`txstream.sinks.live.keyspace`), and per transaction the `TableUpdate` that moves a copy of it
(`txstream.updates.Mirror`) from one state to the next.

The changes come from the engine, consolidated per transaction: for a primary key at most one
deletion (-1, the row as held) and one insertion (+1). Both: the row is modified; only one:
removed or added. Anything else means the engine and the live table disagree, which is a bug
to report, not input to repair."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.changes import DIFF
from txstream.sinks.live.keyspace import allocate
from txstream.updates import ROW_KEY, TableUpdate, same_values

_POS = "__pos"
_NEW = "__new"
# Keys grow by shifts; past this the table is keyed anew and subscribers get a snapshot.
KEY_LIMIT = 1 << 62
SPACING = 1 << 16


def _frozen(keys: np.ndarray) -> np.ndarray:
    """`keys`, read-only: snapshots and views share them."""
    keys.flags.writeable = False
    return keys


class LiveTableError(RuntimeError):
    """Changes that do not fit the live table (a deletion of a row it lacks, an insertion of a
    key it holds): the engine's output and the live table disagree."""


class LiveTable:
    """The rows of one keyed output with their row keys, sorted by `primary_key`, or by the
    columns of `order` (those in `descending` from largest to smallest) then the primary key:
    a sorted view of a served table (`txstream.sinks.live.viewport`). A row whose `order` values
    change moves, so it is removed and added under a new key, not modified."""

    def __init__(self, name: str, schema: pa.Schema, primary_key: Sequence[str],
                 spacing: int = SPACING, order: Sequence[str] = (),
                 descending: Sequence[str] = ()) -> None:
        if not primary_key:
            raise LiveTableError(f"output {name!r} has no primary key; only keyed outputs can "
                                 "be served live (give it primary_key=...)")
        missing = [c for c in primary_key if c not in schema.names]
        if missing:
            raise LiveTableError(f"output {name!r}: primary key columns {missing} are not "
                                 "among its columns")
        self.name = name
        self.schema = schema
        self.primary_key = list(primary_key)
        self.order = [*order, *[c for c in primary_key if c not in order]]
        self.descending = frozenset(descending)
        self.spacing = spacing
        self.keys = _frozen(np.zeros(0, dtype=np.int64))
        self.table = schema.empty_table()
        self.transaction = 0
        self._snapshot: TableUpdate | None = None

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.keys.nbytes

    def restore(self, rows: pa.Table, transaction: int) -> None:
        """Take `rows` (`ROW_KEY` and the columns, in key order, as `snapshot` gives them) as
        the table as of `transaction`."""
        keys = rows.column(ROW_KEY).to_numpy()
        if len(keys) and not (np.diff(keys) > 0).all():
            raise LiveTableError(f"output {self.name!r}: saved row keys are not in order")
        self.keys = _frozen(keys.astype(np.int64))
        self.table = rows.select(self.schema.names).cast(self.schema)
        self.transaction = transaction
        self._snapshot = None

    def snapshot(self) -> TableUpdate:
        """The whole table as of its last transaction, as an update that only adds rows: one
        object per transaction, shared by every subscriber that asks (the keys and rows are
        never changed in place)."""
        if self._snapshot is None or self._snapshot.transaction != self.transaction:
            empty = _frozen(np.zeros(0, dtype=np.int64))
            self._snapshot = TableUpdate(self.transaction, empty, (), self.keys, empty, {},
                                         self._with_keys(self.table, self.keys), snapshot=True)
        return self._snapshot

    def apply(self, changes: pa.Table, transaction: int) -> TableUpdate:
        """Apply one transaction's consolidated `changes` (the output's columns, `time` and
        `diff`) and return the update; a snapshot when the table was keyed anew."""
        if transaction <= self.transaction:
            raise LiveTableError(f"output {self.name!r}: transaction {transaction} is not after "
                                 f"{self.transaction}")
        rows = changes.select(self.schema.names).cast(self.schema)
        diff = changes.column(DIFF)
        minus, plus = rows.filter(pc.equal(diff, -1)), rows.filter(pc.equal(diff, 1))
        if minus.num_rows + plus.num_rows != rows.num_rows:
            raise LiveTableError(f"output {self.name!r}: transaction {transaction} has diffs "
                                 "other than -1 and +1; changes must be consolidated")
        at = self._positions(minus, transaction)
        if len(np.unique(at)) != len(at):
            raise LiveTableError(f"output {self.name!r}: transaction {transaction} deletes a "
                                 "row twice; changes must be consolidated")
        replaced = self._member(minus, plus)  # deletions whose key is inserted again
        inserted_again = self._member(plus, minus)
        if self.order != self.primary_key:  # a row that moves in the order is not modified
            replaced &= ~self._moves(minus, plus)
            inserted_again &= ~self._moves(plus, minus)
        keep = np.ones(self.table.num_rows, dtype=bool)
        keep[at] = False
        survivors = self.table.filter(pa.array(keep))
        survivor_keys = self.keys[keep]
        # Modified rows keep their key: they re-enter as survivors carrying new values.
        was = np.full(plus.num_rows, -1, dtype=np.int64)
        was[inserted_again] = self._keys_of(plus.filter(pa.array(inserted_again)), minus, at)
        merged = pa.concat_tables([survivors, plus]).append_column(
            _NEW, pa.array(np.concatenate([np.full(survivors.num_rows, -2), was])))
        merged = merged.append_column(
            _POS, pa.array(np.concatenate([survivor_keys, np.full(plus.num_rows, -1)])))
        order = merged.take(pa.array(self._order(survivors, plus)))
        self._check_distinct(order, transaction)
        slots = np.where(order.column(_NEW).to_numpy() == -2, order.column(_POS).to_numpy(),
                         order.column(_NEW).to_numpy())
        keys, shifts = allocate(slots, self.spacing)
        fresh = order.column(_NEW).to_numpy() >= -1  # rows from `plus`: added or modified
        table = order.drop_columns([_NEW, _POS])
        old_keys, self.keys, self.table = self.keys, _frozen(keys), table
        self.transaction = transaction
        if len(keys) and keys[-1] > KEY_LIMIT:
            self.keys = _frozen(np.arange(len(keys), dtype=np.int64) * self.spacing)
            return self.snapshot()
        modified_mask = fresh & (slots >= 0)
        modified = keys[modified_mask]
        removed = np.sort(old_keys[at[~replaced]])
        changed = self._changed_columns(minus.filter(pa.array(replaced)), at[replaced],
                                        old_keys, table.filter(pa.array(modified_mask)),
                                        modified)
        return TableUpdate(transaction, removed, shifts, keys[fresh & (slots < 0)], modified,
                           changed, self._with_keys(table.filter(pa.array(fresh)), keys[fresh]))

    # ---- helpers -------------------------------------------------------------------------

    def _order(self, survivors: pa.Table, plus: pa.Table) -> np.ndarray:
        """Indices into `survivors` followed by `plus` in the table's order. The survivors are
        in that order already: a numeric one-column ascending key places the few new rows by
        binary search; any other order sorts it all."""
        key = self.order[0]
        kind = survivors.schema.field(key).type
        if len(self.order) == 1 and not self.descending and (
                pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_temporal(kind)):
            held = survivors.column(key).to_numpy()
            new = plus.column(key).to_numpy()
            by_key = np.argsort(new, kind="stable")
            at = np.searchsorted(held, new[by_key], side="right")
            return np.insert(np.arange(len(held)), at, len(held) + by_key)
        both = pa.concat_tables([survivors.select(self.order), plus.select(self.order)])
        return pc.sort_indices(both, sort_keys=[
            (c, "descending" if c in self.descending else "ascending")
            for c in self.order]).to_numpy()

    def _with_keys(self, table: pa.Table, keys: np.ndarray) -> pa.Table:
        return table.add_column(0, ROW_KEY, pa.array(keys, pa.int64()))

    def _positions(self, minus: pa.Table, transaction: int) -> np.ndarray:
        """Where the deleted rows are held; each must be held exactly as deleted."""
        if not minus.num_rows:
            return np.zeros(0, dtype=np.int64)
        held = self.table.append_column(_POS, pa.array(np.arange(self.table.num_rows)))
        # The table probes a hash table of the few deleted rows, not the other way round.
        found = held.join(minus.append_column(_NEW, pa.array(np.arange(minus.num_rows))),
                          self.primary_key, join_type="inner", right_suffix="__deleted")
        if found.num_rows != minus.num_rows:
            raise LiveTableError(f"output {self.name!r}: transaction {transaction} deletes "
                                 f"{minus.num_rows - found.num_rows} row(s) the live table does "
                                 "not hold")
        found = found.sort_by(_NEW)
        pos = found.column(_POS)
        for c in self.schema.names:
            if c in self.primary_key:
                continue
            if not pc.all(same_values(found.column(c), found.column(f"{c}__deleted"))).as_py():
                raise LiveTableError(f"output {self.name!r}: transaction {transaction} deletes "
                                     f"a row whose {c!r} differs from the one held")
        return pos.to_numpy()

    def _member(self, rows: pa.Table, others: pa.Table) -> np.ndarray:
        """Which of `rows` have a primary key among `others`'."""
        if not rows.num_rows or not others.num_rows:
            return np.zeros(rows.num_rows, dtype=bool)
        tagged = rows.select(self.primary_key).append_column(
            _NEW, pa.array(np.arange(rows.num_rows)))
        hits = tagged.join(others.select(self.primary_key), self.primary_key,
                           join_type="left semi")
        mask = np.zeros(rows.num_rows, dtype=bool)
        mask[hits.column(_NEW).to_numpy()] = True
        return mask

    def _moves(self, rows: pa.Table, others: pa.Table) -> np.ndarray:
        """Which of `rows` share their primary key with a row of `others` whose `order`
        values differ (null equals null, NaN equals NaN)."""
        moved = np.zeros(rows.num_rows, dtype=bool)
        if not rows.num_rows or not others.num_rows:
            return moved
        sort_columns = [c for c in self.order if c not in self.primary_key]
        tagged = rows.select([*self.primary_key, *sort_columns]).append_column(
            _NEW, pa.array(np.arange(rows.num_rows)))
        pairs = tagged.join(others.select([*self.primary_key, *sort_columns]),
                            self.primary_key, join_type="inner", right_suffix="__other")
        differs = np.zeros(pairs.num_rows, dtype=bool)
        for c in sort_columns:
            same = same_values(pairs.column(c), pairs.column(f"{c}__other"))
            differs |= ~same.to_numpy(zero_copy_only=False)
        moved[pairs.column(_NEW).to_numpy()[differs]] = True
        return moved

    def _keys_of(self, rows: pa.Table, minus: pa.Table, at: np.ndarray) -> np.ndarray:
        """The row keys held for `rows`' primary keys (each among the deleted `minus`, held at
        positions `at`)."""
        tagged = rows.select(self.primary_key).append_column(
            _NEW, pa.array(np.arange(rows.num_rows)))
        held = minus.select(self.primary_key).append_column(_POS, pa.array(self.keys[at]))
        found = tagged.join(held, self.primary_key, join_type="inner").sort_by(_NEW)
        return found.column(_POS).to_numpy()

    def _check_distinct(self, order: pa.Table, transaction: int) -> None:
        """In the table's order, no two neighbours share their primary key (the base table
        catches a key inserted twice; a sorted view of it gets the same changes)."""
        if order.num_rows < 2:
            return
        same = None
        for c in self.primary_key:
            col = order.column(c).combine_chunks()
            eq = pc.fill_null(pc.equal(col.slice(1), col.slice(0, len(col) - 1)), False)
            same = eq if same is None else pc.and_(same, eq)
        if pc.any(same).as_py():
            raise LiveTableError(f"output {self.name!r}: transaction {transaction} inserts a "
                                 "primary key the live table already holds")

    def _changed_columns(self, before: pa.Table, held_at: np.ndarray, old_keys: np.ndarray,
                         after: pa.Table, keys: np.ndarray) -> dict[str, np.ndarray]:
        """For each non-key column, the modified keys whose value of it changed. `before`: the
        deleted rows of modified keys (held at `held_at`); `after`: their new rows, in key
        order, whose keys are `keys`."""
        if not after.num_rows:
            return {}
        old = before.append_column(_POS, pa.array(old_keys[held_at])).sort_by(_POS)
        changed: dict[str, np.ndarray] = {}
        for c in self.schema.names:
            if c in self.primary_key:
                continue
            same = same_values(old.column(c), after.column(c))
            differs = ~same.to_numpy(zero_copy_only=False)
            if differs.any():
                changed[c] = keys[differs]
        return changed
