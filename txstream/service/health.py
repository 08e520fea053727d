"""What a running pipeline reports: its progress and metrics (`Progress`), its liveness
(`stall`), its readiness (`Readiness`), and the HTTP endpoint serving them: `/healthz`,
`/readyz` and `/metrics` (Prometheus text format), and the live table page `/ui`
(`txstream.sinks.live.page`; with a live token, only to a browser that gave it once as `?token=`,
kept in a cookie, or a client sending `Authorization: Bearer`).

The endpoint answers anyone who can reach the port, so its bodies name what is wrong, never
the error text behind it (hosts, user names): that goes to the log, once per change."""

from __future__ import annotations

import bisect
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from txstream.sinks.live.page import LivePage, PageRequestError
from txstream.sinks.live.serving import LiveTables

log = logging.getLogger(__name__)
_COOKIE = "txstream_live_token"


def _query(text: str) -> dict[str, str]:
    """A query string's parameters, percent-decoded only: a `+` stays a `+` (a token's
    base64 would otherwise lose it)."""
    pairs = (part.partition("=") for part in text.split("&") if part)
    return {unquote(k): unquote(v) for k, _, v in pairs}

# Seconds: from a fast Spark job or PostgreSQL write to a slow checkpoint.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_COUNTS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_CHANGES = (10, 100, 1000, 10_000, 100_000, 1_000_000)


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()  # observed by the stages and the input monitor thread

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value
            self.count += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        with self._lock:
            counts, total, count = list(self._counts), self.sum, self.count
        lines, running = [], 0
        sep = "," if labels else ""
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {running}')
        suffix = f"{{{labels}}}" if labels else ""
        return [*lines, f"{name}_sum{suffix} {total}", f"{name}_count{suffix} {count}"]


STAGES = ("ingest", "compute", "deliver", "checkpoint")


@dataclass
class Progress:
    """What the service has done since start (counters), where it is (gauges), and how long its
    steps take (histograms)."""

    started: float = field(default_factory=time.monotonic)
    events: int = 0
    bad_records: int = 0
    incomplete_upstream: int = 0
    transactions_closed: int = 0
    transactions: int = 0  # committed to every sink
    batches: int = 0
    output_changes: int = 0
    engine_seconds: float = 0.0
    sink_seconds: float = 0.0
    checkpoints: int = 0
    checkpoint_failures: int = 0
    spark_jobs: int = 0  # of the engine's batches
    spark_stages: int = 0
    state_index_bytes: int = 0
    live_table_bytes: int = 0  # the live tables' rows and row keys
    live_subscribers: int = 0
    last_transaction: int = 0  # last committed
    last_checkpoint_transaction: int | None = None
    last_checkpoint_at: float | None = None  # monotonic
    lag: int = 0
    lag_by_partition: dict[tuple[str, int], int] = field(default_factory=dict)
    batch_transactions: Histogram = field(default_factory=lambda: Histogram(_COUNTS))
    batch_changes: Histogram = field(default_factory=lambda: Histogram(_CHANGES))
    spark_job_seconds: Histogram = field(default_factory=lambda: Histogram(_SECONDS))
    sink_write_seconds: Histogram = field(default_factory=lambda: Histogram(_SECONDS))
    checkpoint_seconds: Histogram = field(default_factory=lambda: Histogram(_SECONDS))
    end_to_end_seconds: Histogram = field(default_factory=lambda: Histogram(_SECONDS))
    # Time each stage of the service spent working (not waiting): the slowest stage is the one
    # whose busy time grows as fast as the wall clock.
    stage_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    # Liveness (`stall`), monotonic: when a batch was last committed to every sink, and when
    # closed transactions last began to wait while none did.
    last_delivered_at: float = field(default_factory=time.monotonic)
    waiting_since: float = field(default_factory=time.monotonic)
    # Rows a sink's destination refused, kept aside by the sink, per output.
    rejected_rows: dict[str, int] = field(default_factory=dict)
    # Why processing stopped for good (a pipeline expression failed on the data): the same
    # input would fail again, so the process stays up and not ready instead of restarting.
    halted: str | None = None

    def closed(self, total: int, now: float) -> None:
        """The input has closed `total` transactions since start, as of `now` (monotonic): if
        none was waiting, work begins to wait now."""
        if total > self.transactions_closed and self.transactions_closed <= self.transactions:
            self.waiting_since = now
        self.transactions_closed = total

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def checkpoint_age(self) -> float | None:
        if self.last_checkpoint_at is None:
            return None
        return time.monotonic() - self.last_checkpoint_at

    def line(self) -> str:
        """The status line: rates since start, lag per partition, last committed transaction,
        checkpoint age."""
        elapsed = max(self.elapsed, 1e-9)
        lags = " ".join(f"{t}/{p}:{n}" for (t, p), n in sorted(self.lag_by_partition.items()))
        age = self.checkpoint_age
        checkpoint = "none" if age is None else (
            f"#{self.last_checkpoint_transaction} {age:.0f}s ago")
        return (
            f"transactions {self.transactions} ({self.transactions / elapsed:,.1f}/s, last "
            f"#{self.last_transaction}) | events {self.events} ({self.events / elapsed:,.0f}/s) | "
            f"bad records {self.bad_records} | output changes {self.output_changes} | "
            f"lag {self.lag} [{lags}] | checkpoint {checkpoint} | "
            f"spark {self.engine_seconds:.1f}s sinks {self.sink_seconds:.1f}s"
        )

    def fields(self) -> dict[str, object]:
        """The status line's figures, for a structured (JSON) log record."""
        elapsed = max(self.elapsed, 1e-9)
        return {
            "transactions": self.transactions, "transactions_per_s": self.transactions / elapsed,
            "last_transaction": self.last_transaction, "events": self.events,
            "events_per_s": self.events / elapsed, "bad_records": self.bad_records,
            "output_changes": self.output_changes, "lag": self.lag,
            "lag_by_partition": {f"{t}/{p}": n for (t, p), n in self.lag_by_partition.items()},
            "last_checkpoint_transaction": self.last_checkpoint_transaction,
            "checkpoint_age_s": self.checkpoint_age,
        }


