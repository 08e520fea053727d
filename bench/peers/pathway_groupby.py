"""Peer benchmark: the throughput workload of bench/engine.py, run on Pathway instead.

Workload (Pathway's own group-by benchmark shape, mirroring bench/engine.py's part 1):
events i = 0..N-1 with key k = i mod K and value v = i mod 1000 (integers), grouped into T
consecutive transactions of N/T events each; a group-by on k computing count and sum(v).
bench/engine.py runs it with N = 1,000,000, K = 10,000 and T = 100 (100 transactions of 10,000
events; each transaction touches every key, so the output stream holds ~2 changes per event).
Its values are doubles, ((i * 7919) mod 10007) / 8, instead of i mod 1000: the keys, the
transactions and the output changes, hence the work, are the same.

    python3 bench/peers/pathway_groupby.py [--events N] [--keys K] [--transactions T]
                                           [--venv DIR] [--feed python|pandas]

Any Python 3 may run it: Pathway lives in its own virtualenv (default
~/.cache/txstream/peers/pathway-venv), which is created with `python3 -m venv` and
`pip install pathway==0.33.0` when missing, and the script re-executes itself with that
venv's interpreter. If the venv or the install fails, the last stdout line is
{"peer": "pathway", "skipped": "<reason>"} and the exit status 0. Otherwise it is

    {"peer": "pathway", "version": ..., "events": N, "keys": K, "transactions": T,
     "seconds": ..., "events_per_s": ..., "threads": PATHWAY_THREADS or 1, "verified": true, ...}

Progress, pip's and Pathway's own output go to stderr (file descriptor 1 is pointed at stderr
while Pathway runs, so no banner or log line can follow the JSON).

How the input is fed (`--feed`, default `python`): a `pw.io.python.ConnectorSubject` with
autocommit disabled sends the N/T rows of each transaction with `next()` and then calls
`commit()`; each commit closes one Pathway time (when the clock has not moved, the engine
bumps the time by 2, so commits are never merged), so Pathway sees exactly T input times and
emits the group-by's updates for each. The subject runs in its own thread, concurrently with
the dataflow, like a live source. The alternative, `--feed pandas`, builds one
`pw.debug.table_from_pandas` table with a `__time__` column (2, 4, .., 2T); it gives the same
times by construction, but Pathway converts it row by row in Python (a fingerprint per row id,
then a DataRow per row) before the dataflow starts, so nothing overlaps, and on this machine it
measured no faster. Rust-side readers (pw.io.csv / fs with one file per transaction) parse
faster but commit on their own schedule: several files share a time, so they would not test T
transactions. Every Pathway API that fixes the transaction boundaries thus pays one Python call
per row; that is the cost of feeding Pathway from Python and is part of the measured time.

Timing (`seconds`) covers building the Pathway input table and graph and `pw.run` until the
input is exhausted and every output update was delivered; it excludes venv creation, pip,
imports and generating the events as Python lists (as engine.py's Arrow input is built before
its clock starts). The output is consumed by `pw.io.subscribe`, whose callback integrates the
change stream in a dict (the analogue of engine.py collecting the consolidated output diffs).
`pw.run` uses `monitoring_level=NONE`; without a license key Pathway sends no telemetry (a
run under strace made no connect() call).

Verification: the integrated output must hold exactly one row per key, equal to numpy's
bincount of count and sum(v); the output must carry updates at exactly T distinct times, and
its number of changes must be what T separate transactions produce (one insertion per key in
the transaction that first touches it, a retraction and an insertion in every later
transaction touching it), so the transactions were not merged into one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only in Pathway's venv, imported there after the bootstrap
    import numpy as np
    import pandas as pd
    import pathway as pw

PATHWAY_PIN = "pathway==0.33.0"
DEFAULT_VENV = Path.home() / ".cache" / "txstream" / "peers" / "pathway-venv"
# Set on re-execution: we are meant to be inside the peer venv, never bootstrap again.
INSIDE_ENV = "TXSTREAM_PATHWAY_PEER_VENV"

_T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[pathway {time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def emit(result: dict[str, Any], fd: int | None = None) -> None:
    """Writes `result` as the last stdout line (to `fd` when stdout was redirected)."""
    line = json.dumps(result) + "\n"
    if fd is None:
        sys.stdout.write(line)
        sys.stdout.flush()
    else:
        os.write(fd, line.encode())


def skip(reason: str) -> None:
    log(f"skipped: {reason}")
    emit({"peer": "pathway", "skipped": reason})
    sys.exit(0)


# --- bootstrap: the peer's own virtualenv ------------------------------------------------


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def inside_venv(venv: Path) -> bool:
    return (os.environ.get(INSIDE_ENV) == str(venv)
            or Path(sys.prefix).resolve() == venv.resolve())


def installed_version(python: Path) -> str | None:
    """Pathway's version in the venv of `python`, None if it is not installed there."""
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('pathway'))"],
        capture_output=True, text=True, check=False)
    return probe.stdout.strip() if probe.returncode == 0 else None


