"""The engine against DuckDB: random DAGs of every operator and the example pipeline under random
transactions, checked after every transaction at several batch sizes; and definition errors.

Default run: a few fixed seeds, one DAG at batch sizes 1, 7 and all-in-one; `--long` runs many
more seeds, each at every batch size.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Callable
from decimal import Decimal

import pytest
from pyspark.sql import SparkSession
from support.engine_oracle import (
    Columns,
    RandomDag,
    RandomSource,
    Row,
    Transaction,
    apply_changes,
    check_at_every_size,
    process,
    random_transactions,
)

from txstream.engine import Engine, Pipeline, PipelineDefinitionError, Table
from txstream.engine import reducers as r
from txstream.engine.operators.join import JoinOp
from txstream.examples.orders import CUSTOMERS, ORDERS
from txstream.examples.orders import pipeline as orders_pipeline
from txstream.schemas.tables import TableSchema

DAYS = [dt.date(2026, 1, 1), dt.date(2026, 1, 2), dt.date(2026, 1, 3), None]
VALUES = [-1.5, 0.5, 1.0, 2.5, None]  # halves: sums are exact, so only avg needs a tolerance
AMOUNTS = [Decimal("-1.50"), Decimal("0.05"), Decimal("1.00"), Decimal("2.55"), None]
KEYS = [0, 1, 2, 3, None]
TEXTS = ["x", "y", "z", None]

SOURCES = (
    RandomSource("a", TableSchema.of({"id": "bigint", "k": "bigint", "v": "double", "s": "text"},
                                     primary_key=["id"]),
                 {"id": range(6), "k": KEYS, "v": VALUES, "s": TEXTS}),
    RandomSource("b", TableSchema.of({"k": "bigint", "s": "text", "w": "double"}),
                 {"k": KEYS, "s": TEXTS, "w": VALUES}),
    RandomSource("c", TableSchema.of({"cid": "bigint", "k": "bigint", "n": "int", "f": "boolean",
                                      "d": "date"}, primary_key=["cid"]),
                 {"cid": range(5), "k": KEYS, "n": [0, 1, 2, None], "f": [True, False, None],
                  "d": DAYS}),
)
EXAMPLE_SOURCES = (
    RandomSource("customers", CUSTOMERS,
                 {"customer_id": range(5), "name": ["ann", "bob", None],
                  "region": ["north", "south", None]}),
    RandomSource("orders", ORDERS,
                 {"order_id": range(8), "customer_id": [0, 1, 2, 3, 5, None],
                  "amount": AMOUNTS, "status": ["paid", "open", "void", None]}),
)
# The example's outputs as SQL, written from its docstring, not from its code.
EXAMPLE_VIEWS = (
    ("paid_orders", "SELECT o.order_id, o.customer_id, c.region, o.amount FROM orders o "
                    "JOIN customers c ON o.customer_id = c.customer_id WHERE o.status = 'paid'"),
    ("region_totals", "SELECT region, COUNT(*), SUM(amount), MIN(amount), MAX(amount) "
                      "FROM paid_orders GROUP BY region"),
    ("customer_stats", "SELECT c.customer_id, c.name, COUNT(o.order_id), "
                       "COALESCE(SUM(o.amount), 0) FROM customers c LEFT JOIN orders o "
                       "ON o.customer_id = c.customer_id GROUP BY c.customer_id, c.name"),
    ("statuses", "SELECT DISTINCT status FROM orders"),
)
EXAMPLE_OUTPUTS: dict[str, Columns] = {
    "paid_orders": (("order_id", "bigint"), ("customer_id", "bigint"), ("region", "text"),
                    ("amount", "decimal(12,2)")),
    "region_totals": (("region", "text"), ("orders", "bigint"), ("revenue", "decimal(22,2)"),
                      ("min_amount", "decimal(12,2)"), ("max_amount", "decimal(12,2)")),
    "customer_stats": (("customer_id", "bigint"), ("name", "text"), ("n_orders", "bigint"),
                       ("total", "decimal(22,2)")),
    "statuses": (("status", "text"),),
}

DAG_SIZE = 6  # random nodes besides the sources (renaming selects before joins come on top)
TRANSACTIONS = 12
ONE_BATCH = 0  # batch size meaning every transaction in one batch
EVERY_SIZE = (1, 7, ONE_BATCH)
# (seed, batch sizes, parallelism) of the default run, sized for a few minutes on a shared
# 2-core machine: each batch of a DAG costs seconds of Spark jobs, so only one DAG runs at every
# batch size at each parallelism.
DEFAULT_RUNS = {
    # Seed 6's DAG runs a few dozen hash operators in one task: it ran out of execution
    # memory with Spark's default page size (see txstream.service.spark).
    "test_random_dag": ((2, EVERY_SIZE, 1), (4, (7,), 1), (5, (ONE_BATCH,), 1), (6, (1,), 1),
                        (3, EVERY_SIZE, 2), (6, (7,), 2)),
    "test_example_pipeline": ((1, EVERY_SIZE, 1), (2, EVERY_SIZE, 2)),
    # Seeds whose DAG has a join that pairs without some columns when only the unread nodes
    # are outputs (test_unread_columns_are_exercised).
    "test_random_dag_outputs_unread_nodes": ((5, (1, ONE_BATCH), 1), (9, (7,), 2),
                                             (29, (ONE_BATCH,), 2)),
}
LONG_SEEDS = range(1, 21)  # `--long`: each at every batch size and parallelism (hours)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.function.__name__
    if name in DEFAULT_RUNS:
        runs = ([(seed, EVERY_SIZE, p) for seed in LONG_SEEDS for p in (1, 2)]
                if metafunc.config.getoption("--long") else DEFAULT_RUNS[name])
        metafunc.parametrize(("seed", "sizes", "parallelism"), runs, ids=[
            f"seed{seed}-batch{'/'.join(str(b or 'all') for b in sizes)}-P{p}"
            for seed, sizes, p in runs
        ])


def _show(transactions: list[Transaction]) -> str:
    return "\n".join(f"  t={t}: {tx}" for t, tx in enumerate(transactions, 1))


def _check_random_dag(spark: SparkSession, seed: int, sizes: tuple[int, ...],
                      parallelism: int, every_output: bool) -> None:
    rng = random.Random(seed)
    dag = RandomDag(rng, SOURCES, DAG_SIZE, every_output)
    transactions = random_transactions(rng, SOURCES, TRANSACTIONS)

    def describe(name: str) -> str:
        return f"seed {seed}, DAG:\n{dag.describe(name)}\ntransactions:\n{_show(transactions)}"

    views = tuple((rel.name, rel.sql) for rel in dag.rels if rel.sql is not None)
    outputs = {rel.name: rel.columns for rel in dag.outputs}
    check_at_every_size(spark, dag.pipeline, SOURCES, outputs, views, transactions, sizes,
                        describe, parallelism)


def test_random_dag(spark: SparkSession, seed: int, sizes: tuple[int, ...], parallelism: int
                    ) -> None:
    _check_random_dag(spark, seed, sizes, parallelism, every_output=True)


def test_random_dag_outputs_unread_nodes(spark: SparkSession, seed: int,
                                         sizes: tuple[int, ...], parallelism: int) -> None:
    """As test_random_dag, with only the nodes no other node reads as outputs: then readers of
    the others read some of their columns only, and a join pairs without the rest."""
    _check_random_dag(spark, seed, sizes, parallelism, every_output=False)


def test_unread_columns_are_exercised(spark: SparkSession) -> None:
    """Each DAG of test_random_dag_outputs_unread_nodes's default run has a join that pairs
    without columns no reader reads, as the example pipeline's left join does (a customer's
    region)."""
    def unread(pipeline: Pipeline) -> list[str]:
        return [c for op in Engine(pipeline, spark).compiled.operators if isinstance(op, JoinOp)
                for c in op.columns if c not in op.needed]

    assert unread(orders_pipeline()) == ["status", "name", "region", "region"]
    for seed, _, _ in DEFAULT_RUNS["test_random_dag_outputs_unread_nodes"]:
        dag = RandomDag(random.Random(seed), SOURCES, DAG_SIZE, every_output=False)
        assert unread(dag.pipeline), f"seed {seed}: no join pairs without a column"


def test_example_pipeline(spark: SparkSession, seed: int, sizes: tuple[int, ...],
                          parallelism: int) -> None:
    transactions = random_transactions(random.Random(seed), EXAMPLE_SOURCES, TRANSACTIONS)

    def describe(name: str) -> str:
        return f"seed {seed}, txstream/examples/orders.py, transactions:\n{_show(transactions)}"

    check_at_every_size(spark, orders_pipeline(), EXAMPLE_SOURCES, EXAMPLE_OUTPUTS,
                        EXAMPLE_VIEWS, transactions, sizes, describe, parallelism)


def _features(specs: tuple[RandomSource, ...], transactions: list[Transaction]) -> set[str]:
    """The edge cases a workload exercises."""
    seen: set[str] = set()
    contents = {s.name: Counter[Row]() for s in specs}
    gone: dict[str, set[Row]] = {s.name: set() for s in specs}  # keys deleted earlier
    for tx in transactions:
        if len(tx) != 1:
            seen.add("several sources" if tx else "empty transaction")
        for s in specs:
            changes = tx.get(s.name, [])
            if any(v is None for row, _ in changes for v in row):
                seen.add("null")
            apply_changes(contents[s.name], changes)
            if not s.schema.primary_key:
                if any(n > 1 for n in contents[s.name].values()):
                    seen.add("duplicate row")
                continue
            signs: dict[Row, set[int]] = {}
            for row, diff in changes:
                signs.setdefault(s.key_of(row), set()).add(diff)
            for key, diffs in signs.items():
                if diffs == {1, -1}:
                    seen.add("upsert")
                elif diffs == {-1}:
                    seen.add("delete")
                    gone[s.name].add(key)
                else:
                    seen.add("re-insert" if key in gone[s.name] else "insert")
    return seen


def test_workloads_exercise_the_edge_cases() -> None:
    """The default run's random workloads hold what the suite claims to test."""
    seen: set[str] = set()
    for seed, _, _ in DEFAULT_RUNS["test_random_dag"]:
        rng = random.Random(seed)
        RandomDag(rng, SOURCES, DAG_SIZE)  # the workload's random numbers come after the DAG's
        seen |= _features(SOURCES, random_transactions(rng, SOURCES, TRANSACTIONS))
    assert seen == {"empty transaction", "several sources", "null", "duplicate row", "upsert",
                    "delete", "insert", "re-insert"}


