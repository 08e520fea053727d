"""A client of txstream's live tables (served over Arrow Flight by the service, see
docs/guide.md, "Subscribing to live tables"):

    from txstream.client import LiveClient
    from txstream.viewports import Viewport

    client = LiveClient("grpc+tcp://localhost:8815", token="...")
    print(client.tables())
    rows, transaction = client.snapshot("customer_stats")
    with client.subscribe("customer_stats") as subscription:
        for update in subscription:          # one per transaction
            print(update.transaction, len(update.added), len(update.removed))
            table = subscription.mirror.rows()   # the table as of that transaction
        # or: subscription.run(lambda update, mirror: ...), called back per transaction

    # Only the 50 largest totals, and what changes among them:
    top = client.subscribe("customer_stats", Viewport.of(0, 49, [("total", "desc")]))
    top.move(50, 99)                         # scroll: the next update brings rows 50-99

Each update is a `txstream.updates.TableUpdate` (added, removed, modified, shifts, modified
columns); the subscription applies it to its `Mirror` before handing it over, so the mirror
always equals the served table as of `subscription.mirror.transaction` (for a viewport: the
rows at its positions, in its sort order, keyed by the sorted view's row keys).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Self

import pyarrow as pa
import pyarrow.flight as flight

from txstream.updates import ROW_KEY, Mirror, TableUpdate
from txstream.viewports import Viewport
from txstream.wire import chunks_of, decode


class LiveClientError(RuntimeError):
    """The server refused a request or ended a stream with an error."""


def _table_schema(stream: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in stream if f.name != ROW_KEY])


def _read_update(reader: flight.FlightStreamReader, schema: pa.Schema) -> TableUpdate | None:
    """The next update message of a stream, or None at its end."""
    try:
        first = reader.read_chunk()
    except StopIteration:
        return None
    if first.app_metadata is None:
        raise LiveClientError("a stream message came without its update metadata")
    metadata = first.app_metadata.to_pybytes()
    batches = [first.data]
    for _ in range(chunks_of(metadata) - 1):
        batches.append(reader.read_chunk().data)
    return decode(metadata, batches, schema)


class Subscription:
    """A live table's updates as they come, applied to `mirror`; iterate to receive them,
    `close` (or leave the `with` block) to end it."""

    def __init__(self, reader: flight.FlightStreamReader, viewport: Viewport | None = None,
                 move: Callable[[int, int], None] | None = None) -> None:
        self._reader = reader
        self._move = move
        self.viewport = viewport
        self._schema = reader.schema
        self._closed = False
        self.mirror = Mirror(_table_schema(self._schema))

    def __iter__(self) -> Iterator[TableUpdate]:
        return self

    def __next__(self) -> TableUpdate:
        if self._closed:
            raise StopIteration
        try:
            update = _read_update(self._reader, self._schema)
        except flight.FlightError as exc:
            if self._closed:  # cancelled by `close`, from another thread
                raise StopIteration from None
            raise LiveClientError(f"the subscription ended: {exc}") from exc
        if update is None:
            raise StopIteration
        self.mirror.apply(update)
        return update

    def run(self, callback: Callable[[TableUpdate, Mirror], None]) -> None:
        """Call `callback(update, mirror)` per update, the mirror already updated, until the
        subscription ends (`close`, from the callback or another thread)."""
        for update in self:
            callback(update, self.mirror)

    def move(self, first: int, last: int) -> None:
        """Move the viewport to positions `first`..`last` (a viewport subscription only): a
        later update removes the rows that left it and adds those that entered."""
        if self.viewport is None or self._move is None:
            raise LiveClientError("this subscription is to the whole table; subscribe with a "
                                  "viewport to move one")
        moved = self.viewport.moved(first, last)
        self._move(first, last)
        self.viewport = moved

    def close(self) -> None:
        """End the subscription; an iteration waiting in another thread stops."""
        self._closed = True
        self._reader.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class LiveClient:
    """Connects to a service's live tables at `location` (`grpc+tcp://host:port`, or
    `grpc+tls://...` with `tls_root_certs` when the server's certificate is not trusted
    system-wide)."""

    def __init__(self, location: str, *, token: str | None = None,
                 tls_root_certs: bytes | None = None) -> None:
        kwargs = {"tls_root_certs": tls_root_certs} if tls_root_certs else {}
        self._client = flight.FlightClient(location, **kwargs)
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(headers=headers)

    def tables(self) -> list[str]:
        """The names of the served tables."""
        try:
            return [info.descriptor.path[0].decode()
                    for info in self._client.list_flights(options=self._options)]
        except flight.FlightError as exc:
            raise LiveClientError(str(exc)) from exc

    def _get(self, table: str, mode: str, **extra: object) -> flight.FlightStreamReader:
        ticket = flight.Ticket(json.dumps({"table": table, "mode": mode, **extra}).encode())
        try:
            return self._client.do_get(ticket, options=self._options)
        except flight.FlightError as exc:
            raise LiveClientError(str(exc)) from exc

    def _action(self, name: str, body: dict[str, object]) -> None:
        try:
            for _ in self._client.do_action(flight.Action(name, json.dumps(body).encode()),
                                            options=self._options):
                pass
        except flight.FlightError as exc:
            raise LiveClientError(str(exc)) from exc

    def snapshot(self, table: str, viewport: Viewport | None = None) -> tuple[pa.Table, int]:
        """The table's rows (with `__row_key`, in key order), or those of `viewport`, and the
        transaction they are as of."""
        extra = {} if viewport is None else {"viewport": viewport.to_json()}
        reader = self._get(table, "snapshot", **extra)
        try:
            update = _read_update(reader, reader.schema)
        except flight.FlightError as exc:
            raise LiveClientError(str(exc)) from exc
        if update is None:
            raise LiveClientError(f"the snapshot of {table!r} came empty")
        return update.rows, update.transaction

    def subscribe(self, table: str, viewport: Viewport | None = None) -> Subscription:
        """The table's snapshot, then its updates (see `Subscription`); with `viewport`, only
        the rows at its positions and what changes among them."""
        if viewport is None:
            return Subscription(self._get(table, "subscribe"))
        subscription = uuid.uuid4().hex

        def move(first: int, last: int) -> None:
            self._action("viewport", {"table": table, "subscription": subscription,
                                      "first": first, "last": last})

        return Subscription(self._get(table, "subscribe", subscription=subscription,
                                      viewport=viewport.to_json()), viewport, move)

    def close(self) -> None:
        self._client.close()
