"""JVM objects that only Python's cycle collector frees, collected on a schedule.

py4j's `JavaObject` caches a `JavaMember` per method called on it, and each member refers back
to its object: every JVM object a batch's plans called a method on (Datasets, plans, the
builders of cached relations, and through them blocks of memory) sits in a reference cycle on
the Python side, and stays pinned in the JVM until Python's cycle collector frees it. Left to
Python's own thresholds, the oldest generation is collected rarely on a long-lived driver: in
bench/temporal.py's runs a windowed pipeline's JVM heap after a JVM GC grew from 357 MB to
889 MB over 30 batches with a state of 20 rows, and stayed near 220 MB with a full collection
every 5 batches.

The rule: after a batch, a full collection when at least `interval_s` passed since the last
one. A collection costs tens of milliseconds (each freed object is one message to the JVM),
spent once per interval instead of at a moment Python picks; the JVM never holds more than an
interval's worth of batches' objects.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

# Seconds between full collections: at most 40-50 ms each on the example pipelines, so a
# lone transaction pays it at most once every so often.
INTERVAL_S = 10.0


class JavaGarbage:
    """Runs `collect` (a full cycle collection) after a batch at most every `interval_s`
    seconds of `clock`."""

    def __init__(self, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 collect: Callable[[], object] = gc.collect) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._collect = collect
        self._last = clock()
        self.collections = 0

    def after_batch(self) -> None:
        now = self._clock()
        if now - self._last >= self.interval_s:
            self._collect()
            self._last = self._clock()
            self.collections += 1
