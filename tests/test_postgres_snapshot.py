"""The live-snapshot sink against the real PostgreSQL fixture."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from txstream.changes import DIFF, TIME, Changes
from txstream.schemas.config import SinkConfig
from txstream.schemas.sinks import PostgresSnapshotSettings, RetryPolicy, TombstonePurge
from txstream.schemas.tables import TableSchema
from txstream.service.embedded.postgres import PostgresEndpoint
from txstream.sinks.postgres import common as postgres_common
from txstream.sinks.postgres.snapshot import PostgresSnapshotSink
from txstream.sinks.sink import Sink, SinkDataError, SinkSchemaError

SCHEMA = TableSchema.of({"id": "bigint", "name": "text", "score": "double"}, primary_key=["id"])

Change = tuple[dict[str, Any], int, int]  # (row, time, diff)


def changes_table(changes: list[Change], schema: TableSchema = SCHEMA) -> Changes:
    rows = [{**row, TIME: t, DIFF: d} for row, t, d in changes]
    return Changes.of(pa.Table.from_pylist(rows, schema=schema.arrow_schema(with_changes=True)))


def fetch(url: str, query: sql.Composable) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return sorted(conn.execute(query).fetchall(), key=repr)


def whole_table(url: str, db_schema: str, table: str) -> list[tuple[Any, ...]]:
    return fetch(url, sql.SQL("SELECT * FROM {}").format(sql.Identifier(db_schema, table)))


def live(url: str, db_schema: str, view: str) -> list[tuple[Any, ...]]:
    return fetch(url, sql.SQL("SELECT * FROM {}").format(sql.Identifier(db_schema, view)))


@st.composite
def keyed_streams(draw: st.DrawFn) -> tuple[list[list[Change]], dict[int, dict[str, Any]]]:
    """Transactions 1..n of random inserts, deletes and updates over a few keys, each
    consolidated (at most one -1 and one +1 per key), and the final live rows by key."""
    state: dict[int, dict[str, Any]] = {}
    transactions: list[list[Change]] = []
    names = st.sampled_from(["a", "b", "", "ü"])
    for t in range(1, draw(st.integers(1, 8)) + 1):
        txn: list[Change] = []
        for key in draw(st.sets(st.integers(0, 5), max_size=4)):
            new = {"id": key, "name": draw(names), "score": float(draw(st.integers(0, 3)))}
            old = state.get(key)
            action = draw(st.sampled_from(["upsert", "delete"]))
            if old is not None and (action == "delete" or old != new):
                txn.append((old, t, -1))
                del state[key]
            if action == "upsert" and (old is None or old != new):
                txn.append((new, t, 1))
                state[key] = new
        transactions.append(txn)
    return transactions, state


def apply_in_order(url: str, db_schema: str, transactions: list[list[Change]]) -> None:
    with PostgresSnapshotSink(url, "in_order", SCHEMA, db_schema=db_schema,
                              mode="replace") as sink:
        for txn in transactions:
            sink.write(changes_table(txn))


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=keyed_streams(), seed=st.integers(0, 2**32 - 1))
def test_out_of_order_delivery_ends_in_the_in_order_table(
    postgres: PostgresEndpoint, pg_schema: str,
    stream: tuple[list[list[Change]], dict[int, dict[str, Any]]], seed: int,
) -> None:
    """Whole transactions shuffled with some delivered twice, then single changes shuffled
    across transactions in random batches: both end in exactly the in-order table (rows,
    tombstones, times and diffs), whose live view is the model's final state."""
    transactions, final = stream
    rng = random.Random(seed)
    apply_in_order(postgres.url, pg_schema, transactions)
    expected = whole_table(postgres.url, pg_schema, "in_order")
    assert live(postgres.url, pg_schema, "in_order_live") == sorted(
        ((r["id"], r["name"], r["score"]) for r in final.values()), key=repr)

    redelivered = transactions + rng.sample(transactions, k=len(transactions) // 2)
    rng.shuffle(redelivered)
    with PostgresSnapshotSink(postgres.url, "shuffled", SCHEMA, db_schema=pg_schema,
                              mode="replace") as sink:
        for txn in redelivered:
            sink.write(changes_table(txn))
    assert whole_table(postgres.url, pg_schema, "shuffled") == expected

    singles = [c for txn in transactions for c in txn]
    singles += rng.sample(singles, k=len(singles) // 3)
    rng.shuffle(singles)
    with PostgresSnapshotSink(postgres.url, "shuffled", SCHEMA, db_schema=pg_schema,
                              mode="replace") as sink:
        while singles:
            cut = rng.randint(1, 4)
            sink.write(changes_table(singles[:cut]))
            singles = singles[cut:]
    assert whole_table(postgres.url, pg_schema, "shuffled") == expected


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=keyed_streams(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_purging_below_the_watermark_never_changes_the_outcome(
    postgres: PostgresEndpoint, pg_schema: str,
    stream: tuple[list[list[Change]], dict[int, dict[str, Any]]], seed: int,
    data: st.DataObject,
) -> None:
    """All transactions up to W and some later ones delivered shuffled, watermark W declared
    and tombstones purged, then the other later ones shuffled with duplicates of any later one:
    the live rows and every tombstone newer than W are those of in-order application."""
    transactions, _ = stream
    watermark = data.draw(st.integers(0, len(transactions) // 2))
    rng = random.Random(seed)
    apply_in_order(postgres.url, pg_schema, transactions)
    after = transactions[watermark:]
    rng.shuffle(after)
    cut = rng.randint(0, len(after))
    early = transactions[:watermark] + after[:cut]
    late = after[cut:] + rng.sample(after, k=len(after) // 2)
    rng.shuffle(early)
    rng.shuffle(late)
    with PostgresSnapshotSink(postgres.url, "purged", SCHEMA, db_schema=pg_schema,
                              mode="replace") as sink:
        for txn in early:
            sink.write(changes_table(txn))
        sink.advance_watermark(watermark)
        sink.purge_tombstones()
        for txn in late:
            sink.write(changes_table(txn))

    def kept(table: str) -> list[tuple[Any, ...]]:
        return [r for r in whole_table(postgres.url, pg_schema, table)
                if r[-1] == 1 or r[-2] > watermark]
    assert kept("purged") == kept("in_order")
    assert all(r[-1] == 1 or r[-2] > watermark
               for r in whole_table(postgres.url, pg_schema, "purged"))


def test_concurrent_writers_end_in_the_in_order_table(postgres: PostgresEndpoint,
                                                      pg_schema: str) -> None:
    """Three writers apply disjoint shares of shuffled transactions at the same time (one
    transaction twice); row locks taken in key order keep them from deadlocking."""
    rng = random.Random(3)
    transactions: list[list[Change]] = []
    state: dict[int, dict[str, Any]] = {}
    for t in range(1, 41):
        txn: list[Change] = []
        for key in rng.sample(range(30), 10):
            if key in state:
                txn.append((state.pop(key), t, -1))
            if rng.random() < 0.8:
                state[key] = {"id": key, "name": rng.choice("abc"), "score": float(t)}
                txn.append((state[key], t, 1))
        transactions.append(txn)
    apply_in_order(postgres.url, pg_schema, transactions)
    shuffled = [*transactions, transactions[5]]
    rng.shuffle(shuffled)
    with PostgresSnapshotSink(postgres.url, "shared", SCHEMA, db_schema=pg_schema):
        pass  # created once, so that the writers only validate it

    def writer(share: list[list[Change]]) -> None:
        with PostgresSnapshotSink(postgres.url, "shared", SCHEMA, db_schema=pg_schema) as sink:
            for txn in share:
                sink.write(changes_table(txn))

    with ThreadPoolExecutor(3) as pool:
        for done in [pool.submit(writer, shuffled[w::3]) for w in range(3)]:
            done.result()
    assert whole_table(postgres.url, pg_schema, "shared") == whole_table(
        postgres.url, pg_schema, "in_order")


def test_older_insert_after_newer_delete_does_not_resurrect(
        postgres: PostgresEndpoint, pg_schema: str) -> None:
    with PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema) as sink:
        assert isinstance(sink, Sink)
        row = {"id": 1, "name": "x", "score": 1.0}
        sink.write(changes_table([(row, 5, -1)]))
        sink.write(changes_table([(row, 3, 1)]))
    assert whole_table(postgres.url, pg_schema, "t") == [(1, "x", 1.0, 5, -1)]
    assert live(postgres.url, pg_schema, "t_live") == []


def test_creates_validates_and_replaces_the_table(postgres: PostgresEndpoint,
                                                  pg_schema: str) -> None:
    PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema).close()
    # The same schema again is accepted as is.
    PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema).close()
    other = TableSchema.of({"id": "bigint", "name": "int", "extra": "text"}, primary_key=["id"])
    with pytest.raises(SinkSchemaError) as info:
        PostgresSnapshotSink(postgres.url, "t", other, db_schema=pg_schema)
    message = str(info.value)
    assert "'name' has type text, expected integer" in message
    assert "'extra' is missing" in message and "'score' is not in the output table" in message
    rekeyed = TableSchema.of({"id": "bigint", "name": "text", "score": "double"},
                             primary_key=["id", "name"])
    with pytest.raises(SinkSchemaError, match=r"key is \(id\), expected \(id, name\)"):
        PostgresSnapshotSink(postgres.url, "t", rekeyed, db_schema=pg_schema)
    PostgresSnapshotSink(postgres.url, "t", other, db_schema=pg_schema, mode="replace").close()
    with psycopg.connect(postgres.url) as conn:
        types = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
            [f'"{pg_schema}".t']).fetchall()
    assert types == [("id", "bigint"), ("name", "integer"), ("extra", "text"),
                     ("time", "bigint"), ("diff", "smallint")]


def test_refuses_a_table_without_primary_key(postgres: PostgresEndpoint, pg_schema: str) -> None:
    with pytest.raises(SinkSchemaError, match="no primary key"):
        PostgresSnapshotSink(postgres.url, "t", TableSchema.of({"a": "int"}), db_schema=pg_schema)


@pytest.mark.parametrize("table", ['we"ird', "x; DROP TABLE t; --", "Ünïcødé ☃", "a.b"])
def test_hostile_table_names_are_quoted(postgres: PostgresEndpoint, pg_schema: str,
                                        table: str) -> None:
    with PostgresSnapshotSink(postgres.url, table, SCHEMA, db_schema=pg_schema) as sink:
        sink.write(changes_table([({"id": 1, "name": "n", "score": 0.5}, 1, 1)]))
    assert live(postgres.url, pg_schema, f"{table}_live") == [(1, "n", 0.5)]
    with psycopg.connect(postgres.url) as conn:
        tables = conn.execute("SELECT relname FROM pg_class c JOIN pg_namespace n"
                              " ON n.oid = c.relnamespace WHERE nspname = %s ORDER BY 1",
                              [pg_schema]).fetchall()
    names = {t for (t,) in tables} - {"txstream_rejects", "txstream_rejects_once"}
    assert {table, f"{table}_live"} < names and len(names) == 3  # and the key's index


def test_names_postgres_would_truncate_are_refused(postgres: PostgresEndpoint,
                                                   pg_schema: str) -> None:
    with pytest.raises(SinkSchemaError, match="longer than PostgreSQL's 63 bytes"):
        PostgresSnapshotSink(postgres.url, "é" * 32, SCHEMA, db_schema=pg_schema)
    with pytest.raises(SinkSchemaError, match="live_view"):
        PostgresSnapshotSink(postgres.url, "x" * 60, SCHEMA, db_schema=pg_schema)
    PostgresSnapshotSink(postgres.url, "x" * 60, SCHEMA, db_schema=pg_schema,
                         live_view="short").close()


def test_hostile_values(postgres: PostgresEndpoint, pg_schema: str) -> None:
    """Extremes of bigint and double (NaN, infinities, subnormals) and text with quotes,
    commas, newlines and unicode round-trip exactly; empty text stays distinct from NULL."""
    with PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema) as sink:
        values = [
            (2**63 - 1, 'a "quoted", comma\nnewline\\', math.nan),
            (-(2**63), "", math.inf),
            (0, None, -math.inf),
            (1, "☃ 𝄞 \u200b", 5e-324),
            (2, "\\N", 1.7976931348623157e308),
            (3, "NULL", 0.1 + 0.2),
        ]
        sink.write(changes_table([({"id": i, "name": n, "score": s}, 1, 1) for i, n, s in values]))
        got = {r[0]: r for r in live(postgres.url, pg_schema, "t_live")}
        for i, name, score in values:
            assert got[i][1] == name
            assert (math.isnan(got[i][2]) and math.isnan(score)) or got[i][2] == score


def test_batches_that_do_not_fit_the_table_are_refused_whole(postgres: PostgresEndpoint,
                                                             pg_schema: str) -> None:
    with PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema) as sink:
        with pytest.raises(SinkDataError, match="lack column"):
            sink.write(Changes.of(pa.table({"id": [1], "time": [1], "diff": [1]})))
        with pytest.raises(SinkDataError, match="diff other than"):
            sink.write(changes_table([({"id": 1, "name": "a", "score": 1.0}, 1, 2)]))
        with pytest.raises(SinkDataError, match="do not convert"):  # beyond BIGINT
            sink.write(Changes.of(pa.table({
                "id": pa.array([2**64 - 1], pa.uint64()), "name": ["a"], "score": [1.0],
                "time": [1], "diff": [1]})))
        with pytest.raises(SinkDataError, match="'id' with null values"):
            sink.write(Changes.of(pa.table({
                "id": pa.array([None], pa.int64()), "name": ["a"], "score": [1.0], "time": [1],
                "diff": [1]})))
        assert whole_table(postgres.url, pg_schema, "t") == []


