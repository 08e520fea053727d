"""The PostgreSQL outputs of a pipeline committed together with its progress row, against the
real PostgreSQL fixture."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.pg_proxy import CommitCutter
from support.postgres_outputs import LOG, batch, mark, outputs, query

from txstream.schemas.sinks import RetryPolicy
from txstream.service.embedded.postgres import PostgresEndpoint
from txstream.sinks.postgres.append import PostgresAppendSink
from txstream.sinks.postgres.outputs import PostgresOutputs
from txstream.sinks.sink import SinkWriteError


def test_a_batch_is_one_postgresql_transaction_across_tables_with_its_progress(
        postgres: PostgresEndpoint, pg_schema: str) -> None:
    group, *sinks = outputs(postgres.url, pg_schema)
    try:
        group.write(batch(1, 3), [mark(1, ("tx-a",)), mark(2), mark(3, ("tx-b",))])
        [row] = query(postgres.url, 'SELECT pipeline, definition, "transaction", upstream_ids,'
                      " offsets FROM {}", pg_schema, "txstream_progress")
        assert row == ("p", "txstream.examples.orders:pipeline", 3, ["tx-a", "tx-b"],
                       {"orders": {"0": 30, "1": 15}})
        assert group.committed() == 3
        # All or nothing: a table that fails takes the others and the progress row with it.
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER TABLE {} RENAME TO gone").format(
                sql.Identifier(pg_schema, "log")))
        with pytest.raises(SinkWriteError):
            group.write(batch(4, 4), [mark(4)])
        assert query(postgres.url, 'SELECT v, "time" FROM {}', pg_schema, "totals") == [(3, 3)]
        assert group.committed() == 3
    finally:
        group.close()
        for sink in sinks:
            sink.close()


def test_a_reader_sees_every_table_at_the_same_transaction(postgres: PostgresEndpoint,
                                                            pg_schema: str) -> None:
    group, *sinks = outputs(postgres.url, pg_schema)
    seen: list[tuple[Any, ...]] = []
    done = threading.Event()

    def read() -> None:
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            statement = sql.SQL(  # one statement, one snapshot
                'SELECT (SELECT "transaction" FROM {0} WHERE pipeline = %s),'
                ' (SELECT max("time") FROM {1}), (SELECT "time" FROM {2} WHERE id = 1)').format(
                    *[sql.Identifier(pg_schema, t) for t in ("txstream_progress", "log",
                                                              "totals")])
            while not done.is_set():
                seen.append(conn.execute(statement, ["p"]).fetchone() or ())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(1, 41):
            group.write(batch(n, n), [mark(n)])
    finally:
        done.set()
        reader.join()
        group.close()
        for sink in sinks:
            sink.close()
    written = [row for row in seen if row[0] is not None]
    assert written and all(len(set(row)) == 1 for row in written), \
        [row for row in written if len(set(row)) > 1][:3]


def test_replays_and_lost_commits_write_nothing_twice(postgres: PostgresEndpoint,
                                                      pg_schema: str) -> None:
    group, *sinks = outputs(postgres.url, pg_schema)
    group.write(batch(1, 2), [mark(1), mark(2)])
    group.write(batch(1, 2), [mark(1), mark(2)])  # a replay after a crash
    group.write(batch(2, 4), [mark(2), mark(3), mark(4)])  # one partly replayed
    group.close()
    with CommitCutter(postgres.url) as proxy:
        lossy = PostgresOutputs(proxy.url, {"totals": [sinks[0]], "log": [sinks[1]]},
                                pipeline="p", definition="d", db_schema=pg_schema,
                                retry=RetryPolicy(attempts=1))
        proxy.cut_next_commit()
        with pytest.raises(SinkWriteError):
            lossy.write(batch(5, 5), [mark(5)])  # committed, but the writer cannot know
        lossy.write(batch(5, 6), [mark(5), mark(6)])  # the runner writes the batch again
        lossy.close()
    for sink in sinks:
        sink.close()
    assert query(postgres.url, 'SELECT id, "time" FROM {} ORDER BY id', pg_schema, "log") == [
        (n, n) for n in range(1, 7)]
    assert query(postgres.url, 'SELECT id, v, "time" FROM {}', pg_schema, "totals") == [(1, 6, 6)]


def test_other_pipelines_rows_are_never_touched(postgres: PostgresEndpoint,
                                                pg_schema: str) -> None:
    group, *sinks = outputs(postgres.url, pg_schema)
    other, *others = outputs(postgres.url, pg_schema, pipeline="other")
    group.write(batch(1, 3), [mark(1), mark(2), mark(3)])
    other.write({}, [mark(1)])
    assert other.committed() == 1 and group.committed() == 3
    for g in (group, other):
        g.close()
    for sink in [*sinks, *others]:
        sink.close()
    rows = query(postgres.url, 'SELECT pipeline, "transaction" FROM {} ORDER BY 1', pg_schema,
                 "txstream_progress")
    assert rows == [("other", 1), ("p", 3)]


def test_one_postgresql_transaction_per_stream_transaction_on_request(
        postgres: PostgresEndpoint, pg_schema: str) -> None:
    group, *sinks = outputs(postgres.url, pg_schema, commit="transaction")
    group.write(batch(1, 3), [mark(1), mark(2), mark(3)])
    group.close()
    for sink in sinks:
        sink.close()
    # Rows one PostgreSQL transaction writes share an id (that of its savepoint for the table).
    writers = query(postgres.url, 'SELECT "time", xmin::text FROM {}', pg_schema, "log")
    assert len({x for _, x in writers}) == 3
    [(offsets,)] = query(postgres.url, "SELECT offsets FROM {}", pg_schema, "txstream_progress")
    assert json.dumps(offsets, sort_keys=True) == '{"orders": {"0": 30, "1": 15}}'


def test_without_a_progress_row_an_append_table_says_what_it_holds(
        postgres: PostgresEndpoint, pg_schema: str) -> None:
    # Tables an earlier release wrote, without a progress row: a replay must not append again.
    with PostgresAppendSink(postgres.url, "log", LOG, db_schema=pg_schema) as early:
        early.write(batch(1, 2)["log"])
    group, *sinks = outputs(postgres.url, pg_schema)
    group.write(batch(1, 3), [mark(1), mark(2), mark(3)])
    group.close()
    for sink in sinks:
        sink.close()
    assert query(postgres.url, 'SELECT id FROM {} ORDER BY id', pg_schema, "log") == [
        (1,), (2,), (3,)]
