"""A pipeline whose expression fails on some data (ANSI SQL division by zero): for the test of
what the service does then."""

from __future__ import annotations

from txstream import Pipeline, TableSchema

EVENTS = TableSchema.of({"k": "bigint", "v": "bigint"}, primary_key=["k"])


def pipeline() -> Pipeline:
    p = Pipeline()
    p.output("ratios", p.source("events", EVENTS).select("k", q="100 DIV v"))
    return p
