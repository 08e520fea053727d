"""The `txstream` command: run, check, demo, replay."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from txstream.engine import EngineInputError, ExpressionError, PipelineDefinitionError
from txstream.engine.errors import EngineStateError
from txstream.kafka_client import client_settings
from txstream.schemas.config import ConfigError, PipelineConfig
from txstream.service.checkpoint import CheckpointError
from txstream.service.health import HealthServer, Progress, Readiness
from txstream.sinks.kafka_sink import KafkaSinkFatalError
from txstream.sinks.live.flight import LiveFlightServer
from txstream.sinks.live.serving import LiveTables

if TYPE_CHECKING:  # imported when running: it loads Spark
    from txstream.service.runner import PipelineRunner

log = logging.getLogger("txstream.service.cli")
# Our own packages log at --log-level; everything else (py4j, Spark's Python side) at WARNING.
_OWN_LOGGERS = ("service", "connectors", "schemas", "examples")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _set_up_logging(level: str, json_format: bool) -> None:
    handler = logging.StreamHandler()
    if json_format:
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in _OWN_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())


def _status_printer(json_format: bool) -> Callable[[Progress], None]:
    def report(progress: Progress) -> None:
        if json_format:
            print(json.dumps({"status": progress.fields()}, default=str), flush=True)
        else:
            print(progress.line(), flush=True)

    return report


def _run(args: argparse.Namespace) -> int:
    from txstream.service.compose import open_runner
    from txstream.service.runner import ShutdownRequested

    config = PipelineConfig.load(args.config)
    _set_up_logging(args.log_level, config.log_format == "json")
    progress, readiness = Progress(), Readiness(config.ready_max_lag)
    health = None
    if config.http_port is not None:
        health = HealthServer(config.http_port, progress, readiness,
                              stall_timeout_s=config.stall_timeout_s).start()
    runner: PipelineRunner | None = None
    live: LiveFlightServer | None = None
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            return
        stop.set()
        log.warning("%s: finishing the current batch, checkpointing, exiting (at most %.0fs)",
                    signal.Signals(signum).name, config.shutdown_timeout_s)
        if runner is not None:
            runner.request_stop()
        # A batch stuck on an unavailable dependency or a slow checkpoint must not hold the
        # exit: everything is crash-safe, so exiting without the final checkpoint only costs
        # a replay at the next start.
        threading.Thread(target=_exit_after, args=(config.shutdown_timeout_s,), daemon=True,
                         name="shutdown-watchdog").start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        try:
            runner = open_runner(config, progress=progress, readiness=readiness)
        except ShutdownRequested:
            return 0
        if stop.is_set():
            runner.request_stop()
        if runner.live is not None:
            live = serve_live(config, runner.live)
            if health is not None and config.live.page:
                token = config.live.token
                health.serve_live(runner.live, token.get_secret_value() if token else None)
        interval = args.progress_interval or config.status_interval_s
        try:
            runner.run(on_progress=_status_printer(config.log_format == "json"),
                       progress_interval=interval)
        except ExpressionError as exc:
            _halt(exc, runner, stop)
            return 0
        if runner.checkpoint():
            log.info("final checkpoint through #%d", runner.progress.last_transaction)
        print(progress.line(), flush=True)
    finally:
        if live is not None:
            live.shutdown()
        if runner is not None:
            runner.close()
        if health is not None:
            health.stop()
    return 0


def serve_live(config: PipelineConfig, tables: LiveTables) -> LiveFlightServer:
    """The Arrow Flight endpoint of `tables`, as `config.live` says."""
    settings = config.live
    tls = None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        tls = (settings.tls_cert_file.read_bytes(), settings.tls_key_file.read_bytes())
    server = LiveFlightServer(
        tables, settings.host, settings.port, tls=tls,
        token=settings.token.get_secret_value() if settings.token else None)
    log.info("live tables %s served at %s://%s:%d", ", ".join(tables.names), server.scheme,
             settings.host, server.port)
    return server


def _halt(exc: ExpressionError, runner: PipelineRunner, stop: threading.Event) -> None:
    """Checkpoint what was delivered, then stay up, not ready, until told to stop: the batch
    would fail the same way after a restart, so exiting would only make Kubernetes restart the
    process in a loop. The fix is a new pipeline version."""
    log.error("processing halted: %s", exc)
    runner.progress.halted = str(exc)
    try:
        if runner.checkpoint():
            log.info("checkpoint through #%d before halting", runner.progress.last_transaction)
    except Exception:  # the halt stands; a restart replays from the previous checkpoint
        log.exception("checkpoint before halting failed")
    stop.wait()


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    log.error("shutdown took longer than %.0fs: exiting without a final checkpoint; the next "
              "start replays from the last one", seconds)
    logging.shutdown()
    os._exit(0)


Check = tuple[str, bool, str]


def _attempt(name: str, work: Callable[[], str]) -> Check:
    try:
        return name, True, work()
    except Exception as exc:  # a check reports any failure, whatever its kind
        return name, False, f"{type(exc).__name__}: {exc}".replace("\n", " ")


def run_checks(config: PipelineConfig) -> list[Check]:
    """Everything `txstream run` needs, tried without changing anything: the pipeline fits
    the configuration, Spark compiles it, the topics exist, PostgreSQL answers, the checkpoint
    location is readable and belongs to this pipeline."""
    import psycopg
    from confluent_kafka import Consumer

    from txstream.engine import Engine
    from txstream.service.checkpoint import CheckpointStore, PipelineIdentity
    from txstream.service.compose import check_sinks, check_sources
    from txstream.service.pipelines import load_pipeline
    from txstream.service.spark import get_spark

    checks: list[Check] = []

    def pipeline_fits() -> str:
        check_sources(config, load_pipeline(config.pipeline))
        return f"{config.pipeline} reads {', '.join(s.name for s in config.sources)}"

    checks.append(_attempt("pipeline", pipeline_fits))
    spark_box: list[object] = []

    def spark_compiles() -> str:
        spark = get_spark(config.spark_master)
        spark_box.append(spark)
        engine = Engine(load_pipeline(config.pipeline), spark)
        check_sinks(config, engine)
        return (f"Spark {spark.version} at {spark.sparkContext.master} compiled outputs "
                f"{', '.join(sorted(engine.outputs))}")

    checks.append(_attempt("spark", spark_compiles))

    def kafka_topics() -> str:
        consumer = Consumer(client_settings(config.kafka_bootstrap_servers, config.kafka_security,
                                            **{"group.id": f"{config.consumer_group}-check"}))
        try:
            topics = consumer.list_topics(timeout=10).topics
        finally:
            consumer.close()
        wanted = [s.topic for s in config.sources] + (
            [config.dead_letter_topic] if config.dead_letter_topic else [])
        missing = [t for t in wanted if t not in topics or topics[t].error is not None]
        if missing:
            raise ConfigError(f"topic(s) {', '.join(missing)} do not exist on "
                              f"{config.kafka_bootstrap_servers}; create them")
        return ", ".join(f"{t} ({len(topics[t].partitions)} partitions)" for t in wanted)

    checks.append(_attempt("kafka", kafka_topics))
    if config.database_dsn is not None:
        dsn = config.database_dsn

        def postgres_answers() -> str:
            with psycopg.connect(dsn, connect_timeout=10) as conn:
                row = conn.execute("SHOW server_version").fetchone()
            return f"PostgreSQL {row[0] if row else '?'}"

        checks.append(_attempt("postgresql", postgres_answers))

    def checkpoint_readable() -> str:
        from pyspark.sql import SparkSession

        spark = spark_box[0] if spark_box else get_spark(config.spark_master)
        assert isinstance(spark, SparkSession)
        store = CheckpointStore(config.checkpoint_location, spark, PipelineIdentity(
            pipeline=config.pipeline, sources={s.name: s.topic for s in config.sources},
            outputs=sorted(load_pipeline(config.pipeline).outputs)))
        latest = store.latest()
        if latest is None:
            return f"{store.location}: no checkpoint yet (the pipeline starts from scratch)"
        return (f"{store.location}: resumes after transaction #{latest.transaction} "
                f"(checkpoint of {latest.manifest.created:%Y-%m-%d %H:%M:%S} UTC)")

    checks.append(_attempt("checkpoint", checkpoint_readable))
    return checks


def _check(args: argparse.Namespace) -> int:
    config = PipelineConfig.load(args.config)
    failures = 0
    for name, ok, detail in run_checks(config):
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        failures += not ok
    print(f"{failures} problem(s)" if failures else "configuration, pipeline and connections ok")
    return 1 if failures else 0


def _demo(args: argparse.Namespace) -> int:
    from txstream.service import demo

    if args.stop:
        print("stopped the demo's PostgreSQL" if demo.stop() else "no demo PostgreSQL running")
        return 0
    demo.run_demo(events_count=args.events, say=lambda line: print(line, flush=True))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from txstream.service.pipelines import load_pipeline
    from txstream.service.replay import replay
    from txstream.service.spark import get_spark

    pipeline = load_pipeline(args.pipeline)
    written = replay(pipeline, get_spark(), Path(args.input), Path(args.output),
                     batch_transactions=args.batch_transactions)
    print(f"wrote {written} changes to {args.output}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txstream", description=__doc__)
    parser.add_argument("--log-level", default="INFO",
                        help="of txstream's own loggers (others log warnings only)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a configured pipeline (the deployed process)")
    run.add_argument("config", type=Path, help="pipeline configuration (YAML)")
    run.add_argument("--progress-interval", type=float, default=None,
                     help="seconds between status lines (default: status_interval_s)")
    run.set_defaults(func=_run)

    check = sub.add_parser("check", help="validate a configuration and its pipeline, connect to "
                           "Kafka, PostgreSQL and Spark; exit 1 on problems")
    check.add_argument("config", type=Path, help="pipeline configuration (YAML)")
    check.set_defaults(func=_check)

    demo = sub.add_parser("demo", help="the example pipeline end to end on embedded defaults")
    demo.add_argument("--events", type=int, default=20_000)
    demo.add_argument("--stop", action="store_true", help="stop the PostgreSQL a demo left")
    demo.set_defaults(func=_demo)

    rep = sub.add_parser("replay", help="run a recorded change log through a pipeline")
    rep.add_argument("pipeline", help="module:function returning the Pipeline")
    rep.add_argument("--input", required=True, help="change log, JSON lines")
    rep.add_argument("--output", required=True, help="output changes, JSON lines")
    rep.add_argument("--batch-transactions", type=int, default=100,
                     help="transactions per Spark job (the result does not depend on it)")
    rep.set_defaults(func=_replay)

    args = parser.parse_args(argv)
    _set_up_logging(args.log_level, json_format=os.environ.get("TXSTREAM_LOG_FORMAT") == "json")
    try:
        return int(args.func(args))
    except (ConfigError, PipelineDefinitionError, EngineInputError, EngineStateError,
            CheckpointError, KafkaSinkFatalError, ValueError) as exc:
        print(f"txstream {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
