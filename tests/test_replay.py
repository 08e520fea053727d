"""`txstream replay`: change log in, output changes out, batch size irrelevant to the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txstream.service.cli import main
from txstream.service.pipelines import load_pipeline
from txstream.service.replay import ReplayInputError, read_batches

LOG = [
    {"source": "customers", "time": 1, "diff": 1,
     "row": {"customer_id": 1, "name": "Ann", "region": "eu"}},
    {"source": "orders", "time": 1, "diff": 1,
     "row": {"order_id": 10, "customer_id": 1, "amount": 5.0, "status": "paid"}},
    {"source": "orders", "time": 2, "diff": 1,
     "row": {"order_id": 11, "customer_id": 1, "amount": "7.10", "status": "paid"}},
    # An update: -1 old, +1 new, one time.
    {"source": "orders", "time": 3, "diff": -1,
     "row": {"order_id": 10, "customer_id": 1, "amount": 5.0, "status": "paid"}},
    {"source": "orders", "time": 3, "diff": 1,
     "row": {"order_id": 10, "customer_id": 1, "amount": 5.0, "status": "refunded"}},
]


def _write(path: Path, lines: list[dict]) -> Path:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _replay(tmp_path: Path, batch: int) -> list[dict]:  # type: ignore[type-arg]
    src = _write(tmp_path / "in.jsonl", LOG)
    out = tmp_path / f"out-{batch}.jsonl"
    assert main(["replay", "txstream.examples.orders:pipeline", "--input", str(src), "--output",
                 str(out), "--batch-transactions", str(batch)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_replay_outputs_and_batch_invariance(tmp_path: Path, spark) -> None:  # type: ignore[no-untyped-def]
    one = _replay(tmp_path, 1)
    everything = _replay(tmp_path, 100)
    key = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731
    assert sorted(one, key=key) == sorted(everything, key=key)
    region = [(c["time"], c["diff"], c["row"]) for c in one if c["table"] == "region_totals"]
    eu = {"region": "eu"}
    # Amounts are decimal(12,2): exact, written as strings with their two places.
    assert region == [
        (1, 1, {**eu, "orders": 1, "revenue": "5.00", "min_amount": "5.00",
                "max_amount": "5.00"}),
        # Within a transaction the deletion comes first, then the insertion.
        (2, -1, {**eu, "orders": 1, "revenue": "5.00", "min_amount": "5.00",
                 "max_amount": "5.00"}),
        (2, 1, {**eu, "orders": 2, "revenue": "12.10", "min_amount": "5.00",
                "max_amount": "7.10"}),
        (3, -1, {**eu, "orders": 2, "revenue": "12.10", "min_amount": "5.00",
                 "max_amount": "7.10"}),
        (3, 1, {**eu, "orders": 1, "revenue": "7.10", "min_amount": "7.10",
                "max_amount": "7.10"}),
    ]
    statuses = {(c["time"], c["diff"], c["row"]["status"]) for c in one
                if c["table"] == "statuses"}
    assert statuses == {(1, 1, "paid"), (3, 1, "refunded")}
    assert [c["time"] for c in one] == sorted(c["time"] for c in one)


@pytest.mark.parametrize(("line", "reason"), [
    ("{not json", r"line 2: .*Invalid JSON"),
    ('{"source": "orders", "time": 1, "diff": 0, "row": {}}', r"line 2: diff: .*non-zero"),
    ('{"source": "nope", "time": 1, "diff": 1, "row": {}}', r"line 2: unknown source 'nope'"),
    ('{"source": "orders", "time": 1, "diff": 1, "row": {"order_id": 1, "colour": "red"}}',
     r"line 2: column\(s\) colour not in source 'orders'"),
    ('{"source": "orders", "time": 1, "diff": 1, "row": {"customer_id": 1}}',
     r"line 2: source 'orders' needs a value for order_id"),
    ('{"source": "orders", "time": 1, "diff": 1, "row": {"order_id": "x"}}',
     r"line 2: row does not fit source 'orders'"),
    ('{"source": "orders", "time": 0, "diff": 1, "row": {"order_id": 1}}', r"line 2: time"),
    ('{"source": "orders", "time": 1, "diff": 1, "row": {"order_id": 1, "amount": 0.125}}',
     r"line 2: row does not fit source 'orders'"),
])
def test_bad_lines_name_the_line_and_reason(tmp_path: Path, line: str, reason: str) -> None:
    first = json.dumps(LOG[0])
    path = tmp_path / "bad.jsonl"
    path.write_text(first + "\n" + line + "\n")
    with open(path) as src, pytest.raises(ReplayInputError, match=reason):
        list(read_batches(src, load_pipeline("txstream.examples.orders:pipeline"), 10))


def test_decreasing_time_is_refused(tmp_path: Path) -> None:
    later = {**LOG[2], "time": 5}
    path = _write(tmp_path / "t.jsonl", [later, LOG[0]])
    with open(path) as src, pytest.raises(ReplayInputError, match="line 2: time 1 after time 5"):
        list(read_batches(src, load_pipeline("txstream.examples.orders:pipeline"), 10))
