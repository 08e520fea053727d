"""Records on a Debezium source that are no change of a row, told apart from bad records, so
that they are neither dead-lettered nor joined to a transaction:

* heartbeats (`__debezium-heartbeat.<topic.prefix>`: `{"ts_ms": ...}`, schema
  `io.debezium.connector.common.Heartbeat`) and schema changes (`<topic.prefix>`, the topic of
  MySQL's, SQL Server's, Oracle's and Db2's DDL: `ddl`, `tableChanges`, schema
  `...SchemaChangeValue`) reach a source only when its topic names theirs by mistake: ignored,
  with a warning the first time that says so;
* logical decoding messages (PostgreSQL's `pg_logical_emit_message`, `op: m`, on
  `<topic.prefix>.message`) are no rows of any table: skipped. A transactional one carries its
  transaction's id, but its `END` event counts it under `LOGICAL_DECODING_MESSAGE`, never under
  a table of the pipeline, so skipping it leaves the transaction's count whole.

Pure, one record at a time: only records the decoder could not read as rows are looked at
(heartbeats come every `heartbeat.interval.ms`, schema changes with DDL), so the bulk path pays
nothing.
"""

from __future__ import annotations

import json
from typing import Any, Literal

Kind = Literal["heartbeat", "schema change", "logical decoding message"]

_HEARTBEAT_SCHEMA = "io.debezium.connector.common.Heartbeat"
_SCHEMA_CHANGE_SCHEMA = ".SchemaChangeValue"  # io.debezium.connector.<connector>.SchemaChangeValue


def event_kind(value: bytes | None) -> Kind | None:
    """Which of Debezium's records that change no row `value` is (JsonConverter, with or
    without schemas); None for anything else."""
    if value is None:
        return None
    try:
        obj: Any = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    schema = obj.get("schema")
    name = schema.get("name") if isinstance(schema, dict) else None
    body = obj["payload"] if isinstance(obj.get("payload"), dict) else obj
    if body.get("op") == "m" and isinstance(body.get("message"), dict):
        return "logical decoding message"
    if name == _HEARTBEAT_SCHEMA or set(body) == {"ts_ms"}:
        return "heartbeat"
    if (isinstance(name, str) and name.endswith(_SCHEMA_CHANGE_SCHEMA)) or (
            "op" not in body and ("tableChanges" in body or isinstance(body.get("ddl"), str))):
        return "schema change"
    return None


def advice(kind: Kind, source: str, topic: str) -> str:
    """The log line of the first record of `kind` a source reads."""
    if kind == "logical decoding message":
        return (f"source {source}: skipping logical decoding messages (op 'm') on topic "
                f"{topic!r}; they change no row")
    where = ("Debezium's heartbeat topic (__debezium-heartbeat.<topic.prefix>)" if kind ==
             "heartbeat" else "Debezium's schema change topic (<topic.prefix>)")
    return (f"source {source}: ignoring {kind} records on topic {topic!r}, which looks like "
            f"{where}; point the source at a table's topic (<topic.prefix>.<schema>.<table>)")