# --- definition errors ------------------------------------------------------------------------

def _sources(p: Pipeline) -> tuple[Table, Table]:
    a = p.source("a", SOURCES[0].schema)
    b = p.source("b", TableSchema.of({"k": "int", "w": "double", "s": "text"}))
    return a, b


BAD_DEFINITIONS: dict[str, tuple[Callable[[Table, Table], Table], str]] = {
    "select unknown column": (lambda a, b: a.select("k", z="nope + 1"),
                              r"select\(k, z\) of source a.*nope"),
    "filter unknown column": (lambda a, b: a.filter("nope > 1"),
                              r"filter\(nope > 1\) of source a.*nope"),
    "filter not boolean": (lambda a, b: a.filter("v + 1"),
                           # Spark's analyzer or the engine's own check: either names the type.
                           r"(?i)filter\(v \+ 1\) of source a: .*double.*not (a )?boolean"),
    "join unknown key": (lambda a, b: a.join(b.select("w", nope="k"), on="nope"),
                         r"inner join of source a and .* on nope: left join key.* nope not found"),
    "join key type mismatch": (lambda a, b: a.join(b.select("k", "w"), on="k"),
                               r"join of source a and .* key 'k' is bigint on the left but int"),
    "non-key column on both sides": (lambda a, b: a.select("id", "s", k="CAST(k AS INT)")
                                     .join(b, on="k"),
                                     r"join of select.* and source b on k: column\(s\) s exist on "
                                     r"both sides"),
    "groupby unknown column": (lambda a, b: a.groupby("nope").reduce(n=r.count()),
                               r"groupby\(nope\).reduce of source a: group-by column\(s\) nope "
                               r"not found"),
    "reducer unknown column": (lambda a, b: a.groupby("k").reduce(m=r.max("nope")),
                               r"groupby\(k\).reduce of source a: reducer m=max\(nope\) "
                               r"column\(s\) nope not found"),
    "sum of text": (lambda a, b: a.groupby("k").reduce(t=r.sum("s")),
                    r"groupby\(k\).reduce of source a: t=sum\(s\) needs a numeric column, but "
                    r"'s' is text"),
    "concat mismatched schemas": (lambda a, b: b.concat(a.select("k", "v", "s")),
                                  r"concat of source b, select\(k, v, s\) of source a: inputs "
                                  r"differ.*'k', 'int'.*'k', 'bigint'"),
}


