"""`txstream prepare`: writing the driver JVM's class-data archive
(`txstream.service.class_archive` says what it is, where it lives and how a start uses it).

A driver JVM started with `-XX:ArchiveClassesAtExit=<archive>.partial` runs the example
pipeline's warm-up, which loads what a batch loads (plans of every operator kind, compiled and
run), then exits normally: PySpark's gateway exits when its stdin closes, and the JVM writes the
archive as it exits. The partial file is renamed to the archive only then, so a start never maps
half an archive.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from pyspark import SparkContext
from pyspark.errors import PySparkException

from txstream.engine import Engine
from txstream.engine.warmup import warm_up
from txstream.examples.orders import pipeline
from txstream.service.class_archive import (
    ENV,
    ClassArchiveError,
    archive_path,
    owner_file,
    spark_home,
    sweep,
)
from txstream.service.spark import get_spark

log = logging.getLogger(__name__)


def prepare(timeout_s: float = 300.0) -> Path:
    """Write this installation's archive, and delete those beside it no installation can use
    (`sweep`); its path. Starts, uses and ends a Spark JVM of its own, so call it in
    a process that has started none."""
    path = archive_path()
    if path is None:
        raise ClassArchiveError(f"no archive to write: {ENV}=off, or no `java` found "
                                "(JAVA_HOME or PATH)")
    if SparkContext._gateway is not None:
        raise ClassArchiveError("prepare: this process has started a Spark JVM already; the "
                                "archive is written by a JVM of its own as it exits")
    partial = path.with_name(path.name + ".partial")
    started = time.monotonic()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        spark = get_spark(java_options=f'"-XX:ArchiveClassesAtExit={partial}"')
        # The classes a batch loads: plans of every operator kind, compiled and run.
        warm_up(Engine(pipeline(), spark), 1_000)
        gateway = SparkContext._gateway
        spark.stop()
    except (OSError, PySparkException) as exc:
        raise ClassArchiveError(f"could not run the JVM that writes the archive: {exc}") from exc
    assert gateway is not None
    SparkContext._gateway = SparkContext._jvm = None  # this JVM is about to exit
    gateway.proc.stdin.close()  # the gateway's cue to exit (System.exit), writing the archive
    try:
        code = gateway.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        gateway.proc.kill()
        gateway.proc.wait()
        raise ClassArchiveError(f"the JVM did not exit within {timeout_s:.0f} s of being "
                                "told to; no archive written") from exc
    if code != 0 or not partial.is_file():
        raise ClassArchiveError(f"the JVM exited with {code} and wrote no archive to "
                                f"{partial}; see its output above (logger `spark`)")
    partial.replace(path)
    owner_file(path).write_text(f"{spark_home()}\n")
    sweep(path)
    log.info("class archive written to %s (%.0f MiB) in %.0f s", path,
             path.stat().st_size / 2**20, time.monotonic() - started)
    return path
