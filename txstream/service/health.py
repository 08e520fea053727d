"""Whether a running pipeline is well: its liveness (`stall`), its readiness (`Readiness`), and
the HTTP endpoint serving them, `/healthz` and `/readyz`, with `/metrics` (Prometheus text
format, `txstream.service.metrics`) and the live table page `/ui`
(`txstream.sinks.live.page_http`, which keeps the page's token).

The endpoint answers anyone who can reach the port, so its bodies name what is wrong, never
the error text behind it (hosts, user names): that goes to the log, once per change."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from txstream.service.metrics import Metrics, render_metrics
from txstream.sinks.live.page_http import PageEndpoint, reply
from txstream.sinks.live.serving import LiveTables

log = logging.getLogger(__name__)


def stall(metrics: Metrics, now: float, timeout_s: float) -> str | None:
    """Why the pipeline is stuck at `now` (monotonic), or None: transactions are closed but not
    yet committed to every sink (waiting for compute, being computed or being written), and
    for more than `timeout_s` seconds neither was a batch delivered nor did that work begin to
    wait. With nothing waiting the pipeline is idle, not stuck, however long ago it last
    delivered; halted, it is not stuck either (a restart would fail the same way)."""
    ingest, delivery = metrics.ingest, metrics.delivery
    waiting = ingest.transactions_closed - delivery.transactions
    if waiting <= 0 or metrics.compute.halted is not None:
        return None
    quiet = now - max(delivery.last_delivered_at, ingest.waiting_since)
    if quiet <= timeout_s:
        return None
    return (f"stalled: {waiting} transaction(s) waiting, no batch delivered in the last "
            f"{quiet:.0f}s (stall_timeout_s={timeout_s:g})")


class Readiness:
    """Ready means: started (state restored, first poll done), every dependency reachable at
    its last use, and the lag at most `max_lag`. Set by the stages and the input monitor.

    Each observer's verdict is kept apart: a dependency is down while any observer last saw it
    fail. The ingest stage's successful poll proves little (a poll of a paused broker returns
    nothing without an error), so it must not clear the monitor's failed metadata request."""

    def __init__(self, max_lag: int) -> None:
        self.max_lag = max_lag
        self.started = threading.Event()
        # "standby" or "fenced" while this instance waits for the pipeline's writer lease
        # (`txstream.service.leadership`): not ready whatever else holds.
        self._waiting: str | None = None
        self._problems: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def fail(self, dependency: str, reason: str, observer: str = "stages") -> None:
        with self._lock:
            known = (dependency, observer) in self._problems
            self._problems[(dependency, observer)] = reason
        if not known:
            # Once per outage, not per retry or probe: the detail /readyz leaves out.
            log.warning("%s unavailable (seen by the %s): %s", dependency, observer, reason)

    def ok(self, dependency: str, observer: str = "stages") -> None:
        with self._lock:
            known = self._problems.pop((dependency, observer), None) is not None
        if known:
            log.info("%s available again (seen by the %s)", dependency, observer)

    def problems(self, metrics: Metrics) -> list[str]:
        """Why the service is not ready, with each dependency's last error (which may name
        hosts and users): for logs and tests, never served."""
        return self._problems_as(metrics, detail=True)

    def public_problems(self, metrics: Metrics) -> list[str]:
        """Why the service is not ready, naming each dependency that is down but not its
        error: what /readyz tells anyone who asks."""
        return self._problems_as(metrics, detail=False)

    def wait_as(self, reason: str | None) -> None:
        """Not ready with `reason` while waiting for the writer lease (None: no longer)."""
        self._waiting = reason

    @property
    def waiting(self) -> str | None:
        """Why this instance runs no pipeline (`standby`, `fenced`), or None."""
        return self._waiting

    def _problems_as(self, metrics: Metrics, detail: bool) -> list[str]:
        if (waiting := self._waiting) is not None:
            return [waiting]
        if not self.started.is_set():
            return ["starting"]
        with self._lock:
            reasons = {d: r for (d, _), r in sorted(self._problems.items(), reverse=True)}
        found = [f"{d} unavailable: {r}" if detail else f"{d}: unavailable"
                 for d, r in sorted(reasons.items())]
        lag, halted = metrics.source.lag, metrics.compute.halted
        if lag > self.max_lag:
            found.append(f"lag {lag} > {self.max_lag}")
        if halted is not None:
            found.append(f"halted: {halted}" if detail
                         else "halted: an expression failed on the data or an invariant broke, "
                         "see the log")
        return found

    def up(self, dependency: str) -> bool:
        with self._lock:
            return all(d != dependency for d, _ in self._problems)



