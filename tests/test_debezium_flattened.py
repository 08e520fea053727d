"""`format: debezium_flattened`, without a broker: change events after Debezium's
ExtractNewRecordState SMT (transformations/event-flattening.adoc), the row itself with the
fields the SMT adds: `__deleted` ("true"/"false", `delete.handling.mode=rewrite` or 2.x's
`delete.tombstone.handling.mode=rewrite`), `__op` and `__source_ts_ms` (`add.fields=op,
source.ts_ms`), and the tombstones it keeps (`drop.tombstones=false`, `tombstone`,
`rewrite-with-tombstone`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.debezium_records import (
    CUSTOMERS,
    HEARTBEAT,
    HEARTBEAT_KEY,
    NOTES,
    Source,
    customer,
    flat,
    key,
    old_key_only,
)

from txstream.schemas.sources import UNAVAILABLE_VALUE, SourceSpec
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import RawRecords


def spec(**settings: Any) -> SourceSpec:
    return SourceSpec(**{"name": "customers", "topic": "dbserver1.inventory.customers",
                         "schema": CUSTOMERS, "format": "debezium_flattened",
                         "semantics": "upsert", **settings})


@pytest.mark.parametrize("schemas", [True, False])
def test_rewrite_mode_upserts_and_deletes(schemas: bool) -> None:
    """`__deleted: "true"` deletes the key (its row holding only the key), whatever `__op`
    says or whether it is there; a tombstone after it changes nothing
    (`rewrite-with-tombstone`)."""
    src = Source(spec())
    src.read([(key(1), flat(customer(1, "1@x"), False, "r", schemas)),
              (key(2), flat(customer(2, "2@x"), False, None, schemas)),
              (key(3), flat(customer(3, "3@x"), False, "c", schemas))], 1)
    assert [r[0] for r in src.close(1)] == [1, 2, 3]
    done = src.read([(key(1), flat(customer(1, "1@y"), False, "u", schemas)),
                     (key(2), flat(old_key_only(2), True, "d", schemas)), (key(2), None),
                     (key(3), flat(old_key_only(3), True, None, schemas))], 2)
    assert done.skipped == [5]
    assert src.close(2) == [(1, "1@x", NOTES, -1), (1, "1@y", NOTES, 1), (2, "2@x", NOTES, -1),
                            (3, "3@x", NOTES, -1)]


def test_op_d_alone_deletes_and_a_tombstone_alone_deletes() -> None:
    """`add.fields=op` without rewrite never shows a delete's row, but `__op: d` is one; with
    `delete.handling.mode=none` (2.x: `tombstone`) a delete arrives as a tombstone."""
    src = Source(spec())
    src.read([(key(i), flat(customer(i, f"{i}@x"), op="c")) for i in (1, 2)], 1)
    src.close(1)
    src.read([(key(1), flat(old_key_only(1), op="d")), (key(2), None)], 2)
    assert src.close(2) == [(1, "1@x", NOTES, -1), (2, "2@x", NOTES, -1)]


def test_unchanged_toast_values_keep_the_rows_value() -> None:
    src = Source(spec())
    src.read([(key(1), flat(customer(1, "1@x")))], 1)
    src.close(1)
    src.read([(key(1), flat(customer(1, "1@y", notes=UNAVAILABLE_VALUE)))], 2)
    assert src.close(2) == [(1, "1@x", NOTES, -1), (1, "1@y", NOTES, 1)]


def test_bad_records_are_dead_lettered_whole_and_heartbeats_ignored() -> None:
    """A row without its key, a value that is not JSON, an envelope the SMT did not flatten:
    dead letters holding the record as it was, with the reason. A heartbeat, which the SMT
    passes on unchanged, is ignored."""
    source = spec()
    envelope = json.dumps({"payload": {"op": "c", "before": None,
                                       "after": customer(4, "4@x")}}).encode()
    values = [flat({"first_name": "no key"}), b"{not json", envelope, HEARTBEAT,
              flat(customer(5, "5@x"))]
    keys = [key(1), key(2), key(4), HEARTBEAT_KEY, key(5)]
    headers = [[("h", b"\x00\x01")], None, None, None, None]
    batch = SourceDecoder(source).decode(RawRecords.of(source.topic, values, keys, headers),
                                         list(range(5)))
    assert batch.rows.column("id").to_pylist() == [5]
    bad = sorted(batch.bad, key=lambda b: b.offset)
    assert [(b.offset, b.key, b.value) for b in bad] == [(i, keys[i], values[i]) for i in (0, 1, 2)]
    assert bad[0].headers == [("h", b"\x00\x01")]
    assert "'id'" in bad[0].error and "malformed JSON" in bad[1].error and "'id'" in bad[2].error
    assert batch.skipped == [3] and batch.ignored_events == 1


@pytest.mark.parametrize("settings, problem", [
    ({"semantics": "insert_delete"}, "use semantics 'upsert'"),
    ({"delete_field": "gone"}, "delete_field applies to JSON upsert sources only"),
])
def test_settings_that_do_not_fit_the_flattened_form(settings: dict[str, Any],
                                                     problem: str) -> None:
    with pytest.raises(ValueError, match=problem):  # pydantic wraps the SourceSpecError
        spec(**settings)


def test_the_debezium_settings_apply() -> None:
    """The SMT keeps the values as the connector encoded them: decimals, the TOAST
    placeholder; transaction ids read by their shape, or by the configured connector."""
    assert spec(decimal_handling_mode="string").precise_decimals is False
    assert spec().precise_decimals is True
    assert spec(unavailable_value_placeholder="__u").placeholder == "__u"
    assert spec(connector="postgresql").connector == "postgresql"
