"""Errors of pipeline definitions and of engine input."""


class PipelineDefinitionError(ValueError):
    """A pipeline is malformed: unknown column, type mismatch, bad reducer, duplicate name...

    Raised when the pipeline is built (compiled against Spark's analyzer), before any data flows;
    the message names the table and the column.
    """


class EngineInputError(ValueError):
    """A batch handed to the engine does not fit the pipeline (unknown source, wrong columns)."""


class EngineStateError(RuntimeError):
    """Saved engine state is missing or was saved by a different pipeline definition."""
