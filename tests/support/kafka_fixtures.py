"""The Kafka fixtures, one pytest plugin (`pytest_plugins` in tests/conftest.py), so that a test
asks for them by name and imports none: the broker (`kafka`), topics of one test alone
(`topic_name`, `topics`, `dlq`), the transaction builders a test made (`builders`, closed after
it) and a Schema Registry (`registry_url`).

`KAFKA_BOOTSTRAP_SERVERS` and `SCHEMA_REGISTRY_URL` point the same tests at real services;
otherwise testcontainers (where Docker answers) or the embedded broker, and the registry double
of `support.schema_registry_double`, are used.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from support.schema_registry_double import running_double
from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.sources.transactions import TransactionBuilder


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaEndpoint]:
    broker = kafka_from_env()
    yield broker
    broker.stop()


@pytest.fixture
def topic_name() -> str:
    """A topic name no other test uses (topics are not deleted between tests)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def topics(kafka: KafkaEndpoint, topic_name: str) -> dict[str, str]:
    """The example pipeline's two topics, of this test alone (orders in two partitions)."""
    names = {"customers": f"{topic_name}-customers", "orders": f"{topic_name}-orders"}
    kafka.create_topic(names["customers"], 1)
    kafka.create_topic(names["orders"], 2)
    return names


@pytest.fixture
def dlq(kafka: KafkaEndpoint) -> str:
    """A dead-letter topic of this test alone."""
    name = f"dlq-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, 1)
    return name


@pytest.fixture
def builders() -> Iterator[list[TransactionBuilder]]:
    """The transaction builders a test appends here are closed after it."""
    made: list[TransactionBuilder] = []
    yield made
    for b in made:
        b.close()


@pytest.fixture(scope="module")
def registry_url() -> Iterator[str]:
    """A Schema Registry's URL: SCHEMA_REGISTRY_URL's, or a test double's, one per module."""
    url = os.environ.get("SCHEMA_REGISTRY_URL")
    if url:
        yield url
        return
    with running_double() as url:
        yield url
