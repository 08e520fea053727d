"""The `live` sink: an output's changes applied to its live table (`txstream.sinks.live.serving`),
whose subscribers get one update per transaction.

The table lives in memory and is saved before every checkpoint is published (Parquet with its
row keys and the transaction it is as of, written to a temporary file then renamed, and beside
it the checkpoint it was saved for), so a restart resumes with the same rows and row keys. The
table may be ahead of the checkpoint; the replay after a restart repeats transactions it
already holds, and `write` skips those (`held_through`). A saved table older than the
checkpoint (`saved_through`) cannot be completed by the replay: the runner refuses to start."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from txstream.changes import Changes
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.sink import SinkBase, SinkSchemaError

log = logging.getLogger(__name__)
_TRANSACTION = b"txstream.transaction"


class LiveSink(SinkBase):
    """Writes output `output` into its table of `tables`, saved under `state_dir`."""

    def __init__(self, tables: LiveTables, output: str, state_dir: Path) -> None:
        self._tables = tables
        self._output = output
        self._path = state_dir / f"{output}.parquet"
        self._through_path = state_dir / f"{output}.checkpoint"
        self._held: int | None = None
        self._saved: int | None = None  # the transaction the file on disk is as of
        self._through = 0  # the checkpoint it was saved for
        table = tables.table(output)
        if self._path.exists():
            try:
                saved = pq.read_table(self._path)
                transaction = int((saved.schema.metadata or {})[_TRANSACTION])
                table.restore(saved, transaction)
            except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
                raise SinkSchemaError(f"the saved live table {self._path} cannot be read: {exc};"
                                      " move it away to rebuild it from a start from scratch"
                                      ) from exc
            self._held = self._saved = transaction
            try:
                self._through = int(self._through_path.read_text())
            except (OSError, ValueError):
                self._through = 0  # saved by a version without it: not proven current
            log.info("live table %s restored as of transaction #%d (%d rows)", output,
                     transaction, saved.num_rows)

    def write(self, changes: Changes) -> None:
        new = changes.after(self._held)
        if new.num_rows:
            self._tables.publish(self._output, new.table)

    def held_through(self) -> int | None:
        return self._held

    def saved_through(self) -> int:
        return self._through

    def before_checkpoint(self, transaction: int) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        snapshot = self._tables.snapshot(self._output)
        if snapshot.transaction != self._saved:  # changed since the last save
            rows = snapshot.rows.replace_schema_metadata(
                {_TRANSACTION: str(snapshot.transaction).encode()})
            temporary = self._path.with_suffix(".parquet.tmp")
            pq.write_table(rows, temporary)
            os.replace(temporary, self._path)
            self._saved = snapshot.transaction
        # The table holds every transaction through the checkpoint: every sink committed it.
        temporary = self._through_path.with_suffix(".tmp")
        temporary.write_text(str(transaction))
        os.replace(temporary, self._through_path)
        self._through = transaction

    def close(self) -> None:
        """Nothing to release: the table stays served until the service stops."""
