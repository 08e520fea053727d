"""An as-of join under a temporal behavior through the engine: state that stays bounded.

Workload: bench/temporal.py's page views (`--events`, default 2M, over a simulated day, `--late`
of them 2 to 30 minutes behind), each view of one of `--products` products (default 1,000),
and a price table: every product gets a new price every `--price-every` minutes (default 10),
each inserted in the transaction whose views first reach its `valid_from`. Transactions of
`--per-transaction` events (default 10,000), `--per-batch` of them per engine call (default
10). Two pipelines on the same input, each on a fresh engine, each every view priced as of its
time (`views.asof_join(prices, "ts", "valid_from", on="product_id", how="left")`):

* `behavior`: under `common_behavior(cutoff=--cutoff minutes)` (default 10), and the views'
  late rows as an output too;
* `no_behavior`: the same join without one.

Measured per pipeline: events/s through the engine (Arrow in, consolidated changes out); after
the first `--first` events (default 200,000) and at the end, the rows every state holds
(`Engine.state_rows`) and the JVM's heap in use after a full GC (as bench/temporal.py). Checked
with numpy: the integrated output is each view not late (under the behavior: its time plus the
cutoff above the views' clock before its transaction) once, with the price whose `valid_from`
is the latest at or before its time, and the late rows counted are those numpy finds late.

Prints one JSON object; progress on stderr.

    .venv/bin/python bench/temporal_joins.py [--events 2000000] [--first 200000]
        [--products 1000] [--price-every 10] [--cutoff 10] [--late 0.01]
        [--per-transaction 10000] [--per-batch 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from txstream.changes import DIFF, TIME, Changes
from txstream.engine import Engine, Pipeline
from txstream.engine import temporal as t
from txstream.schemas.tables import TableSchema
from txstream.service.spark import get_spark

# A sibling script, not a package: its workload and samples (as `python bench/...` runs it,
# and whatever the working directory).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from temporal import DAY, DAY_US, MINUTE_US, growth, page_views, sample, transactions_of

VIEWS = TableSchema.of({"view_id": "bigint", "product_id": "bigint", "ts": "timestamp"},
                       primary_key=["view_id"])
PRICES = TableSchema.of({"pid": "bigint", "product_id": "bigint", "valid_from": "timestamp",
                         "price": "bigint"}, primary_key=["pid"])


def prices(products: int, every_us: int, seed: int = 2) -> dict[str, np.ndarray]:
    """Each product's price versions over the day, `every_us` apart (each product's own
    offset), valid from the day's start."""
    rng = np.random.default_rng(seed)
    start = int((DAY - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    versions = DAY_US // every_us + 1
    product = np.repeat(np.arange(products, dtype=np.int64), versions)
    offset = np.repeat(rng.integers(0, every_us, products), versions)
    k = np.tile(np.arange(versions, dtype=np.int64), products)
    valid = start + np.where(k == 0, 0, offset + (k - 1) * every_us)
    order = np.argsort(valid, kind="stable")
    return {"pid": np.arange(len(valid), dtype=np.int64), "product_id": product[order],
            "valid_from": valid[order], "price": rng.integers(1, 100, len(valid))}


def pipeline(cutoff_min: int | None) -> Pipeline:
    p = Pipeline()
    views, priced = p.source("views", VIEWS), p.source("prices", PRICES)
    behavior = (t.common_behavior(cutoff=timedelta(minutes=cutoff_min))
                if cutoff_min is not None else None)
    joined = views.asof_join(priced, "ts", "valid_from", on="product_id", how="left",
                             behavior=behavior)
    p.output("priced", joined.select("view_id", "pid"))
    if behavior is not None:
        p.output("late_views", joined.late_rows("left"))
    return p


def expected(views: dict[str, np.ndarray], table: dict[str, np.ndarray], transaction: np.ndarray,
             cutoff_us: int | None) -> tuple[dict[int, int], int]:
    """{view_id: its price's pid} for the views not late, and the number late: a view is late
    when its time plus the cutoff is at or below the largest time of the transactions before
    its own."""
    peaks = np.maximum.accumulate(
        np.maximum.reduceat(views["ts"], np.flatnonzero(np.diff(transaction, prepend=0))))
    before = np.concatenate([[np.iinfo(np.int64).min], peaks])[transaction - 1]
    late = (views["ts"] + cutoff_us <= before) if cutoff_us is not None \
        else np.zeros(len(transaction), bool)
    pid = np.full(len(transaction), -1, dtype=np.int64)
    for product in np.unique(views["user_id"]):
        mine = table["product_id"] == product
        times, ids = table["valid_from"][mine], table["pid"][mine]
        seen = views["user_id"] == product
        at = np.searchsorted(times, views["ts"][seen], side="right") - 1
        pid[seen] = np.where(at >= 0, ids[np.maximum(at, 0)], -1)
    kept = ~late
    return dict(zip(views["view_id"][kept].tolist(), pid[kept].tolist(), strict=True)), \
        int(late.sum())


def run(spark: SparkSession, name: str, views: dict[str, np.ndarray],
        table: dict[str, np.ndarray], args: argparse.Namespace) -> dict[str, Any]:
    cutoff = args.cutoff if name == "behavior" else None
    engine = Engine(pipeline(cutoff), spark)
    events = len(views["ts"])
    transaction = transactions_of(events, args.per_transaction)
    # A price is inserted in the first transaction whose views reach its time.
    peaks = np.maximum.accumulate(
        np.maximum.reduceat(views["ts"], np.arange(0, events, args.per_transaction)))
    price_tx = np.minimum(np.searchsorted(peaks, table["valid_from"]) + 1, transaction[-1])
    stamp = pa.timestamp("us", tz="UTC")
    view_rows = pa.table({"view_id": views["view_id"], "product_id": views["user_id"],
                          "ts": pa.array(views["ts"], stamp), TIME: transaction,
                          DIFF: np.ones(events, dtype=np.int64)},
                         schema=VIEWS.arrow_schema(with_changes=True))
    price_rows = pa.table({"pid": table["pid"], "product_id": table["product_id"],
                           "valid_from": pa.array(table["valid_from"], stamp),
                           "price": table["price"], TIME: price_tx,
                           DIFF: np.ones(len(price_tx), dtype=np.int64)},
                          schema=PRICES.arrow_schema(with_changes=True))
    rows = args.per_transaction * args.per_batch
    got: dict[int, int] = {}
    samples: list[dict[str, Any]] = []
    computing, done = 0.0, 0
    for lo in range(0, events, rows):
        chunk = view_rows.slice(lo, rows)
        first, last = transaction[lo], transaction[min(lo + rows, events) - 1]
        these = np.flatnonzero((price_tx >= first) & (price_tx <= last))
        started = time.perf_counter()
        out = engine.process({"views": Changes(chunk),
                              "prices": Changes(price_rows.take(these))})
        computing += time.perf_counter() - started
        for row in out["priced"].table.to_pylist():
            view, pid = row["view_id"], -1 if row["pid"] is None else row["pid"]
            if row[DIFF] > 0:
                got[view] = pid
            elif got.get(view) == pid:
                del got[view]
        done += chunk.num_rows
        if done in (min(args.first, events), events):
            samples.append(sample(spark, engine, name, done, computing))
    want, late = expected(views, table, transaction,
                          cutoff * MINUTE_US if cutoff is not None else None)
    assert got == want, f"{name}: {len(got)} views priced, {len(want)} expected"
    assert sum(engine.late_rows.values()) == late, (engine.late_rows, late)
    return {"events": events, "prices": len(table["pid"]), "seconds": round(computing, 2),
            "events_per_s": round(events / computing), "late_rows": late, **growth(samples),
            "verified": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--first", type=int, default=200_000)
    parser.add_argument("--products", type=int, default=1_000)
    parser.add_argument("--price-every", type=int, default=10, help="minutes")
    parser.add_argument("--cutoff", type=int, default=10, help="minutes")
    parser.add_argument("--late", type=float, default=0.01)
    parser.add_argument("--per-transaction", type=int, default=10_000)
    parser.add_argument("--per-batch", type=int, default=10)
    args = parser.parse_args()
    views = page_views(args.events, args.products, args.late)
    table = prices(args.products, args.price_every * MINUTE_US)
    spark = get_spark()
    results = {name: run(spark, name, views, table, args)
               for name in ("behavior", "no_behavior")}
    print(json.dumps({"workload": vars(args),
                      "date": datetime.now(UTC).isoformat(timespec="seconds"), **results,
                      "speed_ratio": round(results["behavior"]["events_per_s"]
                                           / results["no_behavior"]["events_per_s"], 2)},
                     indent=1))


if __name__ == "__main__":
    main()
