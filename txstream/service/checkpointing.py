"""The checkpoint stage: when a checkpoint is due, writing one as of a transaction every sink
committed (in the background during a run, while later batches go on), and telling the sinks.

A checkpoint costs O(state), so it is not taken after every batch: after
`checkpoint_every_batches` batches or `checkpoint_every_s` seconds since the last one,
whichever comes first, one at a time (while one is written, later batches wait for the next
occasion), and at a graceful stop. Once no batch has been committed for
`checkpoint_when_idle_s`, the last committed transaction is checkpointed if no checkpoint holds
it: the stop of an idle pipeline has nothing left to write.

A checkpoint that fails (a full or broken storage, most often) is deleted as far as it was
written, so that it holds no space, and tried again with backoff (`retry_initial_backoff_s`
doubling up to `retry_max_backoff_s`), while batches go on and when idle: it resumes by itself
once the storage takes writes again. Meanwhile, when the failure is the storage's (an I/O
error), the service is not ready (`checkpoint storage`) until a checkpoint is written; each
failure is counted, and a crash replays from the last checkpoint written."""

from __future__ import annotations

import logging
import queue
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from txstream.schemas.config import PipelineConfig
from txstream.service.health import CHECKPOINT_STORAGE, Readiness
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
                 outputs: Outputs, metrics: CheckpointMetrics, readiness: Readiness,
                 crash: CrashPoints, checkpointed: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`checkpointed`: the transaction of the checkpoint resumed from (0: none)."""
        self._config = config
        self._engine = engine
        self._store = store
        self._outputs = outputs
        self._metrics = metrics
        self._readiness = readiness
        self._crash = crash
        self.checkpointed = checkpointed  # the newest checkpoint's transaction
        self._announced = checkpointed  # the newest checkpoint the sinks were told of
        self._clock = clock
        self._last_at = clock()
        self._batches_since = 0
        # The last committed transaction, the engine's version as of it and when (set by the
        # deliver stage).
        self._last_commit: tuple[int, EngineVersion | None, float] = (
            checkpointed, None, self._last_at)
        # After a failed checkpoint: when to try again (None: the last one was written), and
        # the pause after that try if it fails too.
        self._retry_at: float | None = None
        self._backoff_s = config.retry_initial_backoff_s

    def due(self, stages: Stages) -> bool:
        """Whether to checkpoint as of the batch being committed (counted in); if so, the
        checkpoint is reserved until written."""
        if stages.checkpointing.is_set():
            return False
        if self._retry_at is not None:
            due = self._clock() >= self._retry_at
        else:
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
        # The checkpoint stage's flag first: it changes `checkpointed` and `_retry_at`.
        if stages.checkpointing.is_set() or not stages.idle():
            return False
        number, version, at = self._last_commit
        idle_s = self._config.checkpoint_when_idle_s
        now = self._clock()
        if number == self.checkpointed:
            return False
        if self._retry_at is not None:  # a failed one is tried again, idle checkpoints or not
            if now < self._retry_at:
                return False
        elif not idle_s or now - at < idle_s:
            return False
        # Nothing in flight: `number` is the last commit until compute takes another batch.
        stages.checkpointing.set()
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
                self.attempt(number, state, version)
            finally:
                stages.checkpointing.clear()

    def attempt(self, number: int, state: SourceState, version: EngineVersion | None) -> bool:
        """`save`, or False if it failed: tried again later (see the module doc)."""
        try:
            self.save(number, state, version)
        except FencedError:
            raise  # stops every stage: another instance took over
        except Exception as exc:
            self._failed(number, exc)
            return False
        return True

    def _failed(self, number: int, exc: Exception) -> None:
        """The checkpoint through `number` failed: try again after a pause (see the module
        doc); until then a crash replays more (an incomplete checkpoint is never read)."""
        reason = _reason(exc)
        if _storage_error(exc):
            # Before the count, which is what a caller may watch for.
            self._readiness.fail(CHECKPOINT_STORAGE, reason, observer="checkpoints")
        self._metrics.failed()
        first = self._retry_at is None
        self._retry_at = self._clock() + self._backoff_s
        # The whole trace once per outage; each retry is one line.
        log.error("checkpoint through #%d failed, tried again in %.1fs: %s", number,
                  self._backoff_s, reason, exc_info=first)
        self._backoff_s = min(self._backoff_s * 2, self._config.retry_max_backoff_s)

    def save(self, number: int, state: SourceState, version: EngineVersion | None) -> None:
        """Write the checkpoint through transaction `number` (`version`: the engine's state
        as of it; None: its current one)."""
        started = self._clock()
        prepared = self._store.prepare(number, state)
        try:
            self._engine.save_state(self._store.engine_uri(prepared), version)
            self._outputs.before_checkpoint(number)
            self._crash.reached("checkpoint")
            # A fenced instance never publishes: the instance that took over may have newer
            # ones.
            self._outputs.check_writer()
            self._store.publish(prepared)
        except BaseException:
            self._store.discard(prepared)
            raise
        self._crash.reached("checkpointed")
        if self._retry_at is not None:
            self._retry_at, self._backoff_s = None, self._config.retry_initial_backoff_s
            self._readiness.ok(CHECKPOINT_STORAGE, observer="checkpoints")
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


def _storage_error(exc: Exception) -> bool:
    """Whether `exc` is the storage's (full, read-only, unreachable: Python's or the JVM's I/O
    errors), which makes the service not ready, rather than, say, a sink's."""
    return isinstance(exc, OSError) or re.search(
        r"^Caused by: java\.io\.\w*(IOException|FileNotFoundException)", str(exc),
        re.MULTILINE) is not None


def _reason(exc: Exception) -> str:
    """What made `exc`, in a line: a JVM error's innermost cause (Spark's own first line only
    says which call failed), else its first line."""
    text = str(exc).strip()
    causes = re.findall(r"^Caused by: (.+)$", text, re.MULTILINE)
    if causes:
        return causes[-1].strip()
    return text.splitlines()[0] if text else type(exc).__name__
