"""A batch being planned: what its one Spark job must compute besides the outputs.

Operators describe their work here without running anything: the state versions they stage,
the frames several consumers share. The engine then materializes it all in one action and
installs the staged versions (`commit`) only when that action succeeded.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from service.engine.frames import cached_leaf
from service.engine.state import StagedRuns, ZSetState


class BatchPlan:
    def __init__(self, weight: int) -> None:
        # Rows of input in the batch: the weight of the runs it stages (see ZSetState.staged).
        self.weight = weight
        self._staged: list[StagedRuns] = []

    def append(self, state: ZSetState, delta: DataFrame) -> None:
        """Stage `delta` (the state's key and weight columns, any others ignored) into
        `state`'s next version."""
        self._staged.append(state.staged(delta, self.weight))

    @staticmethod
    def shared(frame: DataFrame) -> DataFrame:
        """A frame several plans read: computed once, by the batch's job, and seen by those
        plans as a leaf (see `cached_leaf`). It reports the single partition of its plan, so
        joins with it need no exchange."""
        return cached_leaf(frame)

    @property
    def frames(self) -> list[DataFrame]:
        """The frames the batch's job must compute although no output shows them."""
        return [s.new for s in self._staged]

    def commit(self) -> None:
        for staged in self._staged:
            staged.state.install(staged.runs)
