"""The service's warm-up runs while it has nothing to do, never before a batch: a backlog at
start is computed first and the warm-up follows once the service is quiet, an idle start
warms the engine up with made-up batches, and an engine holding state (after a backlog or a
restored checkpoint) is warmed through a scratch engine of the same pipeline, which leaves that
state alone (`PipelineRunner`, `compose.open_runner`: a restored engine is not fresh either,
and takes the same path as one that computed a backlog)."""

from __future__ import annotations

import pytest
from support.orders import OrderProducer
from support.runner import Background, assert_snapshots, example_config

from txstream.schemas.config import PipelineConfig
from txstream.service.compose import open_runner

MADE_UP = "warm-up: made-up batch"
ENDED = "warm-up ended by a batch to compute"
CUT_SHORT = "warm-up cut short by a batch to compute"  # during a made-up batch
THROUGH = "warm-up done"  # every made-up batch taken
DELIVERED = "batch of"  # the runner's debug line once a batch is delivered


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
        with caplog.at_level("INFO", logger="txstream.service"), \
                Background(runner) as loop:
            loop.wait("a made-up batch while idle", lambda: MADE_UP in caplog.text)
            producer.send(300)
            loop.wait("all events committed", loop.drained(300))
        assert_snapshots(postgres.url, pg_schema, producer.world)
        assert any(m in caplog.text for m in (THROUGH, ENDED, CUT_SHORT)), \
            caplog.text
    finally:
        runner.close()


def test_a_backlog_goes_first_then_the_warm_up_runs_beside_the_state(  # type: ignore[no-untyped-def]
        warming, postgres, spark, pg_schema, caplog: pytest.LogCaptureFixture) -> None:
    config, producer = warming
    producer.send(300)
    runner = open_runner(config, spark=spark)
    try:
        with caplog.at_level("DEBUG", logger="txstream.service"), \
                Background(runner) as loop:
            loop.wait("all events committed", loop.drained(300))
            loop.wait("the warm-up, while idle, through", lambda: THROUGH in caplog.text
                      or "no warm-up" in caplog.text, timeout=300)
            assert THROUGH in caplog.text, caplog.text
            producer.send(200)
            loop.wait("the next events committed", loop.drained(500))
        messages = [r.getMessage() for r in caplog.records]
        first_made_up = next(i for i, m in enumerate(messages) if m.startswith(MADE_UP))
        assert any(m.startswith(DELIVERED) for m in messages[:first_made_up]), \
            "the backlog is computed before the warm-up begins"
        assert_snapshots(postgres.url, pg_schema, producer.world)
    finally:
        runner.close()
