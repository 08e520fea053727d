"""The service's warm-up runs while it has nothing to do, never before a batch: a backlog at
start is computed at once (its first batches warm the JVM), an idle start warms the engine up
with made-up batches, and a restored engine is warmed through a scratch engine of the same
pipeline, leaving the restored state alone (`PipelineRunner`, `compose.open_runner`)."""

from __future__ import annotations

import pytest
from support.orders import OrderProducer
from support.runner import Background, assert_snapshots, example_config

from txstream.schemas.config import PipelineConfig
from txstream.service.compose import open_runner

MADE_UP = "warm-up: made-up batch"
ENDED = "warm-up ended by a batch to compute"
CUT_SHORT = "warm-up cut short by a batch to compute"  # during a made-up batch
NOT_BEGUN = "no warm-up: a batch came first"


@pytest.fixture
def warming(kafka, postgres, pg_schema, topics, topic_name, tmp_path  # type: ignore[no-untyped-def]
            ) -> tuple[PipelineConfig, OrderProducer]:
    """The example pipeline with a (small) warm-up, and a producer of its events."""
    return (example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                           f"g-{topic_name}", tmp_path / "ck", warm_up_rows=600),
            OrderProducer(kafka.bootstrap_servers, topics))


def test_an_idle_start_warms_up_then_computes(  # type: ignore[no-untyped-def]
        warming, postgres, spark, pg_schema, caplog: pytest.LogCaptureFixture) -> None:
    config, producer = warming
    runner = open_runner(config, spark=spark)
    try:
        with caplog.at_level("INFO", logger="txstream.service.runner"), \
                Background(runner) as loop:
            loop.wait("a made-up batch while idle", lambda: MADE_UP in caplog.text)
            producer.send(300)
            loop.wait("all events committed", loop.drained(300))
        assert_snapshots(postgres.url, pg_schema, producer.world)
        assert any(m in caplog.text for m in (f"{MADE_UP} 3 of 3", ENDED, CUT_SHORT)), \
            caplog.text
    finally:
        runner.close()


def test_a_backlog_goes_first_and_a_restored_engine_warms_up_beside_its_state(  # type: ignore[no-untyped-def]
        warming, postgres, spark, pg_schema, caplog: pytest.LogCaptureFixture) -> None:
    config, producer = warming
    producer.send(300)
    runner = open_runner(config, spark=spark)
    try:
        with caplog.at_level("INFO", logger="txstream.service.runner"), \
                Background(runner) as loop:
            loop.wait("all events committed", loop.drained(300))
        assert NOT_BEGUN in caplog.text and MADE_UP not in caplog.text, caplog.text
        assert runner.checkpoint()
    finally:
        runner.close()
    caplog.clear()

    runner = open_runner(config, spark=spark)  # restores the checkpoint: not a fresh engine
    try:
        with caplog.at_level("INFO", logger="txstream.service.runner"), \
                Background(runner) as loop:
            loop.wait("the warm-up, while idle, through",
                      lambda: f"{MADE_UP} 3 of 3" in caplog.text, timeout=300)
            producer.send(200)
            loop.wait("all events committed", loop.drained(200))
        assert_snapshots(postgres.url, pg_schema, producer.world)
    finally:
        runner.close()
