"""Throughput of the live-snapshot writer against a plain COPY of the same rows, in one run.

A table of `--rows` keys is loaded, then `--transactions` transactions of `--txn-rows` keys each
are applied through `PostgresSnapshotSink.write` (70% updates = -1 old/+1 new, 20% inserts of
new keys, 10% deletions, so about 1.7 change rows per key). The baseline COPies the same rows the
sink writes (one per key, with time and diff) into a table without index or key, one PostgreSQL
transaction per stream transaction. Prints one JSON object.

    .venv/bin/python bench/postgres_sink.py [--rows 1000000] [--txn-rows 10000] [--transactions 20]

Uses `DATABASE_URL` if set, else starts a throwaway PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import numpy as np
import psycopg
import pyarrow as pa
from psycopg import sql

from txstream.schemas.tables import TableSchema
from txstream.service.embedded.postgres import postgres_from_env
from txstream.sinks.postgres.common import copy_into
from txstream.sinks.postgres.snapshot import PostgresSnapshotSink, last_change_per_key

SCHEMA = TableSchema.of({"id": "bigint", "name": "text", "score": "double", "qty": "int"},
                        primary_key=["id"])


def rows(ids: np.ndarray, version: int, time_: int, diff: int) -> pa.Table:
    """Rows of the keys `ids` as of `version`: values are a function of (id, version)."""
    n = len(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array(np.char.add("name-", (ids * 7 + version).astype(str)), pa.string()),
        "score": pa.array(ids * 0.5 + version, pa.float64()),
        "qty": pa.array((ids + version) % 1000, pa.int32()),
        "time": pa.array(np.full(n, time_), pa.int64()),
        "diff": pa.array(np.full(n, diff), pa.int64()),
    })


def transaction(rng: np.random.Generator, live: np.ndarray, next_id: int, size: int,
                time_: int) -> tuple[pa.Table, np.ndarray, int]:
    """One stream transaction touching `size` keys; the new set of live keys."""
    n_upd, n_ins = int(size * 0.7), int(size * 0.2)
    n_del = size - n_upd - n_ins
    picked = rng.choice(len(live), n_upd + n_del, replace=False)
    updated, deleted = live[picked[:n_upd]], live[picked[n_upd:]]
    inserted = np.arange(next_id, next_id + n_ins)
    # The old version of a key's row is irrelevant to the sink's cost; version 0 stands for it.
    changes = pa.concat_tables([
        rows(updated, 0, time_, -1), rows(updated, time_, time_, 1),
        rows(deleted, 0, time_, -1), rows(inserted, time_, time_, 1),
    ])
    keep = np.ones(len(live), bool)
    keep[picked[n_upd:]] = False
    return changes, np.concatenate([live[keep], inserted]), next_id + n_ins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--txn-rows", type=int, default=10_000)
    parser.add_argument("--transactions", type=int, default=20)
    args = parser.parse_args()

    pg = postgres_from_env()
    schema_name = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema_name)))
        sink = PostgresSnapshotSink(pg.url, "snapshot", SCHEMA, db_schema=schema_name)
        live = np.arange(args.rows)
        started = time.perf_counter()
        sink.write(rows(live, 0, 1, 1))
        load_s = time.perf_counter() - started
        # A long-lived table is kept vacuumed by autovacuum; right after the bulk load the first
        # transactions would pay for setting the loaded rows' hint bits instead.
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(
                sql.Identifier(schema_name, "snapshot")))

        rng = np.random.default_rng(42)
        batches = []
        next_id = args.rows
        for t in range(2, args.transactions + 2):
            changes, live, next_id = transaction(rng, live, next_id, args.txn_rows, t)
            batches.append(changes)

        started = time.perf_counter()
        for changes in batches:
            sink.write(changes)
        sink_s = time.perf_counter() - started
        sink.close()

        # What the sink COPies: one row per key, prepared outside the timed loop.
        deduped = [last_change_per_key(b, ["id"]) for b in batches]
        started = time.perf_counter()
        for b in batches:
            last_change_per_key(b, ["id"])
        prepare_s = time.perf_counter() - started

        plain = sql.Identifier(schema_name, "plain")
        with psycopg.connect(pg.url) as conn:
            conn.execute(sql.SQL(
                'CREATE TABLE {} (id BIGINT, name TEXT, score DOUBLE PRECISION, qty INTEGER,'
                ' "time" BIGINT, diff SMALLINT)').format(plain))
            conn.commit()
            started = time.perf_counter()
            for b in deduped:
                with conn.cursor() as cur:
                    copy_into(cur, plain, b)
                conn.commit()
            copy_s = time.perf_counter() - started

        keys = sum(b.num_rows for b in deduped)
        change_rows = sum(b.num_rows for b in batches)
        sink_rate = keys / sink_s
        copy_rate = keys / copy_s
        print(json.dumps({
            "table_rows": args.rows,
            "transactions": args.transactions,
            "keys_per_transaction": args.txn_rows,
            "change_rows_per_transaction": change_rows // args.transactions,
            "initial_load_rows_per_s": round(args.rows / load_s),
            "snapshot_keys_per_s": round(sink_rate),
            "snapshot_change_rows_per_s": round(change_rows / sink_s),
            "snapshot_ms_per_transaction": round(1000 * sink_s / args.transactions, 1),
            "of_which_arrow_dedup_ms_per_transaction": round(
                1000 * prepare_s / args.transactions, 1),
            "plain_copy_rows_per_s": round(copy_rate),
            "snapshot_to_plain_copy_ratio": round(sink_rate / copy_rate, 3),
        }, indent=2))
    finally:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(schema_name)))
        pg.stop()


if __name__ == "__main__":
    main()
