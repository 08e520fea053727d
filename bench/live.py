"""Live tables over Arrow Flight: a 1M-row keyed table changing by 1,000 rows per transaction
(500 balances raised by one, 250 rows deleted, 250 inserted), served to 1, 10 and 100
subscribers of the whole table, and of a 50-row viewport (the 50 largest balances: a sorted
view that the changes keep reordering). Prints one JSON object with, per run:

* `updates_per_s`: updates delivered (summed over subscribers) per second of publishing and
  delivering `--transactions` transactions, the snapshots already received;
* `latency_ms` p50/p99: from the start of a transaction's publish (the server applying it)
  to a subscriber having read the whole update;
* `publish_ms` p50: the server applying one transaction and queueing its update;
* `bytes_per_update`: Arrow body and metadata of one update, per subscriber;
* `snapshot_s`: the subscribers' snapshots (1M rows each for the whole table), taken one
  subscriber after the other before the clock starts.

Subscribers are threads of a child process reading the raw Flight stream (no mirror: the
client's `Mirror.apply` costs about 0.02 s per update at 1M rows, which would measure the
client); one extra subscriber in this process (of the same table or viewport) keeps a mirror
and checks it at the end against the table (or its sort, sliced).

    .venv/bin/python bench/live.py [--rows 1000000] [--transactions 50] [--subscribers 1,10,100]
        [--modes whole,viewport]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from txstream.client import LiveClient
from txstream.sinks.live.flight import LiveFlightServer
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.live.table import LiveTable
from txstream.updates import same_rows
from txstream.viewports import Viewport
from txstream.wire import chunks_of

SCHEMA = pa.schema([("id", pa.int64()), ("account", pa.string()), ("balance", pa.int64())])
CHANGES = 1_000
VIEWPORT = Viewport.of(0, 49, [("balance", "desc")])


def subscribers(location: str, count: int, transactions: int, viewport: Viewport | None,
                pipe: Connection) -> None:
    """`count` raw readers sharing one connection; sends (snapshot seconds, receipts per
    transaction, bytes), or an error."""
    received: list[dict[int, float]] = [{} for _ in range(count)]
    sizes: list[int] = []
    errors: list[str] = []
    snapshotted = threading.Semaphore(0)
    client = flight.FlightClient(location)
    request: dict[str, object] = {"table": "accounts", "mode": "subscribe"}
    if viewport is not None:
        request["viewport"] = viewport.to_json()

    def read(i: int) -> None:
        try:
            follow(i)
        except BaseException as exc:
            errors.append(f"subscriber {i}: {exc!r}")
            snapshotted.release()

    def follow(i: int) -> None:
        reader = client.do_get(flight.Ticket(json.dumps(request).encode()))
        first = True
        while True:
            chunk = reader.read_chunk()
            head = json.loads(chunk.app_metadata.to_pybytes())
            size = chunk.data.nbytes + len(chunk.app_metadata.to_pybytes())
            for _ in range(chunks_of(chunk.app_metadata.to_pybytes()) - 1):
                size += reader.read_chunk().data.nbytes
            if first:
                first = False
                snapshotted.release()
                continue
            received[i][head["transaction"]] = time.time()
            if i == 0:
                sizes.append(size)
            if head["transaction"] == transactions + 1:
                return

    threads = [threading.Thread(target=read, args=(i,)) for i in range(count)]
    started = time.monotonic()
    for t in threads:  # one snapshot at a time: 100 of 1M rows at once need GBs in flight
        t.start()
        snapshotted.acquire()
        if errors:
            pipe.send(("error", errors))
            return
    pipe.send(time.monotonic() - started)
    for t in threads:
        t.join()
    pipe.send(("error", errors) if errors else (received, sizes))


def receive(pipe: Connection, child: multiprocessing.process.BaseProcess) -> object:
    """The child's next report; fails if it reported an error or died."""
    while not pipe.poll(1):
        if not child.is_alive():
            raise SystemExit(f"the subscribers' process exited (code {child.exitcode})")
    message = pipe.recv()
    if isinstance(message, tuple) and message[0] == "error":
        raise SystemExit(f"subscribers failed: {message[1][:3]}")
    return message


