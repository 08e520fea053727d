"""Under a backlog that holds a batch, compute waits for ingest to fill it
(`backlog_wait_ms`, `Stages.take_batch`): the runner in-process against the real broker,
PostgreSQL and Spark, ingest reading a backlog a few transactions per poll. The records not
read yet come from the consumer's cached high watermarks (`TransactionBuilder.waiting_records`):
this checks that wiring, which `tests/test_stages.py` leaves out."""

from __future__ import annotations

from typing import Any

import pytest
from support.orders import OrderProducer
from support.runner import assert_snapshots, example_config

from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.runner import PipelineRunner


def _record_sizes(runner: PipelineRunner) -> list[int]:
    """The number of transactions of each batch compute takes."""
    sizes: list[int] = []
    compute = runner._compute

    def recording(batch: Any) -> None:
        sizes.append(len(batch))
        compute(batch)

    runner._compute = recording  # type: ignore[method-assign]
    return sizes


@pytest.mark.parametrize("wait_ms", [0, 60_000])
def test_a_backlog_is_taken_in_full_batches_while_it_holds_them(  # type: ignore[no-untyped-def]
        kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path, wait_ms: int) -> None:
    # 1,000 events in transactions of 25, read at most 50 records per poll: 40 transactions,
    # two closed per poll, 8 to a batch.
    config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                            f"g-{topic_name}", tmp_path / "ck").model_copy(update={
        "transactions": BatchPolicy(max_events=25, max_delay_ms=200, max_poll_records=50),
        "batch_transactions": 8, "backlog_wait_ms": wait_ms})
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(1_000)
    runner = open_runner(config, spark=spark)
    try:
        sizes = _record_sizes(runner)
        runner.run(until=lambda r: r.lag() == 0 and r.metrics.ingest.events >= 1_000)
    finally:
        runner.close()
    assert_snapshots(postgres.url, pg_schema, producer.world)
    assert sum(sizes) == runner.metrics.delivery.last_transaction
    if wait_ms:
        # Every batch full while the unread records held the rest of one (the last ones may
        # not be: the backlog's tail is less than a batch).
        assert sizes[:3] == [8, 8, 8], sizes
    else:
        assert sizes[0] < 8, f"taken as it came: {sizes}"
