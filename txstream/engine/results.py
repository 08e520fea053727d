"""A batch's one result, and each output's changes read back from it.

    output a rows ──> PART = 0, __out0 = struct(a's row), __out1 = null, ...  ┐
    output b rows ──> PART = 1, __out0 = null, __out1 = struct(b's row), ...  ├ union ─> Arrow
    staged state  ──> PART = -1, every __out null, no row (a filter none passes) ┘

Every output's changes become a struct column of their own, filled on that output's rows only,
so one Spark action collects them all (`ResultLayout.columns`); the driver then cuts the Arrow
result into each output's `Changes` (`ResultLayout.read`).

An output may come as pairs (`Pairs`): an operator whose changes are a retraction of a row and
an insertion of its new version (a group-by: a group's row before and after a transaction)
lays each pair out as one row, the old values beside the new ones, and the driver splits them.
That halves the rows Spark builds and converts to Arrow, and spares it the generator that
would split them: a million-event group-by batch took 29% less time (its job 34% less;
medians of four, alternated in one process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField, StructType

from txstream.changes import Changes, order
from txstream.engine.columns import DIFF, PART, TIME
from txstream.engine.frames import col
from txstream.schemas.tables import TableSchema

# A pair's columns besides the row's: whether its old version is retracted, whether its new
# version is inserted, and the prefix of the old version's values.
RETRACT, INSERT, OLD = "__retract", "__insert", "__old_"


@dataclass(frozen=True)
class Pairs:
    """An output whose rows are the `keys` and `values` of its table, laid out as pairs: per
    changed row and time, the keys, `time`, RETRACT and INSERT, the old values (prefixed OLD)
    and the new ones. Retracted and inserted versions differ in their values only."""

    keys: tuple[str, ...]
    values: tuple[str, ...]

    def columns(self, schema: StructType) -> list[StructField]:
        """The pair's fields, given the table's `schema`."""
        flags = [StructField(n, BooleanType(), True) for n in (RETRACT, INSERT)]
        return [*(schema[k] for k in self.keys), StructField(TIME, schema[TIME].dataType),
                *flags, *(StructField(f"{OLD}{v}", schema[v].dataType) for v in self.values),
                *(schema[v] for v in self.values)]

    def changes(self, pairs: pa.Table) -> pa.Table:
        """The retractions and insertions of `pairs`, as the table's columns, time and diff."""
        names = [*self.keys, *self.values, TIME]
        old = pairs.filter(pairs[RETRACT]).select(
            [*self.keys, *(f"{OLD}{v}" for v in self.values), TIME]).rename_columns(names)
        new = pairs.filter(pairs[INSERT]).select(names)
        return pa.concat_tables([
            t.append_column(DIFF, pa.repeat(pa.scalar(diff, pa.int64()), t.num_rows))
            for t, diff in ((old, -1), (new, 1))])


def _output_column(part: int) -> str:
    """The column of a batch's one result that holds output number `part`'s changes."""
    return f"__out{part}"


class ResultLayout:
    """How a batch's outputs, by name, share its one result (see the module doc): each with
    its table's schema and, when it comes as pairs, their layout."""

    def __init__(self, outputs: Mapping[str, tuple[TableSchema, Pairs | None]]) -> None:
        self._outputs = dict(outputs)
        self._part_of = {name: i for i, name in enumerate(self._outputs)}
        structs = []
        for schema, pairs in self._outputs.values():
            fields = StructType.fromDDL(schema.spark_ddl(with_changes=True)).fields
            if pairs is not None:
                fields = pairs.columns(StructType(fields))
            structs.append(StructType([StructField(f.name, f.dataType, True) for f in fields]))
        # Made once: each column is several round trips to the JVM.
        self._columns = {None: self._layout(-1, structs),
                         **{name: self._layout(i, structs) for name, i in self._part_of.items()}}

    @staticmethod
    def _layout(part: int, structs: Sequence[StructType]) -> list[Column]:
        return [F.lit(part).alias(PART), *[
            (F.struct(*[col(f.name) for f in s.fields]) if i == part
             else F.lit(None)).cast(s).alias(_output_column(i)) for i, s in enumerate(structs)]]

    def columns(self, output: str | None) -> list[Column]:
        """The result's columns for the rows of `output` (None: for the rows that only make
        Spark compute the staged state)."""
        return self._columns[output]

    def read(self, result: pa.Table | None, present: Sequence[str]) -> dict[str, Changes]:
        """Every output's changes in `result` (None: no batch was computed), empty for an
        output not `present`, ordered; the operators' plans consolidated them."""
        read = {name: Changes.empty(schema.arrow_schema())
                for name, (schema, _) in self._outputs.items()}
        for name in present:
            assert result is not None, "a present output comes with a result"
            i = self._part_of[name]
            mine = result.filter(pc.equal(result.column(PART), i))
            rows = pa.Table.from_struct_array(mine.column(_output_column(i)).combine_chunks())
            schema, pairs = self._outputs[name]
            if pairs is not None:
                rows = pairs.changes(rows).select([*schema.names, TIME, DIFF])
            read[name] = Changes(order(rows.cast(schema.arrow_schema(with_changes=True))))
        return read
