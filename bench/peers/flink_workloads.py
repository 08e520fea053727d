"""Peer benchmark: bench/engine.py's two workloads and bench/temporal.py's windows and sessions
run by Apache Flink (Flink SQL, streaming mode).

Runs inside Flink's own virtualenv (`apache-flink==2.3.0` from PyPI, which bundles Flink's jars;
Java 17 on the PATH); bench/flink_peer.py creates that venv, writes the CSV input and runs this
script with the venv's interpreter:

    <flink-venv>/bin/python bench/peers/flink_workloads.py --workload WORKLOAD
        --input DIR --events N [--parallelism P] [--warm-s S]

Each workload is one Flink SQL job in streaming mode on a local mini-cluster (PyFlink's local
executor starts one for the job, with P task slots), `parallelism.default` = P, reading CSV
files through the `filesystem` connector (bounded: the job finishes once the files are read)
and writing every output to a `blackhole` sink. Flink's defaults otherwise: no mini-batch, no
checkpointing, heap state. The filesystem source reads a CSV file as one split (CSV is not
splittable), so the writer splits each table into P files by key: each source subtask can read
one, and all changes of a key stay in one file, in order.

- `groupby`: `DIR/events/*.csv` holds (k, v), events i = 0..N-1 with k = i mod 10,000 and
  v = ((i * 7919) mod 10007) / 8, the values of bench/engine.py's throughput workload (and the
  shape of bench/peers/pathway_groupby.py); `SELECT k, COUNT(*), SUM(v) ... GROUP BY k`. Flink
  has no transactions: it updates the count and sum per event, so each event yields a
  retraction and an insertion of its key's row (the first of a key only an insertion).
- `orders`: the example pipeline of txstream/examples/orders.py (paid_orders, region_totals,
  customer_stats, statuses, the SQL in its doc) over the first N events of
  txstream/examples/order_events.py's `events` with 10,000 customers (its first 10,000 events
  insert the customers; then order inserts, order updates of status or amount, order deletes and
  customers' region changes). The events are upserts by primary key; the engine consumes them as
  the changes `as_changes` makes of them: -1 the old row, +1 the new. The input here holds the
  same changes, one CSV line each with an op column: `+I` a new row, `-U` and `+U` the old and
  new row of an update, `-D` a deleted row (full images, so nothing needs to be looked up).
  Flink 2.3's built-in process table function `FROM_CHANGELOG` turns each append-only CSV table
  into the changelog table the queries read: stateless, one changelog row per CSV line. This is
  the closest Flink SQL gets to the engine's input; its other option, upsert semantics (an
  upsert source, or FROM_CHANGELOG's upsert mode, which 2.3 does not support yet), would make
  Flink materialize every table in a ChangelogNormalize operator to recover the old rows that
  the changes here already carry. FROM_CHANGELOG declares no unique key, so joins keep their
  inputs' rows by value (as the engine's state does).
- `windows` and `sessions`: bench/temporal.py's page views, `DIR/page_views/*.csv` holding
  (user_id, ts), ts to the millisecond, in event order but for the late ones; per-user counts in
  one-minute `TUMBLE` windows, or in `SESSION` windows of five-minute gaps, through Flink's
  window table-valued functions, a watermark at the largest event time so far (see `VIEWS_DDL`).

Output: one JSON line, the last on stdout (Flink's own output goes to stderr):

    {"peer": "flink", "version": "2.3.0", "workload": ..., "parallelism": P, "events": N,
     "input_rows": ..., "seconds": ..., "events_per_s": ..., "job_start_s": ..., "start": {...},
     "tasks_running_s": ...[, "warm_up_s": ..., "warm_up_jobs": ...]}

What is timed. The mini-cluster archives every finished job (`jobmanager.archive.fs.dir`, the
History Server's input: the REST answers about the job, with the JobManager's timestamps of
every state change of the job and of each subtask); the timed job's archive is found by its id.
`seconds` runs from the first subtask to switch to RUNNING (a source starts reading then) to the
job's FINISHED timestamp (every subtask done, the sinks included), both taken from that archive;
`events_per_s` = N / seconds. It includes the other subtasks' initialization (`tasks_running_s`:
first to last subtask RUNNING, operators' generated code compiled and state backends opened,
overlapping the first reads), and excludes everything before. That is `job_start_s`: from before
the TableEnvironment is created (the JVM launch) to that first RUNNING, split in `start` as
`jvm_s` (launching the JVM and the py4j gateway, creating the environment), `submit_s` (the DDL,
planning and optimizing the SQL, translating it to a job graph, starting the mini-cluster and
submitting the job: until `StatementSet.execute()` returns) and `deploy_s` (scheduling the job
and deploying its tasks). Python's interpreter start and imports and writing the input (by the
caller) are in neither.

With `--warm-s S` the same workload first runs as one job after another, untimed, in the same
TableEnvironment and JVM, until S seconds have passed since the environment was created (the
DDL included); then the timed job runs. Each job still gets a mini-cluster of its own and its
own generated code, compiled for it: what is warm is the JVM, whose JIT has compiled Flink's
runtime and whose classes are loaded. That is about how bench/scale.py's warm txstream figures
are taken (its scratch engines run in the measured driver's JVM first), so that both systems
are measured on JVMs of about the same age. `job_start_s` and `start` are then the timed job's,
from its submission on (no `jvm_s`; `submit_s` without the DDL, which ran before the warm-up
jobs), and the report adds `warm_up_s` and `warm_up_jobs`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyflink.common import Configuration
from pyflink.table import EnvironmentSettings, TableEnvironment
from pyflink.version import __version__ as FLINK_VERSION

# The op codes of the CSV input, as FROM_CHANGELOG maps them to Flink's row kinds.
OP_MAPPING = ("MAP['+I', 'INSERT', '-U', 'UPDATE_BEFORE', '+U', 'UPDATE_AFTER', "
              "'-D', 'DELETE']")

GROUPBY_DDL = (
    "CREATE TABLE events (k BIGINT, v DOUBLE) WITH ({events})",
    "CREATE TABLE sums (k BIGINT, n BIGINT, s DOUBLE) WITH ('connector' = 'blackhole')",
)
GROUPBY_INSERTS = ("INSERT INTO sums SELECT k, COUNT(*), SUM(v) FROM events GROUP BY k",)

ORDERS_DDL = (
    "CREATE TABLE customers_log (op STRING, customer_id BIGINT, name STRING, region STRING) "
    "WITH ({customers})",
    "CREATE TABLE orders_log (op STRING, order_id BIGINT, customer_id BIGINT, "
    "amount DECIMAL(12, 2), status STRING) WITH ({orders})",
    f"CREATE TEMPORARY VIEW customers AS SELECT * FROM FROM_CHANGELOG("
    f"input => TABLE customers_log, op => DESCRIPTOR(op), op_mapping => {OP_MAPPING})",
    f"CREATE TEMPORARY VIEW orders AS SELECT * FROM FROM_CHANGELOG("
    f"input => TABLE orders_log, op => DESCRIPTOR(op), op_mapping => {OP_MAPPING})",
    "CREATE TEMPORARY VIEW paid_orders AS SELECT o.order_id, o.customer_id, c.region, o.amount "
    "FROM orders o JOIN customers c ON o.customer_id = c.customer_id WHERE o.status = 'paid'",
    "CREATE TABLE paid_orders_out (order_id BIGINT, customer_id BIGINT, region STRING, "
    "amount DECIMAL(12, 2)) WITH ('connector' = 'blackhole')",
    "CREATE TABLE region_totals_out (region STRING, orders BIGINT, revenue DECIMAL(38, 2), "
    "min_amount DECIMAL(12, 2), max_amount DECIMAL(12, 2)) WITH ('connector' = 'blackhole')",
    "CREATE TABLE customer_stats_out (customer_id BIGINT, name STRING, n_orders BIGINT, "
    "total DECIMAL(38, 2)) WITH ('connector' = 'blackhole')",
    "CREATE TABLE statuses_out (status STRING) WITH ('connector' = 'blackhole')",
)
# One statement set: the four outputs are one job sharing its sources, as they share the
# engine's batches.
ORDERS_INSERTS = (
    "INSERT INTO paid_orders_out SELECT * FROM paid_orders",
    "INSERT INTO region_totals_out SELECT region, COUNT(*), SUM(amount), MIN(amount), "
    "MAX(amount) FROM paid_orders GROUP BY region",
    "INSERT INTO customer_stats_out SELECT c.customer_id, c.name, COUNT(o.order_id), "
    "COALESCE(SUM(o.amount), 0) FROM customers c "
    "LEFT JOIN orders o ON o.customer_id = c.customer_id GROUP BY c.customer_id, c.name",
    "INSERT INTO statuses_out SELECT DISTINCT status FROM orders",
)

# bench/temporal.py's page views: one-minute tumbling windows and five-minute sessions per
# user, counted. The watermark is the largest event time so far (no allowed lateness), so a
# window is emitted once, when the watermark passes its end, and a view behind it is dropped:
# the engine's `exactly_once_behavior()`.
VIEWS_DDL = (
    "CREATE TABLE page_views (user_id BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts) "
    "WITH ({page_views})",
    "CREATE TABLE per_window (user_id BIGINT, window_start TIMESTAMP(3), "
    "window_end TIMESTAMP(3), view_count BIGINT) WITH ('connector' = 'blackhole')",
)
_PER_WINDOW = ("INSERT INTO per_window SELECT user_id, window_start, window_end, COUNT(*) "
               "FROM TABLE({}) GROUP BY user_id, window_start, window_end")
WINDOWS_INSERTS = (
    _PER_WINDOW.format("TUMBLE(TABLE page_views, DESCRIPTOR(ts), INTERVAL '1' MINUTES)"),)
SESSIONS_INSERTS = (_PER_WINDOW.format(
    "SESSION(TABLE page_views PARTITION BY user_id, DESCRIPTOR(ts), INTERVAL '5' MINUTES)"),)

SQL = {"groupby": (GROUPBY_DDL, GROUPBY_INSERTS), "orders": (ORDERS_DDL, ORDERS_INSERTS),
       "windows": (VIEWS_DDL, WINDOWS_INSERTS), "sessions": (VIEWS_DDL, SESSIONS_INSERTS)}
# Each workload's source tables: their CSV files are in --input's subdirectory of that name.
TABLES = {"groupby": ("events",), "orders": ("customers", "orders"),
          "windows": ("page_views",), "sessions": ("page_views",)}

_T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[flink {time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def source_options(directory: Path) -> str:
    return f"'connector' = 'filesystem', 'path' = 'file://{directory}', 'format' = 'csv'"


def statements(workload: str, input_dir: Path) -> tuple[list[str], tuple[str, ...]]:
    """The workload's DDL (sources pointed at their directories) and its INSERTs."""
    ddl, inserts = SQL[workload]
    options = {name: source_options(input_dir / name) for name in TABLES[workload]}
    return [statement.format(**options) for statement in ddl], inserts


