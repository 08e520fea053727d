"""Live tables over Arrow Flight, client and server in this process over real gRPC on
loopback: a subscriber's mirror equals the served table as of every transaction (a validator
in the manner of Deephaven's TableUpdateValidator), on random transactions; bearer tokens;
a slow subscriber gets a fresh snapshot instead of the updates it missed."""

from __future__ import annotations

import random
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from txstream.client import LiveClient, LiveClientError
from txstream.sinks.live.flight import LiveFlightServer
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.live.table import LiveTable
from txstream.updates import Mirror, TableUpdate, same_rows
from txstream.viewports import Viewport

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("qty", pa.int64())])
TOKEN = "s3cret"


def changes(rows: list[tuple[tuple[int, str, int], int]], t: int) -> pa.Table:
    return pa.table({"k": [r[0] for r, _ in rows], "name": [r[1] for r, _ in rows],
                     "qty": [r[2] for r, _ in rows], "time": [t] * len(rows),
                     "diff": [d for _, d in rows]})


def random_transactions(seed: int, n: int) -> Iterator[pa.Table]:
    rng = random.Random(seed)
    state: dict[int, tuple[int, str, int]] = {}
    for t in range(1, n + 1):
        batch: list[tuple[tuple[int, str, int], int]] = []
        for k in rng.sample(range(200), rng.randrange(1, 30)):
            new = (k, rng.choice("abc"), rng.randrange(5))
            if k in state and rng.random() < 0.3:
                batch.append((state.pop(k), -1))
            elif k in state and new != state[k]:
                batch += [(state[k], -1), (new, 1)]
                state[k] = new
            elif k not in state:
                batch.append((new, 1))
                state[k] = new
        yield changes(batch, t)


@pytest.fixture
def served() -> Iterator[tuple[LiveTables, str]]:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"], spacing=2)}, capacity=1000)
    server = LiveFlightServer(tables, "127.0.0.1", 0, token=TOKEN)
    try:
        yield tables, f"grpc+tcp://127.0.0.1:{server.port}"
    finally:
        tables.close()
        server.shutdown()


def test_a_subscriber_mirrors_the_table_at_every_transaction(
    served: tuple[LiveTables, str],
) -> None:
    tables, location = served
    client = LiveClient(location, token=TOKEN)
    assert client.tables() == ["t"]
    expected: dict[int, pa.Table] = {0: tables.snapshot("t").rows}
    checked: list[int] = []
    failures: list[str] = []
    subscription = client.subscribe("t")
    first = next(subscription)
    assert first.snapshot and first.transaction == 0

    def validate() -> None:
        for update in subscription:
            rows = subscription.mirror.rows()
            if not same_rows(rows, expected[update.transaction]):
                failures.append(f"transaction {update.transaction}: mirror differs")
            checked.append(update.transaction)
            if update.transaction == 80:
                return

    reader = threading.Thread(target=validate)
    reader.start()
    # The server's table as of each transaction, from a twin applying the same changes (keys
    # are allocated deterministically), recorded before publishing: the reader may see the
    # update at once.
    twin = LiveTable("t", SCHEMA, ["k"], spacing=2)
    shifts = 0
    for t, batch in enumerate(random_transactions(3, 80), start=1):
        twin.apply(batch, t)
        expected[t] = twin.snapshot().rows
        update: TableUpdate = tables.publish("t", batch)[0]
        assert same_rows(tables.snapshot("t").rows, expected[t])
        shifts += len(update.shifts)
    reader.join(timeout=60)
    subscription.close()
    assert not reader.is_alive()
    assert not failures
    assert checked == list(range(1, 81))
    assert shifts  # spacing 2: gaps run out
    rows, transaction = client.snapshot("t")
    assert transaction == 80 and same_rows(rows, expected[80])


def by_qty_descending(tables: LiveTables, viewport: Viewport) -> list[dict[str, object]]:
    """The served rows at `viewport`'s positions, sorted here by qty (largest first) then k."""
    rows = sorted(tables.snapshot("t").rows.drop_columns(["__row_key"]).to_pylist(),
                  key=lambda r: (-r["qty"], r["k"]))
    return rows[viewport.first:viewport.last + 1]


