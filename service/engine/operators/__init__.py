"""The incremental operators, one module per kind of DAG node; each owns its node's schema
rule and its delta rule (in the module's doc comment)."""

from service.engine.operators.base import Delta, Operator
from service.engine.operators.distinct import DistinctOp
from service.engine.operators.join import JoinOp, PadOp
from service.engine.operators.reduce import ReduceOp
from service.engine.operators.rowwise import ConcatOp, FilterOp, NegateOp, SelectOp, SourceOp
from service.engine.table import (
    ConcatNode,
    DistinctNode,
    FilterNode,
    JoinNode,
    NegateNode,
    Node,
    PadNode,
    ReduceNode,
    SelectNode,
    SourceNode,
)

OPERATORS: dict[type[Node], type[Operator]] = {
    SourceNode: SourceOp,
    SelectNode: SelectOp,
    FilterNode: FilterOp,
    NegateNode: NegateOp,
    ConcatNode: ConcatOp,
    JoinNode: JoinOp,
    PadNode: PadOp,
    DistinctNode: DistinctOp,
    ReduceNode: ReduceOp,
}

__all__ = ["OPERATORS", "Delta", "Operator", "SourceOp"]