def input_rows(workload: str, input_dir: Path) -> int:
    return sum(sum(1 for _ in path.open("rb"))
               for name in TABLES[workload] for path in (input_dir / name).glob("*.csv"))


def archived_job(archive: Path, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The REST answers the mini-cluster archived for the job `job_id`, by path. The
    Dispatcher writes the archive when the job terminates, possibly just after `wait()`
    returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        files = [p for p in archive.rglob(job_id) if p.is_file() and p.parent.name == "jobs"]
        if files:
            try:
                entries = json.loads(files[0].read_text())["archive"]
                return {e["path"]: json.loads(e["json"]) for e in entries}
            except (json.JSONDecodeError, KeyError):
                pass  # still being written
        if time.monotonic() > deadline:
            raise SystemExit(f"flink peer: no job archive in {archive} after {timeout_s} s")
        time.sleep(0.1)


def job_timestamps(job: dict[str, Any]) -> tuple[float, float, float]:
    """(first subtask RUNNING, last subtask RUNNING, job FINISHED), epoch seconds."""
    [jid] = [path.split("/")[2] for path in job if path.count("/") == 2
             and path.startswith("/jobs/") and path != "/jobs/overview"]
    info = job[f"/jobs/{jid}"]
    if info["state"] != "FINISHED":
        raise SystemExit(f"flink peer: the job ended {info['state']}")
    running = [subtask["timestamps"]["RUNNING"]
               for vertex in info["vertices"]
               for subtask in job[f"/jobs/{jid}/vertices/{vertex['id']}/subtasktimes"]["subtasks"]]
    return min(running) / 1e3, max(running) / 1e3, info["timestamps"]["FINISHED"] / 1e3


def submit(env: TableEnvironment, inserts: tuple[str, ...]) -> Any:
    """The workload's job, submitted (its `TableResult`)."""
    job = env.create_statement_set()
    for insert in inserts:
        job.add_insert_sql(insert)
    return job.execute()


def run(workload: str, parallelism: int, events: int, input_dir: Path, warm_s: float = 0
        ) -> dict[str, Any]:
    rows = input_rows(workload, input_dir)
    log(f"flink {FLINK_VERSION}: {workload}, {events:,} events ({rows:,} input rows), "
        f"P={parallelism}{f', after {warm_s:.0f} s of warm-up' if warm_s else ''}")
    # The mini-cluster may still be writing there as it shuts down.
    with tempfile.TemporaryDirectory(prefix="flink-archive-",
                                     ignore_cleanup_errors=True) as archive:
        conf = Configuration()
        conf.set_string("parallelism.default", str(parallelism))
        conf.set_string("jobmanager.archive.fs.dir", f"file://{archive}")
        t0 = time.time()
        env = TableEnvironment.create(EnvironmentSettings.new_instance().in_streaming_mode()
                                      .with_configuration(conf).build())
        created = time.time()
        ddl, inserts = statements(workload, input_dir)
        for statement in ddl:
            env.execute_sql(statement)
        warm_jobs = 0
        while time.time() - created < warm_s:
            submit(env, inserts).wait()
            warm_jobs += 1
        if warm_s:  # timed from its own submission: the JVM and the DDL are behind it
            begun = submitting = time.time()
        else:  # timed from the JVM's launch, its submission from the DDL on
            begun, submitting = t0, created
        result = submit(env, inserts)
        submitted = time.time()
        log(f"job submitted after {submitted - t0:.1f} s")
        result.wait()
        log(f"job finished after {time.time() - t0:.1f} s")
        first_running, last_running, finished = job_timestamps(archived_job(
            Path(archive), str(result.get_job_client().get_job_id())))
    seconds = finished - first_running
    log(f"processing {seconds:.2f} s: {events / seconds:,.0f} events/s; "
        f"job start {first_running - begun:.1f} s")
    start = {"jvm_s": round(created - t0, 3)} if not warm_s else {}
    warm = {"warm_up_s": round(begun - created, 1), "warm_up_jobs": warm_jobs} if warm_s else {}
    return {"peer": "flink", "version": FLINK_VERSION, "workload": workload,
            "parallelism": parallelism, "events": events, "input_rows": rows,
            "seconds": round(seconds, 3), "events_per_s": round(events / seconds),
            "job_start_s": round(first_running - begun, 3),
            "start": {**start, "submit_s": round(submitted - submitting, 3),
                      "deploy_s": round(first_running - submitted, 3)},
            "tasks_running_s": round(last_running - first_running, 3), **warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(TABLES), required=True)
    parser.add_argument("--input", type=Path, required=True,
                        help="directory with one subdirectory of CSV files per source table")
    parser.add_argument("--events", type=int, required=True,
                        help="events the input holds (events/s counts these, not CSV lines)")
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--warm-s", type=float, default=0,
                        help="first run the same job again and again for this many seconds, "
                             "in the same JVM, untimed")
    args = parser.parse_args()
    if args.warm_s < 0:
        parser.error("--warm-s must not be negative")
    # Whatever the JVM or Flink print goes to stderr; the JSON line to the real stdout.
    sys.stdout.flush()
    out_fd = os.dup(1)
    os.dup2(2, 1)
    report = run(args.workload, args.parallelism, args.events, args.input.absolute(),
                 args.warm_s)
    os.write(out_fd, (json.dumps(report) + "\n").encode())


if __name__ == "__main__":
    main()
