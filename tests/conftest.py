"""Session-scoped real parts: one PostgreSQL, one Kafka-protocol broker, one SparkSession (per
pytest worker: `make test` runs two, see the Makefile).

`DATABASE_URL`, `KAFKA_BOOTSTRAP_SERVERS` and `SPARK_MASTER` point the same tests at real
services; otherwise testcontainers (where Docker answers) or the embedded defaults are used.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from txstream.service.embedded.kafka import KafkaEndpoint, kafka_from_env
from txstream.service.embedded.postgres import PostgresEndpoint, postgres_from_env


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="run many more random seeds")


@pytest.fixture(scope="session")
def long_run(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--long"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresEndpoint]:
    pg = postgres_from_env()
    yield pg
    pg.stop()


@pytest.fixture
def pg_schema(postgres: PostgresEndpoint) -> Iterator[str]:
    """A fresh PostgreSQL schema for one test; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaEndpoint]:
    broker = kafka_from_env()
    yield broker
    broker.stop()


@pytest.fixture
def topic_name() -> str:
    """A topic name no other test uses (topics are not deleted between tests)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from txstream.engine import codegen
    from txstream.service.spark import get_spark

    session = get_spark()
    # Generated code from the first batch on, whichever test runs first in a worker: a failure
    # of one evaluation mode must not depend on the order of the tests (test_engine_cost checks
    # the rule for a cold JVM's first batch).
    codegen.compile_now(session)
    yield session
    session.stop()


@pytest.fixture
def topics(kafka: KafkaEndpoint, topic_name: str) -> dict[str, str]:
    """The example pipeline's two topics, of this test alone (orders in two partitions)."""
    names = {"customers": f"{topic_name}-customers", "orders": f"{topic_name}-orders"}
    kafka.create_topic(names["customers"], 1)
    kafka.create_topic(names["orders"], 2)
    return names
