"""The dead-letter topic: bad records go there with their original key, value and headers, plus
`txstream.*` headers saying where they came from and why they were rejected, before the consumer
offsets past them are committed."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer

from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT, KafkaSecurity
from txstream.sources.kafka_source import BadRecord, KafkaSourceError

# Kafka's default limit of a message is about 1 MB (producer `message.max.bytes`, broker and
# topic `max.message.bytes`); a record can be rejected for its size and still be that large.
MAX_DEAD_LETTER_BYTES = 512 * 1024


@dataclass(frozen=True)
class _Letter:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def size(self) -> int:
        return len(self.key or b"") + len(self.value or b"") + sum(
            len(k) + len(v) for k, v in self.headers)

    def within(self, limit: int) -> _Letter:
        """The letter cut to fit in `limit` bytes, the value first, then the record's own
        headers and key; the `txstream.*` headers are kept and say what was cut
        (`txstream.truncated`) and the value's original size (`txstream.value_bytes`)."""
        if self.size() <= limit:
            return self
        value = self.value or b""
        original = dict(self.headers).get("txstream.value_bytes", str(len(value)).encode())
        ours = [(k, v) for k, v in self.headers if k.startswith("txstream.")
                and k not in ("txstream.truncated", "txstream.value_bytes")]
        theirs = [(k, v) for k, v in self.headers if not k.startswith("txstream.")]
        marks = [("txstream.truncated", b"true"), ("txstream.value_bytes", original)]
        cut = _Letter(self.key, value, [*theirs, *ours, *marks])
        if cut.size() - len(value) <= limit:  # the value alone makes room
            return _Letter(self.key, value[:limit - (cut.size() - len(value))], cut.headers)
        key = (self.key or b"")[:max(0, limit - _Letter(None, None, [*ours, *marks]).size())]
        return _Letter(key, b"", [*ours, *marks])


class DeadLetterWriter:
    """Writes bad records to the dead-letter topic: original key, value and headers, plus
    `txstream.*` headers with the source, its coordinates and the error. A value too large for
    the topic is truncated to `max_bytes` in all (headers `txstream.truncated: true` and
    `txstream.value_bytes`: the original size)."""

    def __init__(self, bootstrap_servers: str, topic: str,
                 max_bytes: int = MAX_DEAD_LETTER_BYTES, *,
                 security: KafkaSecurity = PLAINTEXT) -> None:
        self.topic = topic
        self._max_bytes = max_bytes
        self._failed: list[tuple[_Letter, KafkaError]] = []
        self._producer = Producer(client_settings(
            bootstrap_servers, security, **{"enable.idempotence": True, "linger.ms": 20}))

    def _on_delivery(self, letter: _Letter, err: KafkaError | None) -> None:
        if err is not None:
            self._failed.append((letter, err))

    def _produce(self, letter: _Letter) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic, value=letter.value, key=letter.key, headers=letter.headers,
                    on_delivery=lambda err, _msg: self._on_delivery(letter, err),
                )
                break
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.1)
            except KafkaException as exc:
                # Refused before it left (e.g. too large for this producer): kept like a
                # failed delivery, so `flush` raises and sends it again.
                self._failed.append((letter, exc.args[0]))
                break
        self._producer.poll(0)

    def send(self, bad: BadRecord) -> None:
        """Queue one dead letter; never raises: a letter that cannot be delivered is kept and
        makes `flush` fail until it is."""
        headers = [
            *bad.headers,
            ("txstream.error", bad.error.encode()),
            ("txstream.source", bad.source.encode()),
            ("txstream.topic", bad.topic.encode()),
            ("txstream.partition", str(bad.partition).encode()),
            ("txstream.offset", str(bad.offset).encode()),
        ]
        self._produce(_Letter(bad.key, bad.value, headers).within(self._max_bytes))

    def flush(self, timeout: float = 30.0) -> None:
        """Blocks until every dead letter is acknowledged. Raises while any is not, so that the
        consumer offsets past them are not committed; the failed ones are sent again by the next
        call (smaller, when the broker found one too large)."""
        failed, self._failed = self._failed, []
        for letter, err in failed:
            too_large = err.code() == KafkaError.MSG_SIZE_TOO_LARGE
            self._produce(letter.within(letter.size() // 8) if too_large else letter)
        remaining = self._producer.flush(timeout)
        if remaining or self._failed:
            raise KafkaSourceError(
                f"dead-letter topic {self.topic!r}: {remaining} record(s) unacknowledged, "
                f"{len(self._failed)} failed ({', '.join(str(e) for _, e in self._failed[:3])})"
                "; check the topic exists and is writable. They are sent again on the next try"
            )
