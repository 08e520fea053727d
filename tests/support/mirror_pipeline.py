"""The example's two sources as outputs of their own: every change of a source transaction is
visible in the output, for the tests of transaction boundaries end to end."""

from __future__ import annotations

from txstream import Pipeline
from txstream.examples.orders import CUSTOMERS, ORDERS


def pipeline() -> Pipeline:
    p = Pipeline()
    p.output("customers", p.source("customers", CUSTOMERS))
    p.output("orders", p.source("orders", ORDERS))
    return p
