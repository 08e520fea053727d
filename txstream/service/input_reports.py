"""The input monitor's measurements (`txstream.sources.kafka_monitor`: lag, end-to-end
latency, whether the broker answers) into the service's metrics and readiness."""

from __future__ import annotations

from txstream.service.health import Readiness
from txstream.service.metrics import SourceMetrics


class InputReports:
    """The input monitor's measurements, into the source's metrics and readiness."""

    def __init__(self, metrics: SourceMetrics, readiness: Readiness, dependency: str) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._dependency = dependency

    def lag(self, by_partition: dict[tuple[str, int], int]) -> None:
        self._metrics.measured(by_partition)

    def latency(self, seconds: float) -> None:
        self._metrics.end_to_end_seconds.observe(seconds)

    def reachable(self, problem: str | None) -> None:
        if problem is None:
            self._readiness.ok(self._dependency, observer="monitor")
        else:
            self._readiness.fail(self._dependency, problem, observer="monitor")
