"""Reducers for `Table.groupby(...).reduce(...)`: `count`, `sum`, `avg`, `min`, `max`,
`count_distinct`, with SQL semantics (nulls ignored; `sum`/`avg`/`min`/`max` of a group with no
non-null value are null; `count()` counts rows, `count(col)` non-null values)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ReducerKind(StrEnum):
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    COUNT_DISTINCT = "count_distinct"


@dataclass(frozen=True)
class Reducer:
    kind: ReducerKind
    column: str | None = None

    @property
    def needs_numeric(self) -> bool:
        return self.kind in (ReducerKind.SUM, ReducerKind.AVG)

    @property
    def needs_values(self) -> bool:
        """Whether the reducer needs each group's multiset of values, not just running sums."""
        return self.kind in (ReducerKind.MIN, ReducerKind.MAX, ReducerKind.COUNT_DISTINCT)

    def __str__(self) -> str:
        return f"{self.kind.value}({self.column or ''})"


def count(column: str | None = None) -> Reducer:
    return Reducer(ReducerKind.COUNT, column)


def sum(column: str) -> Reducer:
    return Reducer(ReducerKind.SUM, column)


def avg(column: str) -> Reducer:
    return Reducer(ReducerKind.AVG, column)


def min(column: str) -> Reducer:
    return Reducer(ReducerKind.MIN, column)


def max(column: str) -> Reducer:
    return Reducer(ReducerKind.MAX, column)


def count_distinct(column: str) -> Reducer:
    return Reducer(ReducerKind.COUNT_DISTINCT, column)
