"""Debezium's transaction metadata (the `<topic.prefix>.transaction` topic): a transaction's
`END` event says how many change events it wrote per table (`data_collections`), which the
builder turns into the expected count of the transaction (`TransactionBoundaries.announce`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from txstream.sources.debezium.ids import transaction_id


def end_event(value: bytes | None, connector: str | None = None
              ) -> tuple[str | None, dict[str, int]]:
    """A Debezium transaction metadata event (JSON, with or without the converter's `payload`
    wrapper): for an `END` event its transaction (the id's transaction part as `connector`
    writes it, `txstream.sources.debezium.ids`) and record count per data collection; for a
    `BEGIN` event, no id. Raises ValueError, naming what is wrong, on anything else."""
    try:
        event = json.loads(value) if value is not None else None
    except ValueError as exc:
        raise ValueError(f"transaction metadata event is not JSON: {exc}") from exc
    if isinstance(event, dict) and isinstance(event.get("payload"), dict):
        event = event["payload"]
    if not isinstance(event, dict) or event.get("status") not in ("BEGIN", "END"):
        raise ValueError("transaction metadata event without status BEGIN or END; is this "
                         "Debezium's <topic.prefix>.transaction topic?")
    if event["status"] == "BEGIN":
        return None, {}
    uid, collections = event.get("id"), event.get("data_collections")
    if uid is None or not isinstance(collections, list):
        raise ValueError("END event without 'id' or 'data_collections'")
    counts: dict[str, int] = {}
    for entry in collections:
        if not (isinstance(entry, dict) and isinstance(entry.get("data_collection"), str)
                and isinstance(entry.get("event_count"), int)):
            raise ValueError(f"END event of transaction {uid!r}: data_collections entry "
                             f"{entry!r} lacks 'data_collection' or an integer 'event_count'")
        counts[entry["data_collection"]] = counts.get(entry["data_collection"], 0) \
            + entry["event_count"]
    return transaction_id(str(uid), connector), counts


def expected_count(counts: Mapping[str, int], collections: Iterable[str]) -> int:
    """The records an `END` event's `counts` announce for the pipeline's `collections`."""
    return sum(counts.get(c, 0) for c in collections)
