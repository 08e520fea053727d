"""Pathway 0.33 itself as an oracle: its own virtualenv (made on first use, as the benchmarks'
is: `~/.cache/txstream/peers/pathway-venv`), and programs run there that put the same changes
through Pathway's `windowby` (`tests/support/pathway_windows.py`) or its joins by time
(`tests/support/pathway_joins.py`) and print the update streams.

One Pathway time per transaction: transaction N is Pathway time 2N (Pathway's times of input
are even), so an update stream maps back exactly, time by time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.pathway_streams import in_stream_order
from support.temporal_model import Behavior, Windows

PIN = "pathway==0.33.0"
VENV = Path.home() / ".cache" / "txstream" / "peers" / "pathway-venv"
WINDOWS = Path(__file__).with_name("pathway_windows.py")
JOINS = Path(__file__).with_name("pathway_joins.py")
# The time at which Pathway releases what its buffers still hold when the input ends
# (u64::MAX rounded down to even).
END_OF_INPUT = 2**64 - 2


def _version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                            "print(m.version('pathway'))"], capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


def pathway_python() -> Path:
    """The interpreter of a virtualenv with Pathway at `PIN`, installed from PyPI if missing
    (a minute or two, once per machine)."""
    python = VENV / "bin" / "python"
    want = PIN.split("==")[1]
    if _version(python) != want:
        if not python.exists():
            VENV.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                              "--disable-pip-version-check", PIN], capture_output=True,
                             text=True)
        assert pip.returncode == 0, f"pip install {PIN} into {VENV} failed:\n{pip.stderr}"
    assert _version(python) == want, f"{PIN} is not importable in {VENV}"
    return python


def _streams(program: Path, spec: dict[str, Any], work: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Run `program` in Pathway's virtualenv on the JSON `spec`: per name, its output's changes
    (*row, transaction, diff) consolidated, in stream order, without what Pathway flushes at the
    end of its input."""
    given, out = work / "pathway-input.json", work / "pathway-output.json"
    given.write_text(json.dumps(spec))
    run = subprocess.run([str(pathway_python()), str(program), str(given), str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"Pathway failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    streams = {}
    for name, changes in json.loads(out.read_text()).items():
        net: Counter[tuple[Any, ...]] = Counter()
        for *row, time, diff in changes:
            if time >= END_OF_INPUT:
                continue  # what Pathway flushes when its input ends; a service's never does
            net[(*row, time // 2)] += diff
        streams[name] = in_stream_order((*key, diff) for key, diff in net.items() if diff)
    return streams


def windows_streams(rows: Sequence[tuple[Any, ...]], windows: dict[str, dict[str, Any]],
                    work: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Pathway's update stream of each window reduce of `windows` (name -> `kind` "tumbling" or
    "sliding", `hop`, `duration`, `origin` or None, or "session", `max_gap`; `instance` bool,
    optionally `behavior`: see `tests/support/pathway_windows.py`) over the changes `rows` (id,
    user_id, ts, v, transaction, diff)."""
    return _streams(WINDOWS, {"rows": [list(r) for r in rows], "windows": windows}, work)


def joins_streams(sides: dict[str, Sequence[tuple[tuple[Any, ...], int, int]]],
                  joins: dict[str, dict[str, Any]], work: Path, nudged: bool = False
                  ) -> dict[str, list[tuple[Any, ...]]]:
    """Pathway's update stream of each join by time of `orders` with `prices` on the product
    (name -> a left as-of join or an interval join, optionally under a behavior; with
    `nudged`, a row after each transaction makes Pathway forget when txstream does: see
    `tests/support/pathway_joins.py`), given each side's (row, transaction, diff) changes."""
    spec = {name: [[*row, number, diff] for row, number, diff in changes]
            for name, changes in sides.items()}
    return _streams(JOINS, spec | {"joins": joins, "nudged": nudged}, work)


def pathway_spec(windows: Windows, behavior: Behavior | None, instance: bool
                 ) -> dict[str, Any]:
    """The JSON form (`windows_streams`) of a windowed reduce with `behavior`."""
    shown: dict[str, Any] | None = None
    if behavior is not None:
        shown = {"kind": "common", "delay": behavior.delay, "cutoff": behavior.cutoff,
                 "keep_results": behavior.keep_results}
    return {"kind": "tumbling" if windows.hop == windows.duration else "sliding",
            "hop": windows.hop, "duration": windows.duration, "origin": windows.origin,
            "instance": instance, "behavior": shown}
