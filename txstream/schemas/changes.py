"""Change records as they cross the engine's boundary in files and messages."""

from __future__ import annotations

from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator


class SourceChange(BaseModel):
    """One input change of a recorded change log: `{"source", "time", "diff", "row"}`, and
    optionally its transaction's `wall_time` (ISO 8601 with a zone), which now() reads."""

    model_config = ConfigDict(extra="forbid")

    source: str
    time: int = Field(ge=1)
    diff: int
    row: dict[str, Any]
    wall_time: AwareDatetime | None = None

    @field_validator("diff")
    @classmethod
    def _nonzero(cls, v: int) -> int:
        if v == 0:
            raise ValueError("diff must be non-zero (+1 insert, -1 delete)")
        return v



class WallTime(BaseModel):
    """A transaction's wall time alone in a recorded change log: `{"time", "wall_time"}`, a
    tick when no change has that time."""

    model_config = ConfigDict(extra="forbid")

    time: int = Field(ge=1)
    wall_time: AwareDatetime
