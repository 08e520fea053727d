"""`JavaGarbage`: a full cycle collection after a batch at most every interval, so that the JVM
objects Python's reference cycles pin (py4j's objects and their members) are freed on a
schedule; pure, with an injected clock."""

from __future__ import annotations

from txstream.engine.java_garbage import JavaGarbage


def test_a_collection_after_a_batch_at_most_every_interval() -> None:
    now = [100.0]
    collected: list[float] = []
    garbage = JavaGarbage(10.0, clock=lambda: now[0], collect=lambda: collected.append(now[0]))
    for at in (101.0, 109.9, 110.0, 115.0, 119.9, 120.0, 200.0):
        now[0] = at
        garbage.after_batch()
    assert collected == [110.0, 120.0, 200.0]
    assert garbage.collections == 3
