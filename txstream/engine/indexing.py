"""Which state runs an engine indexes, and where the index files go (`txstream.engine.run_index`
writes and probes them, `ZSetState.refresh_indexes` keeps each state's).

An index is only an optimization: whatever goes wrong with one leaves the run streamed, as a
small run is. A run whose files cannot be written (no directory, no room) stays unindexed,
with a warning; files the executors cannot read (an `index_dir` not shared by every host
that runs a lookup) turn indexing off for the engine, with an error saying what to set,
instead of failing every batch.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

from txstream.engine.state import ZSetState

log = logging.getLogger(__name__)


class StateIndexes:
    """Index the runs of at least `rows` rows, in a directory of this object's own under
    `parent` (else the system's temporary directory), made when the first index is written and
    deleted with this object or at exit (not after a kill: a shared `parent` keeps the
    `txstream-index-*` directories of killed processes)."""

    def __init__(self, rows: int, parent: str | None) -> None:
        self.rows = rows
        self._parent = parent
        self._directory: str | None = None
        self.bytes = 0  # what the current indexes' files hold

    def directory(self) -> str:
        if self._directory is None:
            if self._parent is not None:
                Path(self._parent).mkdir(parents=True, exist_ok=True)
            self._directory = tempfile.mkdtemp(prefix="txstream-index-", dir=self._parent)
            weakref.finalize(self, shutil.rmtree, self._directory, True)
        return self._directory

    def refresh(self, states: Iterable[ZSetState], every: Iterable[ZSetState]) -> None:
        """Index `states`' large runs and drop the indexes of their runs merged away; `every`:
        all the engine's states, whose indexes' bytes are counted."""
        for state in states:
            state.refresh_indexes(self.rows, self.directory)
        self.bytes = sum(s.index_bytes for s in every)

    def stop(self, states: Iterable[ZSetState], why: str) -> None:
        """Index no more, and drop every index: an executor could not read one (`why`)."""
        log.error("state indexes are off, lookups stream every run: an executor could not read "
                  "an index file. Set index_dir (TXSTREAM_INDEX_DIR) to a directory every "
                  "executor mounts at the same path. %s", why[:500])
        self.rows = sys.maxsize
        for state in states:
            state.drop_indexes()
        self.bytes = 0
