"""Random DAGs, random transactions and DuckDB as an independent oracle for the engine.

Deephaven's EvalNugget and DBSP's proptests in Python: `RandomDag` builds a random pipeline in
which every node is made twice, once as a Table API call and once as the equivalent SQL text;
`random_transactions` makes a random workload over `RandomSource`s (a source's `TableSchema`
and the values each column takes); `expected_tables` recomputes every node from scratch in
DuckDB on the inputs as of each transaction; `check_engine` runs the engine over the workload
in batches of a given size and checks every output after every transaction.

The engine gets and gives `txstream.changes.Changes`. The oracle keeps its own account of a
transaction, `RowDiffs` (plain Python rows and their weights), and integrates and recomputes
from those alone: nothing of txstream's computes what the engine's results are checked
against.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa
from pyspark.sql import SparkSession

from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine, Pipeline, Table
from txstream.engine import reducers as r
from txstream.engine.codegen import INTERPRETED_ROWS
from txstream.engine.engine import INDEX_ROWS, SPREAD_ROWS
from txstream.engine.nodes import Node
from txstream.engine.reducers import Reducer
from txstream.schemas.tables import ColumnType, TableSchema

Row = tuple[object, ...]
# One source's (row, diff) pairs in one transaction, deliberately not consolidated: the oracle's
# account of what the engine gets as `Changes`.
RowDiffs = list[tuple[Row, int]]
# Source name -> its changes in one transaction.
Transaction = dict[str, RowDiffs]
Columns = tuple[tuple[str, str], ...]  # (name, column type) in order

FLOAT_TOLERANCE = 1e-6


# --- sources and workloads -------------------------------------------------------------------

@dataclass(frozen=True)
class RandomSource:
    """A source table (`p.source(name, schema)`) and the values each column takes: few, so rows
    collide in joins and groups."""

    name: str
    schema: TableSchema
    domains: Mapping[str, Sequence[object]]

    @property
    def columns(self) -> Columns:
        return tuple((c.name, c.type.value) for c in self.schema.columns)

    def random_row(self, rng: random.Random, key: Row = ()) -> Row:
        given = dict(zip(self.schema.primary_key, key, strict=True))
        return tuple(given[n] if n in given else rng.choice(self.domains[n])
                     for n in self.schema.names)

    def key_of(self, row: Row) -> Row:
        return tuple(row[self.schema.names.index(k)] for k in self.schema.primary_key)

    def arrow(self, rows: Sequence[Row], times: Sequence[int] | None = None,
              diffs: Sequence[int] | None = None) -> pa.Table:
        """Rows as an Arrow table; with `times` and `diffs`, as changes for `Engine.process`."""
        data = {n: [row[i] for row in rows] for i, n in enumerate(self.schema.names)}
        if times is not None and diffs is not None:
            data |= {TIME: list(times), DIFF: list(diffs)}
        return pa.table(data, schema=self.schema.arrow_schema(with_changes=times is not None))

    def changes(self, changes: Sequence[tuple[Row, int, int]]) -> Changes:
        """(row, time, diff) triples as the engine takes them, not consolidated."""
        return Changes(self.arrow([c[0] for c in changes], [c[1] for c in changes],
                                  [c[2] for c in changes]))


def apply_changes(contents: Counter[Row], changes: Sequence[tuple[Row, int]],
                  where: str = "the workload") -> None:
    """Integrate changes into a multiset; a multiplicity below zero is an error of `where`."""
    for row, diff in changes:
        contents[row] += diff
        assert contents[row] >= 0, f"{where}: multiplicity of {row} is {contents[row]}"
        if not contents[row]:
            del contents[row]


def _keyed_changes(rng: random.Random, spec: RandomSource, contents: Counter[Row]) -> RowDiffs:
    """Upserts (-1 old, +1 new at one time), deletes, inserts and re-inserts of deleted keys;
    at most one operation per key. An upsert to the very same row is a pair that cancels."""
    live = {spec.key_of(row): row for row in contents}
    keys = list(itertools.product(*(spec.domains[k] for k in spec.schema.primary_key)))
    changes: RowDiffs = []
    for key in rng.sample(keys, rng.randint(1, 3)):
        old = live.get(key)
        if old is None:
            changes.append((spec.random_row(rng, key), 1))
        elif rng.random() < 0.3:
            changes.append((old, -1))
        else:
            changes += [(old, -1), (spec.random_row(rng, key), 1)]
    return changes


def _bag_changes(rng: random.Random, spec: RandomSource, contents: Counter[Row]) -> RowDiffs:
    """Inserts of new rows and of duplicates (also twice in one transaction), deletes of one copy
    or of every copy of a row."""
    contents = Counter(contents)  # ops see each other's effect, the caller's state is untouched
    changes: RowDiffs = []
    for _ in range(rng.randint(1, 3)):
        present = list(contents)
        roll = rng.random()
        if present and roll < 0.35:
            row = rng.choice(present)
            delta = [(row, -1)] * (1 if rng.random() < 0.7 else contents[row])
        elif present and roll < 0.6:
            delta = [(rng.choice(present), 1)]
        else:
            delta = [(spec.random_row(rng), 1)] * rng.choice((1, 1, 2))
        apply_changes(contents, delta)
        changes += delta
    return changes


def random_transactions(rng: random.Random, specs: Sequence[RandomSource], count: int
                        ) -> list[Transaction]:
    """`count` transactions: some empty, most changing several sources at once."""
    contents = {s.name: Counter[Row]() for s in specs}
    transactions: list[Transaction] = []
    for _ in range(count):
        tx: Transaction = {}
        if rng.random() >= 0.15:
            changing = [s for s in specs if rng.random() < 0.6] or [rng.choice(specs)]
            for s in changing:
                make = _keyed_changes if s.schema.primary_key else _bag_changes
                tx[s.name] = make(rng, s, contents[s.name])
                apply_changes(contents[s.name], tx[s.name])
        transactions.append(tx)
    return transactions


# --- the random DAG ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Expr:
    """An expression over columns of the given types, in Spark SQL and in DuckDB SQL (`{0}`,
    `{1}` stand for quoted column names); `duck` defaults to the Spark text."""

    args: tuple[str, ...]
    type: str
    spark: str
    duck: str | None = None

    def render(self, columns: Sequence[str]) -> tuple[str, str]:
        spark = self.spark.format(*(f"`{c}`" for c in columns))
        duck = (self.duck or self.spark).format(*(f'"{c}"' for c in columns))
        return spark, duck


_ANY_TYPE = ("bigint", "int", "double", "text", "boolean", "date")
NUMERIC = ("bigint", "int", "double")
# Joins on doubles are left out: equality of computed floats is not what is being tested.
KEY_TYPES = ("bigint", "int", "text", "boolean", "date")

PREDICATES = (
    Expr(("bigint",), "boolean", "{0} > 1"),
    Expr(("bigint",), "boolean", "{0} <= 1"),
    Expr(("bigint",), "boolean", "{0} = 2"),
    Expr(("int",), "boolean", "{0} >= 1"),
    Expr(("double",), "boolean", "{0} > 0.5"),
    Expr(("double",), "boolean", "{0} < 1"),
    Expr(("text",), "boolean", "{0} = 'x'"),
    Expr(("text",), "boolean", "{0} <> 'y'"),
    Expr(("text",), "boolean", "{0} IN ('x', 'z')"),
    Expr(("boolean",), "boolean", "{0}"),
    Expr(("boolean",), "boolean", "NOT {0}"),
    Expr(("date",), "boolean", "{0} >= DATE '2026-01-02'"),
    Expr(("bigint", "bigint"), "boolean", "{0} = {1}"),
    Expr(("bigint", "bigint"), "boolean", "{0} < {1}"),
    Expr(("double", "double"), "boolean", "{0} <= {1}"),
    *(Expr((t,), "boolean", f"{{0}} IS {neg}NULL") for t in _ANY_TYPE for neg in ("", "NOT ")),
)

VALUES = (
    Expr(("bigint",), "bigint", "{0} + 1"),
    Expr(("bigint",), "bigint", "{0} * 2"),
    Expr(("bigint",), "bigint", "{0} % 2"),
    Expr(("bigint",), "bigint", "COALESCE({0}, 0)"),
    Expr(("bigint",), "double", "CAST({0} AS DOUBLE)"),
    Expr(("bigint",), "text", "CAST({0} AS STRING)", "CAST({0} AS VARCHAR)"),
    Expr(("int",), "int", "{0} + 1"),
    Expr(("int",), "bigint", "CAST({0} AS BIGINT)"),
    Expr(("double",), "double", "{0} * 2"),
    Expr(("double",), "double", "{0} + 1"),
    Expr(("double",), "double", "ABS({0})"),
    Expr(("double",), "double", "COALESCE({0}, 0.0)"),
    Expr(("double",), "boolean", "{0} > 1"),
    Expr(("double",), "bigint", "CAST(FLOOR({0}) AS BIGINT)"),
    Expr(("text",), "text", "UPPER({0})"),
    Expr(("text",), "text", "{0} || '!'"),
    Expr(("text",), "text", "COALESCE({0}, '?')"),
    Expr(("text",), "boolean", "{0} = 'x'"),
    Expr(("text",), "bigint", "CAST(LENGTH({0}) AS BIGINT)"),
    Expr(("boolean",), "boolean", "NOT {0}"),
    Expr(("boolean",), "int", "CASE WHEN {0} THEN 1 ELSE 0 END"),
    Expr(("date",), "text", "CAST({0} AS STRING)", "CAST({0} AS VARCHAR)"),
    Expr(("date",), "bigint", "CAST(DAYOFMONTH({0}) AS BIGINT)"),
    Expr(("bigint", "bigint"), "bigint", "{0} + {1}"),
    Expr(("bigint", "double"), "double", "{0} + {1}"),
    Expr(("double", "double"), "double", "{0} + {1}"),
    Expr(("text", "text"), "text", "{0} || {1}"),
)


@dataclass(frozen=True)
class ReducerSpec:
    """A reducer as the engine's API call and as SQL; `types` it applies to (None: count())."""

    make: Callable[..., Reducer]
    sql: str  # `{0}` is the quoted column, `{1}` the DuckDB name of the result type
    types: tuple[str, ...] | None
    result: Callable[[str], str]  # the result type for the column's type


