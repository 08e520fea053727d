"""Change records as they cross the engine's boundary in files and messages."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SourceChange(BaseModel):
    """One input change of a recorded change log: `{"source", "time", "diff", "row"}`."""

    model_config = ConfigDict(extra="forbid")

    source: str
    time: int = Field(ge=1)
    diff: int
    row: dict[str, Any]

    @field_validator("diff")
    @classmethod
    def _nonzero(cls, v: int) -> int:
        if v == 0:
            raise ValueError("diff must be non-zero (+1 insert, -1 delete)")
        return v

