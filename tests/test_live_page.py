"""The live table page (`/ui`), in a real browser (headless Chromium over the DevTools
protocol, tests/chromium.py): it lists the live tables, shows a viewport of one, shows a
changed row when a transaction changes it (the row flashes), moves its viewport when scrolled,
sorts by a clicked column, and is refused without the live token, also before the tables are
attached. Screenshots are saved in the test's temporary directory. Last, the page fed by the
running service from Kafka."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from support.chromium import Browser
from support.orders import OrderProducer, expected_tables
from support.runner import Background, example_config

from txstream.changes import DIFF, TIME
from txstream.schemas.config import SinkConfig
from txstream.service.compose import open_runner
from txstream.service.health import HealthServer, Readiness
from txstream.service.metrics import Metrics
from txstream.sinks.live.page import message
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.live.table import LiveTable
from txstream.viewports import Viewport

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("qty", pa.int64())])
TOKEN = "pa+9e/="  # base64's characters: a `+` must survive the query string
ROWS_SHOWN = "[...document.querySelectorAll('#grid .row')].map(r => r.innerText)"


def changes(rows: list[tuple[tuple[int, str, int], int]], t: int) -> pa.Table:
    return pa.table({"k": [r[0] for r, _ in rows], "name": [r[1] for r, _ in rows],
                     "qty": [r[2] for r, _ in rows], TIME: [t] * len(rows),
                     DIFF: [d for _, d in rows]})


@pytest.fixture
def page(tmp_path: Path) -> Iterator[tuple[LiveTables, str, Browser]]:
    wide = pa.schema([("id", pa.int64()), *[(f"c{i}", pa.int64()) for i in range(4)]])
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"]), "u": LiveTable("u", wide, ["id"])})
    tables.publish("t", changes([((k, f"row{k}", k % 7), 1) for k in range(500)], 1))
    tables.publish("u", pa.table({"id": [1, 2], **{f"c{i}": [i, 2**60 + i] for i in range(4)},
                                  TIME: [1, 1], DIFF: [1, 1]}))
    health = HealthServer(0, Metrics(), Readiness(1000), "127.0.0.1", page_token=TOKEN).start()
    health.serve_live(tables)
    browser = Browser(tmp_path / "profile")
    try:
        yield tables, f"http://127.0.0.1:{health.port}", browser
    finally:
        browser.close()
        tables.close()
        health.stop()


def test_the_page_shows_changes_scrolls_and_sorts(page: tuple[LiveTables, str, Browser],
                                                   tmp_path: Path) -> None:
    tables, base, browser = page
    browser.open(f"{base}/ui?token={urllib.parse.quote(TOKEN, safe='')}#t")
    shown = browser.wait_for(f"{ROWS_SHOWN}.length >= 20 && {ROWS_SHOWN}")
    assert shown[0].split() == ["0", "row0", "0"]
    assert "last transaction" in browser.evaluate("document.body.innerText")
    assert "token" not in browser.evaluate("location.href")  # kept in the cookie only

    tables.publish("t", changes([((3, "row3", 3), -1), ((3, "changed!", 3), 1)], 2))
    browser.wait_for(f"{ROWS_SHOWN}.some(r => r.includes('changed!'))")
    assert "transaction #2" in browser.evaluate("document.getElementById('info').innerText")
    browser.screenshot(tmp_path / "changed.png")

    browser.evaluate("document.getElementById('grid').scrollTop = 300 * 24")
    rows = browser.wait_for(f"{ROWS_SHOWN}.some(r => r.startsWith('300')) && {ROWS_SHOWN}")
    assert not any(r.split()[0] == "0" for r in rows), "the viewport moved away from the top"

    tables.publish("t", changes([((301, "row301", 301 % 7), -1),
                                 ((301, "seen after scrolling", 1), 1)], 3))
    browser.wait_for(f"{ROWS_SHOWN}.some(r => r.includes('seen after scrolling'))")

    browser.evaluate("document.getElementById('grid').scrollTop = 0; "
                     "[...document.querySelectorAll('#head span')]"
                     ".find(s => s.innerText.startsWith('qty')).click()")
    # Largest qty first (6, as k % 7 is at most 6), ties by key.
    top = browser.wait_for(f"{ROWS_SHOWN}[0] === '6\\nrow6\\n6' && {ROWS_SHOWN}")
    assert [r.split()[-1] for r in top[:20]] == ["6"] * 20
    assert "qty ▼" in browser.evaluate("document.getElementById('head').innerText")
    shot = browser.screenshot(tmp_path / "sorted.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Another table, with more columns: its rows have its cells, none of the first table's.
    browser.evaluate("document.querySelector('nav a[data-table=\"u\"]').click()")
    rows = browser.wait_for(f"{ROWS_SHOWN}.length === 2 && {ROWS_SHOWN}")
    assert rows[1].split() == ["2", *[str(2**60 + i) for i in range(4)]]  # exact, past 2^53
    widths = browser.evaluate("[...document.querySelectorAll('#grid .row')]"
                              ".map(r => r.style.gridTemplateColumns)")
    assert all(w.startswith("repeat(5") for w in widths)


def test_the_page_needs_the_live_token(page: tuple[LiveTables, str, Browser]) -> None:
    _, base, _ = page
    for path in ("/ui", "/ui/tables", "/ui/events?table=t", "/ui?token=pa%209e/="):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + path, timeout=5)
        assert refused.value.code == 401
    request = urllib.request.Request(base + "/ui/tables",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert b'"name": "t"' in reply.read()
    with urllib.request.urlopen(f"{base}/ui?token={TOKEN}", timeout=5) as reply:  # a raw `+`
        assert reply.status == 200 and "HttpOnly" in reply.headers["Set-Cookie"]


def test_update_messages_keep_large_integers_exact() -> None:
    tables = LiveTables({"t": LiveTable("t", SCHEMA, ["k"])})
    tables.publish("t", changes([((2**60, "big", 2**53 + 1), 1), ((1, "small", 7), 1)], 1))
    snapshot, _ = tables.subscribe("t", Viewport.of(0, 9))
    rows = message(snapshot)["rows"]
    assert [(r["k"], r["qty"]) for r in rows] == [(1, 7), (str(2**60), str(2**53 + 1))]


def test_the_page_needs_the_token_before_the_tables_are_attached() -> None:
    """While the service starts (no live tables yet) the page shows only the status, and only
    to those who give the token: it refuses like every other `/ui` path."""
    health = HealthServer(0, Metrics(), Readiness(1000), "127.0.0.1", page_token=TOKEN).start()
    base = f"http://127.0.0.1:{health.port}"
    try:
        for path in ("/ui", "/ui/tables", "/ui/events?table=t", "/ui/elsewhere"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=5)
            assert refused.value.code == 401, path
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(base + "/ui/move?table=t",
                                                          method="POST"), timeout=5)
        assert refused.value.code == 401
        request = urllib.request.Request(base + "/ui/tables",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            listing = json.loads(reply.read())
        assert listing == {"tables": [], "status": {
            "ready": False, "problems": ["starting"], "last_transaction": 0,
            "lag_records": 0, "events": 0}}
    finally:
        health.stop()


def test_the_live_table_page_shows_a_produced_change_in_a_browser(  # type: ignore[no-untyped-def]
    kafka, postgres, spark, pg_schema, topics, topic_name, tmp_path
) -> None:
    """The service's /ui in headless Chromium: events produced to Kafka reach the rows the page
    shows (those of the first viewport, compared with the from-scratch result), and a
    screenshot is saved."""
    config = example_config(kafka.bootstrap_servers, postgres.url, pg_schema, topics,
                            f"g-{topic_name}", tmp_path / "ck")
    config = config.model_copy(update={"sinks": [
        *config.sinks, SinkConfig.model_validate({"output": "customer_stats", "kind": "live"})]})
    producer = OrderProducer(kafka.bootstrap_servers, topics)
    producer.send(150)
    runner = open_runner(config, spark=spark)
    assert runner.live is not None
    health = HealthServer(0, runner.metrics, runner.readiness, "127.0.0.1").start()
    health.serve_live(runner.live)
    browser = Browser(tmp_path / "profile")
    shown = "[...document.querySelectorAll('#grid .row')].map(r => r.innerText.split('\\n'))"

    def page_matches() -> Callable[[], bool]:
        """Whether the page shows the from-scratch rows of the customers it shows."""
        want = {(str(cid), name, str(n), Decimal(total))
                for cid, name, n, total in expected_tables(producer.world)["customer_stats"]}

        def check() -> bool:
            rows = browser.evaluate(shown) or []
            return bool(rows) and all((cid, name, n, Decimal(total)) in want
                                      for cid, name, n, total in rows)
        return check

    try:
        with Background(runner) as loop:
            loop.wait("all events committed", loop.drained(150))
            browser.open(f"http://127.0.0.1:{health.port}/ui")
            loop.wait("the page shows the table", page_matches(), timeout=60)
            before = {tuple(r) for r in browser.evaluate(shown)}
            producer.send(60)
            loop.wait("the page shows the new rows", page_matches(), timeout=60)
            after = {tuple(r) for r in browser.evaluate(shown)}
            assert after != before, "the events changed rows the page shows"
            shot = browser.screenshot(tmp_path / "live_page.png")
            assert shot.stat().st_size > 1000
    finally:
        browser.close()
        health.stop()
        runner.close()
