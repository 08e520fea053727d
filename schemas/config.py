"""The pipeline configuration file (YAML), validated at start.

Connection settings may come from the environment instead of the file (`KAFKA_BOOTSTRAP_SERVERS`,
`DATABASE_URL`, `SPARK_MASTER`); the environment wins, so one file serves every deployment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.sinks import SinkSettings
from schemas.sources import BatchPolicy, SourceSpec


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem with its path."""


class SinkConfig(BaseModel):
    """Where one output table goes: `output` plus the sink's settings, flat in the file:
    `{output: customer_stats, kind: postgres_snapshot}` (a PostgreSQL sink's table defaults to
    the output's name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    output: str
    settings: SinkSettings

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "settings" in data:
            return data
        rest = {k: v for k, v in data.items() if k != "output"}
        rest.setdefault("kind", "postgres_snapshot")
        if rest["kind"].startswith("postgres") and "output" in data:
            rest.setdefault("table", data["output"])
        return {"output": data.get("output"), "settings": rest}


class PipelineConfig(BaseModel):
    """Sources, the pipeline, sinks, connections and batching knobs of one deployed pipeline."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pipeline: str = Field(description="module:function returning the Pipeline")
    sources: list[SourceSpec]
    sinks: list[SinkConfig]
    transactions: BatchPolicy = BatchPolicy()
    # At most this many transactions per Spark job: more amortizes Spark's fixed cost per job
    # (throughput), fewer gets each transaction out sooner (latency). Results do not depend on it.
    batch_transactions: int = Field(default=20, ge=1)
    kafka_bootstrap_servers: str | None = None
    consumer_group: str = "txstream"
    dead_letter_topic: str | None = None
    database_url: str | None = None
    spark_master: str | None = None
    # /healthz, /readyz and /metrics; null turns the HTTP endpoint off.
    http_port: int | None = Field(default=8080, ge=0, le=65535)
    # /readyz answers 503 while more records than this wait in the source topics.
    ready_max_lag: int = Field(default=100_000, ge=0)

    @model_validator(mode="after")
    def _check(self) -> PipelineConfig:
        if ":" not in self.pipeline:
            raise ValueError(f"pipeline {self.pipeline!r} must be 'module:function'")
        if not self.kafka_bootstrap_servers:
            raise ValueError("no Kafka: set kafka_bootstrap_servers or KAFKA_BOOTSTRAP_SERVERS")
        if any(s.settings.kind.startswith("postgres") for s in self.sinks) \
                and not self.database_url:
            raise ValueError("PostgreSQL sinks need database_url or DATABASE_URL")
        return self

    @classmethod
    def from_mapping(cls, data: dict[str, Any], env: dict[str, str] | None = None
                     ) -> PipelineConfig:
        env = dict(os.environ) if env is None else env
        merged = dict(data)
        for key, var in (("kafka_bootstrap_servers", "KAFKA_BOOTSTRAP_SERVERS"),
                         ("database_url", "DATABASE_URL"), ("spark_master", "SPARK_MASTER")):
            if env.get(var):
                merged[key] = env[var]
        try:
            return cls.model_validate(merged)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(p) for p in err['loc'] if p != 'settings') or '(top level)'}: "
                f"{err['msg']}"
                for err in exc.errors()
            ]
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems)) from None

    @classmethod
    def load(cls, path: Path) -> PipelineConfig:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read configuration {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"configuration {path} must be a mapping at the top level")
        return cls.from_mapping(data)
