"""What the transaction builder counts, and what it saves to resume: the state through the last
committed transaction."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from txstream.sources.transaction_batch import Offsets


class IngestStats(BaseModel):
    events: int = 0  # records consumed
    bad_records: int = 0  # records dead-lettered as undecodable or invalid
    transactions: int = 0  # transactions closed
    absent_deletes: int = 0  # upsert deletes of keys without a current row
    unchanged_upserts: int = 0  # upserts equal to the current row
    ignored_tombstones: int = 0  # Debezium compaction tombstones
    ignored_events: int = 0  # Debezium heartbeats, schema changes, logical decoding messages
    incomplete_upstream: int = 0  # upstream transactions dead-lettered after the timeout
    replayed_skipped: int = 0  # records of transactions emitted before a restart
    late_upstream_records: int = 0  # records of an upstream transaction already emitted


class SourceState(BaseModel):
    """What the builder needs to resume exactly where the last transaction it closed ended."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    next_number: int
    offsets: Offsets
    upsert_rows: dict[str, pa.Table] = Field(default_factory=dict)
    # Upstream transactions already emitted whose records may lie beyond `offsets`.
    emitted_upstream_ids: list[str] = Field(default_factory=list)

    def save(self, directory: Path) -> None:
        """`state.json` plus one Parquet file per upsert source."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, rows in self.upsert_rows.items():
            pq.write_table(rows, directory / f"upsert-{name}.parquet")
        meta = self.model_dump(mode="json", exclude={"upsert_rows"})
        meta["upsert_sources"] = sorted(self.upsert_rows)
        (directory / "state.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, directory: Path) -> SourceState:
        meta = json.loads((directory / "state.json").read_text())
        names = meta.pop("upsert_sources")
        rows = {n: pq.read_table(directory / f"upsert-{n}.parquet") for n in names}
        return cls.model_validate({**meta, "upsert_rows": rows})