@pytest.mark.parametrize("case", BAD_DEFINITIONS)
def test_definition_error_names_table_and_column(spark: SparkSession, case: str) -> None:
    """Raised while the pipeline is built (by the Table API call or by compiling it), before any
    data flows, naming the table and the column."""
    build, message = BAD_DEFINITIONS[case]
    p = Pipeline()
    with pytest.raises(PipelineDefinitionError, match=message):
        p.output("out", build(*_sources(p)))
        Engine(p, spark)


# --- reproductions of engine bugs found by this suite -----------------------------------------
# Each is minimal: one source, one node, one transaction of inserts at time 1.

def _insert_once(spark: SparkSession, spec: RandomSource, build: Callable[[Table], Table],
                 rows: list[Row]) -> list[dict[str, object]]:
    """The output of `build(source)` (its key inferred) after one transaction inserting rows."""
    p = Pipeline()
    p.output("out", build(p.source(spec.name, spec.schema)))
    out = process(Engine(p, spark), {spec.name: spec.arrow(rows, [1] * len(rows),
                                                           [1] * len(rows))})["out"]
    return out.to_pylist()


NULLABLE = RandomSource("t", TableSchema.of({"k": "bigint", "v": "double"}), {})


@pytest.mark.parametrize(("build", "row"), [
    # The inferred key is the group-by columns.
    (lambda t: t.groupby("k").reduce(n=r.count()), {"k": None, "n": 1}),
    # The inferred key is every column.
    (lambda t: t.select("k").distinct(), {"k": None}),
], ids=["groupby", "distinct"])
def test_inferred_output_key_with_nulls(spark: SparkSession, build: Callable[[Table], Table],
                                        row: dict[str, object]) -> None:
    """SQL groups nulls together and DISTINCT keeps a null row; the output key the engine
    infers must not make that row unrepresentable (`process` raised pyarrow's "Casting field
    'k' with null values to non-nullable")."""
    assert _insert_once(spark, NULLABLE, build, [(None, 1.0)]) == [{**row, "time": 1, "diff": 1}]


