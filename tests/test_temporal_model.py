"""The clock rule's from-scratch recompute (`tests/support/temporal_model.py`), the oracle the
engine's temporal behaviors are to be checked against, checked itself against Pathway 0.33:

* the update streams Pathway printed for its tutorial's sliding windows and for a tumbling
  window with a deletion, under each behavior (`tests/support/pathway_streams.py`), exactly;
  with `keep_results=False` the model retracts a window in the transaction whose rows close it,
  where Pathway waits for its next row that is not late (DESIGN section 10: be exact there);
* the stored tumbling streams are what Pathway itself gives today (its virtualenv, run here);
* random transactions (inserts, updates, deletes, event times mostly rising, some late) through
  Pathway itself under every behavior but `keep_results=False`: the model's streams.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from support.pathway_peer import pathway_spec, windows_streams
from support.pathway_streams import (
    TUMBLING_ROWS,
    TUMBLING_STREAMS,
    TUMBLING_TIMES,
    TUTORIAL,
    TUTORIAL_STREAMS,
    TUTORIAL_TIMES,
    in_stream_order,
    parse,
)
from support.temporal_model import (
    Behavior,
    Change,
    Windows,
    exactly_once,
    rising_changes,
    update_stream,
)

SLIDING = Windows(hop=4, duration=10)
FROM_360 = Windows(hop=4, duration=10, origin=360)
TUTORIAL_CASES = {
    "no behavior": (SLIDING, None),
    "common_behavior(delay=4)": (SLIDING, Behavior(delay=4)),
    "common_behavior(cutoff=4)": (SLIDING, Behavior(cutoff=4)),
    "exactly_once_behavior(shift=2)": (FROM_360, exactly_once(FROM_360, shift=2)),
}


def _tutorial_changes() -> list[Change]:
    return [((i, 0, event, 1), TUTORIAL_TIMES.index(arrived) + 1, 1)
            for i, (event, arrived) in enumerate(TUTORIAL)]


def _counts(stream: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """(start, end, n, transaction, diff): the tutorial reduces to a count only."""
    return [(*row[:3], *row[4:]) for row in stream]


@pytest.mark.parametrize("name", TUTORIAL_CASES)
def test_the_model_gives_pathways_tutorial_streams(name: str) -> None:
    windows, behavior = TUTORIAL_CASES[name]
    got = update_stream(_tutorial_changes(), windows, behavior, False, len(TUTORIAL_TIMES))
    assert _counts(got) == parse(TUTORIAL_STREAMS[name], TUTORIAL_TIMES)


def test_without_keeping_results_a_window_is_retracted_when_its_rows_close_it() -> None:
    got = update_stream(_tutorial_changes(), FROM_360, Behavior(cutoff=4, keep_results=False),
                        False, len(TUTORIAL_TIMES))
    pathway = parse(TUTORIAL_STREAMS["common_behavior(cutoff=4, keep_results=False)"],
                    TUTORIAL_TIMES)
    # The clock reaches 382 in transaction 6 (Pathway time 382), closing the windows that end
    # by 378; Pathway retracts them in transaction 7, with its next row that is not late.
    lazy = {(360, 370, 3, 7, -1), (364, 374, 4, 7, -1), (368, 378, 3, 7, -1)}
    assert lazy <= set(pathway)
    on_time = in_stream_order([row for row in pathway if row not in lazy]
                              + [(*row[:3], 6, -1) for row in lazy])
    assert _counts(got) == on_time


TUMBLING = Windows(hop=10, duration=10)
TUMBLING_CASES = {
    "no behavior": None,
    "common_behavior(cutoff=0)": Behavior(cutoff=0),
    "exactly_once_behavior()": exactly_once(TUMBLING),
}


def _tumbling_changes() -> list[Change]:
    return [((i, 0, ts, v), TUMBLING_TIMES.index(time) + 1, diff)
            for (i, ts, v), time, diff in TUMBLING_ROWS]


@pytest.mark.parametrize("name", TUMBLING_CASES)
def test_the_model_gives_pathways_tumbling_streams(name: str) -> None:
    got = update_stream(_tumbling_changes(), TUMBLING, TUMBLING_CASES[name], False,
                        len(TUMBLING_TIMES))
    assert got == parse(TUMBLING_STREAMS[name], TUMBLING_TIMES)


def test_closing_on_time_retracts_a_window_pathway_never_retracts() -> None:
    """A deletion and a row of a closed window are ignored (late), and the window [10, 20) is
    retracted in transaction 6, whose row at 25 closes it; Pathway, without a later row that is
    not late, never retracts it."""
    got = update_stream(_tumbling_changes(), TUMBLING, Behavior(cutoff=0, keep_results=False),
                        False, len(TUMBLING_TIMES))
    assert got == [(0, 10, 1, 1, 1, 1), (0, 10, 1, 1, 2, -1), (10, 20, 1, 2, 2, 1),
                   (10, 20, 1, 2, 5, -1), (10, 20, 2, 18, 5, 1), (10, 20, 2, 18, 6, -1),
                   (20, 30, 1, 32, 6, 1)]
    pathway = parse(TUMBLING_STREAMS["common_behavior(cutoff=0, keep_results=False)"],
                    TUMBLING_TIMES)
    assert (10, 20, 2, 18, 6, -1) not in pathway and (0, 10, 2, 5, 5, -1) in pathway


def test_the_stored_tumbling_streams_are_pathways(tmp_path: Path) -> None:
    rows = [(*row, number, diff) for row, number, diff in _tumbling_changes()]
    cases = {**TUMBLING_CASES, "common_behavior(cutoff=0, keep_results=False)":
             Behavior(cutoff=0, keep_results=False)}
    specs = {name: pathway_spec(TUMBLING, behavior, False)
             for name, behavior in cases.items()}
    specs["exactly_once_behavior()"]["behavior"] = {"kind": "exactly_once", "shift": 0}
    got = windows_streams(rows, specs, tmp_path)
    for name in cases:
        assert got[name] == parse(TUMBLING_STREAMS[name], TUMBLING_TIMES), name


PEER_CASES: dict[str, tuple[Windows, Behavior | None, bool]] = {
    "tumbling delay": (Windows(6, 6), Behavior(delay=3), True),
    "tumbling cutoff": (Windows(6, 6), Behavior(cutoff=2), False),
    "sliding delay and cutoff": (Windows(3, 7), Behavior(delay=4, cutoff=3), True),
    "sliding exactly once": (Windows(4, 8), exactly_once(Windows(4, 8), shift=1), False),
    "tumbling exactly once from 5": (Windows(5, 5, origin=5),
                                     exactly_once(Windows(5, 5, origin=5)), True),
}


@pytest.mark.parametrize("seed", [1, 2])
def test_the_model_gives_pathways_streams_on_random_transactions(tmp_path: Path, seed: int
                                                                  ) -> None:
    transactions = 40
    changes = rising_changes(random.Random(seed), transactions)
    rows = [(*row, number, diff) for row, number, diff in changes]
    got = windows_streams(rows, {name: pathway_spec(*case)
                                 for name, case in PEER_CASES.items()}, tmp_path)
    for name, (windows, behavior, instance) in PEER_CASES.items():
        want = update_stream(changes, windows, behavior, instance, transactions)
        once = behavior is not None and behavior.delay == windows.duration + (behavior.cutoff
                                                                               or 0)
        # Exactly once never revises a window; every other case here does, late rows aside.
        assert len(want) > 5 and once != any(row[-1] < 0 for row in want), name
        assert got[name] == want, f"{name}, seed {seed}"
