"""The live table page, `/ui` on the service's HTTP port: the served tables, each shown
through a viewport subscription (`txstream.sinks.live.viewport`) whose updates reach the browser as
server-sent events and are applied there the way `txstream.updates.Mirror` applies them.
Scrolling moves the viewport; clicking a column header sorts by it. No build step, no file
from the internet: one HTML page (`ui.html`) with its script.
Routing over HTTP, the event stream and the page's token: `txstream.sinks.live.page_http`.

* `GET /ui`: the page.
* `GET /ui/tables`: the tables (name, columns, rows, transaction) and the pipeline's status.
* `GET /ui/events?table=t&first=0&last=22&sort=total:desc`: a stream of events: `hello` (the
  subscription's id), then `update` per transaction or move (keys as decimal strings: they
  exceed a JavaScript number's 2^53), and `status` every second; `failure` if refused.
* `POST /ui/move?table=t&subscription=id&first=&last=`: move that viewport.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import numpy as np

from txstream.sinks.live.serving import LiveTables, UnknownSubscriptionError, UnknownTableError
from txstream.updates import ROW_KEY, TableUpdate
from txstream.viewports import Viewport, ViewportError

STATUS_EVERY_S = 1.0
_WAIT_S = 0.25
PAGE_ROWS = 23  # the viewport of a request that names none


class PageRequestError(ValueError):
    """A request of the page's that names no table, or an unknown one, or a bad viewport."""


def _keys(keys: np.ndarray) -> list[str]:
    return [str(k) for k in keys.tolist()]


def _cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or infinities
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return str(value)  # a JavaScript number would round it
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)  # decimals, timestamps, bytes


def event(name: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def message(update: TableUpdate) -> dict[str, Any]:
    """A viewport's update as the page applies it."""
    rows = [{k: (str(v) if k == ROW_KEY else _cell(v)) for k, v in row.items()}
            for row in update.rows.to_pylist()]
    return {
        "transaction": update.transaction, "snapshot": update.snapshot,
        "removed": _keys(update.removed), "added": _keys(update.added),
        "modified": _keys(update.modified),
        "shifts": [[str(s.start), str(s.end), str(s.delta)] for s in update.shifts],
        "modified_columns": {c: _keys(k) for c, k in update.modified_columns.items()},
        "rows": rows, "first": update.first, "size": update.size,
    }


def _viewport(query: Mapping[str, str]) -> Viewport:
    try:
        first = int(query.get("first", 0))
        last = int(query.get("last", first + PAGE_ROWS - 1))
        sort = [tuple(part.split(":", 1)) for part in query.get("sort", "").split(",") if part]
        return Viewport.of(first, last, [(c, d) for c, d in sort])
    except ValueError as exc:  # ViewportError too
        raise PageRequestError(f"bad viewport: {exc} (first, last: positions; sort: "
                               "column:asc|desc, comma-separated)") from exc


class LivePage:
    """Answers the page's requests from `tables`; `status` gives the pipeline's status."""

    def __init__(self, tables: LiveTables | None, status: Callable[[], dict[str, Any]]) -> None:
        self.tables = tables
        self.status = status
        self._html = resources.files("txstream.sinks.live").joinpath("ui.html").read_bytes()

    def html(self) -> bytes:
        return self._html

    def listing(self) -> dict[str, Any]:
        tables = []
        for name in self.tables.names if self.tables is not None else []:
            table = self.tables.table(name)  # type: ignore[union-attr]
            tables.append({"name": name, "columns": table.schema.names,
                           "primary_key": table.primary_key, "rows": table.table.num_rows,
                           "transaction": table.transaction})
        return {"tables": tables, "status": self.status()}

    def _table(self, query: Mapping[str, str]) -> str:
        if self.tables is None:
            raise PageRequestError("this service has no live tables: give an output a sink of "
                                   "kind live")
        name = query.get("table", "")
        try:
            self.tables.served(name)
        except UnknownTableError as exc:
            raise PageRequestError(exc.args[0]) from exc
        return name

    def move(self, query: Mapping[str, str]) -> None:
        name = self._table(query)
        viewport = _viewport(query)
        try:
            self.tables.move(name, query.get("subscription", ""),  # type: ignore[union-attr]
                             viewport.first, viewport.last)
        except UnknownSubscriptionError as exc:
            raise PageRequestError(exc.args[0]) from exc

    def stream(self, query: Mapping[str, str], write: Callable[[bytes], None]) -> None:
        """Write the events of one subscription until the client goes away (`write` raises
        OSError) or the tables close."""
        try:
            name = self._table(query)
            viewport = _viewport(query)
            identity = uuid.uuid4().hex
            tables = self.tables
            assert tables is not None
            snapshot, subscriber = tables.subscribe(name, viewport, identity)
        except (PageRequestError, ViewportError) as exc:
            write(event("failure", {"error": str(exc.args[0] if exc.args else exc)}))
            return
        served = tables.served(name)

        def send(update: TableUpdate) -> None:
            write(event("update", message(update)))

        try:
            write(event("hello", {"subscription": identity}))
            send(snapshot)
            write(event("status", self.status()))
            status_at = time.monotonic()
            while not subscriber.closed:
                update = subscriber.next(served, _WAIT_S)
                if update is not None:
                    send(update)
                if time.monotonic() - status_at >= STATUS_EVERY_S:
                    write(event("status", self.status()))
                    status_at = time.monotonic()
        except OSError:
            return  # the browser went away
        finally:
            tables.unsubscribe(name, subscriber)