REDUCERS = (
    ReducerSpec(r.count, "COUNT(*)", None, lambda t: "bigint"),
    ReducerSpec(r.count, "COUNT({0})", _ANY_TYPE, lambda t: "bigint"),
    ReducerSpec(r.sum, "CAST(SUM({0}) AS {1})", NUMERIC,
                lambda t: "double" if t == "double" else "bigint"),
    ReducerSpec(r.avg, "AVG({0})", NUMERIC, lambda t: "double"),
    ReducerSpec(r.min, "MIN({0})", _ANY_TYPE, lambda t: t),
    ReducerSpec(r.max, "MAX({0})", _ANY_TYPE, lambda t: t),
    ReducerSpec(r.count_distinct, "COUNT(DISTINCT {0})", _ANY_TYPE, lambda t: "bigint"),
)
_DUCK_TYPES = {"bigint": "BIGINT", "double": "DOUBLE"}  # DuckDB sums bigints to HUGEINT


@dataclass(frozen=True)
class Rel:
    """A node of the random DAG: its engine table, its columns, its SQL and how it was built.

    `name` is the pipeline output and the DuckDB view (for a source: the registered input)."""

    name: str
    table: Table
    columns: Columns
    sql: str | None
    api: str
    sources: frozenset[str]  # the sources it is computed from

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]


