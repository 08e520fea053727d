"""Reducers for `Table.groupby(...).reduce(...)`: `count`, `sum`, `avg`, `min`, `max`,
`count_distinct`, with SQL semantics (nulls ignored; `sum`/`avg`/`min`/`max` of a group with no
non-null value are null; `count()` counts rows, `count(col)` non-null values).

Each reducer says its result type, the accumulators it needs and how its value is read from
them. Accumulators are linear (a group's value is the sum of its rows' contributions, each
multiplied by the row's diff), so a deletion subtracts exactly what its insertion added.
`min`, `max` and `count_distinct` are not linear: they read statistics of the group's multiset
of values, which the reduce operator keeps as state of its own.

A `sum` of `decimal(p,s)` is exact, of type `decimal(p+10,s)` as in Spark (`p` may be at most
28, so that a value times a diff never needs rounding). `avg` is `decimal(p+4,s+4)` (`p` at most
24): the exact sum divided by the count by Spark's decimal division, which keeps at least `s+4`
digits after the point and rounds half up, then rounded half up to `s+4` digits (twice rounded,
so the last digit may differ by one from rounding the exact quotient once; it is a function of
the exact sum and count, so it never changes unless they do).

A `sum` of doubles is exact: each finite value below 1e19 in magnitude is rounded to 9 decimal
places and summed exactly, so the result (the double nearest that exact sum) does not depend on
the order in which values came and went. Larger finite values are summed in floating point
beside it; NaN and infinities are counted, giving NaN, +inf or -inf as SQL does.

Exact sums of values of at most 18 digits (decimals of precision 18 or less, doubles below 1e9
rounded to 9 decimal places) are kept as two longs each (`txstream.engine.exact_sums`); wider
decimals, and doubles from 1e9 to 1e19, as DECIMAL(38,s) (a group's sum of such doubles fails
past 1e28).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DecimalType, DoubleType, LongType

from txstream.engine.columns import DIFF, ROW_COUNT
from txstream.engine.exact_sums import LIMB_DIGITS, as_decimal, as_double, exact_in_double, limbs
from txstream.engine.frames import col
from txstream.schemas.tables import ColumnType

# The exact part of a double sum: values below LIMB_BOUND in magnitude are rounded to
# LIMB_VALUE and summed as limbs (see txstream.engine.exact_sums), larger ones below
# EXACT_BOUND as EXACT_VALUE: DECIMAL(28,9) times a DECIMAL(9,0) diff is DECIMAL(38,9) with no
# rounding (a wider product would make Spark drop scale).
LIMB_BOUND = 1e9
LIMB_VALUE = "decimal(18,9)"
EXACT_VALUE = "decimal(28,9)"
EXACT_DIFF = "decimal(9,0)"
EXACT_BOUND = 1e19
# The widest decimal whose sum is exact the same way: DECIMAL(28,s) times the diff.
_SUM_DIGITS = 28
# The widest decimal whose average keeps s+4 digits through Spark's division (see Avg.value).
_AVG_DIGITS = 24


class ReducerKind(StrEnum):
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    COUNT_DISTINCT = "count_distinct"


class ReducerError(ValueError):
    """A reducer does not fit its column (the operator adds the table's name)."""


@dataclass(frozen=True)
class ValueStats:
    """Statistics of a group's non-null values of one column at one transaction."""

    min: Column
    max: Column
    distinct: Column


Accumulators = dict[str, Column]  # accumulator id -> one row's contribution (times its diff)
# Accumulator id (or ROW_COUNT) -> the group's summed column.
Lookup = Callable[[str], Column]


def _weighted(condition: Column, value: Column, zero: Column) -> Column:
    return F.when(condition, value).otherwise(zero)


def _non_null(column: str) -> Accumulators:
    c = col(column)
    return {f"nn:{column}": _weighted(c.isNotNull(), col(DIFF), F.lit(0).cast("long"))}


def _in_limbs(ctype: ColumnType) -> bool:
    """Whether a sum of the column is kept as limbs: a decimal of at most LIMB_DIGITS digits."""
    return ctype.is_decimal and (ctype.precision or 0) <= LIMB_DIGITS


def _sum_parts(column: str, ctype: ColumnType) -> Accumulators:
    c = col(column)
    present = c.isNotNull()
    long_zero = F.lit(0).cast("long")
    if _in_limbs(ctype):
        high, low = limbs(c)
        return {f"high:{column}": _weighted(present, high * col(DIFF), long_zero),
                f"low:{column}": _weighted(present, low * col(DIFF), long_zero)}
    if ctype.is_decimal:
        return {f"sum:{column}": _weighted(
            present,
            c.cast(f"decimal({_SUM_DIGITS},{ctype.scale})") * col(DIFF).cast(EXACT_DIFF),
            F.lit(0).cast(f"decimal(38,{ctype.scale})"))}
    if ctype is not ColumnType.DOUBLE:
        return {f"sum:{column}": _weighted(present, c.cast("long") * col(DIFF), long_zero)}
    # Spark orders NaN above every number, so `abs < bound` also excludes NaN and infinities.
    small = F.abs(c) < F.lit(LIMB_BOUND)
    medium = (F.abs(c) >= F.lit(LIMB_BOUND)) & (F.abs(c) < F.lit(EXACT_BOUND))
    big = (F.abs(c) >= F.lit(EXACT_BOUND)) & ~F.isnan(c) & (F.abs(c) != F.lit(float("inf")))
    # Cast only within their bounds (a cast out of them fails under ANSI SQL).
    high, low = limbs(F.when(small, c).cast(LIMB_VALUE))
    return {
        f"high:{column}": _weighted(small, high * col(DIFF), long_zero),
        f"low:{column}": _weighted(small, low * col(DIFF), long_zero),
        # Null, not zero, without such values: a null sum costs no decimal arithmetic.
        f"exact:{column}": F.when(medium, c).cast(EXACT_VALUE) * col(DIFF).cast(EXACT_DIFF),
        f"big:{column}": _weighted(big, c * col(DIFF), F.lit(0.0)),
        f"nan:{column}": _weighted(F.isnan(c), col(DIFF), long_zero),
        f"pinf:{column}": _weighted(c == F.lit(float("inf")), col(DIFF), long_zero),
        f"ninf:{column}": _weighted(c == F.lit(float("-inf")), col(DIFF), long_zero),
    }


def _sum_value(column: str, ctype: ColumnType, acc: Lookup) -> Column:
    """The exact sum: of a decimal column DECIMAL(p+10,s) (DECIMAL(38,s) for p above 18,
    cast by the reduce operator), of a double column the double nearest it."""
    if _in_limbs(ctype):
        assert ctype.precision is not None and ctype.scale is not None
        return as_decimal(acc(f"high:{column}"), acc(f"low:{column}"), ctype.precision + 10,
                          ctype.scale)
    if ctype is not ColumnType.DOUBLE:
        return acc(f"sum:{column}")
    high, low, medium = (acc(f"{k}:{column}") for k in ("high", "low", "exact"))
    # DECIMAL(29,9) holds the limbs' sum (a long of units, 9 decimals); with the medium
    # values' sum (zero without any) at 37 digits (it fails past 1e28) the total keeps its 9
    # decimals in 38.
    medium_sum = F.coalesce(medium.cast("decimal(37,9)"), F.lit(0).cast("decimal(37,9)"))
    total = as_decimal(high, low, 29, 9) + medium_sum
    exact = F.when(medium.isNull() & exact_in_double(high, low), as_double(high, low)) \
        .otherwise(total.cast("double"))
    nan, pinf, ninf = (acc(f"{k}:{column}") for k in ("nan", "pinf", "ninf"))
    return (F.when((nan > 0) | ((pinf > 0) & (ninf > 0)), F.lit(float("nan")))
            .when(pinf > 0, F.lit(float("inf")))
            .when(ninf > 0, F.lit(float("-inf")))
            .otherwise(exact + acc(f"big:{column}")))


class Reducer(ABC):
    kind: ClassVar[ReducerKind]
    needs_numeric: ClassVar[bool] = False
    # Whether the reducer reads the group's multiset of values (min, max, count_distinct).
    needs_values: ClassVar[bool] = False

    def __init__(self, column: str | None = None) -> None:
        self.column = column

    def __str__(self) -> str:
        return f"{self.kind.value}({self.column or ''})"

    def __repr__(self) -> str:
        return f"reducers.{self}"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.column == self.column  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.kind, self.column))

    def check(self, ctype: ColumnType | None) -> None:
        """Raise ReducerError if the reducer does not apply to a column of type `ctype`
        (None: no column given)."""
        if ctype is None and self.column is None and self.kind is not ReducerKind.COUNT:
            raise ReducerError(f"{self} needs a column")
        if self.needs_numeric and ctype is not None and not ctype.is_numeric:
            raise ReducerError(f"{self} needs a numeric column, but {self.column!r} is "
                               f"{ctype.value}")
        digits = _AVG_DIGITS if self.kind is ReducerKind.AVG else _SUM_DIGITS
        if self.needs_numeric and ctype is not None and (ctype.precision or 0) > digits:
            raise ReducerError(
                f"{self}: {self.column!r} is {ctype.value}, and {self.kind.value} is exact only "
                f"up to decimal({digits},s); cast it with select, e.g. "
                f"CAST({self.column} AS decimal({digits},{ctype.scale}))")

    def result_type(self, ctype: ColumnType | None, spark_type: DataType | None) -> DataType:
        return spark_type  # type: ignore[return-value]

    def accumulators(self, ctype: ColumnType | None) -> Accumulators:
        return {}

    @abstractmethod
    def value(self, ctype: ColumnType | None, acc: Lookup, values: ValueStats | None) -> Column:
        """The group's result, from its accumulators (`acc`) and value statistics."""


