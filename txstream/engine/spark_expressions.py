"""Catalyst expressions that pyspark's functions do not expose, built through py4j (like
`txstream.engine.spark_internals`, which lists the rest of the internal API the engine uses:
upgrading Spark means checking these modules too).

The internal API used: `sql.classic.ExpressionUtils.expression(column)` and `.column(expression)`
(a column's Catalyst expression and back), and the expressions
`sql.catalyst.expressions.UnscaledValue(child)` and `MakeDecimal(child, precision, scale,
nullOnOverflow)` (which Spark's optimizer itself uses to sum small decimals as longs), and
`IntegralDivide(left, right)` (SQL's `div`).
"""

from __future__ import annotations

from collections.abc import Callable

from py4j.java_gateway import JavaObject
from pyspark import SparkContext
from pyspark.sql import Column
from pyspark.sql.classic.column import Column as ClassicColumn


def _expression(build: Callable[[JavaObject, JavaObject], JavaObject], *columns: Column
                ) -> Column:
    """A column of the expression `build(expressions, utils)` makes of the columns' Catalyst
    expressions (`expressions`: the package `sql.catalyst.expressions`)."""
    context = SparkContext._active_spark_context
    assert context is not None and context._jvm is not None, "no active SparkContext"
    jvm = context._jvm
    utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
    children = [utils.expression(c._jc) for c in columns]  # type: ignore[attr-defined]
    return ClassicColumn(utils.column(build(jvm.org.apache.spark.sql.catalyst.expressions,
                                            *children)))


def unscaled_value(decimal: Column) -> Column:
    """A decimal of at most 18 digits as the long of its digits (1.25 as DECIMAL(5,2): 125)."""
    return _expression(lambda e, d: e.UnscaledValue(d), decimal)


def make_decimal(unscaled: Column, precision: int, scale: int) -> Column:
    """The DECIMAL(precision, scale) whose digits are the long `unscaled`; a value with more
    than `precision` digits fails the batch with an arithmetic error, as a cast does."""
    return _expression(lambda e, u: e.MakeDecimal(u, precision, scale, False), unscaled)


def integral_divide(dividend: Column, divisor: Column) -> Column:
    """Long division rounding toward zero (SQL's `div`)."""
    return _expression(lambda e, a, b: e.IntegralDivide(a, b), dividend, divisor)
