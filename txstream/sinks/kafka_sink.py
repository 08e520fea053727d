"""Changes of an output table to a Kafka topic, one Kafka transaction per write.

`format="changes"`: one message per change, the JSON object of `txstream.sinks.change_json`, keyed
by the JSON object of the primary key columns when the table has a key (so all changes of a key
land in one partition), with `time` and `diff` also in headers. `format="updates"`: one message
per transaction, the Deephaven-style `UpdateRecord`, keyed by the table name, `time` in a header.

Every write is one Kafka transaction, so a `read_committed` consumer sees the stream
transactions of a write all at once or not at all. A failed write is aborted and retried whole.
Exactly once: before its first write, and after a failed attempt (whose commit may have gone
through), the sink reads back the last transaction its topic holds (`txstream.sinks.kafka_readback`)
and skips the changes up to it, so a replay after a crash adds nothing twice.

A producer that failed fatally (librdkafka's `fatal()` errors: fenced, a transactional state
the broker refuses, an authorization lost) can never be used again. The sink drops it and opens
a new one with the same transactional id before the next attempt, which aborts whatever the old
one left open. What cannot be mended that way raises `KafkaSinkFatalError`, which the service
does not retry (it stops with the message): a fatal error initialising the first producer (a
transactional id the broker does not authorise) and every attempt of a write failing fatally.

A fenced producer is reopened only while this instance is still the pipeline's writer: the
sink asks `writer_check` first (the service's writer epoch), which raises a `FencedError` when
another instance of the pipeline took over, whose new producer is what fenced this one.
Reopening then would fence the new writer in turn and commit this batch after the takeover.
A second fence (`KafkaSinkFencedError`, a `FencedError` too) means another live producer uses
the same transactional id: reopened, each would keep fencing the other. Either way the service
goes the way of any fenced instance: it stops consuming and waits, not ready (`fenced`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Literal

from confluent_kafka import KafkaError, KafkaException, Producer

from txstream.changes import DIFF, TIME, Changes
from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.schemas.sinks import RetryPolicy
from txstream.schemas.tables import TableSchema
from txstream.sinks.change_json import encode_rows
from txstream.sinks.conform import conform_changes
from txstream.sinks.kafka_readback import last_transaction
from txstream.sinks.sink import (
    FencedError,
    SinkBase,
    SinkError,
    SinkSchemaError,
    SinkWriteError,
)
from txstream.sinks.update_records import update_records

log = logging.getLogger(__name__)

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's own rule for topic names
# What librdkafka reports when the coordinator gave the transactional id to a newer producer.
_FENCING = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                     KafkaError.INVALID_PRODUCER_EPOCH})
Message = tuple[bytes | None, bytes, list[tuple[str, bytes]]]  # key, value, headers


class KafkaSinkFatalError(SinkError):
    """The sink's producer failed fatally in a way reopening does not mend: retrying cannot
    help, so the service stops (unlike `SinkWriteError`, which it retries)."""


class KafkaSinkFencedError(KafkaSinkFatalError, FencedError):
    """The sink was fenced a second time: another live producer uses its transactional id."""


class KafkaSink(SinkBase):
    """Writes the changes of `table` to `topic` with the transactional id `transactional_id`.

    The transactional id must be stable across restarts of one writer (it fences a zombie
    predecessor) and distinct between concurrent writers.
    """

    def __init__(self, bootstrap_servers: str, topic: str, table: str, schema: TableSchema, *,
                 transactional_id: str, format: Literal["changes", "updates"] = "changes",
                 retry: RetryPolicy | None = None, timeout_s: float = 30.0,
                 producer_config: dict[str, str] | None = None,
                 security: KafkaSecurity = PLAINTEXT, skip_replays: bool = True,
                 writer_check: Callable[[], None] | None = None) -> None:
        """`skip_replays=False`: every write is appended, for a writer that does not write
        transactions in order or shares its topic (no exactly once then). `writer_check`:
        raises a `FencedError` once this instance is no longer the pipeline's writer; asked
        before a fenced producer is reopened (None: no writer epoch, reopen once)."""
        if not _TOPIC.match(topic):
            raise SinkSchemaError(
                f"{topic!r} is not a valid Kafka topic name: use 1 to 249 characters out of "
                "letters, digits, '.', '_' and '-'"
            )
        self.topic = topic
        self.table = table
        self.schema = schema
        self.format = format
        self.transactional_id = transactional_id
        self._retry = retry or RetryPolicy()
        self._timeout_s = timeout_s
        self._settings = client_settings(bootstrap_servers, security, **{
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "linger.ms": 5,
            **(producer_config or {}),
        })
        # One fence is taken for an accident (a transaction the coordinator timed out, a
        # predecessor's late start): the sink reopens. A second one is another live writer.
        self._fenced = False
        self._writer_check = writer_check
        self._bootstrap = bootstrap_servers
        self._security = security
        # The last transaction the topic holds, read back (after init_transactions has aborted
        # a predecessor's open transaction) before the first write and after a failed one.
        self._held: int | None = None
        self._unsure = skip_replays
        self._skip_replays = skip_replays
        try:
            self._producer: Producer | None = self._open()
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise KafkaSinkFatalError(
                    f"cannot initialise Kafka transactions with {bootstrap_servers}: "
                    f"{exc.args[0].str()}. Retrying cannot help: check the ACLs of "
                    f"transactional id {transactional_id!r}, the broker's log and "
                    "producer_config"
                ) from exc
            raise SinkWriteError(
                f"cannot initialise Kafka transactions with {bootstrap_servers}: {exc}. Check "
                "that the brokers are reachable and support transactions"
            ) from exc

    def messages(self, changes: Changes) -> list[Message]:
        """The Kafka messages that represent `changes`, in order."""
        if self.format == "updates":
            return [
                (self.table.encode(), record.model_dump_json().encode(),
                 [(TIME, str(record.time).encode())])
                for record in update_records(changes, self.table, self.schema)
            ]
        batch = conform_changes(changes, self.schema).table
        values = encode_rows(batch)
        key_columns = list(self.schema.primary_key)
        keys: list[bytes | None] = (
            list(encode_rows(batch.select(key_columns))) if key_columns
            else [None] * batch.num_rows
        )
        headers = [
            [(TIME, str(t).encode()), (DIFF, str(d).encode())]
            for t, d in zip(batch[TIME].to_pylist(), batch[DIFF].to_pylist(), strict=True)
        ]
        return list(zip(keys, values, headers, strict=True))

    def write(self, changes: Changes) -> None:
        """Write `changes` as one Kafka transaction, retried whole (on a new producer after a
        fatal failure). SinkWriteError when every attempt failed and one of them transiently;
        KafkaSinkFatalError when every attempt failed fatally; a FencedError when fenced by
        the pipeline's new writer (`writer_check`) or fenced twice."""
        batch = conform_changes(changes, self.schema)
        delay = self._retry.initial_backoff_s
        all_fatal = True
        for attempt in range(1, self._retry.attempts + 1):
            try:
                # The producer first: its init_transactions completes or aborts whatever a
                # predecessor left open, which the read-back must see settled.
                producer = self._live()
                self.held_through()
                new = batch.after(self._held)
                messages = self.messages(new)
                if not messages:
                    return  # a replay of transactions the topic holds
                producer.begin_transaction()
                self.produce(messages)
                self._commit()
                if self._skip_replays:
                    self._held = new.last_time()
                return
            except KafkaException as exc:
                # Whether a failed commit went through is unknown: read back before retrying.
                self._unsure = self._skip_replays
                error: KafkaError = exc.args[0]
                all_fatal = all_fatal and error.fatal()
                if error.fatal():
                    self._drop()
                    if error.code() in _FENCING:
                        self._may_reopen_after(error)
                else:
                    self._abort()
                if attempt == self._retry.attempts:
                    raise self._gave_up(batch.num_rows, attempt, error, all_fatal) from exc
                log.warning("Kafka transaction failed (attempt %d), retrying in %.2fs: %s",
                            attempt, delay, error.str())
                time.sleep(delay)
                delay = min(delay * 2, self._retry.max_backoff_s)

    def held_through(self) -> int | None:
        if self._unsure:
            self._held = last_transaction(self._bootstrap, self._security, self.topic,
                                          self._timeout_s)
            self._unsure = False
        return self._held

    def produce(self, messages: list[Message]) -> None:
        """Produce `messages` into the open Kafka transaction."""
        producer = self._live()
        for key, value, headers in messages:
            while True:
                try:
                    producer.produce(self.topic, value, key, headers=headers)
                    break
                except BufferError:
                    # The local queue is full: let deliveries drain it.
                    producer.poll(0.1)
            producer.poll(0)

    def _open(self) -> Producer:
        """A new producer with its transactions initialised, which fences any other producer
        of the transactional id and aborts the transaction it left open."""
        producer = Producer(self._settings)
        try:
            producer.init_transactions(self._timeout_s)
        except KafkaException:
            _discard(producer)
            raise
        return producer

    def _live(self) -> Producer:
        """The producer, a new one if the last failed fatally (KafkaException if it cannot be
        opened)."""
        if self._producer is None:
            self._producer = self._open()
        return self._producer

    def _drop(self) -> None:
        """Forget the producer that failed fatally: the next attempt opens a new one."""
        if self._producer is not None:
            _discard(self._producer)
            self._producer = None

    def _commit(self) -> None:
        """Commit the open transaction; an error librdkafka calls retriable (e.g. a timeout)
        leaves the outcome open, so only committing again, never aborting, is safe."""
        delay = self._retry.initial_backoff_s
        for attempt in range(1, self._retry.attempts + 1):
            try:
                self._live().commit_transaction(self._timeout_s)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == self._retry.attempts:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, self._retry.max_backoff_s)

    def _abort(self) -> None:
        if self._producer is None:  # the failure was opening a new one: nothing is open
            return
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaException as exc:
            log.warning("aborting the Kafka transaction failed: %s", exc)

    def _may_reopen_after(self, error: KafkaError) -> None:
        """The producer was fenced: return if a new one may be opened, else raise the
        FencedError that says why not (see the module's doc)."""
        if self._writer_check is not None:
            self._writer_check()
        if self._fenced:
            raise KafkaSinkFencedError(
                f"the Kafka sink of {self.table!r} (topic {self.topic!r}) was fenced again "
                f"after reopening its producer: {error.str()}. Another live producer uses the "
                f"transactional id {self.transactional_id!r}, and each would keep fencing the "
                "other. Nothing of this write was committed, and this instance writes nothing "
                "more: it stops consuming and waits. Give every writer its own "
                "transactional_id (two txstream processes with one configuration share it: "
                "stop the other one). If no other writer exists, the broker timed out a "
                "transaction: raise transaction.timeout.ms in producer_config")
        self._fenced = True
        log.warning("the Kafka producer of topic %r was fenced (%s): reopening it with "
                    "transactional id %r", self.topic, error.str(), self.transactional_id)

    def _gave_up(self, count: int, attempts: int, error: KafkaError, all_fatal: bool
                 ) -> SinkError:
        if all_fatal:
            return KafkaSinkFatalError(
                f"the Kafka producer of topic {self.topic!r} failed fatally {attempts} time(s) "
                f"in a row, reopened after each failure, last: {error.str()}. Reopening does "
                "not help: check the broker's log, the ACLs of transactional id "
                f"{self.transactional_id!r} and topic {self.topic!r}, and producer_config. "
                "Nothing of this write was committed (the service replays it at its next start)"
            )
        return SinkWriteError(
            f"writing {count} change(s) to Kafka topic {self.topic!r} failed {attempts} times, "
            f"last: {error.str()}. The transaction was aborted, so read_committed consumers see "
            "none of it; write the same changes again"
        )

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self._timeout_s)


def _discard(producer: Producer) -> None:
    """Let go of a producer that failed: its queued messages are purged, so destroying it
    (when its last reference goes) does not wait for deliveries that cannot happen. Not
    `close()`, which would try to abort the failed transaction again and complain."""
    producer.purge()
