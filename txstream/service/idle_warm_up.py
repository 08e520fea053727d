"""The engine's warm-up, taken one step at a time while the service has nothing else to do.

A warm-up (`txstream.engine.warmup`) runs made-up batches so that the JVM compiles the code the
first real batches need. It must never delay a real one:

* it begins at the first idle moment (no batch ready or in flight, the input read to its end):
  before any batch, or once none has been computed for `quiet_s` (after real batches, such as
  a backlog's at start). Neither building a scratch engine nor planning a step can be cut
  short, and at a steady rate the gaps between transactions are idle moments too: the next
  transaction would wait out both;
* each step is cancelled as soon as a batch is ready, a stop is requested or a stage failed,
  and cancelled again every 50 ms until it returns (a step still planning submits its Spark
  job afterwards); a cancelled step ends the warm-up;
* a batch to compute, or the end of the run, ends a warm-up under way (it gives the engine's
  state back first); one not begun by the end of the run is dropped.

Whether the input is read to its end is asked at most once per `check_every_s`: the ingest
thread answers between two polls. Not the lag: a transactional producer's commit markers keep
an idle partition's lag at 1 or more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

log = logging.getLogger(__name__)


class WarmUpSteps(Protocol):
    """A warm-up under way (`txstream.engine.warmup.WarmUp`): each step returns the number of
    made-up batches done."""

    def __next__(self) -> int: ...

    def __iter__(self) -> Iterator[int]: ...

    def close(self) -> None:
        """End it between two steps."""

    def cancel(self) -> None:
        """End the step under way (from another thread), and the warm-up with it."""

    @property
    def cut_short(self) -> bool:
        """Whether `cancel` was called."""
        ...


class IdleWarmUp:
    """One run's warm-up (see the module doc): `begin` builds it (None: no warm-up)."""

    def __init__(self, begin: Callable[[], WarmUpSteps] | None, *, quiet_s: float = 3.0,
                 check_every_s: float = 1.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._begin = begin
        self._quiet_s = quiet_s
        self._check_every_s = check_every_s
        self._clock = clock
        self._steps: WarmUpSteps | None = None
        self._checked_at: float | None = None  # when the input was last asked
        self._computed_at: float | None = None  # when the last real batch was computed

    def wanted(self) -> bool:
        """Whether a step would be taken at an idle moment: a warm-up is under way, or one not
        begun may begin (before any batch, or `quiet_s` after the last one)."""
        return self._steps is not None or (self._begin is not None and (
            self._computed_at is None or self._clock() - self._computed_at >= self._quiet_s))

    def idle(self, nothing_in_flight: Callable[[], bool],
             read_to_end: Callable[[], bool]) -> bool:
        """Whether this is an idle moment: nothing in flight before and after asking the input
        whether it is read to its end, asked at most once per `check_every_s` (False between
        two askings)."""
        now = self._clock()
        if not nothing_in_flight() or (self._checked_at is not None
                                       and now - self._checked_at < self._check_every_s):
            return False
        self._checked_at = now
        # In flight again after the answer: ingest offers what it polled before it answers.
        return read_to_end() and nothing_in_flight()

    def step(self, interrupted: Callable[[], bool]) -> None:
        """The next step, begun if need be, cancelled once `interrupted()` holds."""
        if self._steps is None:
            assert self._begin is not None
            try:
                self._steps, self._begin = self._begin(), None
            except Exception as exc:  # an optimization must not stop the service
                self._begin = None
                log.warning("no warm-up: %s", exc)
                return
            if interrupted():
                self.cut()  # it came while the warm-up was being built
                return
        started = self._clock()
        done = _giving_way(self._steps, interrupted)
        if done is None:
            log.info("warm-up %s", "cut short by a batch to compute, a stop or a failed stage"
                     if self._steps.cut_short else "done")
            self._steps = None
        else:
            log.info("warm-up: made-up batch %d in %.1f s, while idle", done,
                     self._clock() - started)

    def computed(self) -> None:
        """A real batch was computed."""
        self._computed_at = self._clock()

    def cut(self) -> None:
        """Before a real batch: a warm-up under way ends (a warm-up of the running engine must
        give its state back before the engine takes a real batch; the JVM keeps what it
        compiled). One not begun waits until it may (`wanted`)."""
        if self._steps is not None:
            self._steps.close()
            self._steps = None
            log.info("warm-up ended by a batch to compute, or a stop")

    def end(self) -> None:
        """The run is over: a warm-up under way ends, one not begun never will."""
        self.cut()
        if self._begin is not None:
            self._begin = None
            log.info("no warm-up: the run stopped before it began")


def _giving_way(steps: WarmUpSteps, interrupted: Callable[[], bool]) -> int | None:
    """`steps`' next step (None: none left), cancelled whenever `interrupted()` holds, checked
    every 50 ms until the step returns."""
    returned = threading.Event()

    def watch() -> None:
        while True:
            if interrupted():
                steps.cancel()
            if returned.wait(0.05):
                return

    watcher = threading.Thread(target=watch, name="warm-up-watch", daemon=True)
    watcher.start()
    try:
        return next(steps, None)
    finally:
        returned.set()
        watcher.join()
