"""The start-up checks as pure functions (`txstream.service.startup`): the problems each finds
from what it is given, the error a start raises for them, and what a sink's settings answer
about its kind. No broker, database or Spark."""

from __future__ import annotations

from typing import Any

import pytest

from txstream import Pipeline, TableSchema
from txstream.schemas.config import ConfigError, PipelineConfig, SinkConfig
from txstream.schemas.sources import SourceSpec
from txstream.service.checkpoint import CheckpointError
from txstream.service.startup import (
    EarlierOutputError,
    Kind,
    earlier_output,
    outputs_ahead,
    refuse,
    sinks_fit,
    sources_fit,
    stale_saved_state,
)

ITEMS = TableSchema.of({"id": "bigint", "name": "text"}, primary_key=["id"])


def sink(**settings: Any) -> SinkConfig:
    return SinkConfig.model_validate(settings)


SNAPSHOT = sink(output="items", db_schema="s")
APPEND = sink(output="items", kind="postgres_append", table="items_log")
TOPIC = sink(output="items", kind="kafka", topic="out", transactional_id="t")
FILE = sink(output="items", kind="file", path="/data/items.jsonl")
LIVE = sink(output="items", kind="live")


def config(*sinks: SinkConfig, sources: list[SourceSpec] | None = None) -> PipelineConfig:
    return PipelineConfig(
        pipeline="m:f", consumer_group="orders", checkpoint_dir="/ck",
        kafka_bootstrap_servers="k:9092", database_url="postgresql://u@db/x",
        sources=sources if sources is not None else [
            SourceSpec(name="items", topic="items", schema=ITEMS)],
        sinks=list(sinks))


def test_a_sinks_settings_answer_for_its_kind() -> None:
    answers = {cfg.settings.kind: (cfg.settings.writes_postgres, cfg.settings.serves_live,
                                   cfg.settings.kafka_topic, cfg.settings.dependency,
                                   cfg.settings.destination())
               for cfg in (SNAPSHOT, APPEND, TOPIC, FILE, LIVE)}
    assert answers == {
        "postgres_snapshot": (True, False, None, "postgresql", "table s.items"),
        "postgres_append": (True, False, None, "postgresql", "table public.items_log"),
        "kafka": (False, False, "out", "kafka sink", "topic out"),
        "file": (False, False, None, "file sink", "file /data/items.jsonl"),
        "live": (False, True, None, "live sink", "its table saved in live.state_dir"),
    }
    replacing = sink(output="items", mode="replace").settings
    assert replacing.replaces and replacing.resumed().mode == "create"  # type: ignore[union-attr]
    assert not SNAPSHOT.settings.replaces and SNAPSHOT.settings.resumed() is SNAPSHOT.settings
    assert TOPIC.settings.resumed() is TOPIC.settings


def test_the_configuration_must_fit_the_pipeline() -> None:
    p = Pipeline()
    p.output("items", p.source("items", ITEMS).select("id", "name"))
    p.source("unused", ITEMS)
    other = TableSchema.of({"id": "bigint"}, primary_key=["id"])
    cfg = config(SNAPSHOT, sink(output="nowhere"), sources=[
        SourceSpec(name="items", topic="items", schema=other),
        SourceSpec(name="extra", topic="extra", schema=ITEMS)])
    assert [p.text for p in sources_fit(cfg, p)] == [
        "sources.items.schema: differs from the pipeline's source schema (id bigint, name "
        "text; primary key id)",
        "sources: the pipeline reads 'unused', which no source configures",
        "sources.extra: the pipeline has no source of that name",
    ]
    assert [p.text for p in sinks_fit(cfg, {"items"})] == [
        "sinks.1.output: 'nowhere' is not an output of the pipeline (items)"]
    with pytest.raises(ConfigError, match=r"does not fit the pipeline:\n  sinks\.1\.output"):
        refuse(sinks_fit(cfg, {"items"}))
    refuse([])  # nothing to refuse


def test_a_start_from_scratch_refuses_an_earlier_runs_output() -> None:
    cfg = config(SNAPSHOT, APPEND, FILE)
    assert earlier_output(cfg, [(SNAPSHOT, None), (APPEND, 0), (FILE, None)], None) == []
    [problem] = earlier_output(cfg, [(SNAPSHOT, 7), (APPEND, None), (FILE, 3)], 9)
    assert problem.kind is Kind.EARLIER_OUTPUT
    assert problem.text.startswith(
        "the progress row of pipeline 'orders' says its PostgreSQL outputs hold transactions "
        "up to #9; output 'items' (postgres_snapshot table s.items) holds transactions up to "
        "#7; output 'items' (file file /data/items.jsonl) holds transactions up to #3, "
        "written by an earlier run, but this run starts from scratch (no checkpoint or logged "
        "transaction in /ck/orders)")
    with pytest.raises(EarlierOutputError, match="`mode: replace` on every PostgreSQL sink"):
        refuse([problem])


def test_a_resumed_start_refuses_state_older_than_its_checkpoint() -> None:
    cfg = config(SNAPSHOT, LIVE)
    assert stale_saved_state(cfg, [(SNAPSHOT, None), (LIVE, 12)], checkpointed=12) == []
    [stale] = stale_saved_state(cfg, [(SNAPSHOT, None), (LIVE, 10)], checkpointed=12)
    assert stale.text.startswith(
        "output 'items' (live its table saved in live.state_dir) was saved for checkpoint "
        "#10, older than the checkpoint resumed from (#12 in /ck/orders)")
    assert outputs_ahead(cfg, None, logged_through=20) == []
    assert outputs_ahead(cfg, 20, logged_through=20) == []
    [ahead] = outputs_ahead(cfg, 21, logged_through=20)
    assert "hold transactions up to #21, but /ck/orders knows them only up to #20" in ahead.text
    with pytest.raises(CheckpointError, match="was saved for checkpoint #10"):
        refuse([stale, ahead])
