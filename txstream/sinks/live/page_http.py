"""The live page over HTTP: routing of `/ui` and below (`txstream.sinks.live.page` answers),
its server-sent events, and its token.

With a token, every `/ui` path answers 401 unless the request gives it: as `?token=` (then
kept in an HttpOnly cookie, so that the page's own requests carry it), in that cookie, or as
`Authorization: Bearer`. The token is fixed when the endpoint is made, before any table is
attached, so the page never answers without it, not even its status while the service starts.

The service's HTTP server (`txstream.service.health.HealthServer`) hands these paths here."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

from txstream.sinks.live.page import LivePage, PageRequestError
from txstream.sinks.live.serving import LiveTables

COOKIE = "txstream_live_token"
_TEXT = "text/plain; charset=utf-8"


def query_of(text: str) -> dict[str, str]:
    """A query string's parameters, percent-decoded only: a `+` stays a `+` (a token's
    base64 would otherwise lose it)."""
    pairs = (part.partition("=") for part in text.split("&") if part)
    return {unquote(k): unquote(v) for k, _, v in pairs}


def reply(request: BaseHTTPRequestHandler, status: int, data: bytes, ctype: str,
          cookie: str | None = None) -> None:
    """Answer `request` with `data`, setting `cookie` if given."""
    request.send_response(status)
    if cookie:
        request.send_header("Set-Cookie", cookie)
    request.send_header("Content-Type", ctype)
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


class PageEndpoint:
    """Answers the page's requests: `GET /ui`, `/ui/tables`, `/ui/events`, `POST /ui/move`
    (see `txstream.sinks.live.page`), to those who give `token` when one is set. Until
    `attach`, the page has no tables and shows the pipeline's `status` only."""

    def __init__(self, status: Callable[[], dict[str, Any]], token: str | None) -> None:
        self.page = LivePage(None, status)
        self._token = token

    def attach(self, tables: LiveTables) -> None:
        """Show `tables` on the page."""
        self.page.tables = tables

    @staticmethod
    def handles(path: str) -> bool:
        return path.startswith("/ui")

    def get(self, request: BaseHTTPRequestHandler, path: str, query: str) -> None:
        params = query_of(query)
        allowed, cookie = self._allowed(request, params)
        if not allowed:
            return
        if path == "/ui/events":
            request.send_response(200)
            request.send_header("Content-Type", "text/event-stream")
            request.send_header("Cache-Control", "no-store")
            request.end_headers()

            def push(data: bytes) -> None:
                request.wfile.write(data)
                request.wfile.flush()

            self.page.stream(params, push)
        elif path == "/ui":
            reply(request, 200, self.page.html(), "text/html; charset=utf-8", cookie)
        elif path == "/ui/tables":
            reply(request, 200, json.dumps(self.page.listing()).encode(), "application/json",
                  cookie)
        else:
            reply(request, 404, b"not found: try /ui\n", _TEXT, cookie)

    def post(self, request: BaseHTTPRequestHandler, path: str, query: str) -> None:
        if path != "/ui/move":
            reply(request, 404, b"not found: POST /ui/move\n", "text/plain")
            return
        allowed, cookie = self._allowed(request, {})
        if not allowed:
            return
        try:
            self.page.move(query_of(query))
        except PageRequestError as exc:
            reply(request, 400, f"{exc}\n".encode(), _TEXT, cookie)
            return
        reply(request, 204, b"", "text/plain", cookie)

    def _allowed(self, request: BaseHTTPRequestHandler, params: Mapping[str, str]
                 ) -> tuple[bool, str | None]:
        """Whether the page may answer (having answered 401 if not), and the cookie to set:
        no token configured, or the token given as `?token=` (then kept in a cookie), in the
        cookie, or as a bearer token."""
        token = self._token
        if token is None:
            return True, None
        cookie = SimpleCookie(request.headers.get("Cookie", ""))
        given = [params.get("token", ""), request.headers.get("Authorization", ""),
                 cookie[COOKIE].value if COOKIE in cookie else ""]
        if any(hmac.compare_digest(g.removeprefix("Bearer ").encode(), token.encode())
               for g in given if g):
            keep = f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/ui"
            return True, keep if params.get("token") else None
        reply(request, 401, b"the live tables need their token: open /ui?token=<token>\n", _TEXT)
        return False, None
