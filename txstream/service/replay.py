"""`txstream replay`: run a recorded change log through a pipeline, without Kafka.

Input lines: `{"source": "orders", "time": 3, "diff": 1, "row": {...}}`, times non-decreasing
(an update is a -1 and a +1 at one time); a decimal column's value is a numeric string or a
number (as a string when it has more than 15 significant digits). A pipeline that calls now()
needs each transaction's wall time: `"wall_time": "2026-12-06T12:00:00Z"` on a line of it (the
latest given counts), or a line `{"time": 4, "wall_time": ...}` of its own, which is a tick when
no change has that time. Output lines: `{"table": ...,
"time": ..., "diff": ..., "row": {...}}` for every output table, consolidated, in time order;
decimals as strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
from pydantic import ValidationError
from pyspark.sql import SparkSession

from txstream.changes import DIFF, TIME, Changes, consolidate
from txstream.engine import Engine, Pipeline
from txstream.schemas.changes import SourceChange, WallTime
from txstream.schemas.tables import TableSchema
from txstream.sinks.change_json import dumps, json_columns


class ReplayInputError(ValueError):
    """A line of the change log is malformed; the message gives its number and the reason."""


@dataclass
class ReplayBatch:
    """Consecutive transactions of the log: each source's changes, and the wall times given."""

    changes: dict[str, Changes]
    wall_times: dict[int, datetime]
    first_lines: dict[int, int]  # transaction -> its first line, to name in errors


@dataclass
class _Batch:
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lines: dict[str, list[int]] = field(default_factory=dict)
    walls: dict[int, datetime] = field(default_factory=dict)
    first_lines: dict[int, int] = field(default_factory=dict)
    times: int = 0


def _exact(value: Any) -> Any:
    """A decimal column's JSON value as a Decimal: a string as written, a number by its shortest
    round-trip text (the JSON text for up to 15 significant digits; write longer ones as
    strings). Anything else is left for Arrow to refuse."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, str):
        try:
            return Decimal(value)
        except InvalidOperation:
            return value
    return value


def _to_arrow(source: str, schema: TableSchema, rows: list[dict[str, Any]], lines: list[int]
              ) -> pa.Table:
    arrow_schema = schema.arrow_schema(with_changes=True)
    decimals = [c.name for c in schema.columns if c.type.is_decimal]
    if decimals:
        rows = [{**row, **{c: _exact(row.get(c)) for c in decimals}} for row in rows]
    try:
        return pa.Table.from_pylist(rows, schema=arrow_schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    # Only on failure: convert row by row to name the offending line.
    for row, line in zip(rows, lines, strict=True):
        try:
            pa.Table.from_pylist([row], schema=arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise ReplayInputError(f"line {line}: row does not fit source {source!r}: {exc}"
                                   ) from exc
    raise AssertionError("unreachable: the batch failed but no row did")


def _parsed(text: str, number: int) -> SourceChange | WallTime:
    """A line as a change, or as a wall time alone (no `source`)."""
    try:
        given = json.loads(text)
        model = WallTime if isinstance(given, dict) and "source" not in given \
            and "wall_time" in given else SourceChange
        return model.model_validate(given)
    except json.JSONDecodeError as exc:
        raise ReplayInputError(f"line {number}: Invalid JSON: {exc}") from None
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}" for e in exc.errors()
        )
        raise ReplayInputError(f"line {number}: {reasons}") from None


def read_batches(lines: IO[str], pipeline: Pipeline, batch_transactions: int
                 ) -> Iterator[ReplayBatch]:
    """Parse and validate the change log, yielding batches of `batch_transactions` times, each
    source's changes consolidated."""
    schemas = {name: node.schema for name, node in pipeline.sources.items()}
    batch = _Batch()
    last_time = 0

    def flush() -> ReplayBatch:
        return ReplayBatch({src: consolidate(_to_arrow(src, schemas[src], rows,
                                                       batch.lines[src]), schemas[src].names)
                            for src, rows in batch.rows.items()}, batch.walls, batch.first_lines)

    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        change = _parsed(text, number)
        if change.time < last_time:
            raise ReplayInputError(
                f"line {number}: time {change.time} after time {last_time}; times must not "
                "decrease"
            )
        if change.time != last_time:
            if batch.times == batch_transactions:
                yield flush()
                batch = _Batch()
            batch.times += 1
            batch.first_lines[change.time] = number
            last_time = change.time
        if change.wall_time is not None:
            batch.walls[change.time] = change.wall_time
        if isinstance(change, WallTime):
            continue
        schema = schemas.get(change.source)
        if schema is None:
            raise ReplayInputError(
                f"line {number}: unknown source {change.source!r}; the pipeline has "
                f"{', '.join(sorted(schemas))}"
            )
        unknown = sorted(set(change.row) - set(schema.names))
        if unknown:
            raise ReplayInputError(
                f"line {number}: column(s) {', '.join(unknown)} not in source {change.source!r}"
            )
        missing = [c.name for c in schema.columns if not c.nullable and change.row.get(c.name)
                   is None]
        if missing:
            raise ReplayInputError(
                f"line {number}: source {change.source!r} needs a value for {', '.join(missing)}"
            )
        batch.rows.setdefault(change.source, []).append(
            {**change.row, TIME: change.time, DIFF: change.diff})
        batch.lines.setdefault(change.source, []).append(number)
    if batch.times:
        yield flush()


def change_lines(table: str, changes: Changes) -> Iterator[tuple[int, str]]:
    """(time, JSON line) for each change of `table`."""
    columns = json_columns(changes.table)
    for i in range(changes.num_rows):
        record = {"table": table, TIME: columns[TIME][i], DIFF: columns[DIFF][i],
                  "row": {n: columns[n][i] for n in changes.columns}}
        yield columns[TIME][i], dumps(record).decode()


def replay(pipeline: Pipeline, spark: SparkSession, input_path: Path, output_path: Path,
           batch_transactions: int = 100) -> int:
    """Run the log through the pipeline; returns the number of output changes written."""
    engine = Engine(pipeline, spark)
    written = 0
    with open(input_path) as src, open(output_path, "w") as out:
        for batch in read_batches(src, pipeline, batch_transactions):
            if not engine.uses_wall_clock and not batch.changes:
                continue  # wall times alone: nothing moves without now()
            if engine.uses_wall_clock:
                missing = sorted(set(batch.first_lines) - set(batch.wall_times))
                if missing:
                    raise ReplayInputError(
                        f"line {batch.first_lines[missing[0]]}: transaction {missing[0]} has no "
                        "wall_time; the pipeline calls now(), so give each transaction one (on "
                        "any of its lines, or a line {\"time\": ..., \"wall_time\": ...})")
            results = engine.process(batch.changes, batch.wall_times)
            lines = [item for name in sorted(results)
                     for item in change_lines(name, results[name])]
            # A stable sort by time interleaves the tables into one stream of transactions.
            lines.sort(key=lambda item: item[0])
            out.writelines(line + "\n" for _, line in lines)
            written += len(lines)
    return written
