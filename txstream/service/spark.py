"""The long-lived SparkSession: `local[2]` by default, `SPARK_MASTER` selects a cluster."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from txstream.service import class_archive

DEFAULT_MASTER = "local[2]"


_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "false",
    # A broadcast is a Spark job of its own; the engine's joins build their hash table from
    # the batch's delta instead (see txstream.engine.frames.build_side).
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # A join of single-partition inputs stays in one partition only while Spark's size
    # estimate allows; estimates of checkpointed join results are products of products.
    "spark.sql.maxSinglePartitionBytes": str(2**63 - 1),
    # A batch's plans need a few hundred compiled expressions, the same ones every batch;
    # Spark's default cache of 100 would have them evict each other, and every batch would
    # recompile them (and the JIT recompile those classes). Whole-stage code is unique to
    # each plan (its limit counters are numbered process-wide), so it would be compiled anew
    # for every batch: off.
    "spark.sql.codegen.cache.maxEntries": "10000",
    "spark.sql.codegen.wholeStage": "false",
    # This rule merges ungrouped aggregates of the same input (the same one read twice
    # included) into one scalar subquery, whose plan a template cannot rebind
    # (`txstream.engine.templates`): a temporal join's plans read their clock's aggregate
    # twice, and with the rule on, no batch of them with changes on one side was ever rebound
    # (ten such joins: 25-55 s of planning a batch, 5-10 s rebound). Computing such an
    # aggregate twice costs a few rows.
    "spark.sql.optimizer.excludedRules": "org.apache.spark.sql.execution.planmerging.MergeSubplans",
    # A runtime bloom filter is a scalar subquery too: a plan given one would never be rebound.
    "spark.sql.optimizer.runtime.bloomFilter.enabled": "false",
    # Every action renders its plan for the SQL listener; the default, formatted, costs a
    # batch's planning about half a second more.
    "spark.sql.ui.explainMode": "simple",
    # Spark's status store keeps every query's plan graph, metrics and text, every job's and
    # stage's data and every stage's RDD graph (some 250 nodes here), UI or not, up to 1,000
    # of each: a batch runs several of each, so the heap after GC grew until a thousand were
    # kept (an exactly-once windowed pipeline: 80 to 98 MB between its 10th and 100th batch;
    # 74 to 79 MB with these limits). Twenty queries and fifty stages are enough to look into
    # the latest batch. A batch's jobs are counted from the jobs kept
    # (`txstream.engine.sparkjobs`): Spark drops the oldest finished ones, a tenth of the
    # limit at a time, so the latest 180 or more stay, more than a batch runs.
    "spark.sql.ui.retainedExecutions": "20",
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "50",
    # The frames a batch shares between its plans are cached for that batch only
    # (txstream.engine.batch.BatchPlan.shared): compressing them took 7% of a million-event
    # batch's executor time and saved nothing (its job 12% faster without, alternated).
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    "spark.sql.session.timeZone": "UTC",
    # Every hash aggregate, hash join and sort takes at least one page of execution memory,
    # and a batch runs all of them in its one task. Spark's default page (up to 64 MiB, by
    # driver memory) let a DAG of a few dozen such operators fail its first batch with
    # UNABLE_TO_ACQUIRE_MEMORY; a state index was a 64 MiB page even for a few rows.
    "spark.buffer.pageSize": "2m",
    # PySpark otherwise records the Python call site of every DataFrame and Column call in
    # the JVM (four extra round trips each, a third of a batch's planning calls). Errors keep
    # their SQL context: the failing fragment of an expression's text.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Executors talk to their Python workers (a state index's probe, txstream.engine.run_index)
    # over a Unix socket: over loopback TCP the worker's first batch came ~40 ms after the
    # task began (Nagle's algorithm and delayed acknowledgements), in every batch probing one.
    "spark.python.unix.domain.socket.enabled": "true",
    # Old state versions are released by the context cleaner once unreferenced.
    "spark.cleaner.periodicGC.interval": "1min",
    # A replicated state block whose executor is lost is copied again to another one, so that
    # a later loss is survived too (`state_replicas`, txstream.engine.state).
    "spark.storage.replication.proactive": "true",
    # An executor asks the master for replication peers at most this often (ms; Spark's
    # default is a minute): after a loss it would otherwise keep replicating to none for a
    # minute, and the replacement executor would get no copy of the state copied to it.
    "spark.storage.cachedPeersTtl": "1000",
}

# What the JVM prints at every start and says nothing to act on: the JDK's note on the vector
# module Spark loads, log4j's choice of profile, Hadoop's missing native library, the local
# address Spark picked.
_START_UP_NOISE = re.compile(
    r"Using incubator modules|Using Spark's default log4j profile|Setting default log level"
    r"|To adjust logging level use|NativeCodeLoader|Your hostname, .* resolves to a loopback"
    r"|Set SPARK_LOCAL_IP")

# log4j's console layout: `yy/MM/dd HH:mm:ss LEVEL logger: message`.
_LOG4J_RECORD = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (ERROR|WARN|INFO|DEBUG|TRACE) ")

# How far the driver JVM's C2 compiler threads run below the JVM's own priority, in nice
# steps (see `_lower_c2_priority`).
C2_NICE_STEPS = 10
# Every compiler thread started with the JVM: by default HotSpot starts more on demand, each
# from a compiler thread of either kind, whose nice value it would inherit.
_ALL_COMPILER_THREADS = "-XX:-UseDynamicNumberOfCompilerThreads"

jvm_log = logging.getLogger("spark")
log = logging.getLogger(__name__)
# PySpark also logs every error that carries a SQL context, as a JSON record with the whole
# Java stack trace, before raising it: the raised exception says the same.
logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)


def get_spark(master: str | None = None, app_name: str = "txstream", *,
              java_options: str | None = None) -> SparkSession:
    """Return the process's SparkSession, creating it on first use.

    Few shuffle partitions, no adaptive execution and no broadcasts: the engine's batches are
    small jobs whose fixed cost, not parallelism, dominates: a small batch's cost is counted in
    Spark jobs and stages, not rows, and a broadcast exchange runs as a job of its own (the
    Spark facts measured when the engine was designed: section 8 of the project's design
    document, which is kept outside this repository; `docs/design/` holds the research
    published with it). What the
    JVM prints goes through Python logging (logger `spark`), its start-up chatter dropped.
    A new driver JVM gets `java_options`, by default those that map the class archive
    (`txstream.service.class_archive`) when there is one.
    """
    created: tuple[float, str] | None = None  # when this call began a new context, and how
    if SparkContext._active_spark_context is None:
        started = time.monotonic()
        # Executors run the engine's Python code (state indexes, `txstream.engine.run_index`)
        # in workers of this interpreter unless told otherwise: PySpark's default, `python3`
        # on the PATH, may lack the project and pyarrow.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf = SparkConf().setMaster(master or os.environ.get("SPARK_MASTER", DEFAULT_MASTER))
        conf.setAppName(app_name).setAll([
            *_SETTINGS.items(),
            ("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "2")),
            ("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "4g")),
        ])
        options = class_archive.java_options() if java_options is None else java_options
        jvm_options = f"{options} {_ALL_COMPILER_THREADS}".strip()
        conf.set("spark.driver.defaultJavaOptions", jvm_options)
        gateway = launch_gateway(conf, popen_kwargs={"stdout": subprocess.PIPE,
                                                     "stderr": subprocess.STDOUT})
        threading.Thread(target=_forward, args=(gateway.proc.stdout,), daemon=True,
                         name="spark-output").start()
        _lower_c2_priority(gateway.proc.pid)
        SparkContext(conf=conf, gateway=gateway)
        created = started, f"driver JVM options {jvm_options}" + ("" if options else
                                                                 ", no class archive")
    # The session's own start (its JVM object and the SQL session state it builds: seconds of a
    # cold start, docs/benchmarks.md) is Spark's, as the context's is: logged once both are up.
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if created is not None:
        log.info("Spark session started in %.1f s (%s)", time.monotonic() - created[0],
                 created[1])
    return spark


def _lower_c2_priority(jvm_pid: int) -> None:
    """Run the JVM's C2 compiler threads `C2_NICE_STEPS` nice steps below the JVM's own
    priority (at most nice 19), below the threads doing the work.

    A cold JVM's first batch is planned on one thread while both JIT compilers work: on two
    cores the C2 thread took most of a first batch's time in CPU, much of it from the planning
    thread's core. Ten steps lower, that first batch ran faster and the warm example pipeline
    ran as fast as without (the measurements: docs/benchmarks.md, "History"): C2 still gets
    every idle moment and a share of a busy core. C1 keeps its priority: its quick compiles are
    what the first batches run on (with both lowered the first batch was slower than with C2
    alone lowered). Linux only (the threads are found
    in /proc by name). Raising a thread's nice value needs no privilege and lowering it again
    would, so it stays.
    """
    tasks = Path(f"/proc/{jvm_pid}/task")
    if not tasks.is_dir():
        log.debug("no %s: the JIT compiler keeps its priority", tasks)
        return
    lowered = 0
    for task in tasks.iterdir():
        try:  # a thread may end meanwhile
            if (task / "comm").read_text().startswith("C2 CompilerThre"):
                tid = int(task.name)
                nice = min(19, os.getpriority(os.PRIO_PROCESS, tid) + C2_NICE_STEPS)
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                lowered += 1
        except OSError as exc:
            log.debug("thread %s of the JVM keeps its priority: %s", task.name, exc)
    if not lowered:
        log.debug("no C2 compiler thread in the JVM (C1 only?): nothing to lower")


def _forward(output: IO[bytes]) -> None:
    """The JVM's console lines into `log`: a log4j record as an error or a warning, the lines
    that continue it (stack traces, the SQL excerpt of an error) at debug level, since the same
    failure reaches Python as an exception with its message; start-up chatter dropped."""
    for raw in iter(output.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        if not line or _START_UP_NOISE.search(line):
            continue
        record = _LOG4J_RECORD.match(line)
        if record is None:
            jvm_log.debug("%s", line)
        else:
            level = logging.ERROR if record.group(1) == "ERROR" else logging.WARNING
            jvm_log.log(level, "%s", line)
