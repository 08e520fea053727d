"""Where a run resumes: after the newest complete checkpoint, or from the beginning.

    checkpoint #c (source state, engine state) + transactions logged after c (#c+1 .. #l)
    -> the engine loads its state as of c; the input resumes after c's offsets and re-forms
       #c+1 .. #l first, with the same numbers and boundaries the sinks may already hold

Without a checkpoint the engine's state is empty, so the input starts at the beginning of every
topic, whatever offsets the consumer group committed; the logged transactions, if any (a crash
before the first checkpoint), are re-formed all the same. The sinks may hold transactions of an
earlier run exactly when there is a checkpoint or a logged transaction: only a start from
scratch may recreate `mode: replace` tables.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txstream.schemas.config import PipelineConfig
from txstream.sources.source_state import SourceState
from txstream.sources.transaction_batch import TransactionLogEntry

if TYPE_CHECKING:
    from txstream.engine import Engine
    from txstream.service.checkpoint import CheckpointStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumed:
    """Where the run resumes (see the module doc)."""

    state: SourceState  # the input's, as of `checkpointed`
    replay: list[TransactionLogEntry]  # the transactions logged after `checkpointed`
    checkpointed: int  # the checkpoint's last transaction (0: no checkpoint)
    resuming: bool  # whether the sinks may hold transactions of an earlier run

    @property
    def logged_through(self) -> int:
        """The last transaction logged: every one up to it has its number and boundaries."""
        return self.checkpointed + len(self.replay)


def resume(config: PipelineConfig, engine: Engine, checkpoints: CheckpointStore) -> Resumed:
    """Where `config`'s pipeline resumes from `checkpoints`, with `engine`'s state loaded."""
    latest = checkpoints.latest()
    resuming = checkpoints.has_history()
    if latest is not None:
        state = checkpoints.load_source_state(latest)
        engine.load_state(checkpoints.engine_uri(latest))
        checkpointed = latest.transaction
    else:
        state = SourceState(next_number=1, offsets={}, upsert_rows={
            s.name: s.table_schema.arrow_schema().empty_table()
            for s in config.sources if s.semantics == "upsert"})
        checkpointed = 0
    replay = checkpoints.logged_after(checkpointed)
    if latest is not None or replay:
        log.info("resuming after transaction #%d (%s); replaying %d logged transaction(s)",
                 checkpointed, latest.name if latest else "no checkpoint", len(replay))
    return Resumed(state, replay, checkpointed, resuming)
