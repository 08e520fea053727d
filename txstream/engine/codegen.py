"""Whether a batch's expressions are evaluated interpreted or by code Spark generates.

    rows the batch rewrites (its input plus the state runs it merges)
      < interpreted_rows (500) ............................................ interpreted
      < cold_rows (50,000), in the JVM's first batch of 500 rows or more .. interpreted
      otherwise ........................................................... generated code

Generated code pays off from a few hundred rows on (a 1M-event batch of the example pipeline
takes 2.8 times as long interpreted), but below that Spark's canonicalizing and looking up the
generated code of every projection and predicate in each task costs a lone transaction 0.1-0.2 s
of its 0.3 s of execution.

On a cold JVM generating the code costs more than it saves: Janino compiles a few hundred
classes, itself not yet compiled by the JIT. Measured on the development machine (2 cores), the
example pipeline's first batch in a new JVM, alternated runs (rows as the engine counts them,
about 1.5 per event): 29,500 rows (20,000 events in two transactions) took 8.1-8.9 s
interpreted against 12.1-12.5 s with generated code; 74,000 rows 9.4-10.7 s against 11.7-12.1
s; 148,000 rows, and 14,600 in one transaction, about as long either way (the next batch then
paid the compilation, 0.4-2.9 s). In the service (`bench/startup.py`, a backlog of 20,000
events), a start's first batch of 11,500-31,000 rows executed in 2.3-3.4 s interpreted against
3.7-4.7 s with generated code (one run each), and the first commit came 9.0-9.2 s after the
Spark session against 10.1-11.5 s at a cold start, 13.0-14.0 s against 15.7-16.5 s at a restart
(two alternated runs each). So the first batch that would generate code in a JVM (a restart's,
where a backlog is waiting: the one that decides when its first transaction is committed) runs
interpreted when it is small (below 50,000 rows: the gain was still there at 74,000 and gone at
148,000), and the next one compiles. A warm-up (`txstream.engine.warmup`) generates code from
its first batch on: it is there to pay the compilation while the service is idle. Generated code
is cached by the JVM, for every engine in it. On a cluster Janino compiles in the executors, and
a replacement executor starts cold, which this driver-side rule does not see.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

INTERPRETED_ROWS = 500
COLD_INTERPRETED_ROWS = 50_000

# The JVMs (py4j's views of them) past their first batch of `interpreted_rows` rows or more: one
# such batch ran in them, or a warm-up began (`compile_now`).
_past_first: set[object] = set()


def interpreted(spark: SparkSession, rewritten: int, interpreted_rows: int, cold_rows: int
                ) -> bool:
    """Whether a batch rewriting `rewritten` rows is evaluated interpreted (see the module
    doc)."""
    if rewritten < interpreted_rows:
        return True
    return spark.sparkContext._jvm not in _past_first and rewritten < cold_rows


def ran(spark: SparkSession, rewritten: int, interpreted_rows: int) -> None:
    """Record that a batch rewriting `rewritten` rows ran: one of `interpreted_rows` or more puts
    the JVM past its first (one that failed, say one retried or split, does not)."""
    if rewritten >= interpreted_rows:
        compile_now(spark)


def compile_now(spark: SparkSession) -> None:
    """Generate code from the next batch on, as in a JVM past its first batch: a warm-up is there
    to pay the compilation while the service is idle, so that the real batches after it, even
    one that cuts it short, find the JVM as warm as it can make it."""
    _past_first.add(spark.sparkContext._jvm)


def evaluate(spark: SparkSession, interpreted: bool) -> None:
    """Set how the next Spark job evaluates expressions: a session setting, read when the job
    starts, so set for every batch, whichever engine."""
    spark.conf.set("spark.sql.codegen.factoryMode",
                   "NO_CODEGEN" if interpreted else "FALLBACK")