# Where checkpoints and the transaction log go, as readiness and the log name it.
CHECKPOINT_STORAGE = "checkpoint storage"
# The dependencies whose state `/metrics` reports (`txstream_dependency_up`).
DEPENDENCIES = ("kafka", "postgresql", CHECKPOINT_STORAGE)


def metrics_text(metrics: Metrics, readiness: Readiness) -> str:
    """`/metrics`: every metric in Prometheus' text format, with the dependencies' state and
    readiness."""
    return render_metrics(metrics, {d: readiness.up(d) for d in DEPENDENCIES},
                          ready=not readiness.problems(metrics))

class HealthServer:
    """Serves the endpoints from a daemon thread; reads the stages' metrics, never blocks them.

    `/healthz` fails once the pipeline is stuck for `stall_timeout_s` (see `stall`; None: never),
    so that Kubernetes restarts it; `/readyz` fails while `readiness` has problems. `/ui` is
    the live page, refused without `page_token` when one is given."""

    def __init__(self, port: int, metrics: Metrics, readiness: Readiness,
                 host: str = "0.0.0.0", *, stall_timeout_s: float | None = None,
                 page_token: str | None = None) -> None:
        self.metrics = metrics
        self.readiness = readiness
        self.stall_timeout_s = stall_timeout_s
        self._stalled = False
        self.page = PageEndpoint(self.status, page_token)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if server.page.handles(url.path):
                    server.page.get(self, url.path, url.query)
                    return
                status, body, ctype = server.answer(url.path)
                reply(self, status, body.encode(), ctype)

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                server.page.post(self, url.path, url.query)

            def log_message(self, format: str, *args: object) -> None:
                return None  # probes every few seconds would drown the service's own log

        self._http = ThreadingHTTPServer((host, port), Handler)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="health",
                                        daemon=True)

    def serve_live(self, tables: LiveTables) -> None:
        """Show `tables` on the page at `/ui` (to those who give the page's token, if set)."""
        self.page.attach(tables)

    def status(self) -> dict[str, object]:
        """The pipeline's status, as the page shows it."""
        problems = self.readiness.public_problems(self.metrics)
        return {"ready": not problems, "problems": problems,
                "last_transaction": self.metrics.delivery.last_transaction,
                "lag_records": self.metrics.source.lag, "events": self.metrics.ingest.events}

    def answer(self, path: str) -> tuple[int, str, str]:
        """Status, body and content type of the probes and the metrics."""
        text = "text/plain; charset=utf-8"
        if path == "/healthz":
            stalled = self._stall()
            if stalled is not None:
                return 503, f"unhealthy: {stalled}\n", text
            return 200, "ok\n", text
        if path == "/readyz":
            problems = self.readiness.public_problems(self.metrics)
            if problems:
                return 503, "not ready: " + "; ".join(problems) + "\n", text
            return 200, "ready\n", text
        if path == "/metrics":
            return 200, metrics_text(self.metrics, self.readiness), "text/plain; version=0.0.4"
        return 404, "not found: try /healthz, /readyz, /metrics, /ui\n", text

    def _stall(self) -> str | None:
        # A standby or fenced instance runs no batch: the batch a fence abandoned is not stuck,
        # and a restart would only cost the standby its warm Spark session.
        if self.stall_timeout_s is None or self.readiness.waiting is not None:
            return None
        stalled = stall(self.metrics, time.monotonic(), self.stall_timeout_s)
        if (stalled is not None) != self._stalled:
            # Logged on the change, not on every probe: the restart that follows needs a reason.
            self._stalled = stalled is not None
            if stalled is not None:
                log.error("the pipeline is stuck, /healthz answers 503: %s", stalled)
            else:
                log.info("the pipeline progresses again, /healthz answers 200")
        return stalled

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
