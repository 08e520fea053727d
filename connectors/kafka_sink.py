"""Changes of an output table to a Kafka topic, one Kafka transaction per write.

`format="changes"`: one message per change, the JSON object of `connectors.change_json`, keyed
by the JSON object of the primary key columns when the table has a key (so all changes of a key
land in one partition), with `time` and `diff` also in headers. `format="updates"`: one message
per transaction, the Deephaven-style `UpdateRecord`, keyed by the table name, `time` in a header.

Every write is one Kafka transaction, so a `read_committed` consumer sees the stream
transactions of a write all at once or not at all. A failed write is aborted and retried whole.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Literal

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.change_json import encode_rows
from connectors.changes import conform_changes
from connectors.kafka_client import client_settings
from connectors.sink import SinkBase, SinkSchemaError, SinkWriteError
from connectors.update_records import update_records
from schemas.sinks import RetryPolicy
from schemas.tables import TableSchema

log = logging.getLogger(__name__)

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's own rule for topic names
Message = tuple[bytes | None, bytes, list[tuple[str, bytes]]]  # key, value, headers


class KafkaSink(SinkBase):
    """Writes the changes of `table` to `topic` with the transactional id `transactional_id`.

    The transactional id must be stable across restarts of one writer (it fences a zombie
    predecessor) and distinct between concurrent writers.
    """

    def __init__(self, bootstrap_servers: str, topic: str, table: str, schema: TableSchema, *,
                 transactional_id: str, format: Literal["changes", "updates"] = "changes",
                 retry: RetryPolicy | None = None, timeout_s: float = 30.0,
                 producer_config: dict[str, str] | None = None) -> None:
        if not _TOPIC.match(topic):
            raise SinkSchemaError(
                f"{topic!r} is not a valid Kafka topic name: use 1 to 249 characters out of "
                "letters, digits, '.', '_' and '-'"
            )
        self.topic = topic
        self.table = table
        self.schema = schema
        self.format = format
        self._retry = retry or RetryPolicy()
        self._timeout_s = timeout_s
        self._producer = Producer(client_settings(bootstrap_servers, **{
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "linger.ms": 5,
            **(producer_config or {}),
        }))
        try:
            self._producer.init_transactions(timeout_s)
        except KafkaException as exc:
            raise SinkWriteError(
                f"cannot initialise Kafka transactions with {bootstrap_servers}: {exc}. Check "
                "that the brokers are reachable and support transactions"
            ) from exc

    def messages(self, changes: pa.Table) -> list[Message]:
        """The Kafka messages that represent `changes`, in order."""
        batch = conform_changes(changes, self.schema)
        if self.format == "updates":
            return [
                (self.table.encode(), record.model_dump_json().encode(),
                 [("time", str(record.time).encode())])
                for record in update_records(batch, self.table, self.schema)
            ]
        values = encode_rows(batch)
        key_columns = list(self.schema.primary_key)
        keys: list[bytes | None] = (
            list(encode_rows(batch.select(key_columns))) if key_columns
            else [None] * batch.num_rows
        )
        headers = [
            [("time", str(t).encode()), ("diff", str(d).encode())]
            for t, d in zip(batch["time"].to_pylist(), batch["diff"].to_pylist(), strict=True)
        ]
        return list(zip(keys, values, headers, strict=True))

    def write(self, changes: pa.Table) -> None:
        messages = self.messages(changes)
        if not messages:
            return
        delay = self._retry.initial_backoff_s
        for attempt in range(1, self._retry.attempts + 1):
            try:
                self._producer.begin_transaction()
                self.produce(messages)
                self._commit()
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.fatal():
                    raise SinkWriteError(
                        f"the Kafka producer for topic {self.topic!r} failed fatally: "
                        f"{error.str()}. Another producer with the same transactional id may "
                        "have fenced it (use one writer per id); nothing of this write was "
                        "committed. Create a new sink and write the same changes again"
                    ) from exc
                self._abort()
                if attempt == self._retry.attempts:
                    raise SinkWriteError(
                        f"writing {len(messages)} message(s) to Kafka topic {self.topic!r} failed"
                        f" {attempt} times, last: {error.str()}. The transaction was aborted, so"
                        " read_committed consumers see none of it; write the same changes again"
                    ) from exc
                log.warning("Kafka transaction failed (attempt %d), retrying in %.2fs: %s",
                            attempt, delay, error.str())
                time.sleep(delay)
                delay = min(delay * 2, self._retry.max_backoff_s)

    def produce(self, messages: list[Message]) -> None:
        """Produce `messages` into the open Kafka transaction."""
        for key, value, headers in messages:
            while True:
                try:
                    self._producer.produce(self.topic, value, key, headers=headers)
                    break
                except BufferError:
                    # The local queue is full: let deliveries drain it.
                    self._producer.poll(0.1)
            self._producer.poll(0)

    def _commit(self) -> None:
        """Commit the open transaction; an error librdkafka calls retriable (e.g. a timeout)
        leaves the outcome open, so only committing again, never aborting, is safe."""
        delay = self._retry.initial_backoff_s
        for attempt in range(1, self._retry.attempts + 1):
            try:
                self._producer.commit_transaction(self._timeout_s)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == self._retry.attempts:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, self._retry.max_backoff_s)

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaException as exc:
            log.warning("aborting the Kafka transaction failed: %s", exc)

    def close(self) -> None:
        self._producer.flush(self._timeout_s)
