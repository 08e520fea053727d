"""Event time in the service (`txstream run`'s runner in-process, the real broker and Spark):
each transaction's wall time is its records' Kafka timestamp, and while the input is idle tick
transactions move it on, so rows leave a "last two seconds" filter without new data (the output
stream integrates to nothing once every row is older than that); a record without its event
time is a dead letter."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from support.kafka_helpers import produce, read_dead_letters
from support.windowed_pipeline import EVENTS

from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy, SourceSpec
from txstream.service.compose import open_runner


def _config(kafka, topic: str, pipeline: str, output: str, tmp_path: Path,  # type: ignore[no-untyped-def]
            source_format: str = "json", **settings: Any) -> PipelineConfig:
    """The runner's configuration for `pipeline` (of `support.windowed_pipeline`) reading
    `topic` (in `source_format`), its `output` appended to a JSON-lines file `<output>.jsonl`
    under `tmp_path`."""
    return PipelineConfig(
        pipeline=f"support.windowed_pipeline:{pipeline}",
        sources=[SourceSpec(name="events", topic=topic, schema=EVENTS, semantics="upsert",
                            format=source_format)],
        sinks=[SinkConfig.model_validate({"output": output, "kind": "file",
                                          "path": str(tmp_path / f"{output}.jsonl")})],
        kafka_bootstrap_servers=kafka.bootstrap_servers, consumer_group=f"g-{topic}",
        checkpoint_dir=str(tmp_path / "ck"), warm_up_rows=0,
        retry_initial_backoff_s=0.2, retry_max_backoff_s=1.0, **settings)


def test_ticks_move_now_while_the_input_is_idle(  # type: ignore[no-untyped-def]
        kafka, spark, topic_name, tmp_path) -> None:
    kafka.create_topic(topic_name, 1)
    config = _config(kafka, topic_name, "recent", "recent", tmp_path,
                     transactions=BatchPolicy(max_events=20, max_delay_ms=200, tick_ms=300))
    runner = open_runner(config, spark=spark)
    assert runner.engine.uses_wall_clock
    produced = time.time()
    records: list[tuple[str, Any]] = [
        (str(i), {"id": i, "user_id": 1, "ts": int(produced * 1000), "v": i}) for i in range(50)]
    produce(kafka, topic_name, records)
    try:
        runner.run(until=lambda r: r.metrics.ingest.events >= 50 and r.lag() == 0
                   and time.time() > produced + 5)
    finally:
        runner.close()
    changes = [json.loads(line) for line in (tmp_path / "recent.jsonl").read_text().splitlines()]
    entered = {c["id"]: c["time"] for c in changes if c["diff"] == 1}
    left = {c["id"]: c["time"] for c in changes if c["diff"] == -1}
    assert sorted(entered) == list(range(50)), "every row entered, in its transaction"
    assert sorted(left) == list(range(50)), "and left once two seconds of wall time passed"
    integrated: Counter[int] = Counter()
    for c in changes:
        integrated[c["id"]] += c["diff"]
    assert not +integrated
    assert min(left.values()) > max(entered.values()), \
        "they left in tick transactions, after the last transaction with records"


def test_a_debezium_events_own_time_is_its_transactions_wall_time(  # type: ignore[no-untyped-def]
        kafka, spark, topic_name, tmp_path) -> None:
    """Debezium change events carry the source database's time of the change (`source.ts_ms`):
    now() reads it, not the Kafka timestamp. Here the database's clock is a minute ahead, so rows
    stamped with the real time are never in the last two seconds."""
    kafka.create_topic(topic_name, 1)
    config = _config(kafka, topic_name, "recent", "recent", tmp_path, source_format="debezium",
                     transactions=BatchPolicy(max_events=20, max_delay_ms=200, tick_ms=0))
    runner = open_runner(config, spark=spark)
    real_ms = int(time.time() * 1000)
    changed_ms = real_ms + 60_000
    produce(kafka, topic_name, [(json.dumps({"id": i}), {
        "op": "c", "before": None, "after": {"id": i, "user_id": 1, "ts": real_ms, "v": i},
        "ts_ms": changed_ms + 50, "source": {"ts_ms": changed_ms}}) for i in range(10)])
    try:
        runner.run(until=lambda r: r.metrics.ingest.events >= 10 and r.lag() == 0)
    finally:
        runner.close()
    assert runner.wall_time == datetime.fromtimestamp(changed_ms / 1000, UTC)
    written = tmp_path / "recent.jsonl"
    assert not (written.exists() and written.read_text().strip()), \
        "no row entered: their time is a minute before the database's now()"


def test_a_record_without_its_event_time_is_a_dead_letter(  # type: ignore[no-untyped-def]
        kafka, spark, topic_name, tmp_path) -> None:
    """The windowed pipeline reads `ts` as event time: a record whose `ts` is null goes to the
    dead-letter topic, whole, with the reason; the others are windowed."""
    kafka.create_topic(topic_name, 1)
    dlq = f"{topic_name}-dlq"
    kafka.create_topic(dlq, 1)
    config = _config(kafka, topic_name, "pipeline", "windows", tmp_path,
                     transactions=BatchPolicy(max_events=20, max_delay_ms=200),
                     dead_letter_topic=dlq)
    untimed = json.dumps({"id": 2, "user_id": 1, "ts": None, "v": 5}).encode()
    produce(kafka, topic_name, [("1", {"id": 1, "user_id": 1, "ts": 3, "v": 1}),
                                ("2", untimed), ("3", {"id": 3, "user_id": 1, "ts": 4, "v": 2})])
    runner = open_runner(config, spark=spark)
    try:
        runner.run(until=lambda r: r.metrics.ingest.events >= 3 and r.lag() == 0)
    finally:
        runner.close()
    (dead,) = read_dead_letters(kafka, dlq, 1)
    assert dead["value"] == untimed and "'ts'" in dead["txstream.error"]
    changes = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    integrated: Counter[tuple[int, ...]] = Counter()
    for c in changes:
        integrated[(c["user_id"], c["window_start"], c["window_end"], c["n"], c["s"])] += c["diff"]
    assert +integrated == Counter({(1, 0, 5, 2, 3): 1})