def test_each_operator_infers_its_output_key(spark: SparkSession) -> None:
    p = Pipeline()
    t = p.source("t", TableSchema.of({"id": "bigint", "k": "bigint", "v": "double"},
                                     primary_key=["id"]))
    u = p.source("u", TableSchema.of({"k": "bigint", "w": "double"}, primary_key=["k"]))
    p.output("filtered", t.filter("v > 0").select("id", "k", x="v * 2"))
    p.output("renamed", t.select("k", id2="id"))
    p.output("groups", t.groupby("k").reduce(n=r.count()))
    p.output("rows", t.select("k", "v").distinct())
    p.output("joined", t.join(u, "k"))
    p.output("pairs", t.join(t.select("k", id2="id"), "k"))
    p.output("outer", t.join(u, "k", "left"))
    p.output("given", t.select("k", "v"), primary_key=["k"])
    keys = {name: out.schema.primary_key for name, out in Engine(p, spark).outputs.items()}
    assert keys == {"filtered": ("id",), "renamed": (), "groups": ("k",), "rows": ("k", "v"),
                    "joined": ("id",), "pairs": (), "outer": (), "given": ("k",)}


INTERNAL_NAMES = RandomSource("t", TableSchema.of({"_after": "bigint", "_cnt": "bigint"}), {})


