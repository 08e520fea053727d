"""Whether a batch's expressions are evaluated interpreted or by code Spark generates.

    rows the batch rewrites (its input plus the state runs it merges)
      < interpreted_rows (500) ............................................ interpreted
      < cold_rows (50,000), in the JVM's first batch of 500 rows or more .. interpreted
      otherwise ........................................................... generated code

Generated code pays off from a few hundred rows on (a large batch runs several times as long
interpreted), but below that Spark's canonicalizing and looking up the generated code of every
projection and predicate in each task costs a lone transaction a large part of its execution.

On a cold JVM generating the code costs more than it saves: Janino compiles a few hundred
classes, itself not yet compiled by the JIT. On the development machine a new JVM's first batch
of the example pipeline ran faster interpreted at 29,500 and 74,000 rows (rows as the engine
counts them, about 1.5 per event), about as fast either way at 148,000, and in the service the
first commit after a start came sooner (the measurements: docs/benchmarks.md, "History").
So the first batch that would generate code in a JVM (a restart's,
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
