"""Embedded defaults for local runs and tests: a Kafka-protocol broker process and a throwaway
PostgreSQL cluster, each replaceable by a real service through an environment variable."""
