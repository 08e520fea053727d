"""Embedded defaults for local runs and tests: a Kafka-protocol broker process and a throwaway
PostgreSQL cluster, each replaceable by a real service through an environment variable.

    kafka     librdkafka's mock cluster in a process of its own, testcontainers' Kafka where a
              Docker engine answers, or an existing cluster (KAFKA_BOOTSTRAP_SERVERS)
    postgres  a throwaway cluster (initdb + pg_ctl on a free port), or DATABASE_URL's
"""
