"""What a running pipeline measures: one recorder per stage, each written by its stage alone
(`IngestMetrics`, `ComputeMetrics`, `DeliveryMetrics`, `CheckpointMetrics`) or by the input
monitor (`SourceMetrics`), gathered in `Metrics`, which the status line and `/metrics`
(Prometheus text format, `render_metrics`) read.

A recorder's counters are plain attributes, written by one thread through the recorder's
methods (one per event a stage reports: `polled`, `computed`, `written`, `delivered`, ...) and
read by any: a reader sees each value whole (the GIL), perhaps one batch old. Histograms lock,
as the input monitor observes too."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txstream.sources.source_state import IngestStats

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
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value
            self.count += 1

    def render(self, name: str) -> list[str]:
        with self._lock:
            counts, total, count = list(self._counts), self.sum, self.count
        lines, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'{name}_bucket{{le="{le}"}} {running}')
        return [*lines, f"{name}_sum {total}", f"{name}_count {count}"]


def _seconds() -> Histogram:
    return Histogram(_SECONDS)


@dataclass
class IngestMetrics:
    """The ingest stage's: what the input consumed and closed, and its busy time."""

    events: int = 0
    bad_records: int = 0
    incomplete_upstream: int = 0
    transactions_closed: int = 0
    busy_seconds: float = 0.0  # working, not waiting
    # Monotonic: when closed transactions last began to wait while none did (see
    # `txstream.service.health.stall`).
    waiting_since: float = field(default_factory=time.monotonic)

    def polled(self, stats: IngestStats, busy_s: float, now: float, committed: int) -> None:
        """A poll of `busy_s` seconds ended at `now` (monotonic) with the input's totals
        `stats`; `committed` transactions are committed to every sink. A poll that consumed
        nothing was waiting, not working. If no closed transaction was waiting, work begins to
        wait now."""
        if stats.events != self.events:
            self.busy_seconds += busy_s
        self.events, self.bad_records = stats.events, stats.bad_records
        self.incomplete_upstream = stats.incomplete_upstream
        if stats.transactions > self.transactions_closed \
                and self.transactions_closed <= committed:
            self.waiting_since = now
        self.transactions_closed = stats.transactions


@dataclass
class ComputeMetrics:
    """The compute stage's: the engine's batches, their sizes and times, and its state."""

    engine_seconds: float = 0.0
    busy_seconds: float = 0.0
    # In the invariant checks of the engine's input and outputs (`txstream.service.invariants`):
    # part of `busy_seconds`, reported apart so that their cost is seen.
    check_seconds: float = 0.0
    spark_jobs: int = 0  # of the engine's batches
    spark_stages: int = 0
    state_index_bytes: int = 0
    # Late changes each temporal behavior ignored since start, by the windowed table's label
    # (`Engine.late_rows`; the rows themselves: `GroupedTable.late_rows`).
    late_rows: dict[str, int] = field(default_factory=dict)
    batch_transactions: Histogram = field(default_factory=lambda: Histogram(_COUNTS))
    batch_changes: Histogram = field(default_factory=lambda: Histogram(_CHANGES))
    spark_job_seconds: Histogram = field(default_factory=_seconds)
    # Why processing stopped for good (a pipeline expression failed on the data): the same
    # input would fail again, so the process stays up and not ready instead of restarting.
    halted: str | None = None

    def computed(self, transactions: int, changes: int, *, engine_s: float, check_s: float,
                 busy_s: float, jobs: int, stages: int, index_bytes: int,
                 late_rows: Mapping[str, int]) -> None:
        """A batch of `transactions` with `changes` input rows was computed: `engine_s` in the
        engine, `check_s` in the invariant checks, `busy_s` in all; the engine's totals since
        start (`jobs`, `stages`, `late_rows`) and its state's index bytes after it."""
        self.late_rows = dict(late_rows)
        self.spark_job_seconds.observe(engine_s)
        self.engine_seconds += engine_s
        self.check_seconds += check_s
        self.busy_seconds += busy_s
        self.spark_jobs, self.spark_stages = jobs, stages
        self.state_index_bytes = index_bytes
        self.batch_transactions.observe(transactions)
        self.batch_changes.observe(changes)

    def halt(self, reason: str) -> None:
        """Processing stopped for good, for `reason`."""
        self.halted = reason


