"""How often the example pipeline stays exact under load: `--runs` runs of the stress scenario
(`tests/support/stress.py`: `txstream run` fed in bursts while a process keeps a core busy,
batching drawn from each run's seed), each checked against a from-scratch computation and its
append stream replayed. Prints one JSON object: how many held, and every run's settings and
findings.

Uses `KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL` if set, else starts the embedded broker and a
throwaway PostgreSQL.

    .venv/bin/python bench/stress.py [--runs 20] [--first-seed 1] [--seconds 40] [--no-busy]
        [--no-warm-up] [--batch-transactions N] [--service-defaults]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.stress import StressSettings, run_stress

from txstream.service.embedded.kafka import kafka_from_env
from txstream.service.embedded.postgres import postgres_from_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--no-busy", action="store_true", help="no process keeping a core busy")
    parser.add_argument("--no-warm-up", action="store_true")
    parser.add_argument("--batch-transactions", type=int, help="instead of drawn per seed")
    parser.add_argument("--service-defaults", action="store_true",
                        help="the service's default batching in every run, none drawn")
    args = parser.parse_args()
    fixed: dict[str, object] = {"seconds": args.seconds, "busy": not args.no_busy,
                                "warm_up": not args.no_warm_up}
    if args.batch_transactions is not None:
        fixed["batch_transactions"] = args.batch_transactions
    work = Path(tempfile.mkdtemp(prefix="txstream-stress-"))
    kafka = kafka_from_env()
    postgres = postgres_from_env(Path(tempfile.mkdtemp(prefix="txstream-stress-pg-")))
    runs = []
    try:
        for seed in range(args.first_seed, args.first_seed + args.runs):
            settings = (StressSettings(seed, **fixed) if args.service_defaults  # type: ignore[arg-type]
                        else StressSettings.of(seed, **fixed))
            result = run_stress(kafka, postgres.url, work / f"run-{seed}", settings)
            runs.append(result.summary())
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        kafka.stop()
        postgres.stop()
    print(json.dumps({"runs": len(runs), "held": sum(r["held"] for r in runs),
                      "failed_seeds": [r["seed"] for r in runs if not r["held"]],
                      "details": runs}, indent=1))


if __name__ == "__main__":
    main()