def tail(text: str, lines: int = 3) -> str:
    """The last few lines of a tool's output, its ERROR lines when it printed any."""
    found = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in found if line.startswith("ERROR")]
    return " | ".join((errors or found)[-lines:])


def ensure_venv(venv: Path) -> Path:
    """Creates the venv and installs the pinned Pathway when needed; returns its python."""
    python = venv_python(venv)
    want = PATHWAY_PIN.split("==")[1]
    if installed_version(python) == want:
        return python
    if not python.exists():
        log(f"creating venv {venv}")
        try:
            venv.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            skip(f"cannot create {venv.parent}: {error}")
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)],
                              capture_output=True, text=True, check=False)
        if made.returncode != 0:
            skip(f"python3 -m venv {venv} failed: {tail(made.stderr or made.stdout)}")
    log(f"pip install {PATHWAY_PIN} into {venv} (a minute or two)")
    pip = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                          "--quiet", PATHWAY_PIN], capture_output=True, text=True, check=False)
    if pip.returncode != 0:
        skip(f"pip install {PATHWAY_PIN} failed: {tail(pip.stderr or pip.stdout)}")
    if installed_version(python) != want:
        skip(f"{PATHWAY_PIN} is not importable in {venv} after pip install")
    return python


def reexec_in(venv: Path, python: Path) -> None:
    log(f"re-executing with {python}")
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**os.environ, INSIDE_ENV: str(venv)}
    # The script being run (this one, or another peer that borrows this bootstrap).
    os.execve(str(python), [str(python), os.path.abspath(sys.argv[0]), *sys.argv[1:]], env)


# --- the benchmark, inside the venv ------------------------------------------------------


