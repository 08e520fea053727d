"""Debezium's `precise` decimal encoding, decoded a column at a time: against Python's own
big-endian two's-complement encoding of random decimals, and malformed values one by one."""

from __future__ import annotations

import base64
from decimal import Context, Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.sources.debezium.decimals import unscaled_decimals

_EXACT = Context(prec=80)  # the default context rounds to 28 digits


def _encode(value: Decimal, scale: int) -> str:
    """As Kafka Connect writes a Decimal: BigInteger.toByteArray() of the unscaled value."""
    unscaled = int(value.scaleb(scale, context=_EXACT))
    size = unscaled.bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


@st.composite
def _column(draw: st.DrawFn) -> tuple[int, int, list[Decimal | None]]:
    precision = draw(st.integers(1, 38))
    scale = draw(st.integers(0, precision))
    bound = 10**precision - 1
    values = draw(st.lists(st.one_of(st.none(), st.integers(-bound, bound).map(
        lambda u: Decimal(f"{u}e-{scale}"))), max_size=40))
    return precision, scale, values


@settings(max_examples=300, deadline=None)
@given(_column())
def test_decodes_what_kafka_connect_encodes(column: tuple[int, int, list[Decimal | None]]
                                             ) -> None:
    precision, scale, values = column
    texts = [None if v is None else _encode(v, scale) for v in values]
    decoded, bad = unscaled_decimals(pa.array(texts, pa.string()),
                                     pa.decimal128(precision, scale))
    assert decoded.type == pa.decimal128(precision, scale)
    assert decoded.to_pylist() == values
    assert not bad.any()


def test_values_that_are_not_such_decimals_are_reported_row_by_row() -> None:
    texts = ["AKeY", "not base64!", "AK=Y", "AKe", "", "AOjUpRAA", "AAAAAAAAAAAAAAAAAAAAAAAAAAAA",
             None, "/w=="]
    decoded, bad = unscaled_decimals(pa.array(texts), pa.decimal128(12, 2))
    # 0xA798 = 42904; 10^12 / 100 needs 13 digits; 21 bytes exceed a decimal128.
    assert decoded.to_pylist() == [Decimal("429.04"), None, None, None, None, None, None, None,
                                   Decimal("-0.01")]
    assert bad.tolist() == [False, True, True, True, True, True, True, False, False]
