"""The metrics (`txstream.service.metrics`): each stage's recorder reaches `/metrics` and the
status line under the names and types Prometheus scrapes; no broker, database or Spark."""

from __future__ import annotations

import re

from txstream.service.health import Readiness, metrics_text
from txstream.service.metrics import Histogram, Metrics


def test_each_stages_recorder_is_rendered() -> None:
    metrics, readiness = Metrics(), Readiness(max_lag=10)
    readiness.started.set()
    metrics.ingest.events, metrics.ingest.busy_seconds = 120, 1.5
    metrics.compute.spark_jobs, metrics.compute.busy_seconds = 3, 2.25
    metrics.compute.batch_transactions.observe(4)
    metrics.delivery.transactions = metrics.delivery.last_transaction = 4
    metrics.delivery.busy_seconds = 0.5
    metrics.checkpoint.checkpoints, metrics.checkpoint.last_transaction = 1, 4
    metrics.source.measured({("orders", 0): 2, ("orders", 1): 3})
    metrics.source.end_to_end_seconds.observe(0.2)
    body = metrics_text(metrics, readiness)
    values = dict(re.findall(r"^(\S+) (\S+)$", body, re.MULTILINE))
    assert {name: values[name] for name in (
        "txstream_events_total", "txstream_spark_jobs_total",
        "txstream_transactions_committed_total", "txstream_last_committed_transaction",
        "txstream_checkpoints_total", "txstream_lag_records",
        'txstream_partition_lag_records{topic="orders",partition="1"}',
        'txstream_stage_busy_seconds_total{stage="ingest"}',
        'txstream_stage_busy_seconds_total{stage="compute"}',
        'txstream_stage_busy_seconds_total{stage="deliver"}',
        'txstream_stage_busy_seconds_total{stage="checkpoint"}',
        'txstream_batch_transactions_bucket{le="5"}', "txstream_batch_transactions_sum",
        "txstream_end_to_end_latency_seconds_count", "txstream_checkpoint_age_seconds",
        "txstream_ready")} == {
        "txstream_events_total": "120", "txstream_spark_jobs_total": "3",
        "txstream_transactions_committed_total": "4", "txstream_last_committed_transaction": "4",
        "txstream_checkpoints_total": "1", "txstream_lag_records": "5",
        'txstream_partition_lag_records{topic="orders",partition="1"}': "3",
        'txstream_stage_busy_seconds_total{stage="ingest"}': "1.500",
        'txstream_stage_busy_seconds_total{stage="compute"}': "2.250",
        'txstream_stage_busy_seconds_total{stage="deliver"}': "0.500",
        'txstream_stage_busy_seconds_total{stage="checkpoint"}': "0.000",
        'txstream_batch_transactions_bucket{le="5"}': "1", "txstream_batch_transactions_sum": "4.0",
        "txstream_end_to_end_latency_seconds_count": "1",
        "txstream_checkpoint_age_seconds": "NaN",  # restored, not written by this process
        "txstream_ready": "1"}
    assert "# TYPE txstream_events_total counter" in body
    assert "# TYPE txstream_lag_records gauge" in body
    assert "# TYPE txstream_spark_job_seconds histogram" in body
    line = metrics.line()
    assert "transactions 4 (" in line and "events 120 (" in line and "lag 5 [orders/0:2 " in line
    assert metrics.fields()["last_checkpoint_transaction"] == 4


def test_a_histogram_counts_cumulatively() -> None:
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 3.0):
        histogram.observe(value)
    assert histogram.render("h") == ['h_bucket{le="1"} 2', 'h_bucket{le="2"} 3',
                                     'h_bucket{le="+Inf"} 4', "h_sum 6.0", "h_count 4"]
