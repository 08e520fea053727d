"""The event-time example in `txstream demo --example page_views`: page views and prices
(`txstream.examples.page_views`), every output checked against a from-scratch computation.

The simulated clock moves 0.36 s per event, so the views' times run over the two hours before
the demo starts with the default 20,000 events, and the last-hour filter keeps about half of
them. What makes the check exact whatever transactions the service forms: the views' topic
has one partition, so transactions take views in the order produced, at most 500 of them
(three simulated minutes), and a late view has a thousand events before it; an on-time view is
at most a minute behind the views before it, so never late (its minute closes two minutes
after its end, and a view is late for the sessions only when ten minutes behind the clock); a
late view is at least half an hour behind, so late whatever transaction it is in. The expected
outputs are then those of the on-time views (minutes emitted: those whose end plus two minutes
the latest view time reached), the late views themselves, every view priced as of its time,
and the views of the hour before the service's last now().
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg

from txstream.examples.page_view_events import ViewWorld, encode, events
from txstream.examples.page_views import (
    MINUTE_SHIFT,
    OUTPUTS,
    SESSION_GAP,
    kafka_sources,
)
from txstream.schemas.sources import SourceSpec
from txstream.service.demo_example import MAX_EVENTS, DemoError, DemoExample, Record, Say
from txstream.service.runner import PipelineRunner

STEP = timedelta(seconds=0.36)  # of the simulated clock, per event
LAST_HOUR = timedelta(hours=1)


class PageViewsDemo(DemoExample):
    pipeline = "txstream.examples.page_views:pipeline"
    partitions = {"page_views": 1, "prices": 1}
    outputs = OUTPUTS
    what = "page views and price changes (1% of views late)"

    def __init__(self) -> None:
        self.world = ViewWorld()

    def sources(self, topics: dict[str, str]) -> list[SourceSpec]:
        return kafka_sources(topics["page_views"], topics["prices"])

    def records(self, count: int, seed: int) -> Iterator[Record]:
        span = STEP * count
        start = datetime.now(UTC).replace(microsecond=0) - span
        # No late view among the first 1,000 events: each has two full transactions before its
        # own, whose views move the clock past it.
        late_from = max(count // 10, 2 * MAX_EVENTS)
        for i, event in enumerate(events(random.Random(seed), start, span, count,
                                         late_from=late_from)):
            self.world.apply(event)
            yield (event[0], *encode(event))
            if i == count // 2:  # a view without its event time: a dead letter, not lost
                yield ("page_views", b'{"view_id": -1}', json.dumps(
                    {"view_id": -1, "user_id": 1, "product_id": 1, "ts": None}).encode())

    def check(self, url: str, runner: PipelineRunner, say: Say) -> None:
        with psycopg.connect(url) as conn:
            def read(sql: str) -> list[tuple[Any, ...]]:
                return conn.execute(sql).fetchall()  # type: ignore[arg-type]
            minutes = read("SELECT product_id, window_start, window_end, views "
                           "FROM views_per_minute_live")
            late = read("SELECT view_id, window_start, late_clock FROM late_views_live")
            sessions = read("SELECT user_id, window_start, window_end, views FROM sessions_live")
            priced = read("SELECT view_id, price FROM priced_views_live")
            last_hour = read("SELECT product_id, views FROM last_hour_live")
        now = runner.wall_time
        if now is None:
            raise DemoError("the service computed no transaction with a wall time")
        self._show(minutes, late, sessions, last_hour, now, say)
        world = self.world
        on_time = [v for i, v in world.views.items() if i not in world.late]
        wrong = [name for name, got, want in (
            ("views_per_minute", _counted(minutes), self._minutes(on_time)),
            ("late_views", Counter(row[0] for row in late), Counter(world.late)),
            ("sessions", _counted(sessions), _sessions(on_time)),
            ("priced_views", Counter(priced), self._priced()),
            ("last_hour", Counter(last_hour), Counter(Counter(
                v["product_id"] for v in world.views.values() if v["ts"] >= now - LAST_HOUR
            ).items())),
        ) if got != want]
        if wrong:
            raise DemoError(f"{', '.join(wrong)} differ(s) from a from-scratch computation")
        say(f"\nchecked: views_per_minute ({len(minutes)} minutes), late_views "
            f"({len(late)}), sessions ({len(sessions)}), priced_views ({len(priced)}) and "
            f"last_hour (as of now() = {now:%H:%M:%S} UTC) equal a from-scratch computation")

    def _minutes(self, on_time: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
        """Views per product and minute of the on-time views, for the minutes shown: those
        whose end plus the shift the latest view time reached."""
        clock = max(v["ts"] for v in self.world.views.values())
        counts = Counter((v["product_id"], v["ts"].replace(second=0)) for v in on_time)
        return Counter({(product, start, start + timedelta(minutes=1), n): 1
                        for (product, start), n in counts.items()
                        if start + timedelta(minutes=1) + MINUTE_SHIFT <= clock})

    def _priced(self) -> Counter[tuple[int, Decimal | None]]:
        """Every view with the price of its product valid from the latest time at or before
        its own."""
        history: dict[int, list[tuple[datetime, Decimal]]] = {}
        for (product, since), price in self.world.prices.items():
            history.setdefault(product, []).append((since, price))
        priced: Counter[tuple[int, Decimal | None]] = Counter()
        for view_id, v in self.world.views.items():
            valid = [(since, price) for since, price in history.get(v["product_id"], [])
                     if since <= v["ts"]]
            priced[(view_id, max(valid)[1] if valid else None)] += 1
        return priced

    @staticmethod
    def _show(minutes: list[tuple[Any, ...]], late: list[tuple[Any, ...]],
              sessions: list[tuple[Any, ...]], last_hour: list[tuple[Any, ...]], now: datetime,
              say: Say) -> None:
        say("\nviews_per_minute (each minute emitted once, two minutes after its end; the "
            "latest five):")
        for product, start, end, n in sorted(minutes, key=lambda m: (m[1], m[0]))[-5:]:
            say(f"  product {product:>3}  {start:%H:%M}-{end:%H:%M}  {n:>4} views")
        say(f"\nlate_views: {len(late)} views came after their minute closed, kept here "
            "(the first three):")
        for view_id, start, clock in sorted(late)[:3]:
            say(f"  view {view_id:>6}  minute {start:%H:%M}  clock then {clock:%H:%M:%S}")
        longest = sorted(sessions, key=lambda s: (s[3], s[0]))[-3:]
        say(f"\nsessions: {len(sessions)} sessions of users (gaps under five minutes); the "
            "longest three:")
        for user, start, end, n in reversed(longest):
            say(f"  user {user:>5}  {start:%H:%M:%S}-{end:%H:%M:%S}  {n:>3} views")
        top = sorted(last_hour, key=lambda r: (-r[1], r[0]))[:5]
        say(f"\nlast_hour (views in the hour before now() = {now:%H:%M:%S} UTC; top five "
            "products):")
        for product, n in top:
            say(f"  product {product:>3}  {n:>5} views")


def _counted(rows: list[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """Rows with their times in UTC, as a multiset."""
    return Counter(tuple(v.astimezone(UTC) if isinstance(v, datetime) else v for v in row)
                   for row in rows)


def _sessions(on_time: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """Each user's sessions of the on-time views: (user, first, last, views), a new session
    wherever the gap to the previous view is at least the session gap."""
    times: dict[int, list[datetime]] = {}
    for v in on_time:
        times.setdefault(v["user_id"], []).append(v["ts"])
    found: Counter[tuple[Any, ...]] = Counter()
    for user, ts in times.items():
        ts.sort()
        first = 0
        for i in range(1, len(ts) + 1):
            if i == len(ts) or ts[i] - ts[i - 1] >= SESSION_GAP:
                found[(user, ts[first], ts[i - 1], i - first)] += 1
                first = i
    return found
