"""The driver JVM's class-data archive: Spark's classes mapped at start, not loaded from jars.

    txstream prepare --> a driver JVM with -XX:ArchiveClassesAtExit=<archive>.partial
                           runs the example pipeline's warm-up (loading what a batch loads),
                           then exits normally: PySpark's gateway exits when its stdin closes,
                           and the JVM writes the archive as it exits
                     --> <archive>.partial renamed to <archive>
    txstream run ----> get_spark: -XX:SharedArchiveFile=<archive>, when it exists

Every start of the driver JVM loads, parses and verifies the classes of Spark, Scala and their
libraries from some 250 jars, and a first batch loads as many again (Catalyst's rules, the
code generator). A dynamic class-data-sharing archive (JDK 13 and later) holds those classes
parsed and verified, and later JVMs map it. Measured on the development machine (2 cores):
the Spark session's start 11.6 -> 6.2 s, the example pipeline's engine 3.3 -> 2.1 s; a
restart, a takeover and every test that starts the service pay that less.

The archive is only valid for the JVM and the jars that wrote it: its name holds Spark's version
and a digest of the `java` binary and SPARK_HOME, and the JVM itself checks it and ignores one
that does not match (`-Xshare:auto`, the default), so a stale archive costs only its benefit.
The image carries none: whether the Helm chart's driver could map one is not verified (its
`SPARK_CONF_DIR`, a directory holding `spark-defaults.conf`, is on the class path, which
class-data sharing checks), and an archive is ~160 MiB. The archive is written once per
installation (`make install`), with a file beside it naming its SPARK_HOME, and writing it
deletes the archives of other Spark versions and of installations since removed (`sweep`: a
deleted checkout's would otherwise stay); `TXSTREAM_CLASS_ARCHIVE` names another file, or `off`.
It is passed as `spark.driver.defaultJavaOptions`, which Spark puts before
`spark.driver.extraJavaOptions`: JVM options of a user's own belong in the latter (a
`defaultJavaOptions` of theirs in spark-defaults.conf is overridden: `get_spark` always sets it,
with its JIT compiler option, `txstream.service.spark`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import pyspark
from pyspark import SparkContext
from pyspark.errors import PySparkException

ENV = "TXSTREAM_CLASS_ARCHIVE"

log = logging.getLogger(__name__)


class ClassArchiveError(RuntimeError):
    """The archive could not be written: the service starts without one (only slower)."""


def _java() -> Path | None:
    """The `java` that Spark's launcher runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path() -> Path | None:
    """Where this installation's archive is (whether or not it exists yet); None when
    `TXSTREAM_CLASS_ARCHIVE=off` or there is no `java` to key it by."""
    chosen = os.environ.get(ENV)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    java = _java()
    if java is None:
        return None
    stat = java.stat()
    digest = hashlib.sha256(
        f"{java}:{stat.st_size}:{stat.st_mtime_ns}:{_spark_home()}".encode()
    ).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "txstream" / f"spark-{pyspark.__version__}-{digest}.jsa"


def _spark_home() -> Path:
    return Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent).resolve()


def _owner(archive: Path) -> Path:
    """The file beside an archive naming the SPARK_HOME it was written for."""
    return archive.with_name(archive.name + ".home")


def sweep(archive: Path) -> list[Path]:
    """Delete the archives beside `archive` that no installation can use any more (~160 MiB
    each): those of other Spark versions, and those whose SPARK_HOME is gone (a checkout or
    virtualenv removed). Others of this version may be another installation's, which exists;
    one written before archives named their SPARK_HOME is kept. The archives deleted."""
    deleted = []
    for old in archive.parent.glob("spark-*.jsa"):
        owner = _owner(old)
        home_gone = owner.is_file() and not Path(owner.read_text().strip()).exists()
        if old != archive and (home_gone or
                               not old.name.startswith(f"spark-{pyspark.__version__}-")):
            old.unlink(missing_ok=True)
            owner.unlink(missing_ok=True)
            deleted.append(old)
    return deleted


def java_options() -> str:
    """The driver JVM's options for using the archive: none when it is not there."""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    # Quoted: Spark's launcher splits JVM options at blanks outside quotes.
    return f'"-XX:SharedArchiveFile={path}"'


def prepare(timeout_s: float = 300.0) -> Path:
    """Write this installation's archive, and delete those beside it no installation can use
    (`sweep`); its path. Starts, uses and ends a Spark JVM of its own, so call it in
    a process that has started none."""
    # Here, not at the top: every Spark session's start imports this module for its options,
    # and needs neither the engine nor the example pipeline (nor can import `get_spark`'s
    # module, which imports this one).
    from txstream.engine import Engine
    from txstream.engine.warmup import warm_up
    from txstream.examples.orders import pipeline
    from txstream.service.spark import get_spark

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
    _owner(path).write_text(f"{_spark_home()}\n")
    sweep(path)
    log.info("class archive written to %s (%.0f MiB) in %.0f s", path,
             path.stat().st_size / 2**20, time.monotonic() - started)
    return path
