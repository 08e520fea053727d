"""Where the consumer is: the next offset of each partition (`advance`), which partitions it has
read to their end, whether it has caught up with all of them (`caught_up`) and how many records
it has yet to read (`waiting`). Pure: the consumer wrapper hands in the arrays of what it
consumed and the client's end reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

Partition = tuple[str, int]  # (topic, partition)


def advance(positions: dict[Partition, int], at_end: set[Partition], topics: np.ndarray,
            partitions: np.ndarray, offsets: np.ndarray, ends: Mapping[Partition, int]) -> None:
    """Update the consumer's `positions` after consuming records (their `topics`, `partitions`
    and `offsets`, in stream order) and the partitions it has read to the end (`at_end`).
    `ends`: the partitions whose end was reported among the records, each with how many
    records came before its last report. A partition is at its end when the report came after
    its last record; a record after it means the partition grew."""
    last: dict[Partition, int] = {}
    for topic in _distinct(topics):
        in_topic = np.flatnonzero(topics == topic)
        for partition in _distinct(partitions[in_topic]):
            of_partition = in_topic[partitions[in_topic] == partition]
            last[(str(topic), int(partition))] = int(of_partition[-1])
    for tp, index in last.items():
        positions[tp] = int(offsets[index]) + 1
        at_end.discard(tp)
    at_end.update(tp for tp, before in ends.items() if last.get(tp, -1) < before)


def caught_up(assigned: Iterable[Partition], at_end: set[Partition],
              positions: Mapping[Partition, int],
              high_watermark: Callable[[Partition], int]) -> bool:
    """Whether every `assigned` partition is read to its end: reported at its end by the client
    (`at_end`), or read (`positions`: next offset) up to the high watermark the client holds from
    its latest fetch of it (negative: none yet). The watermark answers with the records that
    reach it; the report comes one fetch later (up to `fetch.wait.max.ms`). A transactional
    producer's commit markers, and open or aborted transactions under read_committed, take
    offsets below the watermark that no record reaches: there only the report tells."""
    return all(tp in at_end or 0 <= high_watermark(tp) <= positions.get(tp, -1)
               for tp in assigned)


def waiting(assigned: Iterable[Partition], at_end: set[Partition],
            positions: Mapping[Partition, int],
            high_watermark: Callable[[Partition], int]) -> int:
    """Records the `assigned` partitions hold beyond what the consumer read: up to the high
    watermark the client holds from its latest fetch (a backlog still to read). Nothing for a
    partition reported at its end, or whose watermark or position is not known yet. Offsets
    no record reaches count too, until the client reports the partition's end: a
    transactional producer's commit markers (one per partition a transaction wrote), aborted
    records under read_committed, records past the last stable offset."""
    total = 0
    for tp in assigned:
        if tp in at_end or tp not in positions:
            continue
        total += max(0, high_watermark(tp) - positions[tp])
    return total


def _distinct(values: np.ndarray) -> list[Any]:
    """The distinct values, in order of appearance. A consumed batch holds runs of a few
    partitions: comparing neighbours is cheaper than sorting a million topic names."""
    if not len(values):
        return []
    starts = np.flatnonzero(values[1:] != values[:-1]) + 1
    return list(dict.fromkeys(values[np.concatenate([[0], starts])].tolist()))
