"""The event-time example: page views of products, and the products' prices over time.

Sources: `page_views` (append-only: view_id, user_id, product_id, ts) and `prices`, a CDC table
of each product's price from a time on (product_id, valid_from, price; rows inserted, corrected
and deleted). Outputs:
- views_per_minute: views per product and minute, each minute emitted once, when the views'
                    clock passes its end by two minutes (`exactly_once_behavior`), never revised
- late_views:       the views that came too late for their minute (the row, its window,
                    the clock then): counted, and kept here rather than dropped silently
- sessions:         each user's sessions (views less than 5 minutes apart), updated as views
                    come; a view 10 minutes behind the clock is late, and a session is closed
                    and forgotten 15 minutes after its last view, the gap plus the cutoff
                    (`common_behavior(cutoff=...)`)
- priced_views:     every view with the price in force at its time (`asof_join`, backward),
                    revised when a price is corrected or deleted
- last_hour:        views per product whose time is within the last hour of the wall clock
                    (`now()`), moving as it moves, with ticks while the input is idle
"""

from datetime import timedelta
from typing import Any

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream import temporal as t
from txstream.schemas.sources import SourceSpec

VIEWS = TableSchema.of(
    {"view_id": "bigint", "user_id": "bigint", "product_id": "bigint", "ts": "timestamp"},
    primary_key=["view_id"],
)
PRICES = TableSchema.of(
    {"product_id": "bigint", "valid_from": "timestamp", "price": "decimal(10,2)"},
    primary_key=["product_id", "valid_from"],
)

OUTPUTS = ("views_per_minute", "late_views", "sessions", "priced_views", "last_hour")
MINUTE_SHIFT = timedelta(minutes=2)  # a minute is shown this long after its end
SESSION_GAP = timedelta(minutes=5)
SESSION_CUTOFF = timedelta(minutes=10)


def kafka_sources(views_topic: str, prices_topic: str, **settings: Any) -> list[SourceSpec]:
    """The sources as upsert topics keyed by primary key, JSON (the format of
    `txstream.examples.page_view_events`) unless `settings` say otherwise."""
    return [SourceSpec(name="page_views", topic=views_topic, schema=VIEWS, semantics="upsert",
                       **settings),
            SourceSpec(name="prices", topic=prices_topic, schema=PRICES, semantics="upsert",
                       **settings)]


def pipeline() -> Pipeline:
    p = Pipeline()
    views = p.source("page_views", VIEWS)
    prices = p.source("prices", PRICES)

    minutes = views.windowby("ts", window=t.tumbling(timedelta(minutes=1)),
                             instance="product_id",
                             behavior=t.exactly_once_behavior(shift=MINUTE_SHIFT))
    sessions = views.windowby("ts", window=t.session(max_gap=SESSION_GAP), instance="user_id",
                              behavior=t.common_behavior(cutoff=SESSION_CUTOFF))
    p.output("views_per_minute", minutes.reduce(views=r.count()))
    p.output("late_views", minutes.late_rows(), primary_key=["view_id"])
    p.output("sessions", sessions.reduce(views=r.count()))
    p.output("priced_views", views.asof_join(prices, "ts", "valid_from", on="product_id",
                                             how="left"))
    p.output("last_hour", views.filter("ts >= now() - INTERVAL 1 HOUR")
             .groupby("product_id").reduce(views=r.count()))
    return p
