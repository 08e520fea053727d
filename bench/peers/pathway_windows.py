"""Peer benchmark: bench/temporal.py's windowed workload, run on Pathway 0.33 instead.

The page views bench/temporal.py generated (an .npz of `view_id`, `user_id`, `ts` in
microseconds and `transaction`), fed by a `pw.io.python.ConnectorSubject` that commits after
each transaction (one Pathway time each, as bench/peers/pathway_groupby.py explains), through

    views.windowby(views.ts, window=pw.temporal.tumbling(duration=60_000_000),
                   instance=views.user_id, behavior=pw.temporal.exactly_once_behavior())
         .reduce(user_id=pw.this._pw_instance, window_start=pw.this._pw_window_start,
                 views=pw.reducers.count())

Event times are integers (microseconds since the epoch): Pathway's origin for integers is 0,
which puts minute windows where txstream's timestamp windows are (its origin, 1973-01-01, is a
whole number of minutes after the epoch). Timing covers building the input table and graph and
`pw.run` until the input is exhausted and every update was delivered (pw.io.subscribe
integrates them), as bench/peers/pathway_groupby.py's does; the windows Pathway flushes when
its input ends (at its last time) are left out, as a service never ends its input. The
integrated rows are written to OUTPUT.npz (`user_id`, `window_start`, `views`), which
bench/temporal.py checks against its own recompute.

    python3 bench/peers/pathway_windows.py INPUT.npz OUTPUT.npz [--venv DIR]

Prints {"peer": "pathway", "version", "events", "seconds", "events_per_s", ...} as the last
stdout line, or {"peer": "pathway", "skipped": reason}.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pathway_groupby import DEFAULT_VENV, emit, enter_venv, log

# The time at which Pathway releases what its buffers hold when the input ends.
END_OF_INPUT = 2**64 - 2
MINUTE_US = 60_000_000


def run(source: Path, target: Path, out_fd: int) -> None:
    import numpy as np
    import pathway as pw

    data = np.load(source)
    ids, users, ts = (data[c].tolist() for c in ("view_id", "user_id", "ts"))
    bounds = np.flatnonzero(np.diff(data["transaction"])) + 1
    cuts = [0, *bounds.tolist(), len(ids)]

    class Views(pw.Schema):
        view_id: int
        user_id: int
        ts: int

    class Transactions(pw.io.python.ConnectorSubject):
        def run(self) -> None:
            send = self.next
            for lo, hi in itertools.pairwise(cuts):
                for i in range(lo, hi):
                    send(view_id=ids[i], user_id=users[i], ts=ts[i])
                self.commit()

    net: Counter[tuple[int, int, int]] = Counter()

    def on_change(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
        if time < END_OF_INPUT:
            net[row["user_id"], row["window_start"], row["views"]] += 1 if is_addition else -1

    log(f"pathway {pw.__version__}: {len(ids):,} views in {len(cuts) - 1} transactions")
    start = time.perf_counter()
    views = pw.io.python.read(Transactions(), schema=Views, autocommit_duration_ms=None,
                              name="views")
    per_minute = views.windowby(
        views.ts, window=pw.temporal.tumbling(duration=MINUTE_US), instance=views.user_id,
        behavior=pw.temporal.exactly_once_behavior(),
    ).reduce(user_id=pw.this._pw_instance, window_start=pw.this._pw_window_start,
             views=pw.reducers.count())
    pw.io.subscribe(per_minute, on_change=on_change)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    elapsed = time.perf_counter() - start
    rows = [row for row, weight in net.items() if weight]
    assert all(net[row] == 1 for row in rows), "an integrated row twice"
    np.savez(target, **{name: np.array([row[i] for row in rows], dtype=np.int64)
                        for i, name in enumerate(("user_id", "window_start", "views"))})
    log(f"done in {elapsed:.2f} s: {len(ids) / elapsed:,.0f} events/s, {len(rows):,} windows")
    emit({"peer": "pathway", "version": pw.__version__, "events": len(ids),
          "transactions": len(cuts) - 1, "seconds": round(elapsed, 3),
          "events_per_s": round(len(ids) / elapsed), "windows_out": len(rows)}, out_fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args()
    out_fd = enter_venv(args.venv.expanduser().absolute())
    run(args.source, args.target, out_fd)


if __name__ == "__main__":
    main()