def stall(progress: Progress, now: float, timeout_s: float) -> str | None:
    """Why the pipeline is stuck at `now` (monotonic), or None: transactions are closed but not
    yet committed to every sink (waiting for compute, being computed or being written), and
    for more than `timeout_s` seconds neither was a batch delivered nor did that work begin to
    wait. With nothing waiting the pipeline is idle, not stuck, however long ago it last
    delivered."""
    waiting = progress.transactions_closed - progress.transactions
    if waiting <= 0 or progress.halted is not None:
        return None
    quiet = now - max(progress.last_delivered_at, progress.waiting_since)
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

    def problems(self, progress: Progress) -> list[str]:
        """Why the service is not ready, with each dependency's last error (which may name
        hosts and users): for logs and tests, never served."""
        return self._problems_as(progress, detail=True)

    def public_problems(self, progress: Progress) -> list[str]:
        """Why the service is not ready, naming each dependency that is down but not its
        error: what /readyz tells anyone who asks."""
        return self._problems_as(progress, detail=False)

    def _problems_as(self, progress: Progress, detail: bool) -> list[str]:
        if not self.started.is_set():
            return ["starting"]
        with self._lock:
            reasons = {d: r for (d, _), r in sorted(self._problems.items(), reverse=True)}
        found = [f"{d} unavailable: {r}" if detail else f"{d}: unavailable"
                 for d, r in sorted(reasons.items())]
        if progress.lag > self.max_lag:
            found.append(f"lag {progress.lag} > {self.max_lag}")
        if progress.halted is not None:
            found.append(f"halted: {progress.halted}" if detail
                         else "halted: an expression failed on the data, see the log")
        return found

    def up(self, dependency: str) -> bool:
        with self._lock:
            return all(d != dependency for d, _ in self._problems)


