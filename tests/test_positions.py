"""Where the consumer is (`txstream.sources.positions`), pure: how many records it has yet to
read, from the client's cached high watermarks."""

from __future__ import annotations

from txstream.sources.positions import caught_up, waiting

A, B, C = ("t", 0), ("t", 1), ("u", 0)


def test_waiting_records_are_those_below_the_watermarks_the_client_holds() -> None:
    watermarks = {A: 1_000, B: 50, C: -1001}  # C: not fetched yet
    positions = {A: 400, B: 50, C: 7}
    assert waiting([A, B, C], set(), positions, watermarks.__getitem__) == 600
    assert not caught_up([A, B, C], set(), positions, watermarks.__getitem__)
    # A partition reported at its end holds nothing to read (commit markers keep its
    # watermark above the position), nor does one whose position is not known yet.
    assert waiting([A, B, C], {A}, positions, watermarks.__getitem__) == 0
    assert waiting([A, B], set(), {B: 10}, watermarks.__getitem__) == 40
