"""Writer epochs in a checkpoint location: the instance that resumes a pipeline from it takes
the next epoch, and an instance whose epoch is no longer the newest is fenced: it writes no
checkpoint and no transaction log entry there any more. This is what fences a pipeline with
file or Kafka sinks only (a Kafka sink asks it before it reopens a fenced producer), and it
guards the checkpoints of one whose PostgreSQL outputs fence it too
(`txstream.sinks.postgres.writers`).

An epoch is a marker file `epochs/<epoch>.json`, created only if absent, atomically: a
local or shared (NFS) file system's `O_EXCL` create, HDFS's `create(overwrite=false)`. Two
instances taking an epoch at once both try the next number, one of them gets it, the other
tries the one after (and fences the first). Other Hadoop file systems, object stores
(s3a://, gs://, abfs://) and even file:// among them, check whether the file exists and then
write it, so a location there takes no epoch and is not fenced (`CheckpointStore.take_epoch`
says so in the log).

Checking the epoch before writing is two steps, not one: an instance fenced between its check
and its write may still land that one write. So the marker also records the taker's **base**,
the last transaction it resumed through (its checkpoint plus the logged transactions it
replays), read before the marker was created; every checkpoint and log file carries the
epoch of its writer. What an epoch writes about a transaction above the base of a later
epoch is not part of the pipeline's history: the later epoch formed those transactions
itself, perhaps with other boundaries. Readers ignore it (`valid`), whenever it was written,
so a late write of a fenced instance is harmless. What it wrote at or below that base is the
same transactions from the same log, hence valid. A marker cut short by a crash while it was
created is an epoch taken by an instance that wrote nothing: it bounds nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, ValidationError

from txstream.sinks.postgres.writers import Writer
from txstream.sinks.sink import FencedError

EPOCHS = "epochs"
_MARKER = re.compile(r"^(\d{12})\.json$")

log = logging.getLogger(__name__)


class CheckpointFencedError(FencedError):
    """Another instance took a newer epoch of the checkpoint location."""

    def __init__(self, location: str, epoch: int, newest: int, writer: Writer | None) -> None:
        by = f"taken by {writer}" if writer else "(its marker is unreadable)"
        super().__init__(
            f"pipeline at {location}: this instance (checkpoint epoch {epoch}) was fenced by "
            f"epoch {newest}, {by}. It writes no checkpoint and no transaction there any more "
            "and stops consuming; two instances ran with the same checkpoint_dir and "
            "consumer_group. Leave one of them running, or give the other its own "
            "consumer_group or checkpoint_dir")


class EpochMarker(BaseModel):
    """What `epochs/<epoch>.json` holds: who took the epoch, and through which transaction the
    pipeline's history was when it did (see the module's doc)."""

    writer: Writer
    base: int


class _EpochFiles(Protocol):
    """What the epochs need of a checkpoint location's storage (`txstream.service.checkpoint`)."""

    def list(self, rel: str) -> list[str]: ...

    def read_text(self, rel: str) -> str | None: ...

    def create_new(self, rel: str, text: str) -> bool: ...


class CheckpointEpochs:
    """The epochs of one checkpoint location."""

    def __init__(self, storage: _EpochFiles, location: str) -> None:
        self._storage = storage
        self._location = location
        self._markers: dict[int, EpochMarker] = {}  # complete markers never change

    def newest(self) -> int:
        """The newest epoch taken (0: none); a listing, no file read."""
        return max(self._numbers(), default=0)

    def take(self, writer: Writer, base: int) -> int:
        """The next epoch, now `writer`'s, taken with history through transaction `base`."""
        marker = EpochMarker(writer=writer, base=base).model_dump_json()
        epoch = self.newest() + 1
        while not self._storage.create_new(_name(epoch), marker):
            epoch += 1  # another instance took it at the same moment
        log.info("took checkpoint epoch %d of %s (%s)", epoch, self._location, writer)
        return epoch

    def check(self, epoch: int) -> None:
        """CheckpointFencedError unless `epoch` is still the newest."""
        newest = self.newest()
        if newest != epoch:
            marker = self._marker(newest)
            raise CheckpointFencedError(self._location, epoch, newest,
                                        marker.writer if marker else None)

    def valid(self) -> Callable[[int, int], bool]:
        """Whether what epoch `e` wrote about transaction `t` is part of the history:
        `valid()(e, t)`, as of the markers now (epoch 0: written before any epoch)."""
        bases = sorted((epoch, marker.base) for epoch in self._numbers()
                       if (marker := self._marker(epoch)) is not None)

        def check(epoch: int, transaction: int) -> bool:
            return all(transaction <= base for later, base in bases if later > epoch)

        return check

    def _numbers(self) -> list[int]:
        return sorted(int(m.group(1)) for name in self._storage.list(EPOCHS)
                      if (m := _MARKER.match(name)))

    def _marker(self, epoch: int) -> EpochMarker | None:
        """The marker of `epoch`; None if cut short by a crash while it was created (or
        being created right now: not kept, so read again next time)."""
        if epoch not in self._markers:
            try:
                marker = EpochMarker.model_validate_json(
                    self._storage.read_text(_name(epoch)) or "")
            except ValidationError:
                return None
            self._markers[epoch] = marker
        return self._markers[epoch]


def _name(epoch: int) -> str:
    return f"{EPOCHS}/{epoch:012d}.json"
