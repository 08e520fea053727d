"""The checkpoint stage: when a checkpoint is due, writing one as of a transaction every sink
committed (in the background during a run, while later batches go on), and telling the sinks.

A checkpoint costs O(state), so it is not taken after every batch: after
`checkpoint_every_batches` batches or `checkpoint_every_s` seconds since the last one,
whichever comes first, one at a time (while one is written, later batches wait for the next
occasion), and at a graceful stop. Once no batch has been committed for
`checkpoint_when_idle_s`, the last committed transaction is checkpointed (once per
transaction, failed or not) if no checkpoint holds it: the stop of an idle pipeline has nothing
left to write."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from txstream.schemas.config import PipelineConfig
from txstream.service.metrics import CheckpointMetrics
from txstream.service.outputs import Outputs
from txstream.service.stages import CrashPoints, Stages
from txstream.sinks.sink import FencedError
from txstream.sources.source_state import SourceState

if TYPE_CHECKING:
    from txstream.engine import Engine, EngineVersion
    from txstream.service.checkpoint import CheckpointStore

log = logging.getLogger(__name__)


class Checkpointing:
    """Checkpoints of one runner into `store`: the source state, the engine's state (a version
    of it) and the sinks' own state, all as of one committed transaction."""

    def __init__(self, config: PipelineConfig, engine: Engine, store: CheckpointStore,
                 outputs: Outputs, metrics: CheckpointMetrics, crash: CrashPoints,
                 checkpointed: int, clock: Callable[[], float] = time.monotonic) -> None:
        """`checkpointed`: the transaction of the checkpoint resumed from (0: none)."""
        self._config = config
        self._engine = engine
        self._store = store
        self._outputs = outputs
        self._metrics = metrics
        self._crash = crash
        self.checkpointed = checkpointed  # the newest checkpoint's transaction
        self._announced = checkpointed  # the newest checkpoint the sinks were told of
        self._clock = clock
        self._last_at = clock()
        self._batches_since = 0
        # The last committed transaction, the engine's version as of it and when (set by the
        # deliver stage), and the last one an idle checkpoint was queued for (each is tried
        # once: a failing storage is retried after the next batch, not every few seconds while
        # idle).
        self._last_commit: tuple[int, EngineVersion | None, float] = (
            checkpointed, None, self._last_at)
        self._idle_tried = checkpointed

    def due(self, stages: Stages) -> bool:
        """Whether to checkpoint as of the batch being committed (counted in); if so, the
        checkpoint is reserved until written."""
        if stages.checkpointing.is_set():
            return False
        due = (self._batches_since + 1 >= self._config.checkpoint_every_batches
               or self._clock() - self._last_at >= self._config.checkpoint_every_s)
        if due:
            stages.checkpointing.set()
        return due

    def committed(self, stages: Stages, number: int, state: SourceState | None,
                  version: EngineVersion) -> None:
        """A batch through transaction `number` is committed to every sink, with the source
        `state` as of it when a checkpoint was due: that checkpoint is queued."""
        self._batches_since += 1
        self._last_commit = (number, version, self._clock())
        if state is not None:
            self._batches_since = 0
            stages.checkpoint_jobs.put((number, state, version))

    @property
    def last_commit(self) -> tuple[int, EngineVersion | None]:
        """The last transaction every sink committed (that of the checkpoint resumed from,
        before any), and the engine's state as of it (None: its current one)."""
        number, version, _ = self._last_commit
        return number, version

    def when_idle(self, stages: Stages, state: Callable[[], SourceState]) -> bool:
        """Queue a checkpoint of the last committed transaction (`state()`: the source's state
        as of it) if one is due while idle (see the module doc); call it from compute, which
        alone starts batches, when no batch is ready. True if queued."""
        number, version, at = self._last_commit
        idle_s = self._config.checkpoint_when_idle_s
        if (not idle_s or number in (self.checkpointed, self._idle_tried)
                or self._clock() - at < idle_s or stages.checkpointing.is_set()
                or not stages.idle()):
            return False
        # Nothing in flight: `number` is the last commit until compute takes another batch.
        stages.checkpointing.set()
        self._idle_tried = number
        self._batches_since = 0
        stages.checkpoint_jobs.put((number, state(), version))
        return True

    def run(self, stages: Stages) -> None:
        """Write the queued checkpoints until every other stage is done (a stage's thread)."""
        while True:
            try:
                number, state, version = stages.checkpoint_jobs.get(timeout=0.1)
            except queue.Empty:
                if stages.halt.is_set():
                    return
                continue
            try:
                self.save(number, state, version)
            except FencedError:
                raise  # stops every stage: another instance took over
            except Exception:
                # The storage may be back by the next one; until then a crash replays more
                # (an incomplete checkpoint has no manifest and is never read).
                self._metrics.failed()
                log.exception("checkpoint failed; retried after a later batch")
            finally:
                stages.checkpointing.clear()

    def save(self, number: int, state: SourceState, version: EngineVersion | None) -> None:
        """Write the checkpoint through transaction `number` (`version`: the engine's state
        as of it; None: its current one)."""
        started = self._clock()
        prepared = self._store.prepare(number, state)
        self._engine.save_state(self._store.engine_uri(prepared), version)
        self._outputs.before_checkpoint(number)
        self._crash.reached("checkpoint")
        # A fenced instance never publishes: the instance that took over may have newer ones.
        self._outputs.check_writer()
        self._store.publish(prepared)
        self._crash.reached("checkpointed")
        self.checkpointed = number
        self._last_at = self._clock()
        elapsed = self._last_at - started
        # The metrics' age is read against the wall's monotonic clock, not the injected one.
        self._metrics.written(number, elapsed, at=time.monotonic())
        log.info("checkpoint through transaction #%d in %.2fs (%s)", number, elapsed,
                 prepared.name)

    def now(self, number: int, state: SourceState, version: EngineVersion | None) -> None:
        """Checkpoint through transaction `number` at once, while no run is going on, and tell
        the sinks."""
        self._batches_since = 0
        self.save(number, state, version)
        self.announce()

    def announce(self) -> None:
        """Tell every sink the newest checkpointed transaction (from the thread that writes to
        them)."""
        number = self.checkpointed
        if number > self._announced:
            self._outputs.on_checkpoint(number)
            self._announced = number