@pytest.mark.parametrize(("build", "row"), [
    # DistinctOp's running count is a column `_after`: it replaced the table's own column, so
    # the output was {"_after": 2, "_cnt": 1}, silently wrong.
    (lambda t: t.distinct(), {"_after": 7, "_cnt": 1}),
    # ReduceOp's row count is a column `_cnt`: process raised AMBIGUOUS_REFERENCE.
    (lambda t: t.groupby("_cnt").reduce(n=r.count()), {"_cnt": 1, "n": 2}),
    # ReduceOp ranks each group's rows in a column `_rank`: process raised AMBIGUOUS_REFERENCE.
    (lambda t: t.groupby("_after").reduce(_rank=r.count()), {"_after": 7, "_rank": 2}),
], ids=["distinct", "groupby", "reducer"])
def test_column_names_like_engine_internals(spark: SparkSession,
                                            build: Callable[[Table], Table],
                                            row: dict[str, object]) -> None:
    """Column names are identifiers that may start with `_`; the operators' helper columns
    must not collide with them."""
    got = _insert_once(spark, INTERNAL_NAMES, build, [(7, 1), (7, 1)])
    assert got == [{**row, "time": 1, "diff": 1}]


@pytest.mark.parametrize(("build", "message"), [
    # Not deterministic: a delete retracts another value than its insert added, so the output
    # integrated to multiplicity -1 for the retracted row and +1 for the stale one.
    (lambda t: t.select("k", x="rand()"), r"(?i)select\(k, x\) of source t.*rand"),
    # A whole-table aggregate: process raised MISSING_GROUP_BY.
    (lambda t: t.select(x="sum(v)"), r"(?i)select\(x\) of source t.*sum"),
    # A window over each batch's delta, not over the table: the numbers depend on batching.
    (lambda t: t.select("k", x="row_number() OVER (ORDER BY v)"),
     r"(?i)select\(k, x\) of source t.*row_number"),
    # A reserved name: Engine() raised pydantic's ValidationError, naming neither the table nor
    # the column.
    (lambda t: t.select("k", time="v"), r"select\(k, time\) of source t.*time"),
    # Spark resolves names case-insensitively: these passed the build and process raised
    # AMBIGUOUS_REFERENCE.
    (lambda t: t.select(a="k", A="v"), r"(?i)select\(a, A\) of source t: .*a"),
    (lambda t: t.join(t.select("k", V="v"), on="k"),
     r"(?i)join of source t and select\(k, V\) of source t on k: .*v"),
], ids=["rand", "aggregate", "window", "reserved name", "names equal but for case",
        "join sides equal but for case"])
def test_definition_errors_missed_at_build(spark: SparkSession, build: Callable[[Table], Table],
                                           message: str) -> None:
    p = Pipeline()
    with pytest.raises(PipelineDefinitionError, match=message):
        p.output("out", build(p.source("t", NULLABLE.schema)))
        Engine(p, spark)
