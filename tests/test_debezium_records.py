"""Debezium tombstones and unchanged TOAST values of an upsert source, without a broker: records
written as Debezium's PostgreSQL connector writes them (JsonConverter with schemas) through the
decoder, `debezium.rows.resolve` against the pending changes, and the upsert rows."""

from __future__ import annotations

import pytest
from support.debezium_records import NOTES, PHOTO, TOAST_BYTES, Source, customer, event, key, spec

from txstream.schemas.sources import UNAVAILABLE_VALUE
from txstream.sources.debezium.rows import resolve_updates
from txstream.sources.decoder import SourceDecoder
from txstream.sources.kafka_source import SIGN, RawRecords


def test_a_tombstone_after_its_delete_is_skipped_wherever_the_delete_is() -> None:
    """The delete read in the same poll, in an open transaction, or applied already: the
    tombstone changes nothing and joins no transaction."""
    src = Source(spec())
    src.read([(key(i), event("c", None, customer(i, f"{i}@x"))) for i in (1, 2, 3)], 1)
    src.close(1)
    done = src.read([(key(1), event("d", customer(1, "1@x"), None)), (key(1), None)], 2)
    assert done.skipped == [4] and done.rows.num_rows == 1
    src.read([(key(2), event("d", customer(2, "2@x"), None))], 3)
    assert src.read([(key(2), None)], 3).skipped == [6]  # its delete still pending
    assert src.close(2) == [(1, "1@x", NOTES, -1)] and src.close(3) == [(2, "2@x", NOTES, -1)]
    assert src.read([(key(2), None)], 4).skipped == [7]  # its delete applied


def test_a_tombstone_alone_deletes_the_row_it_finds() -> None:
    """Compaction removed the delete event: the tombstone is the deletion (upsert semantics)."""
    src = Source(spec())
    src.read([(key(1), event("c", None, customer(1, "1@x")))], 1)
    src.close(1)
    done = src.read([(key(1), None)], 2)
    assert done.skipped == [] and done.rows.num_rows == 1
    assert src.close(2) == [(1, "1@x", NOTES, -1)]


def test_unchanged_toast_values_keep_the_rows_value() -> None:
    """REPLICA IDENTITY DEFAULT: updates that leave the TOASTed columns alone send the
    placeholder (the text's, and the base64 of its bytes for the bytea), in the same poll as
    the insert, over two updates in a row, and against the applied row."""
    src = Source(spec())
    same = {"notes": UNAVAILABLE_VALUE, "photo": TOAST_BYTES}
    src.read([(key(1), event("c", None, customer(1, "a@x"))),
              (key(1), event("u", None, customer(1, "b@x", **same))),
              (key(1), event("u", None, customer(1, "c@x", **same)))], 1)
    assert src.close(1) == [(1, "c@x", NOTES, 1)]
    done = src.read([(key(1), event("u", None, customer(1, "d@x", **same)))], 2)
    assert done.rows.column("photo").to_pylist() == [PHOTO]
    assert src.close(2) == [(1, "c@x", NOTES, -1), (1, "d@x", NOTES, 1)]


def test_an_unchanged_toast_value_without_a_row_is_rejected() -> None:
    src = Source(spec())
    done = src.read([(key(7), event("u", None, customer(7, "a@x", notes=UNAVAILABLE_VALUE)))], 1)
    assert done.rows.num_rows == 0 and list(done.rejected) == [0]
    assert "['notes']" in done.rejected[0] and "{'id': 7}" in done.rejected[0]


@pytest.mark.parametrize("placeholder", ["__unavailable__", None])
def test_the_placeholder_is_the_connectors(placeholder: str | None) -> None:
    """`unavailable_value_placeholder` as the connector's `unavailable.value.placeholder`:
    only that value (or Debezium's default) stands for an unchanged value."""
    src = Source(spec(placeholder))
    src.read([(key(1), event("c", None, customer(1, "a@x")))], 1)
    src.close(1)
    other = "__unavailable__" if placeholder is None else UNAVAILABLE_VALUE
    src.read([(key(1), event("u", None, customer(1, "b@x", notes=other)))], 2)
    assert src.close(2)[1] == (1, "b@x", other, 1)
    src.read([(key(1), event("u", None, customer(1, "c@x", notes=src.spec.placeholder or "")))],
             3)
    assert src.close(3)[1] == (1, "c@x", other, 1)


def test_an_insert_delete_update_takes_unchanged_values_from_its_before_image() -> None:
    """REPLICA IDENTITY FULL: the old row is complete, the new one has the placeholder; without
    the old value (REPLICA IDENTITY DEFAULT) the change is rejected."""
    source = spec().model_copy(update={"semantics": "insert_delete"})
    old, new = customer(1, "a@x"), customer(1, "b@x", notes=UNAVAILABLE_VALUE)
    batch = SourceDecoder(source).decode(RawRecords.of(source.topic, [
        event("u", old, new), event("u", {**old, "notes": UNAVAILABLE_VALUE}, new)]), [0, 1])
    done = resolve_updates(source, batch.rows)
    assert sorted((r["email"], r["notes"], r[SIGN]) for r in done.rows.to_pylist()) == [
        ("a@x", NOTES, -1), ("b@x", NOTES, 1)]
    assert list(done.rejected) == [1] and "no complete 'before' image" in done.rejected[1]
