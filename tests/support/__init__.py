"""Helpers the tests share (tests/ is on the import path, so `from support.x import y`):

* `service_process`: `txstream run` in a subprocess, and scraping its HTTP endpoint;
* `orders`: the example pipeline's events, configuration and from-scratch results;
* `runner`: an in-process runner of the example pipeline, run in a background thread;
* `chromium`: a headless browser over the DevTools protocol;
* `kafka_settings`: reading what the service gives librdkafka;
* `halting_pipeline`: a pipeline whose expression fails on some data;
* `mirror_pipeline`: the example's two sources as outputs of their own;
* `engine_oracle`: random DAGs and transactions, and their outputs recomputed in DuckDB;
* `kafka_helpers`: producing records, polling a transaction builder, integrating transactions;
* `pg_proxy`: a TCP proxy in front of PostgreSQL that cuts a client off right after COMMIT;
* `spark_standalone`: a real Spark standalone cluster (a master and workers) on 127.0.0.1;
* `schema_registry_double`: a test double of Confluent's Schema Registry, in its own process;
* `stress`: the example pipeline under load, as a user deploys it;
* `kafka_fixtures`: the Kafka fixtures (broker, topics, builders, Schema Registry), a pytest
  plugin that tests/conftest.py registers: tests ask for them by name and import none;
* `registry_values`: values as the Schema Registry's serializers write them, and their schemas;
* `debezium_records`: Debezium's records as its connectors write them;
* `boundary_records`: records fed to the transaction boundaries' pure core;
* `postgres_outputs`: PostgreSQL outputs of a made-up pipeline, its batches and writer leases;
* `example_batches`: two batches of the example pipeline's changes for `Engine.process`;
* `live_rows`: a keyed table's rows changed in memory, with the changes they make;
* `replay_events`: random changes to the example's sources in `txstream replay`'s format.

Test modules import from here, never from one another.
"""
