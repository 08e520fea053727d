"""The `live` sink: an output's changes applied to its live table (`connectors.live.serving`),
whose subscribers get one update per transaction.

The table lives in memory and is saved at every checkpoint (Parquet with its row keys and the
transaction it is as of, written to a temporary file then renamed), so a restart resumes with
the same rows and row keys. The table may be ahead of the checkpoint; the replay after a
restart repeats transactions it already holds, and `write` skips those (`held_through`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from connectors.live.serving import LiveTables
from connectors.live.table import TIME
from connectors.sink import SinkBase, SinkSchemaError

log = logging.getLogger(__name__)
_TRANSACTION = b"txstream.transaction"


class LiveSink(SinkBase):
    """Writes output `output` into its table of `tables`, saved under `state_dir`."""

    def __init__(self, tables: LiveTables, output: str, state_dir: Path) -> None:
        self._tables = tables
        self._output = output
        self._path = state_dir / f"{output}.parquet"
        self._held: int | None = None
        self._saved: int | None = None  # the transaction the file on disk is as of
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
            log.info("live table %s restored as of transaction #%d (%d rows)", output,
                     transaction, saved.num_rows)

    def write(self, changes: pa.Table) -> None:
        if self._held is not None:
            changes = changes.filter(pc.greater(changes.column(TIME), self._held))
        if changes.num_rows:
            self._tables.publish(self._output, changes)

    def held_through(self) -> int | None:
        return self._held

    def on_checkpoint(self, transaction: int) -> None:
        snapshot = self._tables.snapshot(self._output)
        if snapshot.transaction == self._saved:  # unchanged since the last save
            return
        rows = snapshot.rows.replace_schema_metadata(
            {_TRANSACTION: str(snapshot.transaction).encode()})
        self._path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self._path.with_suffix(".parquet.tmp")
        pq.write_table(rows, temporary)
        os.replace(temporary, self._path)
        self._saved = snapshot.transaction

    def close(self) -> None:
        """Nothing to release: the table stays served until the service stops."""
