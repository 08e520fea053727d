"""The incremental operators, one module per kind of DAG node; each owns its node's schema
rule, its delta rule (in the module's doc comment), its state and its output's key."""

from txstream.engine.nodes import (
    AsofJoinNode,
    AsofNowJoinNode,
    BehaviorNode,
    ConcatNode,
    DistinctNode,
    FilterNode,
    JoinNode,
    LateNode,
    NegateNode,
    Node,
    NowFilterNode,
    PadNode,
    ReduceNode,
    SelectNode,
    SessionNode,
    SourceNode,
    UnmatchedNode,
)
from txstream.engine.operators.asof_join import AsofJoinOp
from txstream.engine.operators.asof_now_join import AsofNowJoinOp
from txstream.engine.operators.base import Delta, Operator
from txstream.engine.operators.behavior import BehaviorOp
from txstream.engine.operators.distinct import DistinctOp
from txstream.engine.operators.join import JoinOp, PadOp
from txstream.engine.operators.late import LateOp
from txstream.engine.operators.now_filter import NowFilterOp
from txstream.engine.operators.reduce import ReduceOp
from txstream.engine.operators.rowwise import ConcatOp, FilterOp, NegateOp, SelectOp, SourceOp
from txstream.engine.operators.session import SessionOp
from txstream.engine.operators.unmatched import UnmatchedOp

OPERATORS: dict[type[Node], type[Operator]] = {
    SourceNode: SourceOp,
    SelectNode: SelectOp,
    FilterNode: FilterOp,
    NowFilterNode: NowFilterOp,
    NegateNode: NegateOp,
    ConcatNode: ConcatOp,
    JoinNode: JoinOp,
    AsofJoinNode: AsofJoinOp,
    AsofNowJoinNode: AsofNowJoinOp,
    PadNode: PadOp,
    DistinctNode: DistinctOp,
    ReduceNode: ReduceOp,
    BehaviorNode: BehaviorOp,
    SessionNode: SessionOp,
    LateNode: LateOp,
    UnmatchedNode: UnmatchedOp,
}

__all__ = ["OPERATORS", "Delta", "Operator", "SourceOp"]
