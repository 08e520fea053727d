"""`txstream check`: everything `txstream run` needs, tried without changing anything."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from confluent_kafka import Consumer
from pyspark.sql import SparkSession

from txstream.engine import Engine
from txstream.kafka_client import client_settings
from txstream.schemas.config import ConfigError, PipelineConfig
from txstream.service.checkpoint import CheckpointStore, PipelineIdentity
from txstream.service.checkpoint_storage import open_storage
from txstream.service.pipelines import load_pipeline
from txstream.service.startup import (
    earlier_output,
    outputs_ahead,
    read_progress_row,
    refuse,
    sinks_fit,
    sources_fit,
)
from txstream.sources.registry.client import RegistrySchemas

Check = tuple[str, bool, str]  # name, passed, what it found


def _attempt(name: str, work: Callable[[], str]) -> Check:
    try:
        return name, True, work()
    except Exception as exc:  # a check reports any failure, whatever its kind
        return name, False, f"{type(exc).__name__}: {exc}".replace("\n", " ")


def run_checks(config: PipelineConfig) -> list[Check]:
    """The checks, each passed or failed with what it found: the pipeline fits the
    configuration (`pipeline`), Spark compiles it and the sinks name its outputs (`spark`), the
    topics exist (`kafka`), PostgreSQL answers (`postgresql`), the checkpoint location is
    readable and belongs to this pipeline (`checkpoint`), and the PostgreSQL outputs' progress
    row fits it as a start would require (`outputs`: the start-up checks of
    `txstream.service.startup` that need no sink opened), and the sources' Schema Registries
    answer (`schema_registry`)."""
    # Looked up when called: a test replaces it to run the checks without Spark.
    from txstream.service import spark as spark_module

    checks: list[Check] = []
    sessions: list[SparkSession] = []

    def session() -> SparkSession:
        if not sessions:
            sessions.append(spark_module.get_spark(config.spark_master))
        return sessions[0]

    def pipeline_fits() -> str:
        refuse(sources_fit(config, load_pipeline(config.pipeline)))
        return f"{config.pipeline} reads {', '.join(s.name for s in config.sources)}"

    def spark_compiles() -> str:
        spark = session()
        engine = Engine(load_pipeline(config.pipeline), spark)
        refuse(sinks_fit(config, engine.outputs))
        return (f"Spark {spark.version} at {spark.sparkContext.master} compiled outputs "
                f"{', '.join(sorted(engine.outputs))}")

    def kafka_topics() -> str:
        consumer = Consumer(client_settings(config.kafka_bootstrap_servers, config.kafka_security,
                                            **{"group.id": f"{config.consumer_group}-check"}))
        try:
            topics = consumer.list_topics(timeout=10).topics
        finally:
            consumer.close()
        wanted = [s.topic for s in config.sources] + (
            [config.dead_letter_topic] if config.dead_letter_topic else [])
        missing = [t for t in wanted if t not in topics or topics[t].error is not None]
        if missing:
            raise ConfigError(f"topic(s) {', '.join(missing)} do not exist on "
                              f"{config.kafka_bootstrap_servers}; create them")
        return ", ".join(f"{t} ({len(topics[t].partitions)} partitions)" for t in wanted)

    registries = sorted({s.schema_registry_url for s in config.sources if s.schema_registry_url})

    def registries_answer() -> str:
        for url in registries:
            RegistrySchemas(url).check()
        return f"Schema Registry at {', '.join(registries)} answers"

    def postgres_answers() -> str:
        assert config.database_dsn is not None
        with psycopg.connect(config.database_dsn, connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return f"PostgreSQL {row[0] if row else '?'}"

    def store() -> CheckpointStore:
        identity = PipelineIdentity(
            pipeline=config.pipeline, sources={s.name: s.topic for s in config.sources},
            outputs=sorted(load_pipeline(config.pipeline).outputs))
        return CheckpointStore(open_storage(config.checkpoint_location, session()), identity)

    def checkpoint_readable() -> str:
        checkpoints = store()
        latest = checkpoints.latest()
        if latest is None:
            return f"{checkpoints.location}: no checkpoint yet (the pipeline starts from scratch)"
        return (f"{checkpoints.location}: resumes after transaction #{latest.transaction} "
                f"(checkpoint of {latest.manifest.created:%Y-%m-%d %H:%M:%S} UTC)")

    def outputs_fit() -> str:
        checkpoints = store()
        row = read_progress_row(config)
        if not checkpoints.has_history():
            refuse(earlier_output(config, [], row))
            return "no progress row of this pipeline: a start from scratch may write them"
        latest = checkpoints.latest()
        checkpointed = latest.transaction if latest is not None else 0
        known = checkpointed + len(checkpoints.logged_after(checkpointed))
        refuse(outputs_ahead(config, row, known))
        return (f"the progress row says #{row if row is not None else 'none'}, "
                f"{checkpoints.location} knows transactions up to #{known}")

    checks.append(_attempt("pipeline", pipeline_fits))
    checks.append(_attempt("spark", spark_compiles))
    checks.append(_attempt("kafka", kafka_topics))
    if registries:
        checks.append(_attempt("schema_registry", registries_answer))
    if config.database_dsn is not None:
        checks.append(_attempt("postgresql", postgres_answers))
    checks.append(_attempt("checkpoint", checkpoint_readable))
    if any(cfg.settings.writes_postgres for cfg in config.sinks):
        checks.append(_attempt("outputs", outputs_fit))
    return checks