def test_connection_loss_is_retried(postgres: PostgresEndpoint, pg_schema: str) -> None:
    retry = RetryPolicy(attempts=3, initial_backoff_s=0.01)
    with PostgresSnapshotSink(postgres.url, pg_schema, SCHEMA, db_schema=pg_schema,
                              live_view="t_live", retry=retry) as sink:
        sink.write(changes_table([({"id": 1, "name": "a", "score": 1.0}, 1, 1)]))
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                  " WHERE application_name = %s",
                                  [f"txstream snapshot {pg_schema}"]).fetchall()
        assert killed == [(True,)]
        sink.write(changes_table([({"id": 2, "name": "b", "score": 2.0}, 2, 1)]))
    assert [r[0] for r in live(postgres.url, pg_schema, "t_live")] == [1, 2]


def test_purge_keeps_tombstones_above_the_watermark(postgres: PostgresEndpoint,
                                                    pg_schema: str) -> None:
    with PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema) as sink:
        rows = [{"id": i, "name": "a", "score": 0.0} for i in range(4)]
        sink.write(changes_table([(r, 1, 1) for r in rows]))
        sink.write(changes_table([(rows[0], 2, -1), (rows[1], 3, -1), (rows[2], 4, -1)]))
        assert sink.purge_tombstones() == 0  # no watermark declared yet: every tombstone may matter
        sink.advance_watermark(3)
        assert sink.purge_tombstones() == 2
        assert [(r[0], r[3], r[4]) for r in whole_table(postgres.url, pg_schema, "t")] == [
            (2, 4, -1), (3, 1, 1)]