@dataclass
class DeliveryMetrics:
    """The deliver stage's: what every sink committed, and the sinks' own figures."""

    transactions: int = 0  # committed to every sink
    batches: int = 0
    output_changes: int = 0
    last_transaction: int = 0  # the last committed
    sink_seconds: float = 0.0
    busy_seconds: float = 0.0
    # Monotonic: when a batch was last committed to every sink (see `stall`).
    last_delivered_at: float = field(default_factory=time.monotonic)
    sink_write_seconds: Histogram = field(default_factory=_seconds)
    # Rows a sink's destination refused, kept aside by the sink, per output.
    rejected_rows: dict[str, int] = field(default_factory=dict)
    live_table_bytes: int = 0  # the live tables' rows and row keys
    live_subscribers: int = 0
    fenced: int = 0  # times another instance took the writer epoch from this one

    def resumed(self, last: int) -> None:
        """The run resumes after transaction `last`, committed by an earlier one."""
        self.last_transaction = last

    def delivered(self, transactions: int, last: int, *, sink_s: float, busy_s: float,
                  now: float) -> None:
        """A batch of `transactions`, the last `last`, was committed to every sink at `now`
        (monotonic): `sink_s` in the sinks, `busy_s` in all."""
        self.sink_seconds += sink_s
        self.last_delivered_at = now
        self.transactions += transactions
        self.batches += 1
        self.last_transaction = last
        self.busy_seconds += busy_s

    def lost_writer_epoch(self) -> None:
        """Another instance took the writer epoch."""
        self.fenced += 1


@dataclass
class CheckpointMetrics:
    """The checkpoint stage's: checkpoints written, failed, and the last one."""

    checkpoints: int = 0
    failures: int = 0
    busy_seconds: float = 0.0
    last_transaction: int | None = None  # of the newest checkpoint (written or restored)
    last_at: float | None = None  # monotonic, of one written by this process
    seconds: Histogram = field(default_factory=_seconds)

    def restored(self, transaction: int) -> None:
        """The run resumed from the checkpoint of `transaction`."""
        self.last_transaction = transaction

    def written(self, transaction: int, seconds: float, at: float) -> None:
        """The checkpoint of `transaction` took `seconds` and was complete at `at`
        (monotonic)."""
        self.checkpoints += 1
        self.seconds.observe(seconds)
        self.busy_seconds += seconds
        self.last_transaction = transaction
        self.last_at = at

    def failed(self) -> None:
        """A checkpoint failed (tried again after a pause, `txstream.service.checkpointing`)."""
        self.failures += 1

    @property
    def age(self) -> float | None:
        return None if self.last_at is None else time.monotonic() - self.last_at


@dataclass
class SourceMetrics:
    """The input monitor's: the lag of the source topics and the end-to-end latency."""

    lag: int = 0
    lag_by_partition: dict[tuple[str, int], int] = field(default_factory=dict)
    end_to_end_seconds: Histogram = field(default_factory=_seconds)

    def measured(self, by_partition: dict[tuple[str, int], int]) -> None:
        self.lag_by_partition = by_partition
        self.lag = sum(by_partition.values())


