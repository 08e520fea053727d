"""Net batches (`PipelineConfig.nets_batches`): the example pipeline into PostgreSQL snapshots
only, committed once per batch, hands the engine each batch of several transactions as one
(`Changes.net`: every change at the batch's last transaction), and the snapshots equal a
from-scratch computation. After a restart the transactions it replays are netted in the groups
the first run logged (`txstream.service.net_groups`), whatever batches the replay forms.

The runner in-process against the real broker, PostgreSQL and Spark; the engine's input is
recorded on its way in (the engine itself runs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.orders import OrderProducer
from support.runner import assert_snapshots, example_config

from txstream.changes import Changes
from txstream.schemas.sources import BatchPolicy
from txstream.service.compose import open_runner
from txstream.service.runner import PipelineRunner


def _record_times(runner: PipelineRunner) -> list[set[int]]:
    """The transactions of each batch the engine is given, as the runner hands it over."""
    seen: list[set[int]] = []
    process = runner.engine.process

    def recording(changes: dict[str, Changes], wall_times: Any = None) -> Any:
        times = {t for c in changes.values() for t in c.times.to_pylist()}
        if times:  # a netted batch whose changes all cancel has none
            seen.append(times)
        return process(changes, wall_times)

    runner.engine.process = recording  # type: ignore[method-assign]
    return seen


def _then_one_more(producer: OrderProducer, events: int) -> Callable[[PipelineRunner], bool]:
    """`until` of a run: once `events` are delivered, 10 more are sent, most likely a
    transaction alone, not netted, which the replay then meets beside a netted part (a logged
    group, or the fresh transactions after it: their changes concatenated); done once those
    are delivered too. `test_net_groups` checks that concatenation on its own."""
    sent: list[int] = []

    def until(runner: PipelineRunner) -> bool:
        if runner.lag() != 0 or runner.metrics.ingest.events < events:
            return False
        if not sent:
            producer.send(10)
            sent.append(10)
            return False
        return runner.metrics.ingest.events >= events + 10

    return until


def test_snapshot_batches_are_netted_and_replays_net_the_same_groups(  # type: ignore[no-untyped-def]
        kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path) -> None:
    # Transactions of 25 events, up to 8 in a batch: a backlog makes batches of several.
    config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                            f"g-{topic_name}", tmp_path / "ck").model_copy(update={
        "transactions": BatchPolicy(max_events=25, max_delay_ms=200), "batch_transactions": 8,
        # No checkpoint before the stop: the second start replays every logged transaction.
        "checkpoint_every_batches": 10_000, "checkpoint_every_s": 3_600.0,
        "checkpoint_when_idle_s": 0.0})
    assert config.nets_batches
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(1_000)
    first = open_runner(config, spark=spark)
    try:
        seen = _record_times(first)
        first.run(until=_then_one_more(producer, 1_000))
        logged = first.metrics.delivery.last_transaction
        batches = first.metrics.delivery.batches
    finally:
        first.close()  # without a checkpoint: the next start replays every logged transaction
    assert batches < logged, "some batch held several transactions"
    assert seen and all(len(times) == 1 for times in seen), seen
    first_times = {t for times in seen for t in times}
    assert_snapshots(postgres.url, pg_schema, producer.world)

    producer.send(500)
    again = open_runner(config, spark=spark)
    try:
        seen = _record_times(again)
        again.run(until=lambda r: r.lag() == 0)
    finally:
        again.close()
    # The same groups: each netted one reaches the engine at its last transaction, as the first
    # time. Not netted, the replay would show every transaction of them.
    assert {t for times in seen for t in times if t <= logged} == first_times
    fresh = [{t for t in times if t > logged} for times in seen]
    assert any(fresh) and all(len(times) <= 1 for times in fresh), fresh
    assert_snapshots(postgres.url, pg_schema, producer.world)