def test_a_viewport_subscription_follows_its_positions_as_they_move(
    served: tuple[LiveTables, str],
) -> None:
    tables, location = served
    client = LiveClient(location, token=TOKEN)
    with client.subscribe("t", Viewport.of(0, 9, [("qty", "desc")])) as subscription:
        assert next(subscription).snapshot
        for t, batch in enumerate(random_transactions(5, 40), start=1):
            tables.publish("t", batch)
            assert next(subscription).transaction == t
            assert subscription.viewport is not None
            assert subscription.mirror.table.to_pylist() == by_qty_descending(
                tables, subscription.viewport), f"transaction {t}"
            if t % 4 == 0:  # scroll down, then back up
                first = t * 2 if t % 8 else 0
                subscription.move(first, first + 9)
                moved = next(subscription)
                assert moved.transaction == t and not moved.snapshot and moved.first == first
                assert subscription.mirror.table.to_pylist() == by_qty_descending(
                    tables, subscription.viewport), f"move at transaction {t}"
    seen: list[int] = []
    top = {40: by_qty_descending(tables, Viewport.of(0, 4))}

    def check(update: TableUpdate, mirror: Mirror) -> None:  # called back per transaction
        seen.append(update.transaction)
        assert mirror.table.to_pylist() == top[update.transaction]
        if update.transaction == 41:
            subscription.close()

    with client.subscribe("t", Viewport.of(0, 4, [("qty", "desc")])) as subscription:
        check(next(subscription), subscription.mirror)  # subscribed: the snapshot came
        row = tables.snapshot("t").rows.to_pylist()[-1]  # to the top: qty is at most 4
        k, name, qty = row["k"], row["name"], row["qty"]
        tables.publish("t", changes([((k, name, qty), -1), ((k, name, qty + 10), 1)], 41))
        top[41] = by_qty_descending(tables, Viewport.of(0, 4))
        assert top[41][0]["k"] == k
        subscription.run(check)
    assert seen == [40, 41]
    viewport = Viewport.of(3, 5, [("qty", "desc")])
    rows, transaction = client.snapshot("t", viewport)
    assert transaction == 41
    assert rows.drop_columns(["__row_key"]).to_pylist() == by_qty_descending(tables, viewport)
    with pytest.raises(LiveClientError, match="no column"):
        client.snapshot("t", Viewport.of(0, 1, [("price", "asc")]))
    with pytest.raises(LiveClientError, match="to the whole table"):
        client.subscribe("t").move(0, 1)


def test_calls_without_the_token_are_refused(served: tuple[LiveTables, str]) -> None:
    _, location = served
    for token in (None, "wrong"):
        client = LiveClient(location, token=token)
        with pytest.raises(LiveClientError, match="bearer token"):
            client.tables()
        with pytest.raises(LiveClientError, match="bearer token"):
            client.snapshot("t")


def test_an_unknown_table_is_named_with_the_served_ones(served: tuple[LiveTables, str]) -> None:
    _, location = served
    with pytest.raises(LiveClientError, match="no live table 'nope'; served: t"):
        LiveClient(location, token=TOKEN).snapshot("nope")


def test_an_overflowing_queue_is_replaced_by_a_fresh_snapshot() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])}, capacity=3)
    served = tables.served("t")
    snapshot, subscriber = tables.subscribe("t")
    assert snapshot.snapshot and snapshot.transaction == 0
    batches = list(random_transactions(7, 21))
    for batch in batches[:2]:  # within capacity: queued as they are
        tables.publish("t", batch)
    assert [u.transaction for u in (subscriber.next(served, 0), subscriber.next(served, 0))
            if u is not None] == [1, 2]
    for batch in batches[2:20]:  # the subscriber reads none of these
        tables.publish("t", batch)
    update = subscriber.next(served, 0)
    assert update is not None and update.snapshot and update.transaction == 20
    assert same_rows(update.rows, tables.snapshot("t").rows)
    assert subscriber.next(served, 0) is None and subscriber.resyncs == 1
    tables.publish("t", batches[20])
    update = subscriber.next(served, 0)
    assert update is not None and update.transaction == 21 and not update.snapshot


def test_a_subscriber_that_does_not_read_never_holds_up_publishing() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])}, capacity=3)
    server = LiveFlightServer(tables, "127.0.0.1", 0)
    try:
        client = LiveClient(f"grpc+tcp://127.0.0.1:{server.port}")
        with client.subscribe("t") as subscription:
            assert next(subscription).snapshot
            for t in range(1, 201):  # ~100 KB each: more than the transport buffers
                tables.publish("t", changes([((t * 1000 + i, "x" * 90, t), 1)
                                             for i in range(1000)], t))
            for update in subscription:
                if update.transaction == 200:
                    break
            assert same_rows(subscription.mirror.rows(), tables.snapshot("t").rows)
    finally:
        tables.close()
        server.shutdown()


def test_shutting_down_ends_open_subscriptions() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])})
    server = LiveFlightServer(tables, "127.0.0.1", 0)
    subscription = LiveClient(f"grpc+tcp://127.0.0.1:{server.port}").subscribe("t")
    assert next(subscription).snapshot
    stopping = threading.Thread(target=server.shutdown)
    stopping.start()
    stopping.join(10)
    assert not stopping.is_alive(), "shutdown waited for the subscription"
    assert list(subscription) == []  # the stream ended


def test_tls_with_the_servers_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])})
    tables.publish("t", changes([((1, "a", 1), 1)], 1))
    server = LiveFlightServer(tables, "localhost", 0, token=TOKEN,
                              tls=(cert.read_bytes(), key.read_bytes()))
    try:
        secure = LiveClient(f"grpc+tls://localhost:{server.port}", token=TOKEN,
                            tls_root_certs=cert.read_bytes())
        rows, transaction = secure.snapshot("t")
        assert transaction == 1 and rows.column("k").to_pylist() == [1]
        with pytest.raises(LiveClientError):
            LiveClient(f"grpc+tcp://localhost:{server.port}", token=TOKEN).snapshot("t")
    finally:
        server.shutdown()
