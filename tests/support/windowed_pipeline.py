"""A windowed pipeline for the service's tests: per-user tumbling windows of 5 over an integer
event time, under `common_behavior(cutoff=2)` (`tests/test_behaviors_service.py`)."""

from __future__ import annotations

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream import temporal as t

EVENTS = TableSchema.of({"id": "bigint", "user_id": "bigint", "ts": "bigint", "v": "bigint"},
                        primary_key=["id"])


def pipeline() -> Pipeline:
    p = Pipeline()
    events = p.source("events", EVENTS)
    p.output("windows", events.windowby("ts", window=t.tumbling(5), instance="user_id",
                                        behavior=t.common_behavior(cutoff=2))
             .reduce(n=r.count(), s=r.sum("v")))
    return p


def recent() -> Pipeline:
    """The events of the last two seconds of wall time, by their epoch-ms `ts`
    (`tests/test_now_service.py`)."""
    p = Pipeline()
    events = p.source("events", EVENTS)
    p.output("recent", events.filter("timestamp_millis(ts) >= now() - INTERVAL 2 SECONDS"))
    return p
