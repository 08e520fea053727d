"""The HTTP endpoint of a running pipeline: `/healthz`, `/readyz` and `/metrics` (Prometheus)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from service.runner import Progress

_COUNTERS = (
    ("events", "txstream_events_total", "records consumed from the source topics"),
    ("bad_records", "txstream_bad_records_total", "records dead-lettered as malformed"),
    ("transactions", "txstream_transactions_total", "transactions committed to the sinks"),
    ("batches", "txstream_batches_total", "Spark batches run"),
    ("output_changes", "txstream_output_changes_total", "changes written to the sinks"),
    ("engine_seconds", "txstream_engine_seconds_total", "time spent in Spark batches"),
    ("sink_seconds", "txstream_sink_seconds_total", "time spent writing to sinks"),
)
_GAUGES = (
    ("lag", "txstream_lag_records", "records in the source topics not yet committed"),
    ("last_transaction", "txstream_last_transaction", "number of the last committed transaction"),
)


def render_metrics(progress: Progress) -> str:
    lines = []
    for kinds, kind in ((_COUNTERS, "counter"), (_GAUGES, "gauge")):
        for attr, name, help_text in kinds:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                      f"{name} {getattr(progress, attr)}"]
    return "\n".join(lines) + "\n"


class HealthServer:
    """Serves the endpoints from a daemon thread; reads the runner's progress, never blocks it.

    Ready means: the loop has completed a poll since start and the last measured lag is at most
    `max_lag`.
    """

    def __init__(self, port: int, progress: Progress, max_lag: int, host: str = "0.0.0.0"
                 ) -> None:
        self.progress = progress
        self.max_lag = max_lag
        self.ready = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body, ctype = server.answer(self.path)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return None  # probes every few seconds would drown the service's own log

        self._http = ThreadingHTTPServer((host, port), Handler)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="health",
                                        daemon=True)

    def answer(self, path: str) -> tuple[int, str, str]:
        text = "text/plain; charset=utf-8"
        if path == "/healthz":
            return 200, "ok\n", text
        if path == "/readyz":
            if not self.ready.is_set():
                return 503, "not ready: starting\n", text
            if self.progress.lag > self.max_lag:
                return 503, f"not ready: lag {self.progress.lag} > {self.max_lag}\n", text
            return 200, "ready\n", text
        if path == "/metrics":
            return 200, render_metrics(self.progress), "text/plain; version=0.0.4"
        return 404, "not found: try /healthz, /readyz, /metrics\n", text

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