class Count(Reducer):
    kind = ReducerKind.COUNT

    def result_type(self, ctype: ColumnType | None, spark_type: DataType | None) -> DataType:
        return LongType()

    def accumulators(self, ctype: ColumnType | None) -> Accumulators:
        return {} if self.column is None else _non_null(self.column)

    def value(self, ctype: ColumnType | None, acc: Lookup, values: ValueStats | None) -> Column:
        return acc(ROW_COUNT) if self.column is None else acc(f"nn:{self.column}")


class Sum(Reducer):
    kind = ReducerKind.SUM
    needs_numeric = True

    def result_type(self, ctype: ColumnType | None, spark_type: DataType | None) -> DataType:
        if ctype is not None and ctype.is_decimal:
            assert ctype.precision is not None and ctype.scale is not None
            return DecimalType(ctype.precision + 10, ctype.scale)
        return DoubleType() if ctype is ColumnType.DOUBLE else LongType()

    def accumulators(self, ctype: ColumnType | None) -> Accumulators:
        assert self.column is not None and ctype is not None
        return {**_non_null(self.column), **_sum_parts(self.column, ctype)}

    def value(self, ctype: ColumnType | None, acc: Lookup, values: ValueStats | None) -> Column:
        assert self.column is not None and ctype is not None
        return F.when(acc(f"nn:{self.column}") > 0, _sum_value(self.column, ctype, acc))


