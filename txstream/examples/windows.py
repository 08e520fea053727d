"""Page views counted per user in one-minute windows, each window shown once, when the clock
passes its end (`exactly_once_behavior`): bench/temporal.py's windowed workload as a pipeline,
run Kafka to PostgreSQL beside Pathway's by bench/temporal_end_to_end.py. Events
`{"user_id": .., "ts": ..}`, `ts` in microseconds since the epoch (a number, as Pathway reads
it: its windows and these fall on the same minutes)."""

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream import temporal as t
from txstream.schemas.sources import SourceSpec

VIEWS = TableSchema.of({"user_id": "bigint", "ts": "bigint"})
MINUTE_US = 60_000_000


def sources(topic: str) -> list[SourceSpec]:
    return [SourceSpec(name="views", topic=topic, schema=VIEWS)]


def pipeline() -> Pipeline:
    p = Pipeline()
    views = p.source("views", VIEWS)
    per_window = views.windowby("ts", window=t.tumbling(MINUTE_US), instance="user_id",
                                behavior=t.exactly_once_behavior()).reduce(views=r.count())
    p.output("per_window", per_window, primary_key=["user_id", "window_start"])
    return p
