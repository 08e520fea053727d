"""Changes of an output table appended to a local file.

Formats: `jsonl` (one JSON change object per line, see `txstream.sinks.change_json`), `csv` (the
columns, `time` and `diff`, a header line when the file starts; strings quoted, nulls empty), and
`updates` (one Deephaven-style `UpdateRecord` JSON object per line and transaction).

A write is appended with a single `write` call and made durable (fsync) before returning. A
crash in the middle can leave a torn last line. JSON lines never contain a raw newline, so on
opening a JSON file the sink cuts a torn tail off; a CSV field may hold newlines, so a torn CSV
tail cannot be told apart and is left for the reader. A file is not a transactional destination.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from txstream.changes import TIME, Changes
from txstream.schemas.tables import TableSchema
from txstream.sinks.change_json import encode_rows
from txstream.sinks.conform import conform_changes
from txstream.sinks.sink import SinkBase
from txstream.sinks.update_records import update_records

FileFormat = Literal["jsonl", "csv", "updates"]


class FileSink(SinkBase):
    def __init__(self, path: str | os.PathLike[str], table: str, schema: TableSchema, *,
                 format: FileFormat = "jsonl") -> None:
        self.path = Path(path)
        self.table = table
        self.schema = schema
        self.format = format
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 -- held open until close()
        if format != "csv":
            self._drop_torn_tail()
        self._held = self._last_time()

    def held_through(self) -> int | None:
        return self._held

    def _last_time(self) -> int | None:
        """The greatest `time` in the file: a JSON file's last line holds it (transactions are
        appended in order); a CSV line cannot be found from the end (fields may hold newlines),
        so its `time` column is read whole."""
        size = self._file.seek(0, os.SEEK_END)
        if size == 0:
            return None
        if self.format == "csv":
            times = pacsv.read_csv(self.path, convert_options=pacsv.ConvertOptions(
                include_columns=[TIME], column_types={TIME: pa.int64()}))[TIME]
            return None if times.null_count == len(times) else int(pc.max(times).as_py())
        with open(self.path, "rb") as reader:
            end = size - 1  # the last line's newline (a torn tail was cut)
            start = end
            while start > 0:
                start = max(0, start - 65536)
                reader.seek(start)
                cut = reader.read(end - start).rfind(b"\n")
                if cut >= 0:
                    start += cut + 1
                    break
            reader.seek(start)
            return int(json.loads(reader.read(end - start))[TIME])

    def _drop_torn_tail(self) -> None:
        size = self._file.seek(0, os.SEEK_END)
        if size == 0:
            return
        with open(self.path, "rb") as reader:
            reader.seek(max(0, size - 1))
            if reader.read(1) == b"\n":
                return
            # Scan back to the last complete line; blocks keep this cheap for big files.
            end = size
            while end > 0:
                start = max(0, end - 65536)
                reader.seek(start)
                block = reader.read(end - start)
                cut = block.rfind(b"\n")
                if cut >= 0:
                    self._file.truncate(start + cut + 1)
                    return
                end = start
        self._file.truncate(0)

    def encode(self, changes: Changes) -> bytes:
        """The bytes `write` appends for `changes`."""
        if not changes.num_rows:
            return b""
        if self.format == "updates":
            lines = [r.model_dump_json().encode()
                     for r in update_records(changes, self.table, self.schema)]
            return b"".join(line + b"\n" for line in lines)
        batch = conform_changes(changes, self.schema).table
        if self.format == "csv":
            buf = io.BytesIO()
            header = self._file.tell() == 0
            pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=header))
            return buf.getvalue()
        return b"".join(line + b"\n" for line in encode_rows(batch))

    def write(self, changes: Changes) -> None:
        data = self.encode(changes)
        if data:
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
