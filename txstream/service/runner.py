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

The runner knows neither Kafka nor Spark: its input is `txstream.sources.kafka_input`, its engine
and checkpoint store are handed to it (`txstream.service.compose.open_runner` builds them).

The guarantees are those of a sequential loop:
* a batch's transactions are in the transaction log before the engine runs them, so before
  any sink sees them;
* offsets are committed only after every sink committed the batch, batches in order;
* a checkpoint holds the source state and the engine's state as of one committed transaction
  (the engine may be further ahead: its versions are immutable, see `Engine.version`).

After a crash the runner loads the newest complete checkpoint and the transactions logged after
it; the builder re-forms those from the same records with the same numbers and boundaries, the
engine recomputes them (netting together those it netted together before,
`txstream.service.net_groups`), and the sinks receive them again:
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
from functools import partial
from typing import TYPE_CHECKING

from txstream.engine.errors import ExpressionError
from txstream.engine.warmup import WARM_UP_BATCHES, WarmUp
from txstream.schemas.config import PipelineConfig
from txstream.service.checkpointing import Checkpointing
from txstream.service.health import Readiness
from txstream.service.input_reports import InputReports
from txstream.service.invariants import check_engine_input, check_keyed_outputs
from txstream.service.metrics import Metrics
from txstream.service.net_groups import NetGroups, Part, engine_changes
from txstream.service.outputs import Outputs
from txstream.service.stages import (
    CRASH_ENV,
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
from txstream.sources.kafka_input import KafkaInput
from txstream.sources.source_state import SourceState
from txstream.sources.transaction_batch import TransactionBatch

if TYPE_CHECKING:
    from txstream.engine import Engine, EngineVersion
    from txstream.service.checkpoint import CheckpointStore

__all__ = ["PipelineRunner", "ShutdownRequested"]

log = logging.getLogger(__name__)

# After real batches, the warm-up waits for this long without a batch (see
# `PipelineRunner._may_begin_warm_up`).
WARM_UP_QUIET_S = 3.0


class PipelineRunner:
    """Runs one configured pipeline until told to stop.

    Construction restores the newest checkpoint (or starts from scratch), connects to Kafka
    and the sinks, retrying while they are unavailable, and refuses to start on the problems
    of `txstream.service.startup`. `run` runs the stages (see the module's docstring);
    `request_stop` (e.g. from a SIGTERM handler) makes it return once the batches already
    computed are delivered; `checkpoint` then `close`.
    """

    def __init__(self, config: PipelineConfig, *, engine: Engine, checkpoints: CheckpointStore,
                 metrics: Metrics | None = None, readiness: Readiness | None = None,
                 live: LiveTables | None = None, fence: WriterEpoch | None = None,
                 warm_up: Callable[[], WarmUp] | None = None) -> None:
        """`engine` and `checkpoints`: the pipeline's compute and state storage, composed by
        `txstream.service.compose.open_runner`. `metrics` and `readiness`: given when an HTTP
        endpoint serves them from before the runner exists (restoring and connecting take a
        while). `live`: the tables of the outputs with a live sink. `fence`: the writer epoch
        this instance took (`txstream.service.leadership`; None: not fenced through
        PostgreSQL). The runner takes the checkpoint location's epoch itself
        (`CheckpointStore.take_epoch`). `warm_up`: the steps of the engine's warm-up
        (`Engine.warming_up`), begun by the first `run` at its first idle moment (no batch
        ready, the input caught up; after real batches, such as a backlog's at start, once none
        has been computed for `WARM_UP_QUIET_S`), and taken while there is nothing else to do;
        a batch to compute ends the warm-up, and so does a stop, also during a step
        (`_step_giving_way`)."""
        self.config = config
        self.live = live
        self.engine = engine
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
        assert config.kafka_bootstrap_servers is not None
        latest = self.checkpoints.latest()
        # Sinks may hold transactions of an earlier run exactly when there is a checkpoint or a
        # logged transaction; only a start from scratch may recreate `mode: replace` tables.
        resuming = self.checkpoints.has_history()
        if latest is not None:
            state = self.checkpoints.load_source_state(latest)
            self.engine.load_state(self.checkpoints.engine_uri(latest))
            checkpointed = latest.transaction
            self.metrics.checkpoint.last_transaction = latest.transaction
        else:
            # No checkpoint: the engine state is empty, so the input starts at the beginning
            # of every topic (whatever offsets the consumer group committed).
            state = SourceState(next_number=1, offsets={}, upsert_rows={
                s.name: s.table_schema.arrow_schema().empty_table()
                for s in config.sources if s.semantics == "upsert"})
            checkpointed = 0
        replay = self.checkpoints.logged_after(checkpointed)
        self._logged_through = checkpointed + len(replay)
        # Before the sinks open: a Kafka sink's new producer fences the previous writer's,
        # which must find the epoch moved on already (`KafkaSink`, writer_check).
        self.checkpoints.take_epoch(Writer.this_process(), base=self._logged_through)
        # The last transaction every sink committed, and the engine's state as of it.
        self._committed: tuple[int, EngineVersion | None] = (checkpointed, None)
        self.metrics.delivery.last_transaction = checkpointed
        if latest is not None or replay:
            log.info("resuming after transaction #%d (%s); replaying %d logged transaction(s)",
                     checkpointed, latest.name if latest else "no checkpoint", len(replay))
        self.outputs = Outputs(config, {name: out.schema for name, out in engine.outputs.items()},
                               resuming=resuming, live=live, retrying=self._retrying,
                               crash=self._crash, fence=fence,
                               checkpoint_fence=self.checkpoints.check_epoch)
        try:
            refuse(self._startup_problems(resuming, checkpointed))
            self._net_groups = NetGroups.of(config.nets_batches, replay, self._logged_through,
                                            self.outputs.progress_row())
        except BaseException:
            self.outputs.close()
            raise
        if config.nets_batches:
            log.info("every sink is a PostgreSQL snapshot committed per batch: a batch of "
                     "several transactions is computed as one, their net change")
        self._checkpointing = Checkpointing(config, engine, checkpoints, self.outputs,
                                            self.metrics.checkpoint, self._crash, checkpointed)
        self.input = self._retrying(KafkaInput.name, lambda: KafkaInput(
            config, state, replay,
            InputReports(self.metrics.source, self.readiness, KafkaInput.name)))
        self._stages = Stages(config.batch_transactions, serving=False)
        self._warm_up = warm_up  # begun (called) when a run is idle (`_may_begin_warm_up`)
        self._warming: WarmUp | None = None
        self._idle_checked = 0.0
        self._computed_at: float | None = None  # when the last batch was computed

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
                                       backlog_wait_s=self.config.backlog_wait_ms / 1000)
        threads = [threading.Thread(target=stages.guard(work), name=name, daemon=True)
                   for name, work in (
                       ("ingest", self._ingest), ("deliver", self._deliver),
                       ("checkpoint", partial(self._checkpointing.run, stages)))]
        for thread in threads:
            thread.start()
        last_report = time.monotonic()
        try:
            while not self._stop.is_set() and stages.failure is None:
                batch = stages.take_batch(timeout=0.1)
                if batch is not None:
                    self._cut_warm_up()
                    self._compute(batch)
                    self._computed_at = time.monotonic()
                elif until is not None and stages.idle() and until(self):
                    break
                elif (self._warming is not None or self._may_begin_warm_up()) \
                        and self._nothing_to_do(stages):
                    self._warm_up_step()
                now = time.monotonic()
                if on_progress is not None and now - last_report >= progress_interval:
                    on_progress(self.metrics)
                    last_report = now
        except BaseException as exc:
            stages.fail(exc)
        finally:
            self._cut_warm_up()
            if self._warm_up is not None:
                self._warm_up = None
                log.info("no warm-up: the run stopped before it began")
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

    # ---- warming up while idle ----------------------------------------------------------

    def _nothing_to_do(self, stages: Stages) -> bool:
        """No batch in flight and the input read to its end (asked at most once a second: the
        ingest thread answers between two polls). Not the lag: a transactional producer's
        commit markers keep an idle partition's lag at 1 or more."""
        now = time.monotonic()
        if not stages.idle() or now - self._idle_checked < 1.0:
            return False
        self._idle_checked = now
        # Idle again after the answer: ingest offers what it polled before it serves the call.
        return stages.call_input(self.input, lambda source: source.read_to_end()) \
            and stages.idle()

    def _may_begin_warm_up(self) -> bool:
        """Whether a warm-up not begun may begin: before any batch, or once none has been
        computed for `WARM_UP_QUIET_S`. Neither building a scratch engine nor planning a step
        can be cut short, and at a steady rate the gaps between transactions are idle
        moments too: the next transaction would wait out both."""
        return self._warm_up is not None and (
            self._computed_at is None
            or time.monotonic() - self._computed_at >= WARM_UP_QUIET_S)

    def _warm_up_step(self) -> None:
        if self._warming is None:
            assert self._warm_up is not None
            try:
                self._warming, self._warm_up = self._warm_up(), None
            except Exception as exc:  # an optimization must not stop the service
                self._warm_up = None
                log.warning("no warm-up: %s", exc)
                return
            if self._stages.has_ready() or self._stop.is_set():
                self._cut_warm_up()  # it came while the warm-up's engine was being built
                return
        started = time.monotonic()
        done = self._step_giving_way(self._warming)
        if done is None:
            log.info("warm-up %s", "cut short by a batch to compute, a stop or a failed stage"
                     if self._warming.cut_short else "done")
            self._warming = None
        else:
            log.info("warm-up: made-up batch %d of %d in %.1f s, while idle", done,
                     WARM_UP_BATCHES, time.monotonic() - started)

    def _step_giving_way(self, warming: WarmUp) -> int | None:
        """The warm-up's next step, cancelled as soon as a batch is ready, a stop is requested
        or a stage failed: a made-up batch takes seconds on a cold JVM, which the first real
        transaction would otherwise wait out. Cancelled again every 50 ms until it returns,
        since a step still planning submits its Spark job afterwards."""
        returned = threading.Event()

        def watch() -> None:
            while True:
                if self._stop.is_set() or self._stages.has_ready() \
                        or self._stages.failure is not None:
                    warming.cancel()
                if returned.wait(0.05):
                    return

        watcher = threading.Thread(target=watch, name="warm-up-watch", daemon=True)
        watcher.start()
        try:
            return next(warming, None)
        finally:
            returned.set()
            watcher.join()

    def _cut_warm_up(self) -> None:
        """Before a batch, and when `run` returns: a warm-up under way ends (a warm-up of this
        engine must give its state back before the engine takes a real batch; the JVM keeps
        what it compiled). One not begun yet waits until it may begin (`_may_begin_warm_up`):
        a backlog's first batches leave the JVM far from warm (see `txstream.engine.warmup`)."""
        if self._warming is not None:
            self._warming.close()
            self._warming = None
            log.info("warm-up ended by a batch to compute, or a stop")

    def _ingest(self) -> None:
        """Poll, decode and form transactions into the ready queue; between polls, run the
        other stages' calls to the input (it is not thread-safe). After a stop, only those
        calls, until the other stages are done."""
        stages, metrics = self._stages, self.metrics.ingest
        try:
            while not stages.halt.is_set():
                stages.serve_input(self.input)
                if self._stop.is_set() or stages.failure is not None:
                    stages.halt.wait(0.02)
                    continue
                started = time.monotonic()
                try:
                    fresh = self._retrying(self.input.name, lambda: self.input.poll(0.05))
                except ShutdownRequested:
                    continue
                self.readiness.started.set()
                stats = self.input.stats
                if stats.events != metrics.events:
                    metrics.busy_seconds += time.monotonic() - started
                metrics.events, metrics.bad_records = stats.events, stats.bad_records
                metrics.incomplete_upstream = stats.incomplete_upstream
                metrics.closed(stats.transactions, time.monotonic(),
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
        as one batch."""
        # Logged before any sink sees them: a recovery re-forms exactly these transactions,
        # and nets the same ones together.
        started = time.monotonic()
        self.checkpoints.log([entry for part in parts for entry in part.batch.log_entries(
            after=self._logged_through, netted=part.netted)])
        batch = TransactionBatch.join([part.batch for part in parts])
        self._logged_through = max(self._logged_through, batch.last.number)
        self._crash.reached("log")
        t0 = time.monotonic()
        try:
            changes = engine_changes(parts, self.engine.sources)
            checking = time.monotonic()
            check_engine_input(changes, batch.first, batch.last.number, self._source_keys)
            checked = time.monotonic()
            outputs = self.engine.process(changes) if changes else {}
            processed = time.monotonic()
            check_keyed_outputs(outputs, self._output_keys)
        except ExpressionError:
            if len(parts) > 1:
                for part in parts:
                    self._compute_parts([part])
                return
            if len(batch) == 1:
                raise
            # Apply the transactions before the failing one: processing stops exactly at it.
            # The log still names their group, if they were one: `NetGroups.of` does not net
            # it again once the progress row is inside it.
            rest: TransactionBatch | None = batch
            while rest is not None:
                one, rest = rest.split(1)
                self._compute_parts([Part(one, False)])
            return
        t1 = time.monotonic()
        metrics = self.metrics.compute
        engine_s = (checking - t0) + (processed - checked)
        metrics.spark_job_seconds.observe(engine_s)
        metrics.engine_seconds += engine_s
        metrics.check_seconds += (checked - checking) + (t1 - processed)
        metrics.spark_jobs = self.engine.totals.jobs
        metrics.spark_stages = self.engine.totals.stages
        metrics.state_index_bytes = self.engine.index_bytes
        metrics.batch_transactions.observe(len(batch))
        metrics.batch_changes.observe(batch.rows)
        metrics.busy_seconds += t1 - started
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
        started = time.monotonic()
        metrics = self.metrics.delivery
        self.outputs.write(computed, metrics)
        commit_time = time.time()
        metrics.sink_seconds += time.monotonic() - started
        self._crash.reached("commit")
        batch = computed.batch
        last = batch.last
        due = self._checkpointing.due(self._stages)
        state = self._retrying(self.input.name, lambda: self._stages.call_input(
            self.input, lambda source: source.commit(batch, commit_time, with_state=due)))
        self._committed = (last.number, computed.version)
        metrics.last_delivered_at = time.monotonic()
        metrics.transactions += len(batch)
        metrics.batches += 1
        metrics.last_transaction = last.number
        metrics.busy_seconds += time.monotonic() - started
        self._checkpointing.committed(self._stages, last.number, state, computed.version)
        log.debug("batch of %d transactions done, last #%d", len(batch), last.number)

    def checkpoint(self) -> bool:
        """Checkpoint through the last transaction every sink committed, if any since the last
        checkpoint; True if written. Call it while `run` is not running (e.g. after it returned,
        at a graceful stop): during a run, checkpoints are taken in the background."""
        number, version = self._committed
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
