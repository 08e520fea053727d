"""Sample events for the event-time example (`txstream.examples.page_views`): page views over a
simulated stretch of time, a few of them late, and a CDC stream of prices.

The simulated clock moves forward with every event, from `start` to `start + span`. A view is
on time (its `ts` at most a minute behind the clock) or, one in a hundred after the first
tenth (or from `late_from`), late: 30 to 60 minutes behind. Prices: one per product from a day
before `start`, then new prices from a recent time on, corrections of a price and deletions of
one (never of the first). Messages are keyed by a JSON object of the primary key columns (a
tombstone, value null, deletes); values are JSON rows, times ISO 8601 in UTC, prices exact
decimal strings.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

Event = tuple[str, dict[str, Any], dict[str, Any] | None]  # (source, key, row; None deletes)
PriceKey = tuple[int, datetime]

LATE_SHARE = 0.01
LATE_BY = (timedelta(minutes=30), timedelta(minutes=60))
ON_TIME_WITHIN = timedelta(minutes=1)
LATE_AFTER = timedelta(minutes=10)


@dataclass
class ViewWorld:
    """What the events so far leave: every view (by id), the ids of the late ones (more than
    `LATE_AFTER` behind the latest view time before them: on-time views never are), and the
    prices as the CDC table holds them."""

    views: dict[int, dict[str, Any]] = field(default_factory=dict)
    late: set[int] = field(default_factory=set)
    prices: dict[PriceKey, Decimal] = field(default_factory=dict)
    latest: datetime | None = None

    def apply(self, event: Event) -> None:
        source, key, row = event
        if source == "page_views":
            assert row is not None
            self.views[key["view_id"]] = row
            if self.latest is not None and row["ts"] < self.latest - LATE_AFTER:
                self.late.add(key["view_id"])
            self.latest = max(self.latest or row["ts"], row["ts"])
        elif row is None:
            self.prices.pop((key["product_id"], key["valid_from"]), None)
        else:
            self.prices[(key["product_id"], key["valid_from"])] = row["price"]


def _price(rng: random.Random) -> Decimal:
    return Decimal(rng.randint(100, 20_000)).scaleb(-2)


def events(rng: random.Random, start: datetime, span: timedelta, count: int, users: int = 1000,
           products: int = 20, late_from: int | None = None) -> Iterator[Event]:
    """`count` events after each product's first price (`start` aware, in UTC); views may be
    late from the event numbered `late_from` on (default: after the first tenth)."""
    late_from = count // 10 if late_from is None else late_from
    first = start - timedelta(days=1)
    for product_id in range(1, products + 1):
        yield ("prices", {"product_id": product_id, "valid_from": first},
               {"product_id": product_id, "valid_from": first, "price": _price(rng)})
    later: list[PriceKey] = []  # prices that may be corrected or deleted
    step = span / count
    for i in range(count):
        clock = start + step * i
        roll = rng.random()
        if roll < 0.97 or (not later and roll >= 0.985):
            late = i >= late_from and rng.random() < LATE_SHARE
            behind = (rng.uniform(*(b.total_seconds() for b in LATE_BY)) if late
                      else rng.uniform(0, ON_TIME_WITHIN.total_seconds()))
            ts = (clock - timedelta(seconds=behind)).replace(microsecond=0)
            row = {"view_id": i, "user_id": rng.randint(1, users),
                   "product_id": rng.randint(1, products), "ts": ts}
            yield "page_views", {"view_id": i}, row
        elif roll < 0.985:
            product_id = rng.randint(1, products)
            since = (clock - timedelta(seconds=rng.uniform(0, 600))).replace(microsecond=0)
            later.append((product_id, since))
            yield ("prices", {"product_id": product_id, "valid_from": since},
                   {"product_id": product_id, "valid_from": since, "price": _price(rng)})
        elif roll < 0.995:
            product_id, since = rng.choice(later)
            yield ("prices", {"product_id": product_id, "valid_from": since},
                   {"product_id": product_id, "valid_from": since, "price": _price(rng)})
        else:
            product_id, since = later.pop(rng.randrange(len(later)))
            yield "prices", {"product_id": product_id, "valid_from": since}, None


def _json(value: Any) -> Any:
    return value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else str(value)


def encode(event: Event) -> tuple[bytes, bytes | None]:
    """The Kafka key and value of an event."""
    _, key, row = event
    return (json.dumps(key, default=_json).encode(),
            None if row is None else json.dumps(row, default=_json).encode())
