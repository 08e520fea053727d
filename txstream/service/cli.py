"""The `txstream` command: run, check, demo, replay, prepare."""

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

from txstream.engine import (
    EngineInputError,
    ExpressionError,
    InvariantError,
    PipelineDefinitionError,
)
from txstream.engine.errors import EngineStateError
from txstream.schemas.config import ConfigError, PipelineConfig
from txstream.service.checkpoint import CheckpointError
from txstream.service.health import HealthServer, Readiness
from txstream.service.leadership import Leadership, report_fenced
from txstream.service.metrics import Metrics
from txstream.sinks.kafka_sink import KafkaSinkFatalError
from txstream.sinks.live.flight import LiveFlightServer
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.sink import FencedError

if TYPE_CHECKING:  # imported when running: it loads Spark
    from txstream.service.runner import PipelineRunner

log = logging.getLogger("txstream.service.cli")
# The exit status of `txstream run` when it stopped without its final checkpoint (the next start
# replays what that would have held): the shutdown outlasted `shutdown_timeout_s`, or the
# checkpoint failed (a full disk). A clean stop exits 0; 1 and 2 are `check`'s problems and a
# refused configuration or start.
EXIT_NO_FINAL_CHECKPOINT = 3
# Our own package logs at --log-level; everything else (py4j, Spark's Python side) at WARNING.
_OWN_LOGGERS = ("txstream",)


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


def _status_printer(json_format: bool) -> Callable[[Metrics], None]:
    def report(metrics: Metrics) -> None:
        if json_format:
            print(json.dumps({"status": metrics.fields()}, default=str), flush=True)
        else:
            print(metrics.line(), flush=True)

    return report


def _run(args: argparse.Namespace) -> int:
    from txstream.service.compose import open_runner
    from txstream.service.runner import ShutdownRequested
    from txstream.service.spark import get_spark

    config = PipelineConfig.load(args.config)
    _set_up_logging(args.log_level, config.log_format == "json")
    metrics, readiness = Metrics(), Readiness(config.ready_max_lag)
    health = start_endpoint(config, metrics, readiness)
    runner: PipelineRunner | None = None
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
        threading.Thread(target=_exit_after, args=(config.shutdown_timeout_s, metrics),
                         daemon=True, name="shutdown-watchdog").start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    leadership = Leadership.of(config, readiness, metrics, stop)
    # Up before waiting for the lease: a standby that takes over skips the JVM's start.
    spark = get_spark(config.spark_master) if leadership is not None else None
    waiting_as = "standby"
    try:
        while True:
            fence = None
            if leadership is not None:
                fence = leadership.wait_for_turn(waiting_as)
                if fence is None:
                    return 0  # stopped while waiting
            try:
                runner = open_runner(config, spark=spark, metrics=metrics, readiness=readiness,
                                     fence=fence)
            except ShutdownRequested:
                return 0
            try:
                return _serve(args, config, runner, health, stop)
            except FencedError as exc:
                if leadership is not None:
                    leadership.fenced(exc)
                else:
                    report_fenced(exc, readiness, metrics)
                waiting_as = "fenced"  # and wait for the lease again, as the new standby
            finally:
                runner.close()
                runner = None
            if leadership is None:
                # No lease to wait for: the instance that fenced this one writes on. Waiting
                # rather than exiting keeps Kubernetes from restarting this one, which would
                # fence the other in turn.
                stop.wait()
                return 0
    finally:
        if leadership is not None:
            leadership.release()
        if health is not None:
            health.stop()


def _serve(args: argparse.Namespace, config: PipelineConfig, runner: PipelineRunner,
           health: HealthServer | None, stop: threading.Event) -> int:
    """Run `runner` until stopped (or halted), then checkpoint."""
    live: LiveFlightServer | None = None
    if stop.is_set():
        runner.request_stop()
    try:
        if runner.live is not None:
            live = serve_live(config, runner.live)
            if health is not None and config.live.page:
                health.serve_live(runner.live)
        interval = args.progress_interval or config.status_interval_s
        try:
            runner.run(on_progress=_status_printer(config.log_format == "json"),
                       progress_interval=interval)
        except (ExpressionError, InvariantError) as exc:
            _halt(exc, runner, stop)
            return 0
        try:
            final = runner.checkpoint()
        except FencedError:
            raise  # another instance writes on: not this one's failure
        except Exception:  # the storage's error; a restart replays more, nothing is lost
            log.exception("final checkpoint failed: the next start resumes from the last one "
                          "(#%s) and replays the transactions after it",
                          runner.metrics.checkpoint.last_transaction)
            print(runner.metrics.line(), flush=True)
            return EXIT_NO_FINAL_CHECKPOINT
        if final:
            log.info("final checkpoint through #%d", runner.metrics.delivery.last_transaction)
        else:
            log.info("no final checkpoint to write: the last one holds every committed "
                     "transaction (#%s)", runner.metrics.checkpoint.last_transaction)
        print(runner.metrics.line(), flush=True)
    finally:
        if live is not None:
            live.shutdown()
    return 0