def test_a_configured_snapshot_purges_unless_told_not_to() -> None:
    """The service's snapshots purge by default (a table of moving keys would otherwise keep a
    tombstone for every key it ever held); `purge: null` keeps them all."""
    assert SinkConfig.model_validate({"output": "o"}).settings.purge == TombstonePurge()
    kept = SinkConfig.model_validate({"output": "o", "purge": None}).settings
    assert isinstance(kept, PostgresSnapshotSettings) and kept.purge is None


def test_background_purge(postgres: PostgresEndpoint, pg_schema: str) -> None:
    purge = TombstonePurge(horizon=1, interval_s=0.05)
    with PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema,
                              purge=purge) as sink:
        rows = [{"id": i, "name": "a", "score": 0.0} for i in range(3)]
        sink.write(changes_table([(r, 1, 1) for r in rows]))
        sink.write(changes_table([(rows[0], 2, -1), (rows[1], 3, -1)]))
        sink.advance_watermark(3)  # horizon 1: tombstones up to time 2 may go
        deadline = time.monotonic() + 10
        while len(whole_table(postgres.url, pg_schema, "t")) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [(r[0], r[3], r[4]) for r in whole_table(postgres.url, pg_schema, "t")] == [
        (1, 3, -1), (2, 1, 1)]


