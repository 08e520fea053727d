"""Exact sums kept as two longs.

A sum the engine keeps exactly (of decimals, and of doubles rounded to 9 decimal places) is a
sum of integers: each value's unscaled value u, the value times 10^scale. Summed as a
DECIMAL(38, scale), every addition of an aggregate or a window read and wrote a BigDecimal (a
decimal of more than 18 digits is stored as bytes in a row): in a profile of the group-by
benchmark, 40% of the executor's samples were in decimal arithmetic, and a batch took 11% longer
than it does now. A value of at most 18 digits is kept as two longs instead, its limbs

    high = u div 10^9        low = u mod 10^9        (both with the sign of u)

so that a row adds two longs (times its diff), and a group's sum is high * 10^9 + low, the
sums of its rows' limbs. Each limb is below 10^9 in magnitude, so a limb's sum overflows (an
arithmetic error, as every overflow under ANSI SQL) only past 9 * 10^9 rows of the largest
values. A decimal is built only when a group's value is read: from one long while the sum is
below 9.1 * 10^18 (a BigDecimal still, where the result has more than 18 digits).

    row:    u  --limbs-->  (high, low) * diff
    group:  (sum high, sum low)  --as_decimal / as_double-->  value
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Column
from pyspark.sql import functions as F

from txstream.engine.spark_expressions import integral_divide, make_decimal, unscaled_value

# The most digits an unscaled value split into limbs may have (a long holds 18 digits).
LIMB_DIGITS = 18
_GIGA = 10**9
# A group's limbs combine into one long below these bounds: |high * 10^9 + low| < 9.1e18.
_LONG_HIGH, _LONG_LOW = 9 * 10**9, 10**17
# ... and into a double that holds them exactly below these: |high * 10^9 + low| < 2^53.
_EXACT_HIGH, _EXACT_LOW = 4 * 10**6, 4 * 10**15


def limbs(decimal: Column) -> tuple[Column, Column]:
    """The limbs (high, low) of a decimal of at most `LIMB_DIGITS` digits."""
    unscaled = unscaled_value(decimal)
    giga = F.lit(_GIGA).cast("long")
    return integral_divide(unscaled, giga), unscaled % giga


def as_decimal(high: Column, low: Column, precision: int, scale: int) -> Column:
    """The DECIMAL(precision, scale) whose unscaled value is high * 10^9 + low (sums of limbs);
    a sum with more digits than `precision` fails the batch with an arithmetic error."""
    fits_long = (F.abs(high) < _LONG_HIGH) & (F.abs(low) < _LONG_LOW)
    # Otherwise in decimals: 10^9 * DECIMAL(19,s) is DECIMAL(30,s) and the sum DECIMAL(31,s),
    # exact under Spark's 38 digits.
    wide = make_decimal(high, 19, scale) * F.lit(Decimal(_GIGA)) + make_decimal(low, 19, scale)
    return F.when(fits_long, make_decimal(high * _GIGA + low, precision, scale)) \
        .otherwise(wide.cast(f"decimal({precision},{scale})"))


def exact_in_double(high: Column, low: Column) -> Column:
    """Whether high * 10^9 + low (sums of limbs) is a long a double holds exactly: its value at
    scale 9 is then `as_double`, one correctly rounded division."""
    return (F.abs(high) < _EXACT_HIGH) & (F.abs(low) < _EXACT_LOW)


def as_double(high: Column, low: Column) -> Column:
    """The double nearest (high * 10^9 + low) / 10^9, where `exact_in_double` holds."""
    return (high * _GIGA + low).cast("double") / F.lit(float(_GIGA))
