"""Peer benchmark: a workload end to end, Kafka to a PostgreSQL snapshot, run on Pathway as a
service (bench/backlog.py runs the same on txstream and compares).

Reads the topic from its beginning (`pw.io.kafka.read`), and writes the result with
`pw.io.postgres.write_snapshot` into `--table`, created if missing. `--workload`:

* `groupby` (bench/end_to_end.py): JSON values `{"k": int, "v": int}` grouped by `k` into
  `count` and `total` = sum(v), primary key `k`;
* `windows` (bench/temporal_end_to_end.py): page views `{"user_id": int, "ts": int}`
  (microseconds), counted per user in one-minute tumbling windows with
  `exactly_once_behavior()` into `user_id`, `window_start`, `views`, primary key (`user_id`,
  `window_start`).

With `--mode streaming` (a service's) it runs until stopped (SIGTERM); with `--mode static` it
reads the topic to its end, as a batch job, and exits once the result is written. Nothing is
timed or observed here, and no callback is added to Pathway's graph: the caller times the run from
outside, by polling the table.

    python3 bench/peers/pathway_kafka_pg.py --bootstrap HOST:PORT --topic T
        --table SCHEMA.TABLE --pg '{"host": ..., "port": ..., "dbname": ..., "user": ...}'
        [--workload groupby|windows] [--mode streaming|static]
        [--fetch '{"fetch.queue.backoff.ms": 10, ...}']

The virtualenv is that of bench/peers/pathway_groupby.py. One JSON line on stdout, written
before Pathway runs: Pathway's version and threads, or `skipped` when Pathway cannot be
installed (the process then exits).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

# The bootstrap is borrowed from a sibling script, not a package.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pathway_groupby import DEFAULT_VENV, emit, enter_venv, log

MINUTE_US = 60_000_000


def run_pathway(args: argparse.Namespace, out_fd: int) -> None:
    import pathway as pw

    settings = {"bootstrap.servers": args.bootstrap, "group.id": f"pathway-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                **{name: str(value) for name, value in json.loads(args.fetch).items()}}
    log(f"pathway {pw.__version__}: {args.workload} from {args.topic} to {args.table}, "
        f"{args.mode}")
    if args.workload == "groupby":
        class Event(pw.Schema):
            k: int
            v: int

        events = pw.io.kafka.read(settings, args.topic, schema=Event, format="json",
                                  mode=args.mode)
        result = events.groupby(pw.this.k).reduce(pw.this.k, count=pw.reducers.count(),
                                                  total=pw.reducers.sum(pw.this.v))
        key = ["k"]
    else:
        class View(pw.Schema):
            user_id: int
            ts: int

        views = pw.io.kafka.read(settings, args.topic, schema=View, format="json",
                                 mode=args.mode)
        result = views.windowby(
            views.ts, window=pw.temporal.tumbling(duration=MINUTE_US), instance=views.user_id,
            behavior=pw.temporal.exactly_once_behavior(),
        ).reduce(user_id=pw.this._pw_instance, window_start=pw.this._pw_window_start,
                 views=pw.reducers.count())
        key = ["user_id", "window_start"]
    pw.io.postgres.write_snapshot(result, json.loads(args.pg), args.table, key,
                                  init_mode="create_if_not_exists")
    emit({"peer": "pathway", "version": pw.__version__, "mode": args.mode,
          "threads": int(os.environ.get("PATHWAY_THREADS") or 1)}, out_fd)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("--bootstrap", "--topic", "--table", "--pg"):
        parser.add_argument(name, required=True)
    parser.add_argument("--workload", choices=("groupby", "windows"), default="groupby")
    parser.add_argument("--mode", choices=("streaming", "static"), default="streaming")
    parser.add_argument("--fetch", default="{}",
                        help="librdkafka fetch settings as JSON (the caller passes txstream's)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args()
    out_fd = enter_venv(args.venv.expanduser().absolute())
    run_pathway(args, out_fd)


if __name__ == "__main__":
    main()