def test_hostile_database_schema_name(postgres: PostgresEndpoint) -> None:
    db_schema = 'sch"; DROP SCHEMA public; --ü'
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(db_schema)))
    try:
        with PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=db_schema) as sink:
            sink.write(changes_table([({"id": 1, "name": "n", "score": 0.5}, 1, 1)]))
        assert live(postgres.url, db_schema, "t_live") == [(1, "n", 0.5)]
    finally:
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(db_schema)))


NULLABLE = TableSchema.model_validate({
    "columns": [{"name": "region", "type": "text"}, {"name": "day", "type": "date"},
                {"name": "total", "type": "double"}],
    "primary_key": ["region", "day"]})
DAY = dt.date(2024, 1, 1)


def nullable_changes(changes: list[tuple[str | None, Any, float, int, int]]) -> Changes:
    return Changes.of(pa.Table.from_pylist(
        [{"region": r, "day": d, "total": v, "time": t, "diff": df} for r, d, v, t, df in changes],
        schema=NULLABLE.arrow_schema(with_changes=True)))


def test_null_keys_are_values_like_any_other(postgres: PostgresEndpoint, pg_schema: str) -> None:
    with PostgresSnapshotSink(postgres.url, "t", NULLABLE, db_schema=pg_schema) as sink:
        sink.write(nullable_changes([(None, None, 1.0, 1, 1), (None, DAY, 2.0, 1, 1),
                                     ("eu", None, 3.0, 1, 1)]))
        # An update of the all-null key in one batch with an older change of it: one row wins.
        sink.write(nullable_changes([(None, None, 1.0, 2, -1), (None, None, 5.0, 2, 1),
                                     (None, None, 9.0, 1, 1), ("eu", None, 3.0, 2, -1)]))
        assert sink.rejected_rows == 0
    assert live(postgres.url, pg_schema, "t_live") == [(None, None, 5.0), (None, DAY, 2.0)]
    assert len(whole_table(postgres.url, pg_schema, "t")) == 3  # and the ("eu", null) tombstone


