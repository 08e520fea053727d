"""The PostgreSQL live snapshot of a change topic (the `changes` format of `KafkaSink`).

The topic may be written by several producers and is read across partitions in no particular
time order; the snapshot sink's time guard makes the result independent of that order, and of
records delivered twice. Offsets are committed only after the batch is in PostgreSQL, so a crash
redelivers (harmlessly) rather than loses changes.
"""

from __future__ import annotations

import threading

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from txstream.changes import Changes, order
from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.sinks.change_json import ChangeDecodeError, decode_changes
from txstream.sinks.postgres.snapshot import PostgresSnapshotSink
from txstream.sinks.sink import Closing, SinkDataError


class ChangeTopicSnapshot(Closing):
    """Consumes `topic` as consumer group `group_id` into `sink`."""

    def __init__(self, bootstrap_servers: str, topic: str, group_id: str,
                 sink: PostgresSnapshotSink, *, batch_size: int = 10_000,
                 consumer_config: dict[str, str] | None = None,
                 security: KafkaSecurity = PLAINTEXT) -> None:
        self.topic = topic
        self.sink = sink
        self._batch_size = batch_size
        self._consumer = Consumer(client_settings(bootstrap_servers, security, **{
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(consumer_config or {}),
        }))
        self._consumer.subscribe([topic])

    def poll(self, timeout_s: float = 1.0) -> int:
        """Apply the next batch of changes (up to `batch_size`, waiting up to `timeout_s`) and
        commit its offsets; the number of changes applied."""
        messages = self._consumer.consume(self._batch_size, timeout_s)
        records = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            records.append(message)
        if records:
            try:
                changes = decode_changes([self._payload(m) for m in records], self.sink.schema)
            except ChangeDecodeError as exc:
                where = (_where(records[exc.index]) if exc.index is not None
                         else f"{self.topic} ({_where(records[0])} to {_where(records[-1])})")
                raise ChangeDecodeError(f"{where}: {exc}", exc.index) from exc
            # Ordered, but a change delivered twice stays twice: it is not consolidated, and the
            # snapshot's time guard applies it once (a sum would double its weight).
            self.sink.write(Changes(order(changes)))
        if messages:
            self._consumer.commit(asynchronous=False)
        return len(records)

    @staticmethod
    def _payload(message: Message) -> bytes:
        value = message.value()
        if value is None:
            raise SinkDataError(
                f"{_where(message)} has no value; a change topic holds one JSON change per message"
            )
        return value

    def run(self, stop: threading.Event, timeout_s: float = 1.0) -> None:
        """Poll until `stop` is set."""
        while not stop.is_set():
            self.poll(timeout_s)

    def close(self) -> None:
        self._consumer.close()


def _where(message: Message) -> str:
    return f"{message.topic()}[{message.partition()}]@{message.offset()}"
