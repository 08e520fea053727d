"""Apache Flink as a benchmark peer: bench/engine.py's group-by workload, the example orders
pipeline, and bench/temporal.py's windows and sessions run by Flink SQL
(bench/peers/flink_workloads.py, whose doc says what runs and what is timed), in a virtualenv of
its own.

`run_flink(workload, parallelism, events[, warm_s])` makes sure the venv exists (created beside
Pathway's, ~/.cache/txstream/peers/flink-venv, with `apache-flink==2.3.0` from PyPI, which
bundles Flink's jars; progress to stderr), writes the workload's CSV input to a temporary
directory, runs the peer script with the venv's interpreter and returns its JSON report. When
the venv cannot be made or the run fails it returns {"peer": "flink", "skipped": reason}, as
bench/engine.py's Pathway peer does, so that a benchmark goes on without it. With `warm_s` the
job is first run untimed for that long in the same JVM (bench/scale.py --warm-s; this script's
own command line measures cold JVMs only).

    .venv/bin/python bench/flink_peer.py [--events N] [--orders-events N] [--parallelism 1,2]

runs both workloads at each parallelism (default 1 and 2, 1,000,000 events each) and prints one
JSON document, with the load average before and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from txstream.examples.order_events import Event
from txstream.examples.order_events import events as order_events

FLINK_PIN = "apache-flink==2.3.0"
DEFAULT_VENV = Path.home() / ".cache" / "txstream" / "peers" / "flink-venv"
PEER = Path(__file__).resolve().parent / "peers" / "flink_workloads.py"
WORKLOADS = ("groupby", "orders", "windows", "sessions")

# The group-by workload: bench/engine.py's throughput workload.
KEYS = 10_000
V_MULT = 7_919
V_MOD = 10_007
V_SCALE = 8.0
# The orders workload: the example pipeline's events with this many customers.
CUSTOMERS = 10_000
ORDERS_SEED = 11  # bench/engine.py's latency part draws its order events from the same seed

_T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[flink-peer {time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr,
          flush=True)


# --- the venv ---------------------------------------------------------------------------


def installed_version(python: Path) -> str | None:
    """PyFlink's version in the venv of `python`, None if it is not installed there."""
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('apache-flink'))"],
        capture_output=True, text=True, check=False)
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_venv(venv: Path = DEFAULT_VENV) -> Path:
    """The venv's python, after creating the venv and installing the pinned PyFlink when
    needed. Raises RuntimeError when that fails."""
    python = venv / "bin" / "python"
    want = FLINK_PIN.split("==")[1]
    if installed_version(python) == want:
        return python
    if not python.exists():
        log(f"creating venv {venv}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)],
                              stdout=sys.stderr, check=False)
        if made.returncode != 0:
            raise RuntimeError(f"python -m venv {venv} failed (exit {made.returncode})")
    log(f"pip install {FLINK_PIN} into {venv} (about 450 MB, a few minutes)")
    # pip's own progress goes to our stderr as it happens.
    pip = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                          "--progress-bar", "off", FLINK_PIN], stdout=sys.stderr, check=False)
    if pip.returncode != 0:
        raise RuntimeError(f"pip install {FLINK_PIN} failed (exit {pip.returncode})")
    if installed_version(python) != want:
        raise RuntimeError(f"{FLINK_PIN} is not importable in {venv} after pip install")
    log(f"{FLINK_PIN} installed")
    return python


# --- the input --------------------------------------------------------------------------


def write_csv(directory: Path, parts: int, part_of: np.ndarray, table: pa.Table) -> None:
    """`table` as `parts` headerless CSV files in `directory`, row r in file part_of[r]: the
    peer's source reads one file per subtask (see its doc), each key's rows in their order."""
    directory.mkdir(parents=True)
    for part in range(parts):
        rows = table.filter(pa.array(part_of == part))
        pacsv.write_csv(rows, directory / f"part-{part}.csv",
                        pacsv.WriteOptions(include_header=False, quoting_style="none"))


def write_groupby(directory: Path, events: int, parts: int) -> None:
    i = np.arange(events, dtype=np.int64)
    k = i % KEYS
    v = ((i * V_MULT) % V_MOD).astype(np.float64) / V_SCALE  # bench/engine.py's value_of
    write_csv(directory / "events", parts, k % parts, pa.table({"k": k, "v": v}))


