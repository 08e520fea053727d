"""Late rows: the rows a temporal behavior ignored as late, as a table of their own.

Delta rule: row-wise, d(late(A)) = late(dA): the behavior's output rows whose `FATE` is `LATE`,
each at its transaction and with its diff, with the clock before that transaction
(`late_clock`) and the behavior's label (`late_operator`). A late row's deletion is late too
(the clock never goes back), so the table integrates to the late rows still present upstream.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from txstream.engine.batch import BatchPlan
from txstream.engine.columns import DIFF, TIME
from txstream.engine.errors import PipelineDefinitionError
from txstream.engine.frames import col
from txstream.engine.nodes import LateNode
from txstream.engine.operators.base import Delta, Operator
from txstream.engine.operators.behavior import FATE, LATE, LATE_CLOCK

CLOCK_COLUMN, OPERATOR_COLUMN = "late_clock", "late_operator"


class LateOp(Operator):
    node: LateNode
    # Its input is the behavior's every row; the few late ones are consolidated here, where a
    # reader needs them so, not all of them upstream.
    reads_unconsolidated = True

    def _resolve(self) -> StructType:
        src = self.input_schemas[0]
        self.row = [f.name for f in src.fields if f.name not in (FATE, LATE_CLOCK)]
        clash = sorted({CLOCK_COLUMN, OPERATOR_COLUMN} & set(self.row))
        if clash:
            raise PipelineDefinitionError(
                f"{self.node.label}: {', '.join(clash)} already in its input; rename it")
        return StructType([*(src[n] for n in self.row),
                           StructField(CLOCK_COLUMN, src[LATE_CLOCK].dataType, True),
                           StructField(OPERATOR_COLUMN, StringType(), False)])

    def plan(self, deltas: Sequence[Delta], batch: BatchPlan) -> Delta:
        d = deltas[0]
        if d is None:
            return None
        late = d.where(col(FATE) == LATE).select(
            *[col(n) for n in self.row], col(LATE_CLOCK).alias(CLOCK_COLUMN),
            F.lit(self.node.inputs[0].label).alias(OPERATOR_COLUMN), col(TIME), col(DIFF))
        return self._output(late, batch)
