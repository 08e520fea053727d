"""Composing a runner for a configured pipeline: the pipeline checked against the configuration,
then the parts that need Spark (the session, the engine, the checkpoint store), handed to
`txstream.service.runner.PipelineRunner`, which knows neither Spark nor Kafka."""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from txstream.engine import Engine, Pipeline
from txstream.schemas.config import ConfigError, PipelineConfig
from txstream.schemas.sinks import LiveSinkSettings
from txstream.schemas.tables import TableSchema
from txstream.service.checkpoint import CheckpointStore, PipelineIdentity
from txstream.service.health import Progress, Readiness
from txstream.service.pipelines import load_pipeline
from txstream.service.runner import PipelineRunner
from txstream.service.spark import get_spark
from txstream.sinks.live.serving import LiveTables
from txstream.sinks.live.table import LiveTable, LiveTableError

log = logging.getLogger(__name__)


def open_runner(config: PipelineConfig, *, spark: SparkSession | None = None,
                pipeline: Pipeline | None = None, progress: Progress | None = None,
                readiness: Readiness | None = None) -> PipelineRunner:
    """The runner of `config`: its pipeline (`pipeline`, else `config.pipeline` imported) on
    `spark` (else a session for `config.spark_master`); see `PipelineRunner`."""
    pipeline = pipeline or load_pipeline(config.pipeline)
    check_sources(config, pipeline)
    spark = spark or get_spark(config.spark_master)
    engine = Engine(pipeline, spark)
    check_sinks(config, engine)
    if config.warm_up_rows:
        seconds = engine.warm_up(config.warm_up_rows)
        log.info("engine warmed up in %.1f s (%d made-up rows per source)", seconds,
                 config.warm_up_rows)
    checkpoints = CheckpointStore(
        config.checkpoint_location, spark, keep=config.checkpoints_kept,
        identity=PipelineIdentity(pipeline=config.pipeline,
                                  sources={s.name: s.topic for s in config.sources},
                                  outputs=sorted(engine.outputs)))
    return PipelineRunner(config, engine=engine, checkpoints=checkpoints, progress=progress,
                          readiness=readiness, live=live_tables(config, engine))


def live_tables(config: PipelineConfig, engine: Engine) -> LiveTables | None:
    """The live tables of the outputs with a live sink (None: there are none)."""
    names = sorted({cfg.output for cfg in config.sinks if isinstance(cfg.settings,
                                                                     LiveSinkSettings)})
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


def _shape(schema: TableSchema) -> tuple[object, ...]:
    """Names, types and key; not nullability, which a schema written in YAML leaves at its
    default even for key columns (that `TableSchema.of` makes non-null)."""
    return tuple((c.name, c.type) for c in schema.columns), tuple(schema.primary_key)


def check_sources(config: PipelineConfig, pipeline: Pipeline) -> None:
    """The configured sources are exactly the pipeline's, with its schemas."""
    problems = []
    configured = {s.name: s for s in config.sources}
    for name, node in pipeline.sources.items():
        spec = configured.get(name)
        if spec is None:
            problems.append(f"sources: the pipeline reads {name!r}, which no source configures")
        elif node.schema is not None and _shape(spec.schema) != _shape(node.schema):
            problems.append(
                f"sources.{name}.schema: differs from the pipeline's source schema "
                f"({', '.join(f'{c.name} {c.type.value}' for c in node.schema.columns)}; "
                f"primary key {', '.join(node.schema.primary_key) or 'none'})"
            )
    for name in configured.keys() - pipeline.sources.keys():
        problems.append(f"sources.{name}: the pipeline has no source of that name")
    if problems:
        raise ConfigError("configuration does not fit the pipeline:\n  " + "\n  ".join(problems))


def check_sinks(config: PipelineConfig, engine: Engine) -> None:
    """Every sink names an output of the pipeline."""
    problems = [
        f"sinks.{i}.output: {cfg.output!r} is not an output of the pipeline "
        f"({', '.join(sorted(engine.outputs))})"
        for i, cfg in enumerate(config.sinks) if cfg.output not in engine.outputs
    ]
    if problems:
        raise ConfigError("configuration does not fit the pipeline:\n  " + "\n  ".join(problems))
