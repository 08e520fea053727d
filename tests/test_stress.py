"""The example pipeline under load stays exact: `txstream run` fed in bursts while a process
keeps a core busy, its batching drawn from the seed (`support.stress`), its live snapshots
equal to a from-scratch computation and its append stream, replayed, never outside 0..1.
`bench/stress.py` runs the same scenario many times."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.stress import StressSettings, run_stress

from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.service.embedded.postgres import PostgresEndpoint


# Seeds whose run failed on 94a7fe8 (before the fix) in a run of bench/stress.py: batches of
# 20 and 100 transactions (docs/benchmarks.md).
@pytest.mark.parametrize("seed", [6, 9, 13])
def test_the_example_pipeline_is_exact_under_load(kafka: KafkaEndpoint,
                                                   postgres: PostgresEndpoint, tmp_path: Path,
                                                   seed: int) -> None:
    result = run_stress(kafka, postgres.url, tmp_path, StressSettings.of(seed, seconds=20))
    assert result.events > 300
    assert result.held, f"{result.summary()}\n{result.log_tail}"
