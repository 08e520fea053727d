"""The cost of building a `txstream.changes.Changes`: ns per `Changes(table)`, which checks the
table's columns (never its rows), for tables of 4 and 40 columns of their own and of 0 and
100,000 rows. Prints one JSON object. Pure Python and Arrow: no Spark, Kafka or PostgreSQL.

    .venv/bin/python bench/changes.py [--calls 200000] [--repeat 7]

Every `Changes` a batch makes (a source's, an output's, each split and netted part) pays this
once; the check must stay O(columns), so the four figures stay close.
"""

from __future__ import annotations

import argparse
import json
import timeit

import pyarrow as pa

from txstream.changes import Changes, change_fields


def ns_per_construction(columns: int, rows: int, calls: int, repeat: int) -> float:
    """The best of `repeat` runs of `calls` constructions, in ns per construction."""
    own = pa.schema([pa.field(f"c{i}", pa.int64()) for i in range(columns)])
    fields = change_fields(own)
    table = pa.table({f.name: pa.array(range(rows), pa.int64()) for f in fields}, schema=fields)
    best = min(timeit.repeat(lambda: Changes(table), number=calls, repeat=repeat))
    return best / calls * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps({f"{columns}_columns_{rows}_rows_ns": round(
        ns_per_construction(columns, rows, args.calls, args.repeat))
        for columns in (4, 40) for rows in (0, 100_000)}))


if __name__ == "__main__":
    main()
