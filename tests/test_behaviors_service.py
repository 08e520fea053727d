"""A temporal behavior in the service (`txstream run`'s runner in-process, the real broker,
PostgreSQL and Spark): every sink a PostgreSQL snapshot committed per batch, which would let
the runner net a batch's transactions, yet the runner hands the engine each transaction of a
batch (a behavior's clock moves transaction by transaction: `Engine.nets_exactly`); the
snapshot equals the clock rule's recompute (`tests/support/temporal_model.py`) over the
changes the engine was given, and the late rows the metrics count are the recompute's."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import psycopg
from support.kafka_helpers import produce
from support.temporal_model import Behavior, Change, Windows, late_entries, results_after
from support.windowed_pipeline import EVENTS

from txstream.changes import DIFF, TIME, Changes
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.service.compose import open_runner


def test_a_behavior_sees_every_transaction_of_a_snapshot_batch(  # type: ignore[no-untyped-def]
        kafka, postgres, spark, pg_schema, topic_name, tmp_path) -> None:
    kafka.create_topic(topic_name, 1)
    rng = random.Random(3)
    records: list[tuple[str, Any]] = []
    for i in range(600):  # rising event times, some far behind (late), some ids written twice
        key = rng.randrange(400)
        ts = i // 10 - (rng.randint(8, 20) if rng.random() < 0.1 else rng.randint(0, 2))
        records.append((str(key), {"id": key, "user_id": rng.randint(1, 3), "ts": ts,
                                   "v": rng.randint(1, 9)}))
    produce(kafka, topic_name, records)
    config = PipelineConfig(
        pipeline="support.windowed_pipeline:pipeline",
        sources=[SourceSpec(name="events", topic=topic_name, schema=EVENTS,
                            semantics="upsert")],
        sinks=[SinkConfig.model_validate({"output": "windows", "db_schema": pg_schema})],
        transactions=BatchPolicy(max_events=20, max_delay_ms=200), batch_transactions=8,
        kafka_bootstrap_servers=kafka.bootstrap_servers, consumer_group=f"g-{topic_name}",
        database_url=postgres.url, checkpoint_dir=str(tmp_path / "ck"), warm_up_rows=0,
        retry_initial_backoff_s=0.2, retry_max_backoff_s=1.0)
    assert config.nets_batches, "every sink a snapshot committed per batch"
    runner = open_runner(config, spark=spark)
    given: list[Change] = []
    batches: list[set[int]] = []
    process = runner.engine.process

    def recording(changes: dict[str, Changes], wall_times: Any = None) -> Any:
        table = changes["events"].table
        rows = zip(*(table[n].to_pylist() for n in EVENTS.names), strict=True)
        times = table[TIME].to_pylist()
        given.extend((tuple(row), time, diff) for row, time, diff
                     in zip(rows, times, table[DIFF].to_pylist(), strict=True))
        batches.append(set(times))
        return process(changes, wall_times)

    runner.engine.process = recording  # type: ignore[method-assign]
    try:
        runner.run(until=lambda r: r.metrics.ingest.events >= 600 and r.lag() == 0)
        late_counted = sum(runner.metrics.compute.late_rows.values())
    finally:
        runner.close()
    assert any(len(times) > 1 for times in batches), "some batch held several transactions"
    last = max(time for _, time, _ in given)
    windows, behavior = Windows(5, 5), Behavior(cutoff=2)
    want = results_after(given, windows, behavior, True, last)
    with psycopg.connect(postgres.url) as conn:
        got = Counter(conn.execute(
            f'SELECT user_id, window_start, window_end, n, s FROM "{pg_schema}".windows_live'
        ).fetchall())
    assert len(want) > 30 and got == want
    late = late_entries(given, windows, behavior, last)
    assert late and late_counted == sum(abs(row[-1]) for row in late)