def start_endpoint(config: PipelineConfig, metrics: Metrics, readiness: Readiness
                   ) -> HealthServer | None:
    """The HTTP endpoint `config.http_port` asks for (None: none), serving from now on, before
    the runner exists. The live page's token is given here, so `/ui` refuses a request
    without it from the start, not only once the live tables are attached."""
    if config.http_port is None:
        return None
    token = config.live.token
    return HealthServer(config.http_port, metrics, readiness,
                        stall_timeout_s=config.stall_timeout_s,
                        page_token=token.get_secret_value() if token else None).start()


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


def _halt(exc: ExpressionError | InvariantError, runner: PipelineRunner, stop: threading.Event
          ) -> None:
    """Checkpoint what was delivered, then stay up, not ready, until told to stop: the batch
    would fail the same way after a restart, so exiting would only make Kubernetes restart the
    process in a loop. The fix is a new pipeline version (an expression), or of txstream (an
    invariant: nothing of the batch was written)."""
    log.error("processing halted: %s", exc)
    runner.metrics.compute.halt(str(exc))
    try:
        if runner.checkpoint():
            log.info("checkpoint through #%d before halting",
                     runner.metrics.delivery.last_transaction)
    except Exception:  # the halt stands; a restart replays from the previous checkpoint
        log.exception("checkpoint before halting failed")
    stop.wait()


def _exit_after(seconds: float, metrics: Metrics) -> None:
    """After `seconds`, exit with EXIT_NO_FINAL_CHECKPOINT, saying which committed transactions
    no checkpoint holds: an orchestrator tells a timed-out stop from a clean one by the
    status, an operator by this line what the next start replays."""
    time.sleep(seconds)
    committed = metrics.delivery.last_transaction
    checkpointed = metrics.checkpoint.last_transaction or 0  # 0: no checkpoint
    if committed > checkpointed:
        missing = (f"transactions #{checkpointed + 1} to #{committed} are committed to the "
                   "sinks but in no checkpoint; the next start replays them")
    else:
        missing = "every committed transaction is in a checkpoint"
    log.error("shutdown took longer than shutdown_timeout_s (%gs): exiting with status %d "
              "without a final checkpoint (last committed transaction #%d, last checkpointed "
              "#%d): %s", seconds, EXIT_NO_FINAL_CHECKPOINT, committed, checkpointed, missing)
    logging.shutdown()
    os._exit(EXIT_NO_FINAL_CHECKPOINT)


def _check(args: argparse.Namespace) -> int:
    from txstream.service.check import run_checks

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
    demo.run_demo(events_count=args.events, say=lambda line: print(line, flush=True),
                  example=args.example)
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


def _prepare(args: argparse.Namespace) -> int:
    from txstream.service.class_archive import ClassArchiveError
    from txstream.service.prepare import prepare

    try:
        path = prepare()
    except ClassArchiveError as exc:
        print(f"txstream prepare: {exc} (the service works without it, only starts slower)",
              file=sys.stderr)
        return 1
    print(f"class archive written: {path}")
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
    demo.add_argument("--example", choices=("orders", "page_views"), default="orders",
                      help="orders (customers and orders) or page_views (event time: windows, "
                      "sessions, an as-of join, a last-hour filter)")
    demo.add_argument("--stop", action="store_true", help="stop the PostgreSQL a demo left")
    demo.set_defaults(func=_demo)

    rep = sub.add_parser("replay", help="run a recorded change log through a pipeline")
    rep.add_argument("pipeline", help="module:function returning the Pipeline")
    rep.add_argument("--input", required=True, help="change log, JSON lines")
    rep.add_argument("--output", required=True, help="output changes, JSON lines")
    rep.add_argument("--batch-transactions", type=int, default=100,
                     help="transactions per Spark job (the result does not depend on it)")
    rep.set_defaults(func=_replay)

    prep = sub.add_parser("prepare", help="write the driver JVM's class archive, which makes "
                          "every later start of Spark faster (once per installation)")
    prep.set_defaults(func=_prepare)

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
