"""The example pipeline run in-process: its configuration (`example_config`), a runner in a
background thread (`Background`), and its snapshots checked against a from-scratch computation
(`assert_snapshots`). Its events come from `support.orders.OrderProducer`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.orders import expected_tables, snapshot_tables
from txstream.examples.order_events import OrderWorld
from txstream.examples.orders import OUTPUTS, kafka_sources
from txstream.schemas.config import PipelineConfig, SinkConfig
from txstream.schemas.sources import BatchPolicy
from txstream.service.runner import PipelineRunner


def example_config(bootstrap: str, database_url: str, schema: str, topics: dict[str, str],
                   group: str, checkpoint_dir: Path, **extra: Any) -> PipelineConfig:
    """The example pipeline into PostgreSQL snapshots in `schema`, small batches, fast
    retries, no warm-up (tested by test_engine_warmup and test_end_to_end)."""
    return PipelineConfig(
        pipeline="txstream.examples.orders:pipeline",
        sources=kafka_sources(topics["customers"], topics["orders"]),
        sinks=[SinkConfig.model_validate({"output": o, "db_schema": schema})
               for o in OUTPUTS],
        transactions=BatchPolicy(max_events=100, max_delay_ms=200),
        batch_transactions=5, kafka_bootstrap_servers=bootstrap, consumer_group=group,
        database_url=database_url, checkpoint_dir=str(checkpoint_dir),
        status_interval_s=1.0,
        **{"warm_up_rows": 0, "retry_initial_backoff_s": 0.2, "retry_max_backoff_s": 1.0,
           **extra})


class Background:
    """`runner.run()` in a thread, stopped and joined on exit."""

    def __init__(self, runner: PipelineRunner) -> None:
        self.runner = runner
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.runner.run()
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.request_stop()
        self._thread.join(120)

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.error is None, f"the loop failed: {self.error!r}"
            assert time.monotonic() < deadline, f"timed out waiting for: {what}"
            time.sleep(0.02)

    def problems(self) -> list[str]:
        return self.runner.readiness.problems(self.runner.metrics)

    def drained(self, events: int) -> Callable[[], bool]:
        """`events` read, and every record of the topics in a committed transaction, measured
        now (the lag in the metrics is measured every few seconds: it may predate the events)."""
        ingest = self.runner.metrics.ingest
        return lambda: (ingest.events >= events and not self.problems()
                        and self.runner.lag() == 0)


def assert_snapshots(url: str, schema: str, world: OrderWorld) -> None:
    assert snapshot_tables(url, schema) == expected_tables(world)