class Integrated:
    """Consumes the group-by's change stream: integrates it and counts changes and times."""

    def __init__(self) -> None:
        self.net: Counter[tuple[int, int, int]] = Counter()
        self.times: set[int] = set()
        self.changes = 0

    def on_change(self, key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
        self.net[row["k"], row["n"], row["s"]] += 1 if is_addition else -1
        self.times.add(time)
        self.changes += 1


def python_feed(ks: list[int], vs: list[int], per_txn: int) -> pw.Table:
    """A Python connector that commits after each transaction: one Pathway time each."""
    import pathway as pw

    class Events(pw.Schema):
        k: int
        v: int

    class Transactions(pw.io.python.ConnectorSubject):
        def run(self) -> None:
            send = self.next
            for lo in range(0, len(ks), per_txn):
                for k, v in zip(ks[lo:lo + per_txn], vs[lo:lo + per_txn], strict=True):
                    send(k=k, v=v)
                self.commit()

    # autocommit off: only our commits end a minibatch, so they are the transaction bounds.
    return pw.io.python.read(Transactions(), schema=Events, autocommit_duration_ms=None,
                             name="events")


def pandas_feed(frame: pd.DataFrame) -> pw.Table:
    """A static table whose `__time__` column puts each transaction at its own time."""
    import pathway as pw

    return pw.debug.table_from_pandas(frame)


def run_pathway(events: int, keys: int, transactions: int, feed: str, out_fd: int) -> None:
    import numpy as np
    import pandas as pd
    import pathway as pw

    per_txn = events // transactions
    i = np.arange(events, dtype=np.int64)
    k, v = i % keys, i % 1000
    # Prepared before the clock starts, as engine.py's Arrow input is.
    if feed == "python":
        ks, vs = k.tolist(), v.tolist()
    else:
        frame = pd.DataFrame({"k": k, "v": v, "__time__": 2 + 2 * (i // per_txn)})

    log(f"pathway {pw.__version__}: {events:,} events, {keys:,} keys, "
        f"{transactions} transactions, feed={feed}")
    start = time.perf_counter()
    table = python_feed(ks, vs, per_txn) if feed == "python" else pandas_feed(frame)
    sums = table.groupby(pw.this.k).reduce(pw.this.k, n=pw.reducers.count(),
                                           s=pw.reducers.sum(pw.this.v))
    out = Integrated()
    pw.io.subscribe(sums, on_change=out.on_change)
    built = time.perf_counter()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    elapsed = time.perf_counter() - start
    log(f"done in {elapsed:.2f} s (graph and input built in {built - start:.2f} s): "
        f"{events / elapsed:,.0f} events/s, {out.changes:,} output changes "
        f"at {len(out.times)} times")

    verify(out, k, v, i // per_txn, keys, transactions)
    emit({"peer": "pathway", "version": pw.__version__, "events": events, "keys": keys,
          "transactions": transactions, "seconds": round(elapsed, 3),
          "events_per_s": round(events / elapsed),
          "threads": int(os.environ.get("PATHWAY_THREADS") or 1), "verified": True,
          "feed": feed, "output_changes": out.changes, "output_times": len(out.times)},
         out_fd)


def verify(out: Integrated, k: np.ndarray, v: np.ndarray, txn: np.ndarray, keys: int,
           transactions: int) -> None:
    import numpy as np

    want_n = np.bincount(k, minlength=keys)
    want_s = np.bincount(k, weights=v, minlength=keys).astype(np.int64)  # exact below 2**53
    present = np.flatnonzero(want_n)
    rows = sorted(row for row, mult in out.net.items() if mult != 0)
    mults = [out.net[row] for row in rows]
    got = np.array(rows, dtype=np.int64).reshape(-1, 3)
    # Each key first appears with one insertion, later transactions touching it retract
    # the old row and insert the new one.
    touched = len(np.unique(txn * keys + k))
    want_changes = 2 * touched - len(present)
    problems = []
    if set(mults) != {1}:
        problems.append(f"integrated multiplicities {sorted(set(mults))}, expected only 1")
    if not np.array_equal(got[:, 0], present):
        problems.append(f"{len(got)} keys in the output, expected {len(present)}")
    elif not np.array_equal(got[:, 1], want_n[present]):
        problems.append("counts differ from numpy")
    elif not np.array_equal(got[:, 2], want_s[present]):
        problems.append("sums differ from numpy")
    if len(out.times) != transactions:
        problems.append(f"output at {len(out.times)} times, expected {transactions}")
    if out.changes != want_changes:
        problems.append(f"{out.changes} output changes, expected {want_changes}")
    if problems:
        raise SystemExit("pathway peer: verification FAILED: " + "; ".join(problems))
    log(f"verified: {len(present):,} keys, counts and sums equal numpy's, "
        f"{transactions} times, {want_changes:,} changes")


# --- main ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--transactions", type=int, default=100)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                        help=f"the peer's virtualenv (default {DEFAULT_VENV})")
    parser.add_argument("--feed", choices=["python", "pandas"], default="python",
                        help="input: Python connector committing per transaction (default), "
                             "or a pandas table with a __time__ column")
    args = parser.parse_args()
    if min(args.events, args.keys, args.transactions) < 1:
        parser.error("--events, --keys and --transactions must be positive")
    if args.events % args.transactions:
        parser.error("--events must be a multiple of --transactions")
    args.venv = args.venv.expanduser().absolute()
    return args


def enter_venv(venv: Path) -> int:
    """Re-execute the running script in the peer's venv (made when missing) unless already
    there; then check Pathway imports and point stdout at stderr. Returns a descriptor of the
    real stdout, for the JSON line."""
    if not inside_venv(venv):
        reexec_in(venv, ensure_venv(venv))
    try:
        import pathway  # noqa: F401 (fails here, not mid-run, when the venv is broken)
    except ImportError as error:
        skip(f"cannot import pathway in {sys.prefix}: {error}")
    # Anything Pathway prints (logs, banners, from Python or Rust) goes to stderr; the JSON
    # line goes to the real stdout.
    sys.stdout.flush()
    out_fd = os.dup(1)
    os.dup2(2, 1)
    return out_fd


def main() -> None:
    args = parse_args()
    out_fd = enter_venv(args.venv)
    run_pathway(args.events, args.keys, args.transactions, args.feed, out_fd)


if __name__ == "__main__":
    main()
