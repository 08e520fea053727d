"""Spark beyond one process: a real standalone master and worker on 127.0.0.1.

The cluster starts once for this module. Drivers run as subprocesses, each with its own
SparkContext (see support/spark_standalone.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.replay_events import generate_events
from support.spark_standalone import StandaloneCluster, standalone_cluster

TXSTREAM = Path(sys.executable).with_name("txstream")


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


def test_standalone_cluster_runs_a_job(spark_cluster: StandaloneCluster) -> None:
    """A groupBy count that runs on the worker's executor, not in the driver."""
    script = textwrap.dedent(
        """
        import json, os
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master(os.environ["SPARK_MASTER"])
                 .appName("txstream-cluster-check")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .getOrCreate())
        rows = spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
        # Executors besides the driver: the job had somewhere else to run.
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        print(json.dumps({"counts": {r["k"]: r["count"] for r in rows}, "executors": executors}))
        spark.stop()
        """
    )
    result = subprocess.run([sys.executable, "-c", script], env=spark_cluster.driver_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stderr[-3000:]}\n{spark_cluster.log_tail()}"
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    expected = {str(k): sum(1 for i in range(1000) if i % 7 == k) for k in range(7)}
    assert answer["counts"] == expected
    assert answer["executors"] == 1
    finished = [app["name"] for app in spark_cluster.status()["completedapps"]]
    assert "txstream-cluster-check" in finished


def _replay(events_path: Path, output: Path, cluster: StandaloneCluster, master: str
            ) -> list[str]:
    """Run `txstream replay` on the example pipeline; its output lines, canonical and sorted.

    Two Spark jobs of 20 transactions: on the cluster, operator state then lives in the
    executor's memory between jobs. Sorted: the order of the changes within one transaction is
    not part of the contract.
    """
    result = subprocess.run(
        [str(TXSTREAM), "replay", "txstream.examples.orders:pipeline",
         "--input", str(events_path), "--output", str(output), "--batch-transactions", "20"],
        env={**cluster.driver_env(), "SPARK_MASTER": master},
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, (
        f"txstream replay on {master} failed ({result.returncode}):\n{result.stderr[-4000:]}"
        f"\n{cluster.log_tail()}"
    )
    lines = [line for line in output.read_text().splitlines() if line.strip()]
    return sorted(json.dumps(json.loads(line), sort_keys=True) for line in lines)


def test_replay_on_cluster_matches_local(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """The example pipeline's replay gives the same output on the cluster as in local mode."""
    assert TXSTREAM.exists(), f"{TXSTREAM} missing: install the package (pip install -e .)"
    events_path = tmp_path / "events.jsonl"
    events_path.write_text("".join(json.dumps(e) + "\n" for e in generate_events(seed=7)))

    local = _replay(events_path, tmp_path / "local.jsonl", spark_cluster, "local[2]")
    on_cluster = _replay(events_path, tmp_path / "cluster.jsonl", spark_cluster,
                         spark_cluster.master_url)

    assert local, "the local replay produced no output"
    assert on_cluster == local
