"""Checkpoints and the transaction log of one pipeline, in a local directory or at any
Hadoop-compatible URI Spark can write (s3a://, hdfs://, file://; the storage itself is
`txstream.service.checkpoint_storage`).

Layout under the pipeline's location (`PipelineConfig.checkpoint_location`):

    ckpt-<transaction>-<millis>/source/     builder state: next number, offsets, upsert rows
    ckpt-<transaction>-<millis>/engine/     every operator's state (Engine.save_state)
    ckpt-<transaction>-<millis>/MANIFEST.json   written last: the checkpoint is complete
    txlog/<first>-<last>[.e<epoch>].json    identities of the transactions of one batch,
                                            written before any sink sees them
    epochs/<epoch>.json                     the writer epochs (checkpoint_epochs)

A checkpoint is complete exactly when its manifest exists. The manifest is written under a
temporary name and renamed, which is atomic on a local file system and HDFS; on object stores
(S3) the renamed object appears whole or not at all. Nothing is ever overwritten, so recovery
only lists directories and takes the newest one with a manifest: no file naming "the latest"
has to be replaced in place, which object stores cannot do atomically.

The transaction log is what lets a recovered pipeline re-form the transactions after its
checkpoint with the same numbers and boundaries that the sinks may already hold.

Where the location can fence (`txstream.service.checkpoint_epochs`), the instance that resumes
from it takes the next writer epoch; every checkpoint and log file it writes carries that
epoch, every write checks it first, and readers ignore what a fenced instance wrote after the
takeover.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pydantic import BaseModel, TypeAdapter, ValidationError

from txstream.service.checkpoint_epochs import CheckpointEpochs
from txstream.service.checkpoint_storage import CheckpointError, CheckpointStorageError, Storage
from txstream.sinks.postgres.writers import Writer
from txstream.sources.source_state import SourceState
from txstream.sources.transaction_batch import TransactionLogEntry

MANIFEST = "MANIFEST.json"
TXLOG = "txlog"
_CHECKPOINT = re.compile(r"^ckpt-(\d{12})-(\d+)$")
_LOG_FILE = re.compile(r"^(\d{12})-(\d{12})(?:\.e(\d+))?\.json$")
_LOG = TypeAdapter(list[TransactionLogEntry])
# What a storage raises when it refuses a write: Python's I/O errors (a local directory), the
# JVM's (a Hadoop file system through py4j).
_STORAGE_ERRORS = (OSError, Py4JJavaError)

_logger = logging.getLogger(__name__)


class PipelineIdentity(BaseModel):
    """What a checkpoint must have been written by: the same pipeline over the same topics."""

    pipeline: str
    sources: dict[str, str]  # source name -> topic
    outputs: list[str]


class Manifest(BaseModel):
    format: int = 1
    transaction: int  # the last transaction the checkpoint includes
    created: datetime
    identity: PipelineIdentity
    epoch: int = 0  # the writer epoch of the instance that wrote it (0: none)


@dataclass(frozen=True)
class Checkpoint:
    name: str
    manifest: Manifest

    @property
    def transaction(self) -> int:
        return self.manifest.transaction


@dataclass(frozen=True)
class PreparedCheckpoint:
    """Written but not yet complete: `publish` makes it the newest checkpoint."""

    name: str
    manifest: Manifest


class CheckpointStore:
    """The checkpoints and transaction log at one location (one pipeline's)."""

    def __init__(self, storage: Storage, identity: PipelineIdentity, keep: int = 2) -> None:
        """`storage`: the pipeline's location (`txstream.service.checkpoint_storage`);
        `keep`: how many complete checkpoints stay, the newest ones."""
        self._storage = storage
        self.location = self._storage.root
        self.identity = identity
        self._keep = keep
        self._epochs = (CheckpointEpochs(self._storage, self.location)
                        if self._storage.fences else None)
        self.epoch: int | None = None  # this instance's, once taken

    # ---- the writer epoch ----------------------------------------------------------------

    def take_epoch(self, writer: Writer, base: int) -> None:
        """Take the location's next writer epoch for `writer`, which resumes through
        transaction `base` (what it read of the checkpoints and the log, before this);
        without fencing (an object store) only say so."""
        if self._epochs is None:
            _logger.warning("checkpoint location %s has no atomic create-if-absent (an object "
                        "store): a second instance of this pipeline is not fenced through it "
                        "(PostgreSQL sinks fence it through their database, Kafka sinks "
                        "through their transactional id); use a file system path or hdfs:// "
                        "for checkpoint_dir to fence file sinks", self.location)
            return
        try:
            self.epoch = self._epochs.take(writer, base)
        except _STORAGE_ERRORS as exc:
            raise _refused(f"cannot take a writer epoch in {self.location}", exc) from exc

    def check_epoch(self) -> None:
        """CheckpointFencedError if another instance took a newer epoch than this one's
        (nothing before one is taken, or where the location cannot fence)."""
        if self._epochs is not None and self.epoch is not None:
            self._epochs.check(self.epoch)

    def _valid(self) -> Callable[[int, int], bool]:
        """Whether what epoch `e` wrote about transaction `t` is part of the history (see
        `txstream.service.checkpoint_epochs`)."""
        return self._epochs.valid() if self._epochs is not None else lambda e, t: True

    # ---- checkpoints ---------------------------------------------------------------------

    def _complete(self, valid: Callable[[int, int], bool] | None = None) -> list[Checkpoint]:
        """Complete checkpoints that are part of the history (`valid`, if the caller has it
        already), newest first."""
        valid = valid or self._valid()
        found = []
        for name in self._storage.list(""):
            if not _CHECKPOINT.match(name):
                continue
            text = self._storage.read_text(f"{name}/{MANIFEST}")
            if text is None:
                continue  # incomplete: a crash or kill while it was being written
            try:
                manifest = Manifest.model_validate_json(text)
            except ValidationError as exc:
                raise CheckpointError(f"checkpoint manifest {self.location}/{name}/{MANIFEST} "
                                      f"is unreadable ({exc}); delete that directory") from exc
            if valid(manifest.epoch, manifest.transaction):
                found.append(Checkpoint(name, manifest))
        return sorted(found, key=lambda c: _order(c.name), reverse=True)

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint; a CheckpointError if another pipeline wrote it."""
        complete = self._complete()
        if not complete:
            return None
        newest = complete[0]
        if newest.manifest.identity != self.identity:
            raise CheckpointError(
                f"the checkpoint {self.location}/{newest.name} was written by another pipeline "
                f"({newest.manifest.identity.model_dump()}); this one is "
                f"{self.identity.model_dump()}. Give this pipeline its own consumer_group or "
                "checkpoint_dir, or delete that directory to start it over"
            )
        return newest

    def has_history(self) -> bool:
        """Whether a pipeline ran here before (a checkpoint or a logged transaction): then the
        sinks may hold its transactions."""
        return self.latest() is not None or bool(self._log_files())

    def load_source_state(self, checkpoint: Checkpoint) -> SourceState:
        with self._storage.local_copy(f"{checkpoint.name}/source") as local:
            return SourceState.load(local)

    def engine_uri(self, checkpoint: Checkpoint | PreparedCheckpoint) -> str:
        return self._storage.uri(f"{checkpoint.name}/engine")

    def prepare(self, transaction: int, state: SourceState) -> PreparedCheckpoint:
        """Write the builder's state into a new checkpoint directory; the caller then saves
        the engine's state at `engine_uri(...)` and calls `publish`."""
        if state.next_number != transaction + 1:
            raise CheckpointError(f"builder state continues at #{state.next_number}, not after "
                                  f"#{transaction}: checkpoint only after a committed batch")
        now = datetime.now(UTC)
        name = f"ckpt-{transaction:012d}-{int(now.timestamp() * 1000)}"
        prepared = PreparedCheckpoint(name, Manifest(transaction=transaction, created=now,
                                                     identity=self.identity,
                                                     epoch=self.epoch or 0))
        try:
            with tempfile.TemporaryDirectory(prefix="txstream-") as scratch:
                state.save(Path(scratch) / "source")
                self._storage.put_dir(Path(scratch) / "source", f"{name}/source")
        except BaseException:
            self.discard(prepared)
            raise
        return prepared

    def publish(self, prepared: PreparedCheckpoint) -> None:
        """Make `prepared` complete (its manifest, last), then delete what it supersedes;
        CheckpointFencedError instead if this instance was fenced."""
        self.check_epoch()
        self._storage.make_durable(prepared.name)
        self._storage.write_text(f"{prepared.name}/{MANIFEST}",
                                 prepared.manifest.model_dump_json())
        self._prune(prepared.name)

    def discard(self, prepared: PreparedCheckpoint) -> None:
        """Delete `prepared` unless its manifest was written: a checkpoint that failed half
        way would otherwise hold its space (on a full disk, the space the next one needs)
        until a later one is published."""
        try:
            if self._storage.read_text(f"{prepared.name}/{MANIFEST}") is None:
                self._storage.delete(prepared.name)
        except _STORAGE_ERRORS as exc:  # the next published checkpoint prunes it
            _logger.warning("could not delete the incomplete checkpoint %s: %s",
                            prepared.name, exc)

    def _prune(self, newest: str) -> None:
        """Keep the newest `keep` complete checkpoints; delete older ones, incomplete leftovers
        below the newest, what fenced instances wrote after a takeover, and log files no kept
        checkpoint needs."""
        valid = self._valid()
        kept = self._complete(valid)[: self._keep]
        kept_names = {c.name for c in kept}
        for name in self._storage.list(""):
            if _CHECKPOINT.match(name) and name not in kept_names and (
                    _order(name) < _order(newest) or not valid(*self._written(name))):
                self._storage.delete(name)
        oldest = min(c.transaction for c in kept)
        for name, first, last, epoch in self._log_files():
            if last <= oldest or not valid(epoch, first):
                self._storage.delete(f"{TXLOG}/{name}")

    def _written(self, name: str) -> tuple[int, int]:
        """The epoch and transaction of checkpoint `name` (one never completed: this
        instance's, which is valid)."""
        text = self._storage.read_text(f"{name}/{MANIFEST}")
        if text is None:
            return self.epoch or 0, _order(name)[0]
        manifest = Manifest.model_validate_json(text)
        return manifest.epoch, manifest.transaction

    # ---- transaction log -----------------------------------------------------------------

    def log(self, entries: Sequence[TransactionLogEntry]) -> None:
        """Record the transactions of a batch (consecutive numbers) before the sinks see them;
        CheckpointFencedError instead if this instance was fenced."""
        if not entries:
            return
        self.check_epoch()
        # The epoch in the name: a fenced instance's late file never replaces the new writer's.
        epoch = f".e{self.epoch}" if self.epoch is not None else ""
        name = f"{entries[0].number:012d}-{entries[-1].number:012d}{epoch}.json"
        try:
            self._storage.write_text(f"{TXLOG}/{name}", _LOG.dump_json(list(entries)).decode())
        except _STORAGE_ERRORS as exc:
            raise _refused(f"cannot log transactions #{entries[0].number}-"
                           f"#{entries[-1].number} in {self.location}/{TXLOG}", exc) from exc

    def _log_files(self) -> list[tuple[str, int, int, int]]:
        """Name, first and last transaction, and epoch (0: none) of each log file."""
        files = []
        for name in self._storage.list(TXLOG):
            m = _LOG_FILE.match(name)
            if m:
                files.append((name, int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)))
        return sorted(files, key=lambda f: f[1])

    def logged_after(self, transaction: int) -> list[TransactionLogEntry]:
        """The logged transactions numbered after `transaction` that are part of the
        history, in order, without gaps."""
        entries: dict[int, TransactionLogEntry] = {}
        valid = self._valid()
        for name, _, last, epoch in self._log_files():
            if last <= transaction:
                continue
            text = self._storage.read_text(f"{TXLOG}/{name}")
            for entry in _LOG.validate_json(text or "[]"):
                if entry.number <= transaction or not valid(epoch, entry.number):
                    continue
                seen = entries.setdefault(entry.number, entry)
                if seen != entry:
                    raise CheckpointError(
                        f"the transaction log in {self.location}/{TXLOG} records #{entry.number} "
                        f"twice with different contents ({seen} vs {entry}); it was written by "
                        "two processes at once. Stop the other one; delete the location to "
                        "start over"
                    )
        numbers = sorted(entries)
        if numbers != list(range(transaction + 1, transaction + 1 + len(numbers))):
            raise CheckpointError(
                f"the transaction log in {self.location}/{TXLOG} has gaps after #{transaction} "
                f"({numbers[:10]}...); it was damaged. Delete the location to start over"
            )
        return [entries[n] for n in numbers]


def _refused(what: str, exc: BaseException) -> CheckpointStorageError:
    return CheckpointStorageError(
        f"{what}: {exc}. Free space there (or mend the storage): the service waits, tries "
        "again with backoff, and goes on once it is written")


def _order(name: str) -> tuple[int, int]:
    m = _CHECKPOINT.match(name)
    assert m is not None
    return int(m.group(1)), int(m.group(2))