class RandomDag:
    """A random pipeline over `specs`: every node (sources included) is an output, or with
    `every_output=False` only the nodes no other node reads (`outputs`), so that readers read
    some columns of the others only (a join then pairs without them, txstream.engine.operators
    .join)."""

    def __init__(self, rng: random.Random, specs: Sequence[RandomSource], size: int,
                 every_output: bool = True) -> None:
        self.rng = rng
        self.pipeline = Pipeline()
        self.rels: list[Rel] = []
        self._fresh = itertools.count(1)
        for s in specs:
            self._add(s.name, self.pipeline.source(s.name, s.schema), s.columns, None,
                      f"{s.name} = p.source({s.name!r}, {s.schema.names}, "
                      f"primary_key={list(s.schema.primary_key)})", frozenset([s.name]))
        builders = [self._filter, self._select, self._join, self._reduce, self._concat,
                    self._distinct]
        # Every operator at least once (in a random order), then random ones.
        missing = rng.sample(builders, len(builders))
        while missing or len(self.rels) < len(specs) + size:
            builder = missing[0] if missing else rng.choices(builders, (2, 2, 3, 3, 1, 1))[0]
            if builder() and builder in missing:
                missing.remove(builder)
        self.outputs = self.rels if every_output else self._unread()
        for rel in self.outputs:
            # No output key: outputs are checked as multisets. (Inferred keys may hold nulls,
            # which test_inferred_output_key_with_nulls checks on its own.)
            self.pipeline.output(rel.name, rel.table, primary_key=())

    def _unread(self) -> list[Rel]:
        """The nodes that no other node reads."""
        read: set[int] = set()

        def visit(node: Node) -> None:
            for i in node.inputs:
                if i.id not in read:
                    read.add(i.id)
                    visit(i)

        for rel in self.rels:
            visit(rel.table.node)
        return [rel for rel in self.rels if rel.table.node.id not in read]

    def _add(self, name: str, table: Table, columns: Columns, sql: str | None, api: str,
             sources: frozenset[str]) -> Rel:
        rel = Rel(name, table, columns, sql, api, sources)
        self.rels.append(rel)
        return rel

    def _name(self, prefix: str) -> str:
        return f"{prefix}{next(self._fresh)}"

    def _pick(self) -> Rel:
        # Later nodes are likelier inputs, which makes the DAG deep rather than wide.
        return self.rng.choices(self.rels, weights=range(1, len(self.rels) + 1))[0]

    def _random_expr(self, rel: Rel, choices: Sequence[Expr]) -> tuple[Expr, list[str]] | None:
        by_type: dict[str, list[str]] = {}
        for n, t in rel.columns:
            by_type.setdefault(t, []).append(n)
        usable = [e for e in choices if all(t in by_type for t in e.args)]
        if not usable:
            return None
        expr = self.rng.choice(usable)
        return expr, [self.rng.choice(by_type[t]) for t in expr.args]

    def _predicate(self, rel: Rel) -> tuple[str, str]:
        atoms = []
        for _ in range(self.rng.choice((1, 1, 2))):
            picked = self._random_expr(rel, PREDICATES)
            assert picked is not None  # IS NULL applies to every type
            atoms.append(picked[0].render(picked[1]))
        joiner = self.rng.choice((" AND ", " OR "))
        return (joiner.join(f"({s})" for s, _ in atoms), joiner.join(f"({d})" for _, d in atoms))

    def _filter(self) -> bool:
        rel = self._pick()
        spark, duck = self._predicate(rel)
        name = self._name("n")
        self._add(name, rel.table.filter(spark), rel.columns,
                  f'SELECT * FROM "{rel.name}" WHERE {duck}',
                  f"{name} = {rel.name}.filter({spark!r})", rel.sources)
        return True

    def _project(self, rel: Rel, items: Sequence[tuple[str, str, str, str]]) -> Rel:
        """A select of (name, type, Spark expression, DuckDB expression) items."""
        name = self._name("n")
        exprs = {n: spark for n, _, spark, _ in items}
        sql = ", ".join(f'{duck} AS "{n}"' for n, _, _, duck in items)
        return self._add(name, rel.table.select(**exprs), tuple((n, t) for n, t, _, _ in items),
                         f'SELECT {sql} FROM "{rel.name}"',
                         f"{name} = {rel.name}.select(**{exprs})", rel.sources)

    @staticmethod
    def _kept(column: str, type_: str) -> tuple[str, str, str, str]:
        return column, type_, f"`{column}`", f'"{column}"'

    def _select(self) -> bool:
        rel = self._pick()
        # Dropping columns makes distinct rows equal: the select must consolidate them.
        items = [self._kept(n, t) for n, t in rel.columns if self.rng.random() < 0.6]
        for _ in range(self.rng.choice((0, 1, 1, 2)) if items else 1):
            picked = self._random_expr(rel, VALUES)
            if picked is not None:
                expr, cols = picked
                items.append((self._name("x"), expr.type, *expr.render(cols)))
        if items:
            self._project(rel, items)
        return bool(items)

    def _join(self) -> bool:
        left = self._pick()
        # Mostly tables of other sources, which several sources changing in one transaction
        # then change together; sometimes a table of the same sources, or itself.
        others = [o for o in self.rels if not o.sources & left.sources]
        right = self.rng.choice(others) if others and self.rng.random() < 0.7 else self._pick()
        right_types = dict(right.columns)
        common = [n for n, t in left.columns if right_types.get(n) == t and t in KEY_TYPES]
        if not common:
            return False
        keys = self.rng.sample(common, self.rng.choice((1, 1, 2)) if len(common) > 1 else 1)
        clash = (set(left.names) & set(right.names)) - set(keys)
        if clash:  # the API wants distinct non-key names: rename the right side's first
            right = self._project(right, [
                (self._name("x") if n in clash else n, t, f"`{n}`", f'"{n}"')
                for n, t in right.columns
            ])
        how = self.rng.choice(("inner", "left", "right", "outer"))
        sql_how = {"inner": "INNER", "left": "LEFT", "right": "RIGHT", "outer": "FULL OUTER"}[how]
        # USING semantics: the key is whichever side's is present.
        cols = [f'COALESCE(l."{k}", r."{k}") AS "{k}"' for k in keys]
        cols += [f'l."{n}"' for n in left.names if n not in keys]
        cols += [f'r."{n}"' for n in right.names if n not in keys]
        on = " AND ".join(f'l."{k}" = r."{k}"' for k in keys)
        columns = (tuple((k, right_types[k]) for k in keys)
                   + tuple(c for c in left.columns if c[0] not in keys)
                   + tuple(c for c in right.columns if c[0] not in keys))
        name = self._name("n")
        self._add(name, left.table.join(right.table, on=keys, how=how), columns,
                  f'SELECT {", ".join(cols)} FROM "{left.name}" AS l {sql_how} JOIN '
                  f'"{right.name}" AS r ON {on}',
                  f"{name} = {left.name}.join({right.name}, on={keys}, how={how!r})",
                  left.sources | right.sources)
        return True

    def _reduce(self) -> bool:
        rel = self._pick()
        keys = self.rng.sample(rel.names, min(len(rel.names), self.rng.choice((1, 1, 2))))
        types = dict(rel.columns)
        reducers: dict[str, Reducer] = {}
        sql = [f'"{k}"' for k in keys]
        columns = [(k, types[k]) for k in keys]
        for _ in range(self.rng.randint(1, 3)):
            kind = self.rng.choice(REDUCERS)
            out = self._name("x")
            if kind.types is None:
                reducers[out] = kind.make()
                sql.append(f'{kind.sql} AS "{out}"')
                columns.append((out, kind.result("")))
                continue
            usable = [n for n, t in rel.columns if t in kind.types]
            if not usable:
                continue
            column = self.rng.choice(usable)
            result = kind.result(types[column])
            reducers[out] = kind.make(column)
            aggregate = kind.sql.format(f'"{column}"', _DUCK_TYPES.get(result))
            sql.append(f'{aggregate} AS "{out}"')
            columns.append((out, result))
        if not reducers:
            return False
        group = ", ".join(f'"{k}"' for k in keys)
        name = self._name("n")
        shown = ", ".join(f"{n}=r.{red.kind.value}({red.column!r})" if red.column else
                          f"{n}=r.count()" for n, red in reducers.items())
        self._add(name, rel.table.groupby(*keys).reduce(**reducers), tuple(columns),
                  f'SELECT {", ".join(sql)} FROM "{rel.name}" GROUP BY {group}',
                  f"{name} = {rel.name}.groupby(*{keys}).reduce({shown})", rel.sources)
        return True

    def _concat(self) -> bool:
        rel = self._pick()
        # The same columns in the same order; the node itself qualifies (a self-union).
        same = [o for o in self.rels if o.columns == rel.columns]
        others = self.rng.choices(same, k=self.rng.choice((1, 1, 2)))
        name = self._name("n")
        sql = " UNION ALL ".join(f'SELECT * FROM "{o.name}"' for o in (rel, *others))
        self._add(name, rel.table.concat(*(o.table for o in others)), rel.columns, sql,
                  f"{name} = {rel.name}.concat({', '.join(o.name for o in others)})",
                  rel.sources.union(*(o.sources for o in others)))
        return True

    def _distinct(self) -> bool:
        rel = self._pick()
        name = self._name("n")
        self._add(name, rel.table.distinct(), rel.columns, f'SELECT DISTINCT * FROM "{rel.name}"',
                  f"{name} = {rel.name}.distinct()", rel.sources)
        return True

    def describe(self, upto: str | None = None) -> str:
        """The DAG as Table API calls and SQL (up to node `upto`), for failure reports."""
        lines = []
        for rel in self.rels:
            lines.append(f"  {rel.api}\n      -- {rel.sql or 'source'}")
            if rel.name == upto:
                break
        return "\n".join(lines)


