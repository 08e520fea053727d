"""The Kafka monitor: lag per partition and end-to-end latency, measured off the service's
threads with consumers of its own, so a slow or unreachable broker never stalls the service
through it."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.sources.transaction_batch import Offsets, Ranges

log = logging.getLogger(__name__)


class MonitorReports(Protocol):
    """Where the monitor's measurements go (the service's metrics and readiness)."""

    def lag(self, by_partition: dict[tuple[str, int], int]) -> None: ...

    def latency(self, seconds: float) -> None: ...

    def reachable(self, problem: str | None) -> None:
        """None: the broker answered; else why it did not."""
        ...


class KafkaMonitor:
    """A thread that measures the lag per partition (high watermark minus the committed
    position) and the end-to-end latency of committed batches (commit time minus the Kafka
    timestamp of the first and last record per partition), off the service's threads, with its
    own consumers: a slow or unreachable broker never stalls the service through it."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], reports: MonitorReports,
                 interval_s: float, security: KafkaSecurity = PLAINTEXT) -> None:
        settings = client_settings(bootstrap, security, **{"group.id": f"{group}-monitor",
                                                           "enable.auto.commit": False,
                                                           "socket.timeout.ms": 5000})
        # Two consumers: a latency probe waiting on a fetch never delays a lag measurement.
        self._consumer = Consumer(settings)
        self._probe = Consumer(settings)
        self._lock = threading.Lock()  # callers of `measure_lag` and the thread share _consumer
        self._topics = topics
        self._reports = reports
        self._interval = interval_s
        self.positions: Offsets = {}  # replaced (never mutated) by the service
        self._latency: queue.Queue[tuple[Ranges, float]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-monitor", daemon=True)

    def start(self) -> KafkaMonitor:
        self._thread.start()
        return self

    def committed(self, ranges: Ranges, commit_time: float) -> None:
        """A batch with these offset ranges was committed at `commit_time` (epoch seconds).
        Sampled: dropped while the previous one is still being measured."""
        with contextlib.suppress(queue.Full):
            self._latency.put_nowait((ranges, commit_time))

    def measure_lag(self) -> int:
        """Measure now; the total lag. Raises KafkaException when the broker does not answer."""
        with self._lock:
            lags: dict[tuple[str, int], int] = {}
            topics = self._consumer.list_topics(timeout=5).topics
            for topic in self._topics:
                meta = topics.get(topic)
                for partition in sorted(meta.partitions if meta else {}):
                    _, high = self._consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=5, cached=False)
                    done = self.positions.get(topic, {}).get(partition, 0)
                    lags[(topic, partition)] = max(0, high - done)
        self._reports.lag(lags)
        return sum(lags.values())

    def _measure_latency(self, ranges: Ranges, commit_time: float) -> None:
        for index in (0, 1):  # the first, then the last record of each range
            tps = [TopicPartition(t, p, span[0] if index == 0 else span[1] - 1)
                   for t, parts in ranges.items() for p, span in parts.items()]
            if not tps:
                return
            self._probe.assign(tps)
            wanted = {(tp.topic, tp.partition): tp.offset for tp in tps}
            deadline = time.monotonic() + 5
            while wanted and time.monotonic() < deadline and not self._stop.is_set():
                for m in self._probe.consume(len(wanted), timeout=0.5):
                    tp = (m.topic(), m.partition())
                    if m.error() is None and wanted.get(tp) == m.offset():
                        del wanted[tp]
                        kind, stamp_ms = m.timestamp()
                        if kind != 0 and stamp_ms > 0:  # 0: TIMESTAMP_NOT_AVAILABLE
                            self._reports.latency(max(0.0, commit_time - stamp_ms / 1000))
        self._probe.unassign()

    def _run(self) -> None:
        next_lag = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_lag:
                try:
                    self.measure_lag()
                    self._reports.reachable(None)
                except KafkaException as exc:
                    self._reports.reachable(str(exc.args[0] if exc.args else exc))
                next_lag = time.monotonic() + self._interval
            try:
                ranges, commit_time = self._latency.get(timeout=self._interval / 4)
            except queue.Empty:
                continue
            try:
                self._measure_latency(ranges, commit_time)
            except KafkaException as exc:
                log.debug("latency probe failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._consumer.close()
        self._probe.close()
