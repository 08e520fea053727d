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
example pipeline's first batch in a new JVM, alternated runs: 20,000 events in two transactions
took 8.1-8.9 s interpreted against 12.1-12.5 s with generated code; 50,000 events 8.6-10.7 s
against 9.6-12.1 s; 100,000 events, and one transaction of 10,000, about as long either way
(the next batch then paid the compilation, about a second). In the service
(`bench/startup.py`), a start's first batch of 10,000-20,000 events executed in 2.3-3.4 s
interpreted against 3.7-4.7 s with generated code. So the first batch that would generate code
in a JVM (a restart's, where a backlog is waiting: the one that decides when its first
transaction is committed) runs interpreted when it is small, and the next one compiles; a
warm-up (`txstream.engine.warmup`) compiles in its second batch. Generated code is cached by
the JVM, for every engine in it.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

INTERPRETED_ROWS = 500
COLD_INTERPRETED_ROWS = 50_000

# The JVMs (py4j's views of them, by id) in which a batch of `interpreted_rows` or more has run:
# only the first of those is `cold`.
_past_first: set[int] = set()


def interpreted(spark: SparkSession, rewritten: int, interpreted_rows: int, cold_rows: int
                ) -> bool:
    """Whether a batch rewriting `rewritten` rows is evaluated interpreted (see the module
    doc)."""
    if rewritten < interpreted_rows:
        return True
    jvm = id(spark._jvm)
    cold = jvm not in _past_first
    _past_first.add(jvm)
    return cold and rewritten < cold_rows


def evaluate(spark: SparkSession, interpreted: bool) -> None:
    """Set how the next Spark job evaluates expressions: a session setting, read when the job
    starts, so set for every batch, whichever engine."""
    spark.conf.set("spark.sql.codegen.factoryMode",
                   "NO_CODEGEN" if interpreted else "FALLBACK")