# --- the oracle -------------------------------------------------------------------------------

def expected_tables(specs: Sequence[RandomSource], views: Sequence[tuple[str, str]],
                    outputs: Sequence[str], transactions: Sequence[Transaction]
                    ) -> list[dict[str, list[Row]]]:
    """For each transaction, every output recomputed by DuckDB from the integrated inputs.

    `views` are (name, SQL) in dependency order; sources are registered under their names."""
    con = duckdb.connect()
    con.execute("SET threads TO 1")  # the machine is shared; these tables are tiny
    con.execute("SET TimeZone = 'UTC'")  # timestamps as the engine gives them
    contents = {s.name: Counter[Row]() for s in specs}
    for s in specs:
        con.register(s.name, s.arrow([]))  # views are bound when created
    for name, sql in views:
        con.execute(f'CREATE VIEW "{name}" AS {sql}')
    result = []
    for tx in transactions:
        for s in specs:
            apply_changes(contents[s.name], tx.get(s.name, []))
            con.register(s.name, s.arrow(list(contents[s.name].elements())))
        result.append({o: con.execute(f'SELECT * FROM "{o}"').fetchall() for o in outputs})
    con.close()
    return result


# --- comparing --------------------------------------------------------------------------------

def _sort_key(row: Row) -> tuple[object, ...]:
    # Rounded floats sort equal values within the tolerance together; None sorts first.
    return tuple((0,) if v is None else (1, round(v, 6) if isinstance(v, float) else v)
                 for v in row)


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)
    return a == b and type(a) is type(b)


