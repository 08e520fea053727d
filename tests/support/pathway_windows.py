"""Run inside Pathway's virtualenv (`tests/support/pathway_peer.py`): the changes of one source
through Pathway's `windowby(...).reduce(...)`, each window's update stream written as JSON.

    <pathway-venv>/bin/python tests/support/pathway_windows.py INPUT.json OUTPUT.json

INPUT: {"rows": [[id, user_id, ts, v, transaction, diff], ...], "windows": {name: {"kind":
"tumbling" | "sliding", "hop", "duration", "origin" (or null) | "kind": "session", "max_gap";
"instance": bool, "behavior":
null | {"kind": "common", "delay", "cutoff", "keep_results"} | {"kind": "exactly_once",
"shift"}}}}. Transaction N
is Pathway time 2N. OUTPUT: {name: [[user_id (with instance), window_start, window_end, n, s,
pathway time, diff], ...]}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pathway as pw


class Events(pw.Schema):
    key: int = pw.column_definition(primary_key=True)  # Pathway reserves `id`
    user_id: int
    ts: int
    v: int


def behavior(spec: dict[str, Any] | None) -> Any:
    """A temporal behavior from its JSON form (None: none)."""
    if spec is None:
        return None
    if spec["kind"] == "exactly_once":
        return pw.temporal.exactly_once_behavior(shift=spec["shift"])
    return pw.temporal.common_behavior(delay=spec["delay"], cutoff=spec["cutoff"],
                                       keep_results=spec["keep_results"])


def main(source: str, target: str) -> None:
    spec = json.loads(Path(source).read_text())
    rows = [(i, user, ts, v, 2 * transaction, diff)
            for i, user, ts, v, transaction, diff in spec["rows"]]
    events = pw.debug.table_from_rows(Events, rows, is_stream=True)
    streams: dict[str, list[list[Any]]] = {}
    for name, window in spec["windows"].items():
        if window["kind"] == "session":
            kind = pw.temporal.session(max_gap=window["max_gap"])
        elif window["kind"] == "tumbling":
            kind = pw.temporal.tumbling(duration=window["duration"], origin=window["origin"])
        else:
            kind = pw.temporal.sliding(hop=window["hop"], duration=window["duration"],
                                       origin=window["origin"])
        instance = events.user_id if window["instance"] else None
        grouped = events.windowby(events.ts, window=kind, instance=instance,
                                  behavior=behavior(window.get("behavior")))
        columns = ({"user_id": pw.this._pw_instance} if window["instance"] else {}) | {
            "window_start": pw.this._pw_window_start, "window_end": pw.this._pw_window_end,
            "n": pw.reducers.count(), "s": pw.reducers.sum(pw.this.v)}
        result = grouped.reduce(**columns)
        changes: list[list[Any]] = []
        streams[name] = changes
        names = list(columns)

        def record(key: Any, row: dict[str, Any], time: int, is_addition: bool,
                   changes: list[list[Any]] = changes, names: list[str] = names) -> None:
            changes.append([row[n] for n in names] + [time, 1 if is_addition else -1])

        pw.io.subscribe(result, on_change=record)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    Path(target).write_text(json.dumps(streams))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
