"""Which transactions of a batch the engine computes as one, their net change (`Changes.net`),
and how a replay computes the same ones together again.

    fresh batch ........ all its transactions as one, when `nets` (every sink a snapshot
                         committed per batch: `PipelineConfig.nets_batches`) and it holds more
                         than one; logged with `netted_through` = its last transaction
    replayed batch ..... cut at the groups the log names: each group as one, the transactions
                         logged on their own as they come (consecutive ones together, not
                         netted); a group whose last transaction is yet to come is held and
                         computed with the next batch

Why a replay must find the same groups: the snapshots hold every replayed transaction up to
their progress row, which is at the end of a group (a group is committed whole, in one
PostgreSQL transaction with the progress row). Netted across that row, a batch would lose what
cancels within it while a snapshot holds the state in between (a row changed and changed back).
Not netted at all, it would evaluate rows the first run never did (a row a later transaction of
its group removed): an expression failing on one would stop the replay where the first run
went on. Netted in the same groups, a replay computes what the first run computed. A group the
progress row falls inside was computed one transaction at a time (its netted batch failed an
expression, and the transactions before the failing one were committed on their own): it is
replayed that way too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from txstream.sources.transaction_batch import TransactionBatch, TransactionLogEntry


@dataclass
class NetGroups:
    """The groups of one run: `nets` for fresh batches, the replay's logged groups."""

    nets: bool
    replayed_through: int  # the last logged transaction at the start: replays are up to it
    groups: dict[int, int] = field(default_factory=dict)  # replayed number -> its group's last
    held: TransactionBatch | None = None  # the start of a replayed group, the rest to come

    @classmethod
    def of(cls, nets: bool, replay: Sequence[TransactionLogEntry], replayed_through: int,
           committed: int | None) -> NetGroups:
        """The groups of the `replay` log entries, but those the progress row (`committed`)
        falls inside."""
        firsts: dict[int, int] = {}
        for e in replay:
            if e.netted_through is not None:
                firsts[e.netted_through] = min(firsts.get(e.netted_through, e.number), e.number)
        cut = {last for last, first in firsts.items()
               if committed is not None and first <= committed < last}
        return cls(nets, replayed_through, {e.number: e.netted_through for e in replay
                                            if e.netted_through not in (None, *cut)})

    def parts(self, batch: TransactionBatch) -> list[tuple[TransactionBatch, bool]]:
        """`batch`, after what was held from the batches before, as the parts to compute in
        order, each with whether it is netted (see the module doc)."""
        if self.held is not None:
            batch, self.held = TransactionBatch.join([self.held, batch]), None
        parts: list[tuple[TransactionBatch, bool]] = []
        rest: TransactionBatch | None = batch
        while rest is not None and rest.first <= self.replayed_through:
            through = self.groups.get(rest.first)
            if through is None:
                alone = 1  # these and the next ones logged on their own, up to the replay's end
                while (rest.first + alone <= min(rest.last.number, self.replayed_through)
                       and rest.first + alone not in self.groups):
                    alone += 1
                part, rest = rest.split(alone)
                parts.append((part, False))
            elif through > rest.last.number:
                self.held = rest
                return parts
            else:
                part, rest = rest.split(through - rest.first + 1)
                parts.append((part, self.nets and len(part) > 1))
        if rest is not None:
            parts.append((rest, self.nets and len(rest) > 1))
        return parts
