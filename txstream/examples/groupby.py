"""Pathway's group-by benchmark as a pipeline: events `{"k": .., "v": ..}` grouped by `k` into
a row count and a sum of `v` (bench/end_to_end.py runs it Kafka to PostgreSQL)."""

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream.schemas.sources import SourceSpec

EVENTS = TableSchema.of({"k": "bigint", "v": "bigint"})


def sources(topic: str) -> list[SourceSpec]:
    return [SourceSpec(name="events", topic=topic, schema=EVENTS)]


def pipeline() -> Pipeline:
    p = Pipeline()
    p.output("sums", p.source("events", EVENTS).groupby("k")
             .reduce(count=r.count(), total=r.sum("v")), primary_key=["k"])
    return p