def test_rows_postgres_refuses_are_kept_aside_and_the_rest_is_written(
        postgres: PostgresEndpoint, pg_schema: str) -> None:
    PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema).close()
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} ADD CHECK (score < 100)").format(
            sql.Identifier(pg_schema, "t")))
    batch = changes_table([({"id": i, "name": n, "score": s}, 3, 1) for i, n, s in [
        (1, "a", 1.0), (2, "nul\x00", 2.0), (3, "c", 500.0), (4, "d", 4.0)]])
    with PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema) as sink:
        sink.write(batch)
        sink.write(batch)  # a replay after a crash: nothing twice
        assert sink.rejected_rows == 4  # counted per write
    # 0000-01-01: Arrow holds it, PostgreSQL has no year 0.
    year0 = pa.table({"region": ["us"], "day": pa.array([-719528], pa.date32()),
                      "total": [2.0], "time": [1], "diff": [1]})
    with PostgresSnapshotSink(postgres.url, "d", NULLABLE, db_schema=pg_schema) as sink:
        sink.write(nullable_changes([("eu", DAY, 1.0, 1, 1)]).concat(
            [Changes(year0.cast(NULLABLE.arrow_schema(with_changes=True)))]))
    assert live(postgres.url, pg_schema, "t_live") == [(1, "a", 1.0), (4, "d", 4.0)]
    assert live(postgres.url, pg_schema, "d_live") == [("eu", DAY, 1.0)]
    rejects = fetch(postgres.url, sql.SQL(
        'SELECT output_table, "time", "diff", reason, row_json FROM {}').format(
            sql.Identifier(pg_schema, "txstream_rejects")))
    assert [(r[0], r[1], r[2]) for r in rejects] == [("d", 1, 1), ("t", 3, 1), ("t", 3, 1)]
    reasons = {json.loads(r[4])["region" if r[0] == "d" else "id"]: r[3] for r in rejects}
    assert "check constraint" in reasons[3] and "0x00" in reasons[2]
    assert "out of range" in reasons["us"]
    # A table recreated from scratch numbers its transactions anew: its old rejects go.
    PostgresSnapshotSink(postgres.url, "t", SCHEMA, db_schema=pg_schema, mode="replace").close()
    assert [r[0] for r in fetch(postgres.url, sql.SQL("SELECT output_table FROM {}").format(
        sql.Identifier(pg_schema, "txstream_rejects")))] == ["d"]


def test_servers_before_15_refuse_null_keys_row_by_row(
        postgres: PostgresEndpoint, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres_common, "nulls_not_distinct", lambda conn: False)
    with PostgresSnapshotSink(postgres.url, "t", NULLABLE, db_schema=pg_schema) as sink:
        sink.write(nullable_changes([(None, None, 1.0, 1, 1), ("eu", None, 2.0, 1, 1),
                                     ("eu", DAY, 3.0, 1, 1)]))
        assert sink.rejected_rows == 2
    assert live(postgres.url, pg_schema, "t_live") == [("eu", DAY, 3.0)]
    monkeypatch.undo()
    # A table keyed the old way (a primary key) is still accepted by a newer server.
    PostgresSnapshotSink(postgres.url, "t", NULLABLE, db_schema=pg_schema).close()
