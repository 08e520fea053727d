"""Peer benchmark: Pathway's group-by workload end to end, Kafka to a PostgreSQL snapshot, run
on Pathway (bench/end_to_end.py runs the same on txstream and compares).

Reads the topic from its beginning to its end (`pw.io.kafka.read(mode="static")`, JSON values
`{"k": int, "v": int}`), groups by `k` into `count` and `total` = sum(v), and writes the result
with `pw.io.postgres.write_snapshot` (primary key `k`) into `--table`, created if missing.
`seconds` runs from building the graph to `pw.run` returning, i.e. until every event is read
and the last snapshot update is written. `times`: how many times (commits of the reader, every
`autocommit_duration_ms`) the output changed at; `last_output_s`: when the last output change
was computed (the rest of `seconds` is the PostgreSQL writer). The caller verifies the table.

    python3 bench/peers/pathway_kafka_pg.py --bootstrap HOST:PORT --topic T --events N
        --table SCHEMA.TABLE --pg '{"host": ..., "port": ..., "dbname": ..., "user": ...}'
        [--fetch '{"fetch.queue.backoff.ms": 10, ...}']

The virtualenv and the output protocol (one JSON line last on stdout; `skipped` when Pathway
cannot be installed) are those of bench/peers/pathway_groupby.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

# The bootstrap is borrowed from a sibling script, not a package.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pathway_groupby import DEFAULT_VENV, emit, enter_venv, log


def run_pathway(args: argparse.Namespace, out_fd: int) -> None:
    import pathway as pw

    class Event(pw.Schema):
        k: int
        v: int

    settings = {"bootstrap.servers": args.bootstrap, "group.id": f"pathway-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                **{name: str(value) for name, value in json.loads(args.fetch).items()}}
    log(f"pathway {pw.__version__}: {args.events:,} events from {args.topic} to {args.table}")
    start = time.perf_counter()
    events = pw.io.kafka.read(settings, args.topic, schema=Event, format="json", mode="static")
    sums = events.groupby(pw.this.k).reduce(pw.this.k, count=pw.reducers.count(),
                                            total=pw.reducers.sum(pw.this.v))
    pw.io.postgres.write_snapshot(sums, json.loads(args.pg), args.table, ["k"],
                                  init_mode="create_if_not_exists")
    # The times Pathway closed (one per reader commit): the work it did depends on how many.
    times: set[int] = set()
    computed: list[float] = [start]
    clock = time.perf_counter  # `time` is the callback's parameter (Pathway passes it by name)

    def on_change(key: object, row: object, time: int, is_addition: bool) -> None:
        times.add(time)
        computed[0] = clock()

    pw.io.subscribe(sums, on_change)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    elapsed = time.perf_counter() - start
    log(f"done in {elapsed:.2f} s: {args.events / elapsed:,.0f} events/s")
    emit({"peer": "pathway", "version": pw.__version__, "events": args.events,
          "seconds": round(elapsed, 3), "events_per_s": round(args.events / elapsed),
          "times": len(times), "last_output_s": round(computed[0] - start, 3),
          "threads": int(os.environ.get("PATHWAY_THREADS") or 1)}, out_fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("--bootstrap", "--topic", "--table", "--pg"):
        parser.add_argument(name, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--fetch", default="{}",
                        help="librdkafka fetch settings as JSON (the caller passes txstream's)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args()
    out_fd = enter_venv(args.venv.expanduser().absolute())
    run_pathway(args, out_fd)


if __name__ == "__main__":
    main()