@dataclass
class Metrics:
    """Every recorder of one service, and when it started."""

    ingest: IngestMetrics = field(default_factory=IngestMetrics)
    compute: ComputeMetrics = field(default_factory=ComputeMetrics)
    delivery: DeliveryMetrics = field(default_factory=DeliveryMetrics)
    checkpoint: CheckpointMetrics = field(default_factory=CheckpointMetrics)
    source: SourceMetrics = field(default_factory=SourceMetrics)
    started: float = field(default_factory=time.monotonic)

    def stage_seconds(self) -> dict[str, float]:
        """Time each stage spent working (not waiting): the slowest stage is the one whose
        busy time grows as fast as the wall clock."""
        return {"ingest": self.ingest.busy_seconds, "compute": self.compute.busy_seconds,
                "deliver": self.delivery.busy_seconds,
                "checkpoint": self.checkpoint.busy_seconds}

    def line(self) -> str:
        """The status line: rates since start, lag per partition, last committed transaction,
        checkpoint age."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        delivered, events, source = self.delivery, self.ingest.events, self.source
        lags = " ".join(f"{t}/{p}:{n}" for (t, p), n in sorted(source.lag_by_partition.items()))
        age = self.checkpoint.age
        checkpoint = "none" if age is None else (
            f"#{self.checkpoint.last_transaction} {age:.0f}s ago")
        return (
            f"transactions {delivered.transactions} ({delivered.transactions / elapsed:,.1f}/s,"
            f" last #{delivered.last_transaction}) | events {events} ({events / elapsed:,.0f}/s)"
            f" | bad records {self.ingest.bad_records} | output changes "
            f"{delivered.output_changes} | lag {source.lag} [{lags}] | checkpoint {checkpoint}"
            f" | spark {self.compute.engine_seconds:.1f}s sinks {delivered.sink_seconds:.1f}s"
            + (f" | late rows {sum(self.compute.late_rows.values())}"
               if self.compute.late_rows else "")
        )

    def fields(self) -> dict[str, object]:
        """The status line's figures, for a structured (JSON) log record."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        delivered, source = self.delivery, self.source
        return {
            "transactions": delivered.transactions,
            "transactions_per_s": delivered.transactions / elapsed,
            "last_transaction": delivered.last_transaction, "events": self.ingest.events,
            "events_per_s": self.ingest.events / elapsed, "bad_records": self.ingest.bad_records,
            "output_changes": delivered.output_changes, "lag": source.lag,
            "lag_by_partition": {f"{t}/{p}": n for (t, p), n in source.lag_by_partition.items()},
            "last_checkpoint_transaction": self.checkpoint.last_transaction,
            "checkpoint_age_s": self.checkpoint.age,
            "late_rows": sum(self.compute.late_rows.values()),
        }


def _families(m: Metrics) -> Iterator[tuple[str, str, str, object]]:
    """(name, help, type, value) of every single-valued metric; a histogram's value is the
    Histogram."""
    i, c, d, k, s = m.ingest, m.compute, m.delivery, m.checkpoint, m.source
    yield from (
        ("txstream_events_total", "records consumed from the source topics", "counter",
         i.events),
        ("txstream_dead_letters_total", "records dead-lettered as malformed", "counter",
         i.bad_records),
        ("txstream_incomplete_upstream_transactions_total",
         "upstream transactions still incomplete at the timeout, dead-lettered", "counter",
         i.incomplete_upstream),
        ("txstream_transactions_closed_total", "transactions closed", "counter",
         i.transactions_closed),
        ("txstream_transactions_committed_total", "transactions committed to every sink",
         "counter", d.transactions),
        ("txstream_batches_total", "Spark batches run", "counter", d.batches),
        ("txstream_output_changes_total", "changes written to the sinks", "counter",
         d.output_changes),
        ("txstream_checkpoints_total", "checkpoints completed", "counter", k.checkpoints),
        ("txstream_fenced_total", "times another instance took over the pipeline's writer "
         "epoch from this one", "counter", d.fenced),
        ("txstream_spark_jobs_total", "Spark jobs the engine's batches ran", "counter",
         c.spark_jobs),
        ("txstream_invariant_check_seconds_total", "time compute spent checking the invariants "
         "of the engine's input and outputs", "counter", round(c.check_seconds, 3)),
        ("txstream_spark_stages_total", "stages of those jobs (skipped ones included)",
         "counter", c.spark_stages),
        ("txstream_checkpoint_failures_total",
         "checkpoints that failed (each tried again after a pause)", "counter", k.failures),
        ("txstream_state_index_bytes",
         "bytes of the index files of large state runs (on the executors' storage)", "gauge",
         c.state_index_bytes),
        ("txstream_live_table_bytes", "memory held by the live tables' rows and row keys",
         "gauge", d.live_table_bytes),
        ("txstream_live_subscribers", "open subscriptions to live tables", "gauge",
         d.live_subscribers),
        ("txstream_lag_records", "records in the source topics not yet committed", "gauge",
         s.lag),
        ("txstream_last_committed_transaction",
         "number of the last transaction committed to every sink", "gauge", d.last_transaction),
        ("txstream_batch_transactions", "transactions per Spark batch", "histogram",
         c.batch_transactions),
        ("txstream_batch_input_changes", "input change rows per Spark batch", "histogram",
         c.batch_changes),
        ("txstream_spark_job_seconds", "time of one Spark batch", "histogram",
         c.spark_job_seconds),
        ("txstream_sink_write_seconds", "time of one sink write", "histogram",
         d.sink_write_seconds),
        ("txstream_checkpoint_seconds", "time to write one checkpoint", "histogram", k.seconds),
        ("txstream_end_to_end_latency_seconds",
         "from a record's Kafka timestamp to the commit of its transaction to every sink "
         "(the first and last record per partition of each batch)", "histogram",
         s.end_to_end_seconds),
    )