def transaction(table: LiveTable, rng: np.random.Generator, t: int, rows: int) -> pa.Table:
    ids = table.table.column("id").to_numpy()
    picked = np.sort(rng.choice(len(ids), CHANGES * 3 // 4, replace=False))
    updated, deleted = picked[: CHANGES // 2], picked[CHANGES // 2:]
    old = table.table.take(pa.array(updated))
    new = old.set_column(2, "balance", pa.array(old.column("balance").to_numpy() + 1))
    gone = table.table.take(pa.array(deleted))
    fresh = np.arange(CHANGES // 4) + rows * 2 + t * CHANGES  # never used before
    born = pa.table({"id": fresh, "account": [f"a{i}" for i in fresh],
                     "balance": np.zeros(len(fresh), dtype=np.int64)})

    def tagged(part: pa.Table, diff: int) -> pa.Table:
        return part.append_column("time", pa.array(np.full(part.num_rows, t))).append_column(
            "diff", pa.array(np.full(part.num_rows, diff)))

    return pa.concat_tables([tagged(old, -1), tagged(new, 1), tagged(gone, -1),
                             tagged(born, 1)])


def loaded(rows: int) -> LiveTable:
    table = LiveTable("accounts", SCHEMA, ["id"])
    ids = np.arange(rows, dtype=np.int64) * 2
    table.apply(pa.table({"id": ids, "account": [f"a{i}" for i in ids],
                          "balance": np.zeros(rows, dtype=np.int64),
                          "time": np.ones(rows, dtype=np.int64),
                          "diff": np.ones(rows, dtype=np.int64)}), 1)
    return table


def run(rows: int, transactions: int, count: int, viewport: Viewport | None
        ) -> dict[str, object]:
    print(f"live: {count} subscriber(s) of {'a viewport' if viewport else 'the table'}, "
          f"{rows:,} rows, {transactions} transactions", file=sys.stderr, flush=True)
    # The transactions are made beforehand (on a twin of the table): the clock times
    # publishing and delivering only.
    twin, rng = loaded(rows), np.random.default_rng(7)
    batches = []
    for t in range(2, transactions + 2):
        batches.append(transaction(twin, rng, t, rows))
        twin.apply(batches[-1], t)
    del twin
    table = loaded(rows)
    tables = LiveTables({"accounts": table}, capacity=transactions + 10)
    server = LiveFlightServer(tables, "127.0.0.1", 0)
    location = f"grpc+tcp://127.0.0.1:{server.port}"
    try:
        checker = LiveClient(location).subscribe("accounts", viewport)
        next(checker)
        ours, theirs = multiprocessing.get_context("spawn").Pipe()
        child = multiprocessing.get_context("spawn").Process(
            target=subscribers, args=(location, count, transactions, viewport, theirs))
        child.start()
        snapshot_s = receive(ours, child)
        published: dict[int, float] = {}
        publish_s: list[float] = []
        started = time.monotonic()
        for t, changes in enumerate(batches, start=2):
            published[t] = time.time()
            tables.publish("accounts", changes)
            publish_s.append(time.time() - published[t])
        received, sizes = receive(ours, child)  # type: ignore[misc]
        elapsed = time.monotonic() - started
        child.join()
        for _ in range(transactions):
            next(checker)
        final = tables.snapshot("accounts").rows
        if viewport is not None:  # the 50 largest balances, ties by id
            final = final.sort_by([("balance", "descending"), ("id", "ascending")]).slice(
                viewport.first, viewport.last - viewport.first + 1)
            assert same_rows(checker.mirror.table, final.drop_columns(["__row_key"]))
        else:
            assert same_rows(checker.mirror.rows(), final)
        checker.close()
    finally:
        server.shutdown()
    latencies = sorted((r[t] - published[t]) * 1000 for r in received for t in published)
    return {"subscribers": count, "viewport": viewport.to_json() if viewport else None,
            "snapshot_s": round(snapshot_s, 2),
            "updates_per_s": round(count * transactions / elapsed),
            "latency_ms": {"p50": round(statistics.median(latencies), 1),
                           "p99": round(latencies[int(len(latencies) * 0.99) - 1], 1)},
            "publish_ms_p50": round(statistics.median(publish_s) * 1000, 1),
            "bytes_per_update": round(statistics.mean(sizes))}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--transactions", type=int, default=50)
    parser.add_argument("--subscribers", default="1,10,100")
    parser.add_argument("--modes", default="whole,viewport")
    args = parser.parse_args()
    modes = {"whole": None, "viewport": VIEWPORT}
    print(json.dumps({
        "rows": args.rows, "changes_per_transaction": CHANGES,
        "runs": [run(args.rows, args.transactions, int(n), modes[mode])
                 for mode in args.modes.split(",") for n in args.subscribers.split(",")]},
        indent=2))