_COUNTERS = (
    ("events", "txstream_events_total", "records consumed from the source topics"),
    ("bad_records", "txstream_dead_letters_total", "records dead-lettered as malformed"),
    ("incomplete_upstream", "txstream_incomplete_upstream_transactions_total",
     "upstream transactions still incomplete at the timeout, dead-lettered"),
    ("transactions_closed", "txstream_transactions_closed_total", "transactions closed"),
    ("transactions", "txstream_transactions_committed_total",
     "transactions committed to every sink"),
    ("batches", "txstream_batches_total", "Spark batches run"),
    ("output_changes", "txstream_output_changes_total", "changes written to the sinks"),
    ("checkpoints", "txstream_checkpoints_total", "checkpoints completed"),
    ("spark_jobs", "txstream_spark_jobs_total", "Spark jobs the engine's batches ran"),
    ("spark_stages", "txstream_spark_stages_total",
     "stages of those jobs (skipped ones included)"),
    ("checkpoint_failures", "txstream_checkpoint_failures_total",
     "checkpoints that failed (retried after the next batch)"),
)
_GAUGES = (
    ("state_index_bytes", "txstream_state_index_bytes",
     "driver memory held by the hash indexes of large state runs"),
    ("live_table_bytes", "txstream_live_table_bytes",
     "memory held by the live tables' rows and row keys"),
    ("live_subscribers", "txstream_live_subscribers", "open subscriptions to live tables"),
    ("lag", "txstream_lag_records", "records in the source topics not yet committed"),
    ("last_transaction", "txstream_last_committed_transaction",
     "number of the last transaction committed to every sink"),
)
_HISTOGRAMS = (
    ("batch_transactions", "txstream_batch_transactions", "transactions per Spark batch"),
    ("batch_changes", "txstream_batch_input_changes", "input change rows per Spark batch"),
    ("spark_job_seconds", "txstream_spark_job_seconds", "time of one Spark batch"),
    ("sink_write_seconds", "txstream_sink_write_seconds", "time of one sink write"),
    ("checkpoint_seconds", "txstream_checkpoint_seconds", "time to write one checkpoint"),
    ("end_to_end_seconds", "txstream_end_to_end_latency_seconds",
     "from a record's Kafka timestamp to the commit of its transaction to every sink "
     "(the first and last record per partition of each batch)"),
)


def render_metrics(progress: Progress, readiness: Readiness) -> str:
    lines: list[str] = []

    def head(name: str, help_text: str, kind: str) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])

    for attr, name, help_text in _COUNTERS:
        head(name, help_text, "counter")
        lines.append(f"{name} {getattr(progress, attr)}")
    for attr, name, help_text in _GAUGES:
        head(name, help_text, "gauge")
        lines.append(f"{name} {getattr(progress, attr)}")
    head("txstream_partition_lag_records", "records not yet committed, per partition", "gauge")
    lines += [f'txstream_partition_lag_records{{topic="{t}",partition="{p}"}} {n}'
              for (t, p), n in sorted(progress.lag_by_partition.items())]
    head("txstream_stage_busy_seconds_total", "time each stage spent working", "counter")
    lines += [f'txstream_stage_busy_seconds_total{{stage="{stage}"}} {seconds:.3f}'
              for stage, seconds in progress.stage_seconds.items()]
    head("txstream_checkpoint_age_seconds", "time since the last checkpoint completed", "gauge")
    age = progress.checkpoint_age
    lines.append(f"txstream_checkpoint_age_seconds {'NaN' if age is None else f'{age:.3f}'}")
    head("txstream_dependency_up", "1 when the dependency answered at its last use", "gauge")
    lines += [f'txstream_dependency_up{{dependency="{d}"}} {int(readiness.up(d))}'
              for d in ("kafka", "postgresql")]
    head("txstream_rejected_rows_total", "rows a sink's destination refused, kept aside",
         "counter")
    lines += [f'txstream_rejected_rows_total{{output="{o}"}} {n}'
              for o, n in sorted(progress.rejected_rows.items())]
    head("txstream_halted", "1 when a pipeline expression failed on the data and processing "
         "stopped", "gauge")
    lines.append(f"txstream_halted {int(progress.halted is not None)}")
    head("txstream_ready", "1 when /readyz answers 200", "gauge")
    lines.append(f"txstream_ready {int(not readiness.problems(progress))}")
    for attr, name, help_text in _HISTOGRAMS:
        head(name, help_text, "histogram")
        lines += getattr(progress, attr).render(name)
    return "\n".join(lines) + "\n"