def _label(value: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(metrics: Metrics, up: dict[str, bool], ready: bool) -> str:
    """Every metric in Prometheus' text format; `up`: whether each dependency answered at its
    last use, `ready`: whether `/readyz` answers 200 (`txstream.service.health.Readiness`)."""
    lines: list[str] = []

    def head(name: str, help_text: str, kind: str) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])

    for name, help_text, kind, value in _families(metrics):
        head(name, help_text, kind)
        lines += value.render(name) if isinstance(value, Histogram) else [f"{name} {value}"]
    head("txstream_partition_lag_records", "records not yet committed, per partition", "gauge")
    lines += [f'txstream_partition_lag_records{{topic="{t}",partition="{p}"}} {n}'
              for (t, p), n in sorted(metrics.source.lag_by_partition.items())]
    head("txstream_stage_busy_seconds_total", "time each stage spent working", "counter")
    lines += [f'txstream_stage_busy_seconds_total{{stage="{stage}"}} {seconds:.3f}'
              for stage, seconds in metrics.stage_seconds().items()]
    head("txstream_checkpoint_age_seconds", "time since the last checkpoint completed", "gauge")
    age = metrics.checkpoint.age
    lines.append(f"txstream_checkpoint_age_seconds {'NaN' if age is None else f'{age:.3f}'}")
    head("txstream_dependency_up", "1 when the dependency answered at its last use", "gauge")
    lines += [f'txstream_dependency_up{{dependency="{d}"}} {int(answered)}'
              for d, answered in up.items()]
    head("txstream_rejected_rows_total", "rows a sink's destination refused, kept aside",
         "counter")
    lines += [f'txstream_rejected_rows_total{{output="{o}"}} {n}'
              for o, n in sorted(metrics.delivery.rejected_rows.items())]
    head("txstream_late_rows_total", "changes a temporal behavior ignored as late, per "
         "windowed table (GroupedTable.late_rows holds them)", "counter")
    lines += [f'txstream_late_rows_total{{operator="{_label(o)}"}} {n}'
              for o, n in sorted(metrics.compute.late_rows.items())]
    head("txstream_halted", "1 when a pipeline expression failed on the data and processing "
         "stopped", "gauge")
    lines.append(f"txstream_halted {int(metrics.compute.halted is not None)}")
    head("txstream_ready", "1 when /readyz answers 200", "gauge")
    lines.append(f"txstream_ready {int(ready)}")
    return "\n".join(lines) + "\n"
