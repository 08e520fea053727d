"""Which transactions of a batch the engine computes as one, their net change (`Changes.net`),
and how a replay computes the same ones together again.

    fresh batch ........ all its transactions as one part, netted when `nets` (every sink a
                         snapshot committed per batch: `PipelineConfig.nets_batches`) and it
                         holds more than one; logged with `netted_through` = its last
    replayed batch ..... cut at the groups the log names: each group one netted part, the
                         transactions logged without a group one part, not netted; a group
                         whose last transaction is yet to come is held and joined to the next
                         batch

A batch's parts still go to the engine in one call (`engine_changes`: a netted part's changes
all at its last transaction) and are committed together.

Why a replay must find the same groups: the snapshots hold every replayed transaction up to
their progress row, which is at the end of a group (a netted batch is committed whole, in one
PostgreSQL transaction with the progress row). Netted across that row, a batch would lose what
cancels within it while a snapshot holds the state in between (a row changed and changed back).
Not netted at all, it would evaluate rows the first run never did (a row a later transaction of
its group removed): an expression failing on one would stop the replay where the first run
went on. Netted in the same groups, a replay computes what the first run computed, as long as
every sink still nets (without netting, nothing is cut: any batching of a replay is exact).

A group the progress row falls inside is not netted: its netted batch failed an expression and
was then computed one transaction at a time, those before the failing one committed on their
own, or a later run without netting (`postgres_commit: transaction`, say) replayed it with a
commit per transaction. So is a group whose last transaction is not in the log (a damaged log):
waiting for it would hold its start forever.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from txstream.changes import Changes
from txstream.sources.transaction_batch import TransactionBatch, TransactionLogEntry


class Part(NamedTuple):
    """Consecutive transactions of a batch, computed as one when `netted`."""

    batch: TransactionBatch
    netted: bool


@dataclass
class NetGroups:
    """The groups of one run: `nets` for fresh batches, the replay's logged groups."""

    nets: bool
    replayed_through: int  # the last logged transaction at the start: replays are up to it
    group_last: dict[int, int] = field(default_factory=dict)  # replayed number -> its group's
    held: TransactionBatch | None = None  # the start of a replayed group, the rest to come

    @classmethod
    def of(cls, nets: bool, replay: Sequence[TransactionLogEntry], replayed_through: int,
           committed: int | None) -> NetGroups:
        """The groups of the `replay` log entries, but those not netted again (see the module
        doc). The replay may begin inside a group (a checkpoint taken after a split group's
        transactions committed on their own): its tail is a group of its own then, netted
        unless the progress row falls inside it."""
        if not nets:
            return cls(nets, replayed_through)
        first: dict[int, int] = {}
        for e in replay:
            if e.netted_through is not None:
                first.setdefault(e.netted_through, e.number)
        kept = {last for last, start in first.items() if last <= replayed_through
                and (committed is None or not start <= committed < last)}
        return cls(nets, replayed_through, {e.number: e.netted_through for e in replay
                                            if e.netted_through in kept})

    def parts(self, batch: TransactionBatch) -> list[Part]:
        """`batch`, after what was held from the batches before, as the parts to compute in
        order (none while a group is held)."""
        if self.held is not None:
            batch, self.held = TransactionBatch.join([self.held, batch]), None
        parts: list[Part] = []
        rest: TransactionBatch | None = batch
        while rest is not None and rest.first <= self.replayed_through:
            through = self.group_last.get(rest.first)
            if through is None:
                alone = 1  # with the next ones logged without a group, up to the replay's end
                while (rest.first + alone <= min(rest.last.number, self.replayed_through)
                       and rest.first + alone not in self.group_last):
                    alone += 1
                part, rest = rest.split(alone)
                parts.append(Part(part, False))
            elif through > rest.last.number:
                self.held = rest
                return parts
            else:
                part, rest = rest.split(through - rest.first + 1)
                parts.append(self._part(part))
        if rest is not None:
            parts.append(self._part(rest))
        return parts

    def _part(self, batch: TransactionBatch) -> Part:
        return Part(batch, self.nets and len(batch) > 1)


def engine_changes(parts: Sequence[Part], sources: Collection[str]) -> dict[str, Changes]:
    """The engine's input for consecutive `parts`: each source's changes (of the `sources` the
    engine has), a netted part's all at its last transaction."""
    found: dict[str, list[Changes]] = {}
    for part in parts:
        for name, changes in part.batch.changes.items():
            if name in sources:
                found.setdefault(name, []).append(
                    changes.net(part.batch.last.number) if part.netted else changes)
    return {name: each[0].concat(each[1:]) for name, each in found.items()}


def engine_wall_times(parts: Sequence[Part]) -> dict[int, datetime]:
    """The wall times of consecutive `parts`, for a pipeline that calls now(): each
    transaction's, a netted part's latest at its last transaction (now() is the latest wall
    time so far, so the part's end sees what its transactions one by one would have)."""
    found: dict[int, datetime] = {}
    for part in parts:
        walls = [(t.number, w) for t in part.batch.transactions
                 if (w := t.wall_time()) is not None]
        if part.netted and walls:
            found[part.batch.last.number] = max(w for _, w in walls)
        else:
            found.update(walls)
    return found
