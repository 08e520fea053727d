"""The engine's errors: a pipeline's definition, a batch's input, a saved state, an expression
failing on a batch's data, a broken invariant. Each message says what went wrong in the
pipeline's terms (its tables, columns, expressions) and what to do about it."""


class PipelineDefinitionError(ValueError):
    """A pipeline is malformed: unknown column, type mismatch, bad reducer, duplicate name...

    Raised when the pipeline is built (compiled against Spark's analyzer), before any data flows;
    the message names the table and the column.
    """


class EngineInputError(ValueError):
    """A batch handed to the engine does not fit the pipeline (unknown source, wrong columns)."""


class EngineStateError(RuntimeError):
    """Saved engine state is missing, or was saved by a different pipeline definition or in
    another layout of the engine's state."""


class ExpressionError(RuntimeError):
    """A pipeline expression failed on a batch's data: Spark runs with ANSI SQL semantics, so a
    division by zero, an invalid cast or an overflow is an error, not a null.

    The batch is not applied (the engine's state is as before it). The same input fails the same
    way on every retry and on every restart, so the service stops processing instead of
    looping; the message names the table and the expression and says how to fix them. A batch
    netted into one transaction (`PipelineConfig.nets_batches`) never evaluates a row that a
    later transaction of the batch removes; a replay nets the same transactions together
    (`txstream.service.net_groups`), so while every sink still nets, it fails where the first
    run failed, and only there.
    """


class InvariantError(RuntimeError):
    """Changes broke an invariant where they crossed a stage (`txstream.service.invariants`,
    and the rows Spark reads of the engine's input): a bug, never a property of the data. The
    service halts, as on an ExpressionError, rather than write results known to be wrong; the
    message names the stage, the transaction and a sample row."""

    def __init__(self, stage: str, problem: str, transaction: int | None = None,
                 sample: object = None) -> None:
        where = f" at transaction {transaction}" if transaction is not None else ""
        row = f"; sample row: {sample}" if sample is not None else ""
        super().__init__(f"invariant broken in {stage}{where}: {problem}{row}. This is a bug "
                         "of txstream, not of the data: nothing of this batch was written; "
                         "report it with this log, and restart to replay from the last "
                         "checkpoint")
        self.stage = stage
        self.transaction = transaction
