"""Update streams Pathway 0.33.0 printed for small inputs, kept exactly (rows `... | __time__ |
__diff__`), with the inputs that made them: the oracle for event-time windows and behaviors
(docs/design/event-time-research.md, sections 3a and 3b, says how each was made).

A Pathway time is one transaction: `parse` numbers the input's distinct times 1, 2, ... . Rows
Pathway flushes when its input ends (time 18446744073709551614) are left out: a service's input
never ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Pathway's tutorial "windows_temporal_behavior": (event_time, the Pathway time it arrived at).
TUTORIAL = [(360, 362), (362, 362), (366, 368), (370, 410), (370, 370), (370, 372), (372, 374),
            (376, 396), (382, 382), (382, 392)]
TUTORIAL_TIMES = sorted({arrived for _, arrived in TUTORIAL})
# `windowby(event_time, window=sliding(duration=10, hop=4[, origin=360]), behavior=...)
# .reduce(window_start, window_end, n_logs=count())`: window_start, window_end, n_logs.
TUTORIAL_STREAMS = {
    "no behavior": """
352 362 1 362 1 | 356 366 2 362 1 | 360 370 2 362 1 | 360 370 2 368 -1 | 360 370 3 368 1
364 374 1 368 1 | 364 374 1 370 -1 | 364 374 2 370 1 | 368 378 1 370 1 | 364 374 2 372 -1
368 378 1 372 -1 | 364 374 3 372 1 | 368 378 2 372 1 | 364 374 3 374 -1 | 368 378 2 374 -1
364 374 4 374 1 | 368 378 3 374 1 | 372 382 1 374 1 | 376 386 1 382 1 | 380 390 1 382 1
376 386 1 392 -1 | 380 390 1 392 -1 | 376 386 2 392 1 | 380 390 2 392 1 | 368 378 3 396 -1
372 382 1 396 -1 | 376 386 2 396 -1 | 368 378 4 396 1 | 372 382 2 396 1 | 376 386 3 396 1
364 374 4 410 -1 | 368 378 4 410 -1 | 364 374 5 410 1 | 368 378 5 410 1
""",
    "common_behavior(delay=4)": """
352 362 1 362 1 | 356 366 2 362 1 | 360 370 3 368 1 | 364 374 2 370 1
364 374 2 372 -1 | 364 374 3 372 1 | 364 374 3 374 -1 | 364 374 4 374 1 | 368 378 3 374 1
372 382 1 382 1 | 376 386 1 382 1 | 376 386 1 392 -1 | 376 386 2 392 1
368 378 3 396 -1 | 372 382 1 396 -1 | 376 386 2 396 -1 | 368 378 4 396 1 | 372 382 2 396 1
376 386 3 396 1 | 364 374 4 410 -1 | 368 378 4 410 -1 | 364 374 5 410 1 | 368 378 5 410 1
""",
    "common_behavior(cutoff=4)": """
352 362 1 362 1 | 356 366 2 362 1 | 360 370 2 362 1
360 370 2 368 -1 | 360 370 3 368 1 | 364 374 1 368 1
364 374 1 370 -1 | 364 374 2 370 1 | 368 378 1 370 1
364 374 2 372 -1 | 368 378 1 372 -1 | 364 374 3 372 1 | 368 378 2 372 1
364 374 3 374 -1 | 368 378 2 374 -1 | 364 374 4 374 1 | 368 378 3 374 1 | 372 382 1 374 1
376 386 1 382 1 | 380 390 1 382 1
376 386 1 392 -1 | 380 390 1 392 -1 | 376 386 2 392 1 | 380 390 2 392 1
372 382 1 396 -1 | 376 386 2 396 -1 | 372 382 2 396 1 | 376 386 3 396 1
""",
    # origin=360
    "common_behavior(cutoff=4, keep_results=False)": """
360 370 2 362 1
360 370 2 368 -1 | 360 370 3 368 1 | 364 374 1 368 1
364 374 1 370 -1 | 364 374 2 370 1 | 368 378 1 370 1
364 374 2 372 -1 | 368 378 1 372 -1 | 364 374 3 372 1 | 368 378 2 372 1
364 374 3 374 -1 | 368 378 2 374 -1 | 364 374 4 374 1 | 368 378 3 374 1 | 372 382 1 374 1
376 386 1 382 1 | 380 390 1 382 1
360 370 3 392 -1 | 364 374 4 392 -1 | 368 378 3 392 -1
376 386 1 392 -1 | 380 390 1 392 -1 | 376 386 2 392 1 | 380 390 2 392 1
372 382 1 396 -1 | 376 386 2 396 -1 | 372 382 2 396 1 | 376 386 3 396 1
""",
    # origin=360; three more windows at the end of input
    "exactly_once_behavior(shift=2)": """
360 370 3 374 1 | 364 374 4 382 1 | 368 378 3 382 1
""",
}

# (id, t, v) rows with the Pathway time and diff of each change (id 1 deleted at time 8);
# `windowby(t, window=tumbling(duration=10), behavior=...).reduce(window_start, window_end,
# n=count(), s=sum(v))`.
TUMBLING_ROWS = [((1, 5, 1), 2, 1), ((2, 10, 2), 4, 1), ((3, 7, 4), 4, 1), ((4, 8, 8), 6, 1),
                 ((1, 5, 1), 8, -1), ((5, 12, 16), 10, 1), ((6, 25, 32), 12, 1)]
TUMBLING_TIMES = sorted({time for _, time, _ in TUMBLING_ROWS})
TUMBLING_STREAMS = {
    "no behavior": """
0 10 1 1 2 1 | 0 10 1 1 4 -1 | 0 10 2 5 4 1 | 10 20 1 2 4 1 | 0 10 2 5 6 -1 | 0 10 3 13 6 1
0 10 3 13 8 -1 | 0 10 2 12 8 1 | 10 20 1 2 10 -1 | 10 20 2 18 10 1 | 20 30 1 32 12 1
""",
    "common_behavior(cutoff=0)": """
0 10 1 1 2 1 | 0 10 1 1 4 -1 | 0 10 2 5 4 1 | 10 20 1 2 4 1
10 20 1 2 10 -1 | 10 20 2 18 10 1 | 20 30 1 32 12 1
""",
    "common_behavior(cutoff=0, keep_results=False)": """
0 10 1 1 2 1 | 0 10 1 1 4 -1 | 0 10 2 5 4 1 | 10 20 1 2 4 1
10 20 1 2 10 -1 | 10 20 2 18 10 1 | 20 30 1 32 12 1 | 0 10 2 5 10 -1
""",
    # one more window at the end of input
    "exactly_once_behavior()": """
0 10 2 5 4 1 | 10 20 2 18 12 1
""",
}


def in_stream_order(rows: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Changes `(*row, transaction, diff)` sorted by transaction, then row, then diff: the one
    order in which update streams are compared (a null before any value)."""
    return sorted(rows, key=lambda row: (row[-2], [(v is not None, v) for v in row[:-2]],
                                         row[-1]))


def parse(text: str, times: list[int]) -> list[tuple[int, ...]]:
    """Pathway's printed rows with the time as a transaction (1 for `times[0]`, ...), in stream
    order."""
    rows = [tuple(int(x) for x in part.split()) for part in text.replace("\n", "|").split("|")
            if part.strip()]
    got = [(*row[:-2], times.index(row[-2]) + 1, row[-1]) for row in rows]
    return in_stream_order(got)
