"""A small event generator for docker-compose.yml: upsert records for the example pipeline.

Writes JSON rows keyed by primary key (a JSON object of the key columns) to the `customers`
and `orders` topics, the upsert semantics of deploy/pipeline.yaml: a record replaces the row of
its key, a tombstone (null value) deletes it. It first upserts every customer, then creates
orders, changes their status, moves customers between regions and now and then deletes an
order, so the snapshot in PostgreSQL keeps changing.

    python deploy/generator.py --rate 20            # forever, 20 events per second
    python deploy/generator.py --events 500 --seed 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, Producer

REGIONS = ("north", "south", "east", "west")
STATUSES = ("new", "paid", "shipped", "delivered")

Event = tuple[str, int, dict[str, Any] | None]  # (source, primary key, row or None to delete)
KEY_COLUMNS = {"customers": "customer_id", "orders": "order_id"}


def events(rng: random.Random, customers: int) -> Iterator[Event]:
    """An endless stream of upserts and deletes over `customers` customers and their orders."""
    for customer_id in range(1, customers + 1):
        yield "customers", customer_id, _customer(rng, customer_id)
    orders: dict[int, dict[str, Any]] = {}
    next_order_id = 1
    while True:
        roll = rng.random()
        if roll < 0.5 or not orders:
            row = {
                "order_id": next_order_id,
                "customer_id": rng.randint(1, customers),
                # Whole cents: sums stay exact enough to compare by eye in PostgreSQL.
                "amount": rng.randint(100, 50_000) / 100,
                "status": STATUSES[0],
            }
            orders[next_order_id] = row
            next_order_id += 1
            yield "orders", row["order_id"], row
        elif roll < 0.85:
            order_id = rng.choice(list(orders))
            row = dict(orders[order_id])
            row["status"] = rng.choice(STATUSES)
            orders[order_id] = row
            yield "orders", order_id, row
        elif roll < 0.95:
            customer_id = rng.randint(1, customers)
            yield "customers", customer_id, _customer(rng, customer_id)
        else:
            order_id = rng.choice(list(orders))
            del orders[order_id]
            yield "orders", order_id, None


def _customer(rng: random.Random, customer_id: int) -> dict[str, Any]:
    return {"customer_id": customer_id, "name": f"customer {customer_id}",
            "region": rng.choice(REGIONS)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers",
                        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
    parser.add_argument("--customers-topic", default="customers")
    parser.add_argument("--orders-topic", default="orders")
    parser.add_argument("--customers", type=int, default=20)
    parser.add_argument("--rate", type=float, default=20.0, help="events per second")
    parser.add_argument("--events", type=int, default=0, help="stop after N events (0: never)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    topics = {"customers": args.customers_topic, "orders": args.orders_topic}
    # Idempotence keeps per-key order through retries: a retried upsert never overtakes a newer one.
    producer = Producer({"bootstrap.servers": args.bootstrap_servers,
                         "enable.idempotence": True, "linger.ms": 20})
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    rng = random.Random(args.seed)
    interval = 1.0 / args.rate
    for count, (source, key, row) in enumerate(events(rng, args.customers), start=1):
        value = None if row is None else json.dumps(row).encode()
        # The key as a JSON object of the key columns: a tombstone has only its key to say
        # which row it deletes.
        producer.produce(topics[source], key=json.dumps({KEY_COLUMNS[source]: key}).encode(),
                         value=value, on_delivery=delivered)
        producer.poll(0)
        if count == args.events:
            break
        time.sleep(interval)
    if producer.flush(30) != 0 or failures:
        raise SystemExit(f"generator: events not delivered: {failures[:3] or 'timed out'}")


if __name__ == "__main__":
    main()
