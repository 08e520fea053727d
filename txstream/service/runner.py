"""The service: a pipeline of stages joined by bounded queues.

    ingest -> compute -> deliver (+ commit) -> checkpoint
    (poll, decode, dead-letter, form transactions) -> (log, engine) -> (every sink of a batch
    in parallel, then the source offsets) -> (in the background, from a committed version)

Each stage runs in a thread of its own and waits when the next one is behind (backpressure):
ingest stops polling while `batch_transactions` closed transactions are ready (one poll's
batch more at most), compute hands over at most one computed batch, so memory stays bounded by
about three batches of changes (the one being computed, one waiting for the sinks, the one
being written). Throughput is that of the
slowest stage, not the sum of all. The queues and signals between them are in
`txstream.service.stages`, the sinks in `txstream.service.outputs`, the checkpoint stage in
`txstream.service.checkpointing`, the checks before a start in `txstream.service.startup`;
each stage records its figures in a recorder of its own (`txstream.service.metrics`).

Batches adapt to the load: compute takes every transaction ready when it is free, up to
`batch_transactions`. At low load that is one transaction, processed as soon as it closes;
under a backlog the batches grow, so the engine's cost per batch is shared by more events, and
compute waits up to `backlog_wait_ms` for the backlog to fill a batch (`Stages.take_batch`).

The runner knows neither Kafka nor Spark: its input (`txstream.service.input.Input`), engine and
checkpoint store are handed to it (`txstream.service.compose.open_runner` builds them). Where it
resumes is `txstream.service.resume`; the warm-up it takes while idle,
`txstream.service.idle_warm_up`.

The guarantees are those of a sequential loop:
* a batch's transactions are in the transaction log before the engine runs them, so before
  any sink sees them;
* offsets are committed only after every sink committed the batch, batches in order;
* a checkpoint holds the source state and the engine's state as of one committed transaction
  (the engine may be further ahead: its versions are immutable, see `Engine.version`).

After a crash the runner loads the newest complete checkpoint and the transactions logged after
it (`txstream.service.resume`); the input re-forms those from the same records with the same
numbers and boundaries, the engine recomputes them (netting together those it netted together
before, `txstream.service.net_groups`), and the sinks receive them again:
* the PostgreSQL outputs are written in one PostgreSQL transaction per batch with the
  pipeline's progress row, which says the last transaction they hold: a replay adds nothing
  twice (`txstream.sinks.postgres.outputs`); snapshots also keep a per-key time guard;
* a Kafka sink reads back the last transaction its topic holds and skips the replay up to it;
* a file sink may receive a replayed transaction a second time (same number, same changes:
  readers can deduplicate by `time`).
The Kafka consumer group's committed offsets are for monitoring only: a restart resumes from
the checkpoint's offsets, which belong with the engine's state.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

from txstream.engine.errors import ExpressionError
from txstream.schemas.config import PipelineConfig
from txstream.service.checkpointing import Checkpointing
from txstream.service.health import CHECKPOINT_STORAGE, Readiness
from txstream.service.idle_warm_up import IdleWarmUp, WarmUpSteps
from txstream.service.input import OpenInput
from txstream.service.input_reports import InputReports
from txstream.service.invariants import check_engine_input, check_keyed_outputs
from txstream.service.metrics import Metrics
from txstream.service.net_groups import NetGroups, Part, engine_changes, engine_wall_times
from txstream.service.outputs import Outputs
from txstream.service.resume import resume
from txstream.service.stages import (
    CRASH_ENV,
    Clock,
    Computed,
    CrashPoints,
    Retrying,
    ShutdownRequested,
    Stages,
)
from txstream.service.startup import (
    Problem,
    earlier_output,
    outputs_ahead,
    refuse,
    stale_saved_state,
)
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.postgres.writers import Writer, WriterEpoch
from txstream.sources.transaction_batch import TransactionBatch

if TYPE_CHECKING:
    from txstream.engine import Engine
    from txstream.service.checkpoint import CheckpointStore

__all__ = ["PipelineRunner", "ShutdownRequested"]

log = logging.getLogger(__name__)

# The input's name as readiness and logs know it, until it is open.
_INPUT = "kafka"


class PipelineRunner:
    """Runs one configured pipeline until told to stop.

    Construction resumes (`txstream.service.resume`), opens the input and the sinks, retrying
    while they are unavailable, and refuses to start on the problems of
    `txstream.service.startup`. `run` runs the stages (see the module's docstring);
    `request_stop` (e.g. from a SIGTERM handler) makes it return once the batches already
    computed are delivered; `checkpoint` then `close`.
    """

    def __init__(self, config: PipelineConfig, *, engine: Engine, checkpoints: CheckpointStore,
                 open_input: OpenInput, metrics: Metrics | None = None,
                 readiness: Readiness | None = None, live: LiveTables | None = None,
                 fence: WriterEpoch | None = None,
                 warm_up: Callable[[], WarmUpSteps] | None = None,
                 clock: Clock = time.monotonic) -> None:
        """`engine`, `checkpoints` and `open_input`: the pipeline's compute, state storage and
        the way to open its input, composed by `txstream.service.compose.open_runner`.
        `metrics` and `readiness`: given when an HTTP endpoint serves them from before the
        runner exists (restoring and connecting take a while). `live`: the tables of the
        outputs with a live sink. `fence`: the writer epoch this instance took
        (`txstream.service.leadership`; None: not fenced through PostgreSQL). The runner takes
        the checkpoint location's epoch itself (`CheckpointStore.take_epoch`). `warm_up`:
        begins the engine's warm-up, which the first `run` takes step by step while idle
        (`txstream.service.idle_warm_up`). `clock`: monotonic seconds, for the backlog wait,
        the warm-up's quiet time, when checkpoints are due and the progress reports."""
        self.config = config
        self.live = live
        self.engine = engine
        self._clock = clock
        self._output_keys = {name: out.schema.primary_key for name, out in engine.outputs.items()}
        self._source_keys = {s.name: s.table_schema.primary_key for s in config.sources
                             if s.semantics == "upsert"}
        self.checkpoints = checkpoints
        self.metrics = metrics or Metrics()
        self.readiness = readiness or Readiness(config.ready_max_lag)
        self._stop = threading.Event()
        self._crash = CrashPoints(os.environ.get(CRASH_ENV))
        self._retrying = Retrying(self.readiness, self._stop, config.retry_initial_backoff_s,
                                  config.retry_max_backoff_s)
        resumed = resume(config, engine, checkpoints)
        checkpointed = resumed.checkpointed
        if checkpointed:
            self.metrics.checkpoint.restored(checkpointed)
        self._logged_through = resumed.logged_through
        # Before the sinks open: a Kafka sink's new producer fences the previous writer's,
        # which must find the epoch moved on already (`KafkaSink`, writer_check).
        self._retrying(CHECKPOINT_STORAGE, lambda: self.checkpoints.take_epoch(
            Writer.this_process(), base=self._logged_through))
        self.metrics.delivery.resumed(checkpointed)
        self.outputs = Outputs(config, {name: out.schema for name, out in engine.outputs.items()},
                               resuming=resumed.resuming, live=live, retrying=self._retrying,
                               crash=self._crash, fence=fence,
                               checkpoint_fence=self.checkpoints.check_epoch)
        nets = config.nets_batches and engine.nets_exactly
        try:
            refuse(self._startup_problems(resumed.resuming, checkpointed))
            self._net_groups = NetGroups.of(nets, resumed.replay,
                                            self._logged_through, self.outputs.progress_row())
        except BaseException:
            self.outputs.close()
            raise
        if nets:
            log.info("every sink is a PostgreSQL snapshot committed per batch: a batch of "
                     "several transactions is computed as one, their net change")
        elif config.nets_batches:
            log.info("every sink is a PostgreSQL snapshot committed per batch, but the "
                     "pipeline's temporal behaviors see each transaction: batches not netted")
        self._checkpointing = Checkpointing(config, engine, checkpoints, self.outputs,
                                            self.metrics.checkpoint, self.readiness,
                                            self._crash, checkpointed, clock)
        self.input = self._retrying(_INPUT, lambda: open_input(
            resumed.state, resumed.replay,
            InputReports(self.metrics.source, self.readiness, _INPUT)))
        self._stages = Stages(config.batch_transactions, serving=False, clock=clock)
        self._warm_up = IdleWarmUp(warm_up, clock=clock)
        # now() of the last batch computed, for a pipeline that calls it (None before one).
        self.wall_time: datetime | None = None

    def _startup_problems(self, resuming: bool, checkpointed: int) -> list[Problem]:
        """What the sinks hold against where the checkpoint location resumes (after
        `checkpointed`)."""
        outputs = self.outputs
        if not resuming:
            return earlier_output(self.config, outputs.held(), outputs.progress_row())
        return [*stale_saved_state(self.config, outputs.saved(), checkpointed),
                *outputs_ahead(self.config, outputs.progress_row(), self._logged_through)]

    # ---- the stages ----------------------------------------------------------------------

    def run(self, until: Callable[[PipelineRunner], bool] | None = None,
            on_progress: Callable[[Metrics], None] | None = None,
            progress_interval: float = 2.0) -> Metrics:
        """Run the stages until `until(self)` holds (checked while every stage is idle) or a stop
        is requested; forever without either. Compute runs in the calling thread; a failure of
        any stage stops them all and is raised here. A batch abandoned by a stop is left to
        recovery."""
        stages = self._stages = Stages(self.config.batch_transactions, serving=True,
                                       backlog_wait_s=self.config.backlog_wait_ms / 1000,
                                       clock=self._clock)
        threads = [threading.Thread(target=stages.guard(work), name=name, daemon=True)
                   for name, work in (
                       ("ingest", self._ingest), ("deliver", self._deliver),
                       ("checkpoint", partial(self._checkpointing.run, stages)))]
        for thread in threads:
            thread.start()
        last_report = self._clock()
        try:
            while not self._stop.is_set() and stages.failure is None:
                batch = stages.take_batch(timeout=0.1)
                if batch is not None:
                    self._warm_up.cut()
                    self._compute(batch)
                    self._warm_up.computed()
                elif until is not None and stages.idle() and until(self):
                    break
                elif self._checkpointing.when_idle(stages, lambda: stages.call_input(
                        self.input, lambda source: source.state())):
                    pass  # queued for the checkpoint stage; a warm-up step waits a loop
                elif self._warm_up.wanted() and self._warm_up.idle(
                        stages.idle, lambda: stages.call_input(
                            self.input, lambda source: source.read_to_end())):
                    self._warm_up.step(self._interrupted)
                now = self._clock()
                if on_progress is not None and now - last_report >= progress_interval:
                    on_progress(self.metrics)
                    last_report = now
        except BaseException as exc:
            stages.fail(exc)
        finally:
            self._warm_up.end()
            stages.computing_done.set()
            if stages.failure is not None:
                self._stop.set()  # no stage waits on a dependency for a run that is over
            threads[1].join()  # delivers what was computed, unless a stage failed
            stages.halt.set()
            for thread in (threads[2], threads[0]):
                thread.join()
        if isinstance(stages.failure, ShutdownRequested):
            log.warning("%s: the current batch is abandoned; the next start replays it",
                        stages.failure)
        elif stages.failure is not None:
            raise stages.failure
        return self.metrics

    def _interrupted(self) -> bool:
        """Whether a warm-up step must give way: a batch is ready, a stop was requested or a
        stage failed."""
        return self._stop.is_set() or self._stages.has_ready() \
            or self._stages.failure is not None

    def _ingest(self) -> None:
        """Poll, decode and form transactions into the ready queue; between polls, run the
        other stages' calls to the input (it is not thread-safe). After a stop, only those
        calls, until the other stages are done."""
        stages = self._stages
        try:
            while not stages.halt.is_set():
                stages.serve_input(self.input)
                if self._stop.is_set() or stages.failure is not None:
                    stages.halt.wait(0.02)
                    continue
                started = self._clock()
                try:
                    fresh = self._retrying(self.input.name, lambda: self.input.poll(0.05))
                except ShutdownRequested:
                    continue
                self.readiness.started.set()
                stats, now = self.input.stats, self._clock()
                self.metrics.ingest.polled(stats, now - started, now,
                                           committed=self.metrics.delivery.transactions)
                # Before the offer, which wakes compute to read it (`Stages.backlog`).
                stages.backlog(self.input.waiting_records(),
                               stats.events / stats.transactions if stats.transactions else 0.0)
                # Never logged, transactions not handed over are formed again at the next
                # start, with the same numbers.
                while fresh is not None and not stages.offer(fresh):
                    stages.serve_input(self.input)
                    if self._stop.is_set() or stages.failure is not None:
                        break
        finally:
            stages.stop_serving(self.input)

    def _compute(self, batch: TransactionBatch) -> None:
        """Compute `batch`, cut into parts by `txstream.service.net_groups` (none while the
        start of a replayed group waits for its end)."""
        parts = self._net_groups.parts(batch)
        if parts:
            self._compute_parts(parts)

    def _compute_parts(self, parts: list[Part]) -> None:
        """Consecutive `parts` (`txstream.service.net_groups`) in one engine call, handed over
        as one batch. On an `ExpressionError`, the parts one by one, and a failing part's
        transactions one by one: processing stops exactly at the failing transaction, after
        the ones before it are applied."""
        # Logged before any sink sees them: a recovery re-forms exactly these transactions,
        # and nets the same ones together.
        started = self._clock()
        entries = [entry for part in parts for entry in part.batch.log_entries(
            after=self._logged_through, netted=part.netted)]
        # A full checkpoint volume holds the batch here, retried, while deliver finishes the
        # one before it: nothing reaches a sink that a recovery could not re-form.
        self._retrying(CHECKPOINT_STORAGE, lambda: self.checkpoints.log(entries))
        batch = TransactionBatch.join([part.batch for part in parts])
        self._logged_through = max(self._logged_through, batch.last.number)
        self._crash.reached("log")
        t0 = self._clock()
        try:
            changes = engine_changes(parts, self.engine.sources)
            checking = self._clock()
            check_engine_input(changes, batch.first, batch.last.number, self._source_keys)
            checked = self._clock()
            # Ticks (transactions without changes) too, for a pipeline that calls now().
            walls = engine_wall_times(parts) if self.engine.uses_wall_clock else {}
            outputs = self.engine.process(changes, walls) if changes or walls else {}
            if walls:
                self.wall_time = max(filter(None, (self.wall_time, *walls.values())))
            processed = self._clock()
            check_keyed_outputs(outputs, self._output_keys)
        except ExpressionError:
            if len(parts) > 1:
                for part in parts:
                    self._compute_parts([part])
                return
            if len(batch) == 1:
                raise
            # The log still names their group, if they were one: `NetGroups.of` does not net
            # it again once the progress row is inside it.
            rest: TransactionBatch | None = batch
            while rest is not None:
                one, rest = rest.split(1)
                self._compute_parts([Part(one, False)])
            return
        t1 = self._clock()
        totals = self.engine.totals
        self.metrics.compute.computed(
            len(batch), batch.rows, engine_s=(checking - t0) + (processed - checked),
            check_s=(checked - checking) + (t1 - processed), busy_s=t1 - started,
            jobs=totals.jobs, stages=totals.stages, index_bytes=self.engine.index_bytes,
            late_rows=self.engine.late_rows)
        self._stages.hand_over(Computed(batch, outputs, self.engine.version()))

    def _deliver(self) -> None:
        """Write each computed batch to every sink (in parallel), then commit its offsets; in
        order, one batch at a time. Tell the sinks about checkpoints between batches."""
        stages = self._stages
        while True:
            self._checkpointing.announce()
            computed = stages.next_computed(timeout=0.1)
            if computed is None:
                if stages.computing_done.is_set() or stages.failure is not None:
                    return
                continue
            try:
                self._write(computed)
            except ShutdownRequested as exc:
                stages.fail(exc)
                return
            finally:
                stages.delivered()

    def _write(self, computed: Computed) -> None:
        started = self._clock()
        self.outputs.write(computed, self.metrics.delivery)
        commit_time = time.time()
        written = self._clock()
        self._crash.reached("commit")
        batch = computed.batch
        last = batch.last
        due = self._checkpointing.due(self._stages)
        state = self._retrying(self.input.name, lambda: self._stages.call_input(
            self.input, lambda source: source.commit(batch, commit_time, with_state=due)))
        now = self._clock()
        self.metrics.delivery.delivered(len(batch), last.number, sink_s=written - started,
                                        busy_s=now - started, now=now)
        self._checkpointing.committed(self._stages, last.number, state, computed.version)
        log.debug("batch of %d transactions done, last #%d", len(batch), last.number)

    def checkpoint(self) -> bool:
        """Checkpoint through the last transaction every sink committed, if any since the last
        checkpoint; True if written. Call it while `run` is not running (e.g. after it returned,
        at a graceful stop): during a run, checkpoints are taken in the background."""
        number, version = self._checkpointing.last_commit
        if number == self._checkpointing.checkpointed:
            return False
        state = self._stages.call_input(self.input, lambda source: source.state())
        self._checkpointing.now(number, state, version)
        return True

    def lag(self) -> int:
        """Records in the source topics not yet in a committed transaction (measured now)."""
        return self.input.lag()

    def request_stop(self) -> None:
        """Make `run` return once the batches already computed are delivered (or at once,
        abandoning them, while a stage waits for an unavailable dependency). Safe from a signal
        handler or another thread."""
        self._stop.set()

    def close(self) -> None:
        self.input.close()
        self.outputs.close()
