"""The example pipeline: customers and their orders.

Outputs, with the meaning of these SQL queries:
- paid_orders:    SELECT o.order_id, o.customer_id, c.region, o.amount FROM orders o
                  JOIN customers c ON o.customer_id = c.customer_id WHERE o.status = 'paid'
- region_totals:  SELECT region, COUNT(*) AS orders, SUM(amount) AS revenue,
                  MIN(amount) AS min_amount, MAX(amount) AS max_amount
                  FROM paid_orders GROUP BY region
- customer_stats: SELECT c.customer_id, c.name, COUNT(o.order_id) AS n_orders,
                  COALESCE(SUM(o.amount), 0) AS total FROM customers c
                  LEFT JOIN orders o ON o.customer_id = c.customer_id
                  GROUP BY c.customer_id, c.name
- statuses:       SELECT DISTINCT status FROM orders
"""

from typing import Any

from txstream import Pipeline, TableSchema
from txstream import reducers as r
from txstream.schemas.sources import SourceSpec

CUSTOMERS = TableSchema.of(
    {"customer_id": "bigint", "name": "text", "region": "text"}, primary_key=["customer_id"]
)
ORDERS = TableSchema.of(
    {"order_id": "bigint", "customer_id": "bigint", "amount": "decimal(12,2)",
     "status": "text"},
    primary_key=["order_id"],
)

OUTPUTS = ("paid_orders", "region_totals", "customer_stats", "statuses")


def kafka_sources(customers_topic: str, orders_topic: str, **settings: Any
                  ) -> list[SourceSpec]:
    """The pipeline's sources as upsert topics of rows keyed by primary key, JSON (the format
    of `txstream.examples.order_events`) unless `settings` (of both sources) say otherwise,
    e.g. `value_format="avro", schema_registry_url=...`."""
    return [SourceSpec(name="customers", topic=customers_topic, schema=CUSTOMERS,
                       semantics="upsert", **settings),
            SourceSpec(name="orders", topic=orders_topic, schema=ORDERS, semantics="upsert",
                       **settings)]


def pipeline() -> Pipeline:
    p = Pipeline()
    customers = p.source("customers", CUSTOMERS)
    orders = p.source("orders", ORDERS)

    paid_orders = (
        orders.filter("status = 'paid'")
        .join(customers, on="customer_id")
        .select("order_id", "customer_id", "region", "amount")
    )
    region_totals = paid_orders.groupby("region").reduce(
        orders=r.count(),
        revenue=r.sum("amount"),
        min_amount=r.min("amount"),
        max_amount=r.max("amount"),
    )
    customer_stats = (
        customers.join(orders.select("order_id", "customer_id", "amount"), on="customer_id",
                       how="left")
        .groupby("customer_id", "name")
        .reduce(n_orders=r.count("order_id"), total=r.sum("amount"))
        .select("customer_id", "name", "n_orders", total="COALESCE(total, 0)")
    )
    statuses = orders.select("status").distinct()

    p.output("paid_orders", paid_orders)
    p.output("region_totals", region_totals)
    p.output("customer_stats", customer_stats, primary_key=["customer_id"])
    p.output("statuses", statuses)
    return p
