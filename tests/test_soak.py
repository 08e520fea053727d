"""Three minutes of the soak (`support.soak`, `bench/soak.py` runs an hour): the example
pipeline under a steady load whose keys keep moving, with a kill -9 of the service, a
PostgreSQL restart, the broker frozen for 20 s and the checkpoint volume full for 20 s. Nothing
is lost or duplicated, the service commits again after each fault, says it is not ready within
10 s of the broker's freeze and of the full volume, and its state stays at the live keys. Its
own broker and PostgreSQL (those of the other tests are not to be restarted), or those of
`KAFKA_BOOTSTRAP_SERVERS` / `DATABASE_URL`, where the faults they cannot take are skipped."""

from __future__ import annotations

import math
from pathlib import Path

from support.soak import SoakSettings, run_soak
from support.volumes import can_mount

from txstream.service.embedded.kafka import MockKafkaBroker, kafka_from_env
from txstream.service.embedded.postgres import EmbeddedPostgres, postgres_from_env


def test_three_minutes_with_a_fault_of_each_kind(tmp_path: Path) -> None:
    # The full volume first once warm: its log retries' backoff (0.5 s doubling to 30 s) may
    # take half a minute after the space is back to see it. Faults that last, 20 s each.
    settings = SoakSettings(duration_s=180, rate=500, customers=200, live_orders=1000,
                            faults=((40, "disk"), (100, "kill"), (130, "postgres"),
                                    (145, "broker")), pause_s=20,
                            service=(("checkpoint_every_s", 20),))
    kafka = kafka_from_env()
    postgres = postgres_from_env()  # in a directory the server's user can reach
    try:
        result = run_soak(kafka, postgres, tmp_path / "run", settings)
    finally:
        kafka.stop()
        postgres.stop()
    summary = result.summary()
    assert result.held, summary
    assert (result.samples[-1]["committed"] or 0) > 0, summary
    injected = {f["kind"]: f for f in result.faults if "skipped" not in f}
    assert set(injected) >= {"kill"} | ({"broker"} if isinstance(kafka, MockKafkaBroker)
                                       else set()) | (
        {"postgres"} if isinstance(postgres, EmbeddedPostgres) else set()) | (
        {"disk"} if can_mount() else set())
    for fault in injected.values():
        assert "committed_after_s" in fault, summary  # a transaction after the fault committed
    for kind in {"broker", "disk"} & set(injected):
        assert injected[kind].get("not_ready_after_s", math.inf) <= 10, summary
        assert "ready_again_after_s" in injected[kind], summary
    rows = [sample["state_rows"] for sample in result.samples if sample.get("state_rows")]
    assert rows, "no checkpoint was sampled"
    assert max(max(r.values()) for r in rows) <= settings.live_orders, rows
