"""A viewport: the rows at positions `first` to `last` (inclusive, from 0) of a live table
sorted by `sort` (columns, each ascending or descending; the primary key breaks ties and is
the order when `sort` is empty). A subscription to a viewport receives only what changes
inside it, and the client may move it (`txstream.client.Subscription.move`) without
subscribing again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DIRECTIONS = ("asc", "desc")


class ViewportError(ValueError):
    """A viewport request that cannot be served as given."""


@dataclass(frozen=True)
class Viewport:
    first: int
    last: int
    sort: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise ViewportError(f"a viewport needs 0 <= first <= last, got first={self.first}, "
                                f"last={self.last}")
        for column, direction in self.sort:
            if direction not in DIRECTIONS:
                raise ViewportError(f"sort direction of {column!r} is {direction!r}; use "
                                    "'asc' or 'desc'")
        columns = [c for c, _ in self.sort]
        if len(set(columns)) != len(columns):
            raise ViewportError(f"a column is sorted twice: {columns}")

    @classmethod
    def of(cls, first: int, last: int, sort: Iterable[tuple[str, str]] | None = None
           ) -> Viewport:
        return cls(first, last, tuple((str(c), str(d)) for c, d in sort or ()))

    def moved(self, first: int, last: int) -> Viewport:
        return Viewport(first, last, self.sort)

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "sort": [list(s) for s in self.sort]}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Viewport:
        try:
            return cls.of(int(value["first"]), int(value["last"]),
                          [(c, d) for c, d in value.get("sort", [])])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ViewportError):
                raise
            raise ViewportError(
                'a viewport is {"first": <int>, "last": <int>, "sort": [[<column>, "asc" | '
                f'"desc"], ...]}}: {exc}') from exc
