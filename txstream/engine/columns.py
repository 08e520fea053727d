"""The columns the engine adds to tables, and the names of its helper columns: declared once.

Every change carries `time` (the transaction number) and `diff` (its weight), named by
`txstream.changes`, the vocabulary every layer shares. Operators add helper columns while they
compute; those start with `INTERNAL_PREFIX`, which user columns may not, so a helper can never
shadow a user column.
"""

from __future__ import annotations

from txstream.changes import DIFF, TIME

__all__ = ["BEFORE_BATCH", "DIFF", "INTERNAL_PREFIX", "PART", "ROW_COUNT", "TIME"]

INTERNAL_PREFIX = "__"
# The time given to rows read from state: earlier than every transaction of any batch.
BEFORE_BATCH = -1
# Which part of a batch's result a row of the batch's single Spark job belongs to.
PART = "__part"
# A reduce's row count per group: a group exists while it is positive. Stored in the reduce's
# saved state under this name.
ROW_COUNT = "__rows"