class Avg(Sum):
    kind = ReducerKind.AVG

    def result_type(self, ctype: ColumnType | None, spark_type: DataType | None) -> DataType:
        if ctype is not None and ctype.is_decimal:
            assert ctype.precision is not None and ctype.scale is not None
            return DecimalType(ctype.precision + 4, ctype.scale + 4)
        return DoubleType()

    def value(self, ctype: ColumnType | None, acc: Lookup, values: ValueStats | None) -> Column:
        assert self.column is not None and ctype is not None
        n = acc(f"nn:{self.column}")
        total = _sum_value(self.column, ctype, acc)
        if ctype.is_decimal:
            # As the sum's type over a long, Spark's quotient keeps 28-p+s >= s+4 digits.
            return F.when(n > 0, total.cast(super().result_type(ctype, None)) / n)
        return F.when(n > 0, total.cast("double") / n)


class _ValueReducer(Reducer):
    """A reducer that reads one statistic of the group's multiset of values."""

    needs_values = True
    statistic: ClassVar[str]  # a field of ValueStats

    def value(self, ctype: ColumnType | None, acc: Lookup, values: ValueStats | None) -> Column:
        assert values is not None
        return getattr(values, self.statistic)


class Min(_ValueReducer):
    kind = ReducerKind.MIN
    statistic = "min"


class Max(_ValueReducer):
    kind = ReducerKind.MAX
    statistic = "max"


class CountDistinct(_ValueReducer):
    kind = ReducerKind.COUNT_DISTINCT
    statistic = "distinct"

    def result_type(self, ctype: ColumnType | None, spark_type: DataType | None) -> DataType:
        return LongType()


def count(column: str | None = None) -> Reducer:
    return Count(column)


def sum(column: str) -> Reducer:
    return Sum(column)


def avg(column: str) -> Reducer:
    return Avg(column)


def min(column: str) -> Reducer:
    return Min(column)


def max(column: str) -> Reducer:
    return Max(column)


def count_distinct(column: str) -> Reducer:
    return CountDistinct(column)