class HealthServer:
    """Serves the endpoints from a daemon thread; reads the runner's progress, never blocks it.

    `/healthz` fails once the pipeline is stuck for `stall_timeout_s` (see `stall`; None: never),
    so that Kubernetes restarts it; `/readyz` fails while `readiness` has problems."""

    def __init__(self, port: int, progress: Progress, readiness: Readiness,
                 host: str = "0.0.0.0", *, stall_timeout_s: float | None = None) -> None:
        self.progress = progress
        self.readiness = readiness
        self.stall_timeout_s = stall_timeout_s
        self._stalled = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = _query(url.query)
                if url.path.startswith("/ui") and not self._allowed(query):
                    return
                if url.path == "/ui/events":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-store")
                    self.end_headers()
                    server.page.stream(query, self._push)
                    return
                status, body, ctype = server.answer(url.path)
                self._reply(status, body.encode() if isinstance(body, str) else body, ctype)

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/ui/move":
                    self._reply(404, b"not found: POST /ui/move\n", "text/plain")
                    return
                if not self._allowed({}):
                    return
                try:
                    server.page.move(_query(url.query))
                except PageRequestError as exc:
                    self._reply(400, f"{exc}\n".encode(), "text/plain; charset=utf-8")
                    return
                self._reply(204, b"", "text/plain")

            def _allowed(self, query: dict[str, str]) -> bool:
                """Whether the page may answer (answering 401 if not): no token configured,
                or the token given as `?token=` (then kept in a cookie), in the cookie, or as a
                bearer token."""
                token = server.page_token
                if token is None:
                    return True
                cookie = SimpleCookie(self.headers.get("Cookie", ""))
                given = [query.get("token", ""), self.headers.get("Authorization", ""),
                         cookie[_COOKIE].value if _COOKIE in cookie else ""]
                if any(hmac.compare_digest(g.removeprefix("Bearer ").encode(), token.encode())
                       for g in given if g):
                    if query.get("token"):
                        self._cookie = f"{_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/ui"
                    return True
                self._reply(401, b"the live tables need their token: open /ui?token=<token>\n",
                            "text/plain; charset=utf-8")
                return False

            _cookie: str | None = None

            def _push(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

            def _reply(self, status: int, data: bytes, ctype: str) -> None:
                self.send_response(status)
                if self._cookie:
                    self.send_header("Set-Cookie", self._cookie)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return None  # probes every few seconds would drown the service's own log

        self.page = LivePage(None, self.status)
        self.page_token: str | None = None
        self._http = ThreadingHTTPServer((host, port), Handler)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="health",
                                        daemon=True)

    def serve_live(self, tables: LiveTables, token: str | None = None) -> None:
        """Show `tables` on the page at `/ui`, to those who give `token` if one is set."""
        self.page_token = token  # first: the tables must never be shown without it
        self.page.tables = tables

    def status(self) -> dict[str, object]:
        """The pipeline's status, as the page shows it."""
        problems = self.readiness.public_problems(self.progress)
        return {"ready": not problems, "problems": problems,
                "last_transaction": self.progress.last_transaction,
                "lag_records": self.progress.lag, "events": self.progress.events}

    def answer(self, path: str) -> tuple[int, str | bytes, str]:
        text = "text/plain; charset=utf-8"
        if path == "/ui":
            return 200, self.page.html(), "text/html; charset=utf-8"
        if path == "/ui/tables":
            return 200, json.dumps(self.page.listing()), "application/json"
        if path == "/healthz":
            stalled = self._stall()
            if stalled is not None:
                return 503, f"unhealthy: {stalled}\n", text
            return 200, "ok\n", text
        if path == "/readyz":
            problems = self.readiness.public_problems(self.progress)
            if problems:
                return 503, "not ready: " + "; ".join(problems) + "\n", text
            return 200, "ready\n", text
        if path == "/metrics":
            return 200, render_metrics(self.progress, self.readiness), \
                "text/plain; version=0.0.4"
        return 404, "not found: try /healthz, /readyz, /metrics, /ui\n", text

    def _stall(self) -> str | None:
        if self.stall_timeout_s is None:
            return None
        stalled = stall(self.progress, time.monotonic(), self.stall_timeout_s)
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
