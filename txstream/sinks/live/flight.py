"""The live tables over Arrow Flight (`pyarrow.flight`), next to the HTTP port.

* `list_flights`: one flight per served table (its stream schema, `txstream.wire`).
* `do_get` with ticket `{"table": name, "mode": "snapshot"}`: the table as of its last
  transaction, one update message with `snapshot: true`.
* `do_get` with ticket `{"table": name, "mode": "subscribe"}`: that snapshot, then one message
  per transaction until the client cancels (after an overflow of its queue, a fresh snapshot
  replaces the updates it missed; see `txstream.sinks.live.serving`).
* The same with `"viewport": {"first": 0, "last": 49, "sort": [["total", "desc"]]}` and
  `"subscription": <id>`: only the rows at those positions of the table so sorted, and what
  changes among them (`txstream.sinks.live.viewport`).
* `do_action` `viewport` with body `{"table": name, "subscription": <id>, "first": f,
  "last": l}`: move that subscription's viewport; what enters and leaves it comes in its
  stream.

With a token configured, every call must carry `authorization: Bearer <token>`; with a
certificate and key, the server speaks TLS (`grpc+tls://`)."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from txstream.sinks.live.serving import LiveTables, UnknownSubscriptionError, UnknownTableError
from txstream.viewports import Viewport, ViewportError
from txstream.wire import encode, stream_schema

log = logging.getLogger(__name__)
_WAIT_S = 0.25  # how often a waiting subscription checks that its client is still there


class _BearerAuth(flight.ServerMiddlewareFactory):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]
                   ) -> flight.ServerMiddleware | None:
        for value in headers.get("authorization", []):
            given = value.encode() if isinstance(value, str) else bytes(value)
            if hmac.compare_digest(given, self._expected):
                return None
        raise flight.FlightUnauthenticatedError(
            "missing or wrong bearer token: send `authorization: Bearer <token>`")


class LiveFlightServer(flight.FlightServerBase):
    """Serves `tables` at `host:port` (port 0: any free one, see `.port`)."""

    def __init__(self, tables: LiveTables, host: str = "0.0.0.0", port: int = 0, *,
                 token: str | None = None, tls: tuple[bytes, bytes] | None = None) -> None:
        scheme = "grpc+tls" if tls else "grpc+tcp"
        super().__init__(
            f"{scheme}://{host}:{port}",
            tls_certificates=[tls] if tls else None,
            middleware={"auth": _BearerAuth(token)} if token else None)
        self.tables = tables
        self.scheme = scheme

    def shutdown(self) -> None:
        """End every subscription (their streams finish), then stop serving: gRPC waits for
        open streams, which would otherwise wait for updates forever."""
        self.tables.close()
        super().shutdown()

    def _ticket(self, ticket: flight.Ticket
                ) -> tuple[str, str, Viewport | None, str | None]:
        try:
            request = json.loads(ticket.ticket)
            name, mode = request["table"], request.get("mode", "snapshot")
            viewport = request.get("viewport")
            subscription = request.get("subscription")
            viewport = None if viewport is None else Viewport.from_json(viewport)
        except ViewportError as exc:
            raise flight.FlightServerError(str(exc)) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(
                'a ticket is JSON: {"table": <name>, "mode": "snapshot" | "subscribe", '
                '"viewport": {...} (optional), "subscription": <id> (optional)}') from exc
        if mode not in ("snapshot", "subscribe"):
            raise flight.FlightServerError(f"unknown mode {mode!r}; use snapshot or subscribe")
        return name, mode, viewport, None if subscription is None else str(subscription)

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [("viewport", "move a viewport subscription: "
                             '{"table", "subscription", "first", "last"}')]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action
                  ) -> Iterator[bytes]:
        if action.type != "viewport":
            raise flight.FlightServerError(f"unknown action {action.type!r}; the only one is "
                                           "viewport")
        try:
            body = json.loads(action.body.to_pybytes())
            self.tables.move(str(body["table"]), str(body["subscription"]), int(body["first"]),
                             int(body["last"]))
        except (UnknownTableError, UnknownSubscriptionError, ViewportError) as exc:
            raise flight.FlightServerError(exc.args[0] if exc.args else str(exc)) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(
                'a viewport action is JSON: {"table": <name>, "subscription": <id>, '
                f'"first": <int>, "last": <int>}}: {exc}') from exc
        return iter(())

    def list_flights(self, context: flight.ServerCallContext, criteria: bytes
                     ) -> Iterator[flight.FlightInfo]:
        for name in self.tables.names:
            yield self._info(name)

    def get_flight_info(self, context: flight.ServerCallContext,
                        descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        name = descriptor.path[0].decode() if descriptor.path else ""
        return self._info(name)

    def _info(self, name: str) -> flight.FlightInfo:
        try:
            table = self.tables.table(name)
        except UnknownTableError as exc:
            raise flight.FlightServerError(str(exc)) from exc
        ticket = flight.Ticket(json.dumps({"table": name, "mode": "snapshot"}).encode())
        return flight.FlightInfo(stream_schema(table.schema), flight.FlightDescriptor.for_path(
            name), [flight.FlightEndpoint(ticket, [])], table.table.num_rows, -1)

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket
               ) -> flight.FlightDataStream:
        name, mode, viewport, subscription = self._ticket(ticket)
        try:
            served = self.tables.served(name)
        except UnknownTableError as exc:
            raise flight.FlightServerError(str(exc)) from exc
        schema = stream_schema(served.table.schema)
        if mode == "snapshot" and viewport is None:
            return flight.GeneratorStream(schema, encode(served.snapshot(), schema))
        try:
            snapshot, subscriber = self.tables.subscribe(name, viewport, subscription)
        except ViewportError as exc:
            raise flight.FlightServerError(str(exc)) from exc
        if mode == "snapshot":
            self.tables.unsubscribe(name, subscriber)
            return flight.GeneratorStream(schema, encode(snapshot, schema))

        def messages() -> Iterator[tuple[pa.RecordBatch, bytes]]:
            try:
                yield from encode(snapshot, schema)
                while not context.is_cancelled():
                    update = subscriber.next(served, _WAIT_S)
                    if subscriber.closed:
                        return
                    if update is not None:
                        yield from encode(update, schema)
            finally:
                self.tables.unsubscribe(name, subscriber)

        return flight.GeneratorStream(schema, messages())
