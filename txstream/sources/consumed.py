"""What the Kafka client consumed, as the pure parts take it: the records apart from the
client's end-of-partition reports and errors (`records_and_ends`), and one topic's records as
plain sequences for its decoder (`raw_records`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

from confluent_kafka import KafkaError, Message

from txstream.sources.kafka_source import KafkaSourceError, RawRecords
from txstream.sources.positions import Partition

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class _PerMessage(Sequence[_T]):
    """One field of consumed records, read from the client's record only when asked."""

    def __init__(self, messages: Sequence[Message], read: Callable[[Message], _T]) -> None:
        self._messages, self._read = messages, read

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[_T]:
        return map(self._read, self._messages)

    @overload
    def __getitem__(self, i: int) -> _T: ...

    @overload
    def __getitem__(self, i: slice) -> list[_T]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._read(m) for m in self._messages[i]]
        return self._read(self._messages[i])


def raw_records(messages: Sequence[Message], topic: str | None = None,
                partitions: Sequence[int] | None = None, offsets: Sequence[int] | None = None
                ) -> RawRecords:
    """Consumed records of one topic (`topic`, or the first record's) as the decoder takes
    them: values read now, the other fields (partitions and offsets unless given) only when
    the decoder asks for them."""
    n = len(messages)
    return RawRecords(
        topic=topic if topic is not None else (messages[0].topic() if n else ""),
        partitions=partitions if partitions is not None else _PerMessage(messages,
                                                                         Message.partition),
        offsets=offsets if offsets is not None else _PerMessage(messages, Message.offset),
        values=list(map(Message.value, messages)),
        keys=_PerMessage(messages, Message.key),
        headers=_PerMessage(messages, Message.headers),
        timestamps=_PerMessage(messages, Message.timestamp),
    )


def records_and_ends(messages: Sequence[Message]) -> tuple[list[Message], dict[Partition, int]]:
    """The records among consumed `messages`, and for each partition whose end was reported,
    how many records came before its last report (see `positions.advance`). Client errors are
    logged (the client retries them) or raised (fatal)."""
    records: list[Message] = []
    ends: dict[Partition, int] = {}
    start = 0
    for i, message in enumerate(messages):
        error = message.error()
        if error is None:
            continue
        records += messages[start:i]
        start = i + 1
        if error.code() == KafkaError._PARTITION_EOF:
            ends[(message.topic(), message.partition())] = len(records)
        elif error.fatal():
            raise KafkaSourceError(f"fatal Kafka error: {error}")
        else:
            log.warning("Kafka consumer error (retried by the client): %s", error)
    records += messages[start:]
    return records, ends
