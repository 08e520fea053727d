"""The pipeline's input from Kafka, as the service's stages see it: closed transactions in,
offsets committed after delivery, the source state for checkpoints, the lag.

It joins the transaction builder (poll, decode, dead letters, boundaries) and the monitor (lag,
end-to-end latency, off the service's threads). Every failure of the broker reaches the caller
as a KafkaSourceError, which the service retries; the service itself imports no Kafka client.
Not thread-safe: one thread at a time (the service's ingest stage runs the others' calls).
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaException

from txstream.schemas.config import PipelineConfig
from txstream.sources.kafka_monitor import KafkaMonitor, MonitorReports
from txstream.sources.kafka_source import KafkaSourceError
from txstream.sources.source_state import IngestStats, SourceState
from txstream.sources.transaction_batch import TransactionBatch, TransactionLogEntry
from txstream.sources.transactions import TransactionBuilder


class KafkaInput:
    name = "kafka"  # the dependency, as readiness and logs name it

    def __init__(self, config: PipelineConfig, state: SourceState,
                 replay: Sequence[TransactionLogEntry], reports: MonitorReports, *,
                 wall_clock: bool = False) -> None:
        """Resume after `state`, re-forming the `replay` transactions first (see
        `TransactionBuilder.restore`); `wall_clock`: the pipeline calls now()."""
        assert config.kafka_bootstrap_servers is not None
        try:
            self._builder = TransactionBuilder(
                config.kafka_bootstrap_servers, config.sources,
                group_id=config.consumer_group, policy=config.transactions,
                dead_letter_topic=config.dead_letter_topic, security=config.kafka_security,
                wall_clock=wall_clock)
        except KafkaException as exc:
            raise KafkaSourceError(f"cannot connect to Kafka: {exc}") from exc
        try:
            self._builder.restore(state, replay)
        except BaseException as exc:
            self._builder.close()
            if isinstance(exc, KafkaException):
                raise KafkaSourceError(f"cannot resume from Kafka: {exc}") from exc
            raise
        self._monitor = KafkaMonitor(
            config.kafka_bootstrap_servers, config.consumer_group,
            [s.topic for s in config.sources], reports,
            interval_s=min(2.0, config.status_interval_s), security=config.kafka_security)
        self._monitor.positions = state.offsets
        self._monitor.start()

    def poll(self, timeout: float) -> TransactionBatch | None:
        """The transactions closed within `timeout` seconds of consuming, as one batch (None:
        none closed)."""
        return self._builder.poll(timeout)

    @property
    def stats(self) -> IngestStats:
        return self._builder.stats

    def commit(self, batch: TransactionBatch, commit_time: float, with_state: bool
               ) -> SourceState | None:
        """Every sink committed `batch` at `commit_time` (epoch seconds): commit its offsets;
        with `with_state`, also return the source state as of its last transaction, taken in
        the same call so that no later commit slips in between."""
        self._builder.commit(batch.last)
        self._monitor.positions = batch.offsets
        self._monitor.committed(batch.ranges, commit_time)
        return self._builder.state() if with_state else None

    def state(self) -> SourceState:
        """The source state as of the last committed transaction (see
        `TransactionBuilder.state`)."""
        return self._builder.state()

    def read_to_end(self) -> bool:
        """Whether every assigned partition is read to its end and every record read is in a
        closed transaction (see `TransactionBuilder.read_to_end`); False before any partition
        is assigned."""
        return self._builder.read_to_end()

    def waiting_records(self) -> int:
        """Records of the sources not read yet, as of the consumer's latest fetches (see
        `TransactionBuilder.waiting_records`): no call to the broker."""
        return self._builder.waiting_records()

    def lag(self) -> int:
        """Records in the source topics not yet in a committed transaction (measured now)."""
        try:
            return self._monitor.measure_lag()
        except KafkaException as exc:
            raise KafkaSourceError(f"cannot measure the lag: {exc}") from exc

    def close(self) -> None:
        self._monitor.close()
        self._builder.close()
