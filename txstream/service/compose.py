"""Composing a runner for a configured pipeline: the pipeline checked against the configuration
(`txstream.service.startup`), then the parts that need Spark (the session, the engine, the
checkpoint store) and Kafka (the input, `txstream.sources.kafka_input.KafkaInput`), handed to
`txstream.service.runner.PipelineRunner`, which knows neither Spark nor Kafka."""

from __future__ import annotations

import logging
from functools import partial

from pyspark.sql import SparkSession

from txstream.engine import Engine, Pipeline, warmup
from txstream.schemas.config import ConfigError, PipelineConfig
from txstream.service.checkpoint import CheckpointStore, PipelineIdentity
from txstream.service.checkpoint_storage import open_storage
from txstream.service.health import Readiness
from txstream.service.metrics import Metrics
from txstream.service.pipelines import load_pipeline
from txstream.service.runner import PipelineRunner
from txstream.service.spark import get_spark
from txstream.service.startup import event_times_required, refuse, sinks_fit, sources_fit
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.live.table import LiveTable, LiveTableError
from txstream.sinks.postgres.writers import WriterEpoch
from txstream.sources.kafka_input import KafkaInput

log = logging.getLogger(__name__)


def open_runner(config: PipelineConfig, *, spark: SparkSession | None = None,
                pipeline: Pipeline | None = None, metrics: Metrics | None = None,
                readiness: Readiness | None = None, fence: WriterEpoch | None = None
                ) -> PipelineRunner:
    """The runner of `config`: its pipeline (`pipeline`, else `config.pipeline` imported) on
    `spark` (else a session for `config.spark_master`), writing PostgreSQL as writer epoch
    `fence`; see `PipelineRunner`."""
    pipeline = pipeline or load_pipeline(config.pipeline)
    refuse(sources_fit(config, pipeline))
    config = event_times_required(config, pipeline)
    spark = spark or get_spark(config.spark_master)
    parallelism = (spark.sparkContext.defaultParallelism if config.parallelism == "auto"
                   else config.parallelism)
    new_engine = partial(Engine, pipeline, spark, parallelism=parallelism,
                         state_replicas=config.state_replicas, index_dir=config.index_dir)
    engine = new_engine()
    log.info("engine parallelism %d", parallelism)
    refuse(sinks_fit(config, engine.outputs))

    def warming_up() -> warmup.WarmUp:
        # Of the engine itself while it is fresh: the plans it records then serve the first
        # real batches. After a restore or real batches, of a scratch engine of the pipeline:
        # the code Spark compiled and the JIT's work are the JVM's, whichever engine caused
        # them.
        target = engine if engine.fresh else new_engine()
        return warmup.warming_up(target, config.warm_up_rows)

    checkpoints = CheckpointStore(
        open_storage(config.checkpoint_location, spark), keep=config.checkpoints_kept,
        identity=PipelineIdentity(pipeline=config.pipeline,
                                  sources={s.name: s.topic for s in config.sources},
                                  outputs=sorted(engine.outputs)))
    return PipelineRunner(config, engine=engine, checkpoints=checkpoints,
                          open_input=partial(KafkaInput, config,
                                             wall_clock=engine.uses_wall_clock),
                          metrics=metrics,
                          readiness=readiness, live=live_tables(config, engine), fence=fence,
                          warm_up=warming_up if config.warm_up_rows else None)


def live_tables(config: PipelineConfig, engine: Engine) -> LiveTables | None:
    """The live tables of the outputs with a live sink (None: there are none)."""
    names = sorted({cfg.output for cfg in config.sinks if cfg.settings.serves_live})
    if not names:
        return None
    tables = {}
    for name in names:
        schema = engine.outputs[name].schema
        try:
            tables[name] = LiveTable(name, schema.arrow_schema(), schema.primary_key)
        except LiveTableError as exc:
            raise ConfigError(f"sinks: {exc}") from exc
    return LiveTables(tables, capacity=config.live.queue_updates)
