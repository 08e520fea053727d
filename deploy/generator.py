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
import os
import random
import time

from confluent_kafka import KafkaError, Producer

from txstream.examples.order_events import encode, events


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
    for count, event in enumerate(events(rng, args.customers), start=1):
        key, value = encode(event)
        producer.produce(topics[event[0]], key=key, value=value, on_delivery=delivered)
        producer.poll(0)
        if count == args.events:
            break
        time.sleep(interval)
    if producer.flush(30) != 0 or failures:
        raise SystemExit(f"generator: events not delivered: {failures[:3] or 'timed out'}")


if __name__ == "__main__":
    main()
