"""The checkpoint stage: when a checkpoint is due, writing one as of a transaction every sink
committed (in the background during a run, while later batches go on), and telling the sinks.

A checkpoint costs O(state), so it is not taken after every batch: after
`checkpoint_every_batches` batches or `checkpoint_every_s` seconds since the last one,
whichever comes first, one at a time (while one is written, later batches wait for the next
occasion), and at a graceful stop."""

from __future__ import annotations

import logging
import queue
import time
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
                 checkpointed: int) -> None:
        """`checkpointed`: the transaction of the checkpoint resumed from (0: none)."""
        self._config = config
        self._engine = engine
        self._store = store
        self._outputs = outputs
        self._metrics = metrics
        self._crash = crash
        self.checkpointed = checkpointed  # the newest checkpoint's transaction
        self._announced = checkpointed  # the newest checkpoint the sinks were told of
        self._last_at = time.monotonic()
        self._batches_since = 0

    def due(self, stages: Stages) -> bool:
        """Whether to checkpoint as of the batch being committed (counted in); if so, the
        checkpoint is reserved until written."""
        if stages.checkpointing.is_set():
            return False
        due = (self._batches_since + 1 >= self._config.checkpoint_every_batches
               or time.monotonic() - self._last_at >= self._config.checkpoint_every_s)
        if due:
            stages.checkpointing.set()
        return due

    def committed(self, stages: Stages, number: int, state: SourceState | None,
                  version: EngineVersion) -> None:
        """A batch through transaction `number` is committed to every sink, with the source
        `state` as of it when a checkpoint was due: that checkpoint is queued."""
        self._batches_since += 1
        if state is not None:
            self._batches_since = 0
            stages.checkpoint_jobs.put((number, state, version))

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
        started = time.monotonic()
        prepared = self._store.prepare(number, state)
        self._engine.save_state(self._store.engine_uri(prepared), version)
        self._outputs.before_checkpoint(number)
        self._crash.reached("checkpoint")
        # A fenced instance never publishes: the instance that took over may have newer ones.
        self._outputs.check_writer()
        self._store.publish(prepared)
        self._crash.reached("checkpointed")
        elapsed = time.monotonic() - started
        self.checkpointed = number
        self._last_at = time.monotonic()
        self._metrics.written(number, elapsed, at=self._last_at)
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
