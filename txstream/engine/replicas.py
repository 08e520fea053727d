"""Every state block on `replicas` executors, kept so across executors' losses.

    batch starts ──► where is each run's every block? (the driver's status store)
    batch installs       │ a block on fewer than `replicas` executors, and enough executors
    its new runs ──►     ▼ are alive to hold them
                     copy those runs anew (`ZSetState.replicate`), then look again

A state run is a local checkpoint (`txstream.engine.runs.kept`): it has no lineage, so a block
lost with its executor is lost for good (CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND) unless another
executor holds a copy. Spark writes each block to `replicas` executors, but not always:

- a block written while an executor is being replaced finds fewer peers, and Spark stores it
  with fewer copies, saying so only in the executor's log ("replicated to only 0 peer(s)");
- an executor asks the driver for its peers at most once per `spark.storage.cachedPeersTtl`,
  so a block written just after a replacement registered may still miss it;
- proactive replication (`spark.storage.replication.proactive`) copies a lost executor's
  blocks again only to the executors alive at that moment: a replacement registering later
  gets none.

So the engine does not infer copies from which executors came and went: it asks the driver
where every block is, before a batch reads the state and after it writes new runs, and copies
the runs found short. A run whose copy is still short (its executor's peers not yet refreshed)
is copied again after one peer refresh, up to `_ATTEMPTS` times; one still short is left to the
next batch. A check costs a few calls into the driver's JVM per run; a copy happens only after
a loss.

Spark's internal API used (see `txstream.engine.spark_internals` for the rest): of the JVM's
`SparkContext`, `statusTracker().getExecutorInfos()`, `listenerBus().waitUntilEmpty(ms)` and
`statusStore().rdd(id)` (`partitions()`, each one's `executors()`); `rdd.RDD.id()`,
`getNumPartitions()`, `conf().getTimeAsMs`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from py4j.java_gateway import JavaObject
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from txstream.engine.state import ZSetState

log = logging.getLogger(__name__)

_ATTEMPTS = 3
_PEERS_TTL = "spark.storage.cachedPeersTtl"
_DELIVERED_MS = 60_000


def executors(spark: SparkSession) -> int:
    """The executors the application has now (the driver's block manager left out)."""
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1


def fewest_copies(spark: SparkSession, rdds: Sequence[JavaObject]) -> list[int]:
    """For each of `rdds`, the fewest executors any one of its partitions' blocks is on (0: a
    block lost), as the application's status store records them once the listener bus has
    delivered every block update. (The block manager master itself is out of py4j's reach:
    reflecting on `SparkEnv` fails on a protobuf class Spark does not ship.)"""
    context = spark.sparkContext._jsc.sc()
    # Longer than Spark's default 10 s wait: a bus still behind after that fails the batch
    # (a TimeoutException); the store it has not yet updated is never read as the copies.
    context.listenerBus().waitUntilEmpty(_DELIVERED_MS)
    store = context.statusStore()
    fewest = []
    for rdd in rdds:
        try:
            partitions = store.rdd(rdd.id()).partitions()
        except Py4JJavaError:  # NoSuchElementException: no block of it was ever stored
            fewest.append(0)
            continue
        held = partitions.get() if partitions.isDefined() else None
        copies = [held.apply(i).executors().size() for i in range(held.size())] if held else []
        # A partition with no copy left is not listed at all.
        fewest.append(min(copies) if len(copies) == rdd.getNumPartitions() else 0)
    return fewest


def _short(spark: SparkSession, states: Iterable[ZSetState], replicas: int
           ) -> dict[ZSetState, set[int]]:
    """The states with runs on fewer than `replicas` executors: the ids of those runs."""
    runs = [(state, run) for state in states for run in state.runs]
    copies = fewest_copies(spark, [run.rdd for _, run in runs])
    short: dict[ZSetState, set[int]] = {}
    for (state, run), n in zip(runs, copies, strict=True):
        if n < replicas:
            short.setdefault(state, set()).add(run.rdd_id)
    return short


def keep_replicated(spark: SparkSession, states: Sequence[ZSetState], replicas: int) -> int:
    """Copy anew the runs of `states` found on fewer than `replicas` executors, once enough
    executors are alive to hold them; the number of copies made (0 when none was short)."""
    if replicas < 2 or executors(spark) < replicas:
        return 0
    made = 0
    for attempt in range(_ATTEMPTS):
        short = _short(spark, states, replicas)
        if not short:
            return made
        if attempt:
            # The executors writing the copies may not see the new peers until they refresh.
            time.sleep(spark.sparkContext._jsc.sc().conf().getTimeAsMs(_PEERS_TTL, "60s")
                       / 1000)
        started = time.perf_counter()
        for state, rdd_ids in short.items():
            state.replicate(rdd_ids)
        made += 1
        log.warning("state runs on fewer than %d executors: %d copied again in %.1f s",
                    replicas, sum(map(len, short.values())), time.perf_counter() - started)
    if _short(spark, states, replicas):
        log.warning("state runs still on fewer than %d executors after %d copies; the next "
                    "batch copies them again", replicas, _ATTEMPTS)
    return made
