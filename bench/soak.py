"""A soak of the service: `txstream run` of the example pipeline under a steady load whose keys
keep moving, for `--minutes` (default 60), with faults on a schedule (default: kill -9 of the
service, a PostgreSQL restart, the broker paused 30 s and the checkpoint volume full for 30 s,
twice each, spread over the run; the full volume needs root, to mount a tmpfs),
sampled every `--sample-s` seconds (`tests/support/soak.py` says what and how), then checked
against a from-scratch computation. Prints one JSON object: the settings, every sample, every
fault with how the service recovered, and whether the run held; `--out FILE` writes it there
too.

Uses `KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL` if set (faults those cannot take are skipped),
else starts the embedded broker and a throwaway PostgreSQL. The embedded broker (librdkafka's
mock cluster) keeps at most 5 MB a partition, some 25 s of this load: on it each topic gets 4
partitions and the service checkpoints every 30 s (its default: 300 s), so that what a restart
replays is still there.

    .venv/bin/python bench/soak.py [--minutes 60] [--rate 2000] [--customers 1000]
        [--live-orders 5000] [--sample-s 10] [--faults kill@6,postgres@11,broker@16,...]
        [--pause-s 30] [--out docs/benchmarks/results/soak-DATE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.soak import FAULTS, SoakSettings, run_soak

from txstream.service.embedded.kafka import MockKafkaBroker, kafka_from_env
from txstream.service.embedded.postgres import postgres_from_env


def faults(text: str, minutes: float) -> tuple[tuple[float, str], ...]:
    """`kind@minute,...` as (seconds, kind); empty: each kind twice, spread over the run."""
    if not text:
        spread = [(minutes * (i + 1) / (2 * len(FAULTS) + 1), kind)
                  for i, kind in enumerate(FAULTS * 2)]
        return tuple((round(at * 60, 1), kind) for at, kind in spread)
    found = []
    for item in text.split(","):
        kind, _, at = item.partition("@")
        if kind not in FAULTS:
            raise SystemExit(f"--faults: {kind!r} is not one of {', '.join(FAULTS)}")
        found.append((float(at) * 60, kind))
    return tuple(sorted(found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="events per second")
    parser.add_argument("--customers", type=int, default=1000)
    parser.add_argument("--live-orders", type=int, default=5000)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--faults", default="", help="kind@minute,... (default: see above)")
    parser.add_argument("--pause-s", type=float, default=30.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="txstream-soak-") as tmp:
        kafka = kafka_from_env()
        postgres = postgres_from_env(Path(tmp))
        embedded = isinstance(kafka, MockKafkaBroker)
        settings = SoakSettings(duration_s=args.minutes * 60, rate=args.rate,
                                customers=args.customers, live_orders=args.live_orders,
                                sample_s=args.sample_s, faults=faults(args.faults, args.minutes),
                                pause_s=args.pause_s, partitions=4 if embedded else 1,
                                service=(("checkpoint_every_s", 30),) if embedded else ())
        try:
            result = run_soak(kafka, postgres, Path(tmp) / "run", settings,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
        finally:
            kafka.stop()
            postgres.stop()
    text = json.dumps(result.summary(), default=str)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
