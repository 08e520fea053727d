"""The last stream transaction a Kafka topic holds, read back from the end of each partition.

Every message a Kafka sink writes carries its transaction in the `time` header, and a sink
writes transactions in order, so the greatest `time` near the end of each partition is the
topic's last transaction. Reading is `read_committed`: the records of an aborted or still open
Kafka transaction are not the topic's. Only a window at the end of each partition is read, made
larger only while it holds no record (commit markers and aborted records take offsets too).
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from txstream.changes import TIME
from txstream.kafka_client import client_settings
from txstream.schemas.kafka import KafkaSecurity
from txstream.sinks.sink import SinkWriteError

_WINDOW = 64  # offsets read first at the end of a partition


def last_transaction(bootstrap_servers: str, security: KafkaSecurity, topic: str,
                     timeout_s: float) -> int | None:
    """The greatest `time` header among `topic`'s committed records (None: no record, or no
    topic yet). SinkWriteError when the brokers do not answer within `timeout_s`."""
    consumer = Consumer(client_settings(bootstrap_servers, security, **{
        "group.id": f"txstream-readback-{uuid.uuid4().hex}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True}))
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or (metadata.error is not None and metadata.error.code()
                                == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None  # no topic yet: it holds nothing
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        found = [_partition_last(consumer, topic, p, timeout_s) for p in metadata.partitions]
        return max((t for t in found if t is not None), default=None)
    except KafkaException as exc:
        raise SinkWriteError(f"cannot read back Kafka topic {topic!r}: {exc}. Check that the "
                             "brokers are reachable") from exc
    finally:
        consumer.close()


def _partition_last(consumer: Consumer, topic: str, partition: int, timeout_s: float
                    ) -> int | None:
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                               timeout=timeout_s)
    window = _WINDOW
    while high > low:
        start = max(low, high - window)
        found = _greatest_time(consumer, TopicPartition(topic, partition, start), timeout_s)
        if found is not None or start == low:
            return found
        window *= 8
    return None


def _greatest_time(consumer: Consumer, start: TopicPartition, timeout_s: float) -> int | None:
    """The greatest `time` header from `start` to the partition's end (its last stable offset:
    the consumer is read_committed)."""
    consumer.assign([start])
    greatest: int | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=0.5):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return greatest
                raise KafkaException(error)
            stamp = dict(message.headers() or ()).get(TIME)
            if stamp is not None:
                value = int(stamp)
                greatest = value if greatest is None else max(greatest, value)
    raise SinkWriteError(f"reading back {start.topic}[{start.partition}] from offset "
                         f"{start.offset} did not reach its end within {timeout_s}s")
