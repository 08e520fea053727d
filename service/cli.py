"""The `txstream` command: run, demo, replay."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from schemas.config import ConfigError, PipelineConfig
from service.engine import EngineInputError, PipelineDefinitionError


def _run(args: argparse.Namespace) -> int:
    from service.health import HealthServer
    from service.runner import PipelineRunner, Progress

    config = PipelineConfig.load(args.config)
    runner = PipelineRunner(config)
    health = None
    if config.http_port is not None:
        health = HealthServer(config.http_port, runner.progress, config.ready_max_lag).start()

    def report(progress: Progress) -> None:
        if health is not None:
            health.ready.set()
        print(progress.line(), flush=True)

    try:
        runner.run(on_progress=report, progress_interval=args.progress_interval)
    except KeyboardInterrupt:
        pass
    finally:
        runner.close()
        if health is not None:
            health.stop()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from service import demo

    if args.stop:
        print("stopped the demo's PostgreSQL" if demo.stop() else "no demo PostgreSQL running")
        return 0
    demo.run_demo(events_count=args.events, say=lambda line: print(line, flush=True))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from service.pipelines import load_pipeline
    from service.replay import replay
    from service.spark import get_spark

    pipeline = load_pipeline(args.pipeline)
    written = replay(pipeline, get_spark(), Path(args.input), Path(args.output),
                     batch_transactions=args.batch_transactions)
    print(f"wrote {written} changes to {args.output}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txstream", description=__doc__)
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a configured pipeline (the deployed process)")
    run.add_argument("config", type=Path, help="pipeline configuration (YAML)")
    run.add_argument("--progress-interval", type=float, default=10.0)
    run.set_defaults(func=_run)

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
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except (ConfigError, PipelineDefinitionError, EngineInputError, ValueError) as exc:
        print(f"txstream {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
