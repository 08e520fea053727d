"""Session-scoped real parts: one PostgreSQL, one Kafka-protocol broker, one SparkSession (per
pytest worker: `make test` runs two, see the Makefile). The Kafka fixtures come from the plugin
`support.kafka_fixtures`.

`DATABASE_URL`, `KAFKA_BOOTSTRAP_SERVERS` and `SPARK_MASTER` point the same tests at real
services; otherwise testcontainers (where Docker answers) or the embedded defaults are used.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from txstream.service.embedded.postgres import PostgresEndpoint, postgres_from_env

pytest_plugins = ["support.kafka_fixtures"]


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