def changes(stream: Iterable[Event]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(source, op, row) for each change the events make: what `as_changes` hands the engine
    (-1 old, +1 new), as Flink's row kinds."""
    current: dict[str, dict[int, dict[str, Any]]] = {"customers": {}, "orders": {}}
    for source, key, row in stream:
        rows = current[source]
        old = rows.pop(key, None)
        if row is None:
            if old is not None:
                yield source, "-D", old
            continue
        rows[key] = row
        if old is None:
            yield source, "+I", row
        else:
            yield source, "-U", old
            yield source, "+U", row


def write_orders(directory: Path, events: int, parts: int) -> None:
    stream = order_events(random.Random(ORDERS_SEED), CUSTOMERS)
    columns: dict[str, dict[str, list[Any]]] = {
        "customers": {"op": [], "customer_id": [], "name": [], "region": []},
        "orders": {"op": [], "order_id": [], "customer_id": [], "amount": [], "status": []}}
    for source, op, row in changes(next(stream) for _ in range(events)):
        out = columns[source]
        out["op"].append(op)
        for name, values in out.items():
            if name != "op":
                # Amounts are Decimals: their str is the exact decimal(12,2) text.
                values.append(str(row[name]) if name == "amount" else row[name])
    for source, key in (("customers", "customer_id"), ("orders", "order_id")):
        table = pa.table(columns[source])
        write_csv(directory / source, parts, table[key].to_numpy() % parts, table)


def write_views(directory: Path, parts: int, user_id: np.ndarray, ts_us: np.ndarray) -> None:
    """bench/temporal.py's page views (`ts_us` microseconds since the epoch), as the windows'
    and the sessions' input: each user's views in one file, in their order."""
    table = pa.table({"user_id": user_id,
                      "ts": pa.array(ts_us // 1000, pa.int64()).cast(pa.timestamp("ms"))})
    write_csv(directory / "page_views", parts, user_id % parts, table)


# --- running the peer -------------------------------------------------------------------


def run_flink(workload: str, parallelism: int, events: int, warm_s: float = 0,
              write: Callable[[Path, int], None] | None = None) -> dict[str, Any]:
    """`workload` (one of `WORKLOADS`) over `events` events, run by Flink at `parallelism`
    (after `warm_s` seconds of the same job run untimed in its JVM): the peer script's JSON
    report, or {"peer": "flink", "skipped": reason}. `write(directory, parts)` writes the
    input of the windows and the sessions (`write_views`)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}, expected one of {WORKLOADS}")
    try:
        python = ensure_venv()
    except (OSError, RuntimeError) as error:
        log(f"skipped: {error}")
        return {"peer": "flink", "skipped": str(error)}
    with tempfile.TemporaryDirectory(prefix="flink-input-") as tmp:
        log(f"writing the {workload} input: {events:,} events in {parallelism} part(s)")
        if write is not None:
            write(Path(tmp), parallelism)
        elif workload in ("groupby", "orders"):
            (write_groupby if workload == "groupby" else write_orders)(Path(tmp), events,
                                                                       parallelism)
        else:
            raise ValueError(f"workload {workload!r} needs its input written (write=)")
        log(f"running {workload} at P={parallelism}")
        # Flink's progress and logs pass through to our stderr; the report is stdout's last line.
        done = subprocess.run(
            [str(python), str(PEER), "--workload", workload, "--input", tmp,
             "--events", str(events), "--parallelism", str(parallelism),
             "--warm-s", str(warm_s)],
            stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"peer": "flink", "workload": workload, "parallelism": parallelism,
                "skipped": f"exit {done.returncode} (its stderr above)"}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="group-by workload events (default 1,000,000)")
    parser.add_argument("--orders-events", type=int, default=1_000_000,
                        help="orders workload events, the 10,000 customers' inserts included "
                             "(default 1,000,000)")
    parser.add_argument("--parallelism", default="1,2",
                        help="comma-separated parallelisms (default 1,2)")
    args = parser.parse_args()
    parallelisms = [int(p) for p in args.parallelism.split(",")]
    report: dict[str, Any] = {"load_average_start": [round(x, 2) for x in os.getloadavg()],
                              "runs": []}
    for workload, events in (("groupby", args.events), ("orders", args.orders_events)):
        for parallelism in parallelisms:
            report["runs"].append(run_flink(workload, parallelism, events))
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
