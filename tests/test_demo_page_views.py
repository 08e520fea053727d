"""`txstream demo --example page_views` as a new user runs it, smaller: the event-time example
(minutes emitted once, late views kept, sessions, prices as of each view's time, the last hour
of the wall clock) through Kafka, the service and PostgreSQL, every output checked by the demo
against a from-scratch computation (`txstream.service.demo_page_views`); here in a database of
its own on the tests' PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pyspark.sql import SparkSession

from txstream.service.demo import run_demo
from txstream.service.embedded.postgres import PostgresEndpoint


def test_page_views_demo_checks_every_output(postgres: PostgresEndpoint, spark: SparkSession,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    database = f"demo_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')  # type: ignore[arg-type]
    monkeypatch.setenv("DATABASE_URL",
                       make_conninfo(**{**conninfo_to_dict(postgres.url), "dbname": database}))
    said: list[str] = []
    run_demo(events_count=4000, work_dir=tmp_path / "demo", say=said.append,
             example="page_views")
    checked = next(line for line in said if line.startswith("\nchecked:"))
    assert "late_views (" in checked and "late_views (0)" not in checked, checked
    assert "(1 malformed, counted and dead-lettered)" in "".join(said), \
        "the view without its event time is a dead letter"