def same_multiset(got: Sequence[Row], want: Sequence[Row]) -> bool:
    """Multiset equality, floats within the tolerance, nulls equal to nulls."""
    if len(got) != len(want):
        return False
    return all(len(g) == len(w) and all(_close(a, b) for a, b in zip(g, w, strict=True))
               for g, w in zip(sorted(got, key=_sort_key), sorted(want, key=_sort_key),
                               strict=True))


def multiset_diff(got: Sequence[Row], want: Sequence[Row], limit: int = 8) -> str:
    extra = list((Counter(got) - Counter(want)).elements())
    missing = list((Counter(want) - Counter(got)).elements())
    return (f"unexpected ({len(extra)}): {sorted(extra, key=_sort_key)[:limit]}\n"
            f"missing ({len(missing)}): {sorted(missing, key=_sort_key)[:limit]}")


# --- running the engine -----------------------------------------------------------------------

def run(engine: Engine, inputs: Mapping[str, Changes]) -> dict[str, pa.Table]:
    """`engine.process` of `inputs`: each output's changes, checked to be consolidated and
    ordered (`Changes.validate`), as a table."""
    return {name: out.validate().table for name, out in engine.process(inputs).items()}


def process(engine: Engine, tables: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
    """`run` of Arrow tables of changes (a table's columns, `time` and `diff`), wrapped as they
    are (`Changes.of`): the workloads' are deliberately not consolidated, which the engine must
    take (it consolidates its input)."""
    return run(engine, {name: Changes.of(table) for name, table in tables.items()})


def check_engine(spark: SparkSession, pipeline: Pipeline, specs: Sequence[RandomSource],
                 outputs: Mapping[str, Columns], transactions: Sequence[Transaction],
                 expected: Sequence[Mapping[str, Sequence[Row]]], batch_size: int,
                 describe: Callable[[str], str], parallelism: int = 1) -> dict[str, list[Row]]:
    """Run the engine over the transactions (numbered from 1) in batches of `batch_size`, at
    `parallelism` (states and exchanged deltas in that many partitions).

    Checks every batch of every output: column names and types, consolidation, times inside
    the batch and sorted; then, after every transaction of the batch, that the output integrated
    up to it has no negative multiplicity and equals `expected`. Returns each output's stream
    as (time, diff, *row) tuples. `describe(output)` explains a failing output.

    With batches of one transaction, some batches must reuse the plans of an earlier one of
    the same shape (`BatchStats.rebound`), so that both ways of planning are checked. Those
    batches evaluate expressions interpreted, as small batches do; larger batches with
    generated code, whatever their size and even as the first batch of a JVM
    (`Engine.interpreted_rows`, `Engine.cold_interpreted_rows`): both ways are checked.

    Batches of several transactions index every state run (`Engine.index_rows`), so later
    batches' lookups probe indexes as they do in a large state; batches of one transaction
    stream their runs, as a small state does (runs of a few rows would be indexed early and
    change the batches' shape for good: none would reuse plans). tests/test_engine_cost.py
    checks lone transactions probing an index against an engine that streams. At parallelism
    above 1 runs are indexed alike (an index file per partition, `txstream.engine.run_index`);
    batches of one transaction are planned in one partition over the partitioned state, as
    small batches are, larger ones spread over the partitions whatever their size
    (`Engine.spread_rows`)."""
    engine = Engine(pipeline, spark, parallelism=parallelism,
                    interpreted_rows=INTERPRETED_ROWS if batch_size == 1 else 0,
                    cold_interpreted_rows=0,
                    index_rows=INDEX_ROWS if batch_size == 1 else 1,
                    spread_rows=SPREAD_ROWS if batch_size == 1 else 0)
    rebound = probed = 0
    integrated = {name: Counter[Row]() for name in outputs}
    streams: dict[str, list[Row]] = {name: [] for name in outputs}
    for first in range(1, len(transactions) + 1, batch_size):
        times = range(first, min(first + batch_size, len(transactions) + 1))
        result = run(engine, {
            s.name: s.changes([(row, t, diff) for t in times
                               for row, diff in transactions[t - 1].get(s.name, [])])
            for s in specs
        })
        assert engine.last_batch is not None
        rebound += engine.last_batch.rebound
        probed += engine.last_batch.indexes > 0
        assert engine.last_batch.interpreted == (batch_size == 1)
        assert set(result) == set(outputs)
        by_time: dict[str, dict[int, list[tuple[Row, int]]]] = {}
        for name, columns in outputs.items():
            where = (f"output {name}, batch of transactions {times.start}..{times.stop - 1} "
                     f"(batch size {batch_size})\n{describe(name)}")
            changes = _checked_batch(result[name], columns, times, where)
            streams[name] += [(t, d, *row) for row, t, d in changes]
            by_time[name] = {}
            for row, t, d in changes:
                by_time[name].setdefault(t, []).append((row, d))
        for t in times:
            for name in outputs:
                apply_changes(integrated[name], by_time[name].get(t, []),
                              f"output {name} at transaction {t}\n{describe(name)}")
                got = list(integrated[name].elements())
                want = expected[t - 1][name]
                assert same_multiset(got, want), (
                    f"output {name} after transaction {t} (batch size {batch_size}) differs from "
                    f"DuckDB:\n{multiset_diff(got, want)}\n{describe(name)}"
                )
    assert batch_size > 1 or rebound, "no batch reused the plans of an earlier one"
    if 1 < batch_size < len(transactions):
        assert probed > 0, "no batch probed an index"
    return streams


def check_at_every_size(spark: SparkSession, pipeline: Pipeline,
                        specs: tuple[RandomSource, ...], outputs: dict[str, Columns],
                        views: tuple[tuple[str, str], ...], transactions: list[Transaction],
                        sizes: tuple[int, ...], describe: Callable[[str], str],
                        parallelism: int) -> None:
    """Every output after every transaction against DuckDB (`views`: (name, SQL) in dependency
    order), at each batch size (0: all transactions in one batch); and the same output stream
    at every batch size."""
    expected = expected_tables(specs, views, list(outputs), transactions)
    streams = {
        size: check_engine(spark, pipeline, specs, outputs, transactions, expected,
                           size or len(transactions), describe, parallelism)
        for size in sizes
    }
    first, *others = sizes
    for size in others:
        for name in outputs:
            got, want = streams[size][name], streams[first][name]
            assert same_multiset(got, want), (
                f"output {name}: the stream at batch size {size or 'all'} differs from the one "
                f"at batch size {first or 'all'} as (time, diff, *row):\n"
                f"{multiset_diff(got, want)}\n{describe(name)}"
            )


def _checked_batch(table: pa.Table, columns: Columns, times: range, where: str
                   ) -> list[tuple[Row, int, int]]:
    want_schema = [(n, ColumnType.parse(t).arrow) for n, t in columns] + [(TIME, pa.int64()),
                                                                (DIFF, pa.int64())]
    got_schema = [(f.name, f.type) for f in table.schema]
    assert got_schema == want_schema, f"{where}: schema {got_schema}, expected {want_schema}"
    names = [n for n, _ in columns]
    rows = [(tuple(rec[n] for n in names), rec[TIME], rec[DIFF])
            for rec in table.to_pylist()]
    assert all(d != 0 for _, _, d in rows), f"{where}: a change with diff 0"
    dupes = [k for k, n in Counter((row, t) for row, t, _ in rows).items() if n > 1]
    assert not dupes, f"{where}: not consolidated, (row, time) repeated: {dupes[:5]}"
    assert all(t in times for _, t, _ in rows), (
        f"{where}: times {sorted({t for _, t, _ in rows})} outside the batch")
    assert [t for _, t, _ in rows] == sorted(t for _, t, _ in rows), f"{where}: not sorted by time"
    return rows
