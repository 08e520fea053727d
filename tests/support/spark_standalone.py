"""A real Spark standalone cluster for tests: one master and N workers on 127.0.0.1.

The daemons come from pyspark's own distribution (`bin/spark-class` under
`pyspark.find_spark_home`), so no separate Spark download is needed. Drivers run in their own
processes (see `StandaloneCluster.driver_env`): a process has one SparkContext, and the test
session's `spark` fixture already holds a local one.

    with standalone_cluster(tmp_path) as cluster:
        subprocess.run([...], env=cluster.driver_env(), check=True)

A test of a lost executor finds an application's executor JVMs (`StandaloneCluster.executors`)
and kills one with SIGKILL (`kill_executor`), as a crashed machine or an evicted pod would end
it: no shutdown hook runs, its blocks are gone; the worker then launches a replacement.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.find_spark_home import _find_spark_home

from txstream.service.embedded.postgres import free_port

HOST = "127.0.0.1"
# Executors smaller than the worker's memory, so the worker always has room for one.
EXECUTOR_MEMORY = "512m"


class SparkClusterError(RuntimeError):
    """The cluster did not come up; the message carries the tail of the daemons' logs."""


@dataclass(frozen=True)
class StandaloneCluster:
    master_url: str
    ui_url: str
    # Holds spark-defaults.conf for the drivers: executors small enough for the worker.
    conf_dir: Path
    log_dir: Path
    # The workers' work directories: an executor runs in <work dir>/<app id>/<executor id>.
    work_dir: Path

    def driver_env(self) -> dict[str, str]:
        """Environment for a driver process (`SPARK_MASTER` is what the service reads)."""
        env = dict(os.environ)
        env.update(
            SPARK_MASTER=self.master_url,
            SPARK_CONF_DIR=str(self.conf_dir),
            SPARK_LOCAL_IP=HOST,
            # Executors run Python workers: the same interpreter and site-packages as the test.
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_DRIVER_MEMORY="1g",
        )
        return env

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the master's and the workers' logs and of every executor's
        stderr (where a task's failure is told in full), for failure messages."""
        parts = []
        for log in [*sorted(self.log_dir.glob("*.log")),
                    *sorted(self.work_dir.glob("*/*/stderr"))]:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.relative_to(self.log_dir.parent)}\n" + "\n".join(tail))
        return "\n".join(parts)

    def status(self) -> dict[str, Any]:
        """The master's state as its web UI serves it as JSON (workers, apps)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state

    def executors(self, app_id: str) -> dict[str, int]:
        """The live executor JVMs of application `app_id` on this cluster's workers: executor
        id -> process id. Found by their working directory, which the worker makes per
        executor under its work dir: no other cluster's or application's executor matches.
        Linux only (/proc)."""
        found = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                command = (proc / "cmdline").read_bytes().split(b"\0")
                cwd = (proc / "cwd").resolve()
            except OSError:  # exited meanwhile, or not ours to inspect
                continue
            if (any(arg.startswith(b"org.apache.spark.executor.") for arg in command)
                    and cwd.parent == self.work_dir.resolve() / app_id):
                found[cwd.name] = int(proc.name)
        return found

    def kill_executor(self, app_id: str, executor_id: str) -> None:
        """SIGKILL executor `executor_id` of `app_id` (its JVM alone: the Python workers it
        started exit when their pipe closes)."""
        os.kill(self.executors(app_id)[executor_id], signal.SIGKILL)


@contextmanager
def _daemon(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run one Spark daemon in its own process group; stop it (and any children) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def standalone_cluster(
    workdir: Path, workers: int = 1, cores: int = 1, memory: str = "1g", timeout: float = 120.0,
    executor_memory: str = EXECUTOR_MEMORY,
) -> Iterator[StandaloneCluster]:
    """Start a master and `workers` workers of `cores` cores and `memory` each, wait until every
    worker registered, stop them all on exit. Each worker runs one executor per application
    (it takes all the worker's cores), so N workers are N executors, of `executor_memory`
    each (within `memory`)."""
    spark_home = _find_spark_home()
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    log_dir = workdir / "logs"
    conf_dir = workdir / "conf"
    daemon_conf_dir = workdir / "daemon-conf"
    work_dir = workdir / "work"
    for directory in (log_dir, conf_dir, daemon_conf_dir, work_dir):
        directory.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(f"spark.executor.memory {executor_memory}\n")

    master_port, ui_port = free_port(HOST), free_port(HOST)
    cluster = StandaloneCluster(
        master_url=f"spark://{HOST}:{master_port}",
        ui_url=f"http://{HOST}:{ui_port}",
        conf_dir=conf_dir,
        log_dir=log_dir,
        work_dir=work_dir,
    )
    env = dict(os.environ)
    env.update(
        SPARK_HOME=spark_home,
        SPARK_LOCAL_IP=HOST,
        # The daemons' own heaps (default 1g each): they only schedule, the executor works.
        SPARK_DAEMON_MEMORY="256m",
        # An empty conf dir for the daemons: nothing from the machine's Spark setup leaks in.
        SPARK_CONF_DIR=str(daemon_conf_dir),
        PYSPARK_PYTHON=sys.executable,
    )
    master_args = [spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                   "--port", str(master_port), "--webui-port", str(ui_port)]
    # One work dir for all workers: executor ids are unique within an application.
    worker_args = [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                   "--host", HOST, "--cores", str(cores), "--memory", memory,
                   "--work-dir", str(work_dir)]

    with ExitStack() as stack:
        daemons = [stack.enter_context(_daemon(master_args, env, log_dir / "master.log"))]
        for i in range(workers):
            daemons.append(stack.enter_context(_daemon(
                [*worker_args, "--webui-port", str(free_port(HOST))], env,
                log_dir / f"worker-{i}.log")))
        deadline = time.monotonic() + timeout
        while True:
            if any(proc.poll() is not None for proc in daemons):
                raise SparkClusterError(f"a Spark daemon exited\n{cluster.log_tail()}")
            try:
                registered = cluster.status().get("workers", [])
                if sum(worker.get("state") == "ALIVE" for worker in registered) >= workers:
                    break
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass  # the master's UI is not up yet
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"not all {workers} workers registered within {timeout:.0f} s\n"
                    f"{cluster.log_tail()}"
                )
            time.sleep(0.5)
        yield cluster
