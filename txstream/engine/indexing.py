"""Which state runs an engine indexes, and where the index files go (`txstream.engine.run_index`
writes and probes them, `txstream.engine.indexed_runs` keeps each state's).

An index is only an optimization: whatever goes wrong with one leaves the run streamed, as a
small run is. A run whose files cannot be written (no directory, no room) stays unindexed,
with a warning; files the executors cannot read (an `index_dir` not shared by every host
that runs a lookup) turn indexing off for the engine, with an error saying what to set,
instead of failing every batch.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
import uuid
import weakref
from collections.abc import Iterable
from pathlib import Path

from txstream.engine.state import ZSetState

log = logging.getLogger(__name__)


_PREFIX = "txstream-index-"
_OWNER = "owner"  # in each directory: the host, process id and process token of its engine
# Tells this process from an earlier one of the same id on the same host (a container
# restarted in its pod gets the same host name and, often, the same process id).
_PROCESS = uuid.uuid4().hex


class StateIndexes:
    """Index the runs of at least `rows` rows, in a directory of this object's own under
    `parent` (else the system's temporary directory), made when the first index is written and
    deleted with this object or at exit. A killed process cannot delete its directory: the
    next one made on its host deletes those of this host's processes that are gone, so a
    service restarted after crashes does not fill the disk with indexes of states it lost."""

    def __init__(self, rows: int, parent: str | None) -> None:
        self.rows = rows
        self._parent = parent
        self._directory: str | None = None

    def directory(self) -> str:
        if self._directory is None:
            parent = Path(self._parent or tempfile.gettempdir())
            parent.mkdir(parents=True, exist_ok=True)
            _sweep(parent)
            self._directory = tempfile.mkdtemp(prefix=_PREFIX, dir=parent)
            weakref.finalize(self, shutil.rmtree, self._directory, True)
            (Path(self._directory) / _OWNER).write_text(
                f"{socket.gethostname()} {os.getpid()} {_PROCESS}")
        return self._directory

    def refresh(self, states: Iterable[ZSetState]) -> None:
        """Index `states`' large runs and drop the indexes of their runs merged away."""
        for state in states:
            state.refresh_indexes(self.rows, self.directory)

    def stop(self, states: Iterable[ZSetState], why: str) -> None:
        """Index no more, and drop every index: an executor could not read one (`why`)."""
        log.error("state indexes are off, lookups stream every run: an executor could not read "
                  "an index file. Set index_dir (TXSTREAM_INDEX_DIR) to a directory every "
                  "executor mounts at the same path. %s", why[:500])
        self.rows = sys.maxsize
        for state in states:
            state.drop_indexes()


def _sweep(parent: Path) -> None:
    """Delete the index directories under `parent` whose owner ran on this host and is gone.
    Others are left: another host's (its processes are not ours to see), and one without an
    owner yet (being made)."""
    host = socket.gethostname()
    for directory in parent.glob(f"{_PREFIX}*"):
        try:
            owner_host, pid, token = (directory / _OWNER).read_text().split()
        except (OSError, ValueError):
            continue
        gone = (token != _PROCESS if int(pid) == os.getpid() else not _alive(int(pid)))
        if owner_host == host and gone:
            log.info("deleting the state indexes of process %s, which is gone: %s", pid,
                     directory)
            shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
