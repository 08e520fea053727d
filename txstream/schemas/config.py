"""The pipeline configuration file (YAML), validated at start.

Every field can be overridden from the environment (12-factor), so one file serves every
deployment:

* `TXSTREAM_<FIELD>` for a top-level field (other `TXSTREAM_` variables, such as the image's
  `TXSTREAM_HEALTHCHECK_PORT`, are not configuration overrides), `__` between the parts of a
  nested path, list items by index: `TXSTREAM_BATCH_TRANSACTIONS=5`,
  `TXSTREAM_TRANSACTIONS__MAX_EVENTS=2000`, `TXSTREAM_SINKS__0__MODE=create`. A value
  starting with `[` or `{` is read as JSON, `null` as null; anything else is text that
  pydantic converts to the field's type.
* the conventional names `KAFKA_BOOTSTRAP_SERVERS`, `DATABASE_URL`, `DATABASE_PASSWORD`,
  `SPARK_MASTER` and, for `kafka_security`, `KAFKA_SASL_USERNAME`, `KAFKA_SASL_PASSWORD`,
  `KAFKA_SSL_KEY_PASSWORD` and `KAFKA_OAUTHBEARER_CLIENT_SECRET` (a `TXSTREAM_...` variable
  wins over them).
* `<VARIABLE>_FILE` instead of any of these reads the value from that file (Docker and
  Kubernetes secrets).

Secrets (the database password, in `database_password` or inside `database_url`, and the
Kafka passwords and client secret of `kafka_security`) are accepted only from the environment
or from files, never from the configuration file, and are held as `SecretStr`, so neither
`repr` nor an error message shows them.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from txstream.schemas.kafka import ENV_VARIABLES, SECRET_FIELDS, KafkaSecurity
from txstream.schemas.sinks import SINK_KINDS, SinkSettings
from txstream.schemas.sources import BatchPolicy, SourceSpec

ENV_PREFIX = "TXSTREAM_"
# Conventional variable -> field path; TXSTREAM_<FIELD> wins over these.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "KAFKA_BOOTSTRAP_SERVERS": ("kafka_bootstrap_servers",),
    "DATABASE_URL": ("database_url",),
    "DATABASE_PASSWORD": ("database_password",),
    "SPARK_MASTER": ("spark_master",),
    **{var: ("kafka_security", field) for field, var in ENV_VARIABLES.items()},
}


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem with its path."""


class SinkConfig(BaseModel):
    """Where one output table goes: `output` plus the sink's settings, flat in the file:
    `{output: customer_stats, kind: postgres_snapshot}` (a PostgreSQL sink's table defaults to
    the output's name).

    `mode: replace` recreates the table when the pipeline starts from scratch (no checkpoint and
    no transaction log in `checkpoint_dir`). When it resumes from a checkpoint the table is kept:
    it holds the transactions the checkpoint continues, and wiping it would lose them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    output: str
    # The sink's own fields, written flat beside `output`; `kind` says which sink.
    settings: SinkSettings

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "settings" in data:
            return data
        rest = {k: v for k, v in data.items() if k != "output"}
        rest.setdefault("kind", "postgres_snapshot")
        kind = SINK_KINDS.get(rest["kind"]) if isinstance(rest["kind"], str) else None
        if kind is not None and "table" in kind.model_fields and "output" in data:
            rest.setdefault("table", data["output"])
        return {"output": data.get("output"), "settings": rest}


class LiveServing(BaseModel):
    """The Arrow Flight endpoint of the outputs with a `live` sink (`txstream.sinks.live.flight`).

    `token`: when set (only from the environment: `TXSTREAM_LIVE__TOKEN` or its `_FILE`),
    every call must carry `authorization: Bearer <token>`. `tls_cert_file` and `tls_key_file`
    (PEM) together make it serve TLS. `queue_updates`: updates held per subscriber; one that
    falls further behind gets a fresh snapshot instead. `state_dir`: where live tables are
    kept across restarts (saved at every checkpoint); default `<checkpoint location>/live`,
    which must then be a local path. `page`: show the tables at `/ui` on the HTTP port too
    (plain HTTP: with a token, reach it through a TLS-terminating proxy or a port-forward)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The address the Flight endpoint listens on.
    host: str = "0.0.0.0"
    # The Flight endpoint's port.
    port: int = Field(default=8815, ge=0, le=65535)
    token: SecretStr | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    queue_updates: int = Field(default=256, ge=1)
    state_dir: Path | None = None
    page: bool = True

    @model_validator(mode="after")
    def _tls_pair(self) -> LiveServing:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        return self


class PipelineConfig(BaseModel):
    """Sources, the pipeline, sinks, connections, checkpoints and batching knobs of one
    deployed pipeline."""

    # Validation errors must not echo their input: it holds the secrets.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    pipeline: str = Field(description="module:function returning the Pipeline")
    # The Kafka topics the pipeline reads, one input table each (named as `Pipeline.source`
    # names them).
    sources: list[SourceSpec]
    # Where the outputs go: one entry per output and destination (an output may have several).
    sinks: list[SinkConfig]
    # How records without upstream transaction ids are cut into transactions, and how long an
    # upstream transaction may stay incomplete.
    transactions: BatchPolicy = BatchPolicy()
    # At most this many transactions per Spark job. Batches adapt below it: one transaction at
    # low load (latency), more under a backlog (Spark's fixed cost per job shared; see
    # `backlog_wait_ms`). It also
    # bounds memory: a stage holds at most one batch. The tables' rows do not depend on it
    # (netted batches, `nets_batches`: a snapshot row's `time` and tombstones do).
    batch_transactions: int = Field(default=100, ge=1)
    # Under a backlog that holds a batch (records not read yet enough for `batch_transactions`
    # transactions), compute waits up to this long for ingest to fill the batch before it
    # takes fewer: a batch's cost is mostly fixed, and every batch computed while ingest
    # reads takes CPU from it where they share cores (txstream.service.stages). Each batch's
    # changes are visible up to this much later meanwhile. 0: take what is ready.
    backlog_wait_ms: int = Field(default=3_000, ge=0)
    # While the service has nothing to do (no batch ready, the input read to its end), the engine
    # runs this many made-up rows per source through the pipeline, one batch at a time, and
    # forgets them, so that batches after an idle start do not pay Spark's planning and code
    # compilation on a cold JVM (seconds). A batch to compute comes first: after a backlog at
    # start, the warm-up waits until no batch has been computed for a few seconds, and a batch
    # ends a warm-up under way. Above 500 rows a batch runs generated code, so that is
    # compiled too (from the warm-up's first batch on, txstream.engine.codegen); more rows
    # hardly change the warm-up's effect. 0: no warm-up.
    warm_up_rows: int = Field(default=5_000, ge=0)
    # Partitions of the engine's state and of a batch's exchanged deltas: the cores a large
    # batch spreads over (txstream.engine.engine). "auto": the Spark session's default
    # parallelism (the cores of `local[N]`, of a cluster's executors). 1, the default, plans
    # every batch in one task: the fastest lone transactions, one core per batch. A restart
    # with another value repartitions the checkpointed state once.
    parallelism: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    # Copies of every block of state on distinct executors. State lives in the executors'
    # memory without lineage: 1 loses it with an executor (the batch fails, the service
    # restarts from its checkpoint); 2 survives an executor's loss at the price of twice the
    # executors' memory for state and a network copy of each new run. Set 2 on a cluster.
    state_replicas: int = Field(default=1, ge=1)
    # Where the executors write the indexes of large state runs (files sorted by key, read by
    # every executor: txstream.engine.run_index). Default: TXSTREAM_INDEX_DIR, else the
    # system's temporary directory, which serves local[N] and executors on the driver's own
    # filesystem; executors in other containers or hosts need a volume they all mount
    # (docs/deploying.md, "State indexes").
    index_dir: str | None = None
    # The Kafka brokers, `host:port[,host:port...]` (or KAFKA_BOOTSTRAP_SERVERS); required.
    kafka_bootstrap_servers: str | None = None
    # TLS and SASL of every Kafka client the service creates (txstream.schemas.kafka).
    kafka_security: KafkaSecurity = KafkaSecurity()
    # Also names the pipeline's checkpoints (`checkpoint_dir/<consumer_group>`).
    consumer_group: str = Field(default="txstream", pattern=r"^[A-Za-z0-9._-]+$")
    # Records that fail to decode or validate go to this topic whole, with the reason in their
    # `txstream.error` header; null: they are only logged and counted.
    dead_letter_topic: str | None = None
    # The PostgreSQL of the PostgreSQL sinks (or DATABASE_URL), without a password; required
    # when a sink writes PostgreSQL.
    database_url: SecretStr | None = None
    # The password of `database_url`: only from the environment (DATABASE_PASSWORD or its
    # _FILE), never from the file.
    database_password: SecretStr | None = None
    # The PostgreSQL sinks commit together with the pipeline's row of txstream_progress (in the
    # first PostgreSQL sink's db_schema): one PostgreSQL transaction per batch (default: one
    # commit for many stream transactions under load, still at transaction boundaries), or
    # per stream transaction (readers see every transaction, at the price of a commit each).
    postgres_commit: Literal["batch", "transaction"] = "batch"
    # Spark's master: `local[N]`, `spark://host:7077`, `k8s://...` (or SPARK_MASTER); null:
    # `local[2]`.
    spark_master: str | None = None
    # /healthz, /readyz and /metrics; null turns the HTTP endpoint off.
    http_port: int | None = Field(default=8080, ge=0, le=65535)
    # /readyz answers 503 while more records than this wait in the source topics.
    ready_max_lag: int = Field(default=100_000, ge=0)
    # /healthz answers 503 once closed transactions have waited this long with no batch
    # delivered (a stage stuck, a sink failing for good), so that Kubernetes restarts the
    # process; idle is healthy. Keep it above the longest batch and the longest outage of Kafka
    # or PostgreSQL worth waiting out without a restart; null: /healthz never fails.
    stall_timeout_s: float | None = Field(default=300.0, gt=0)
    # Checkpoints: a local directory, or any Hadoop-compatible URI Spark can write (s3a://,
    # hdfs://, file://). On a Spark cluster it must be storage the executors share.
    checkpoint_dir: str = Field(default=".txstream/checkpoints", min_length=1)
    # The Arrow Flight endpoint (and the /ui page) of the outputs with a `live` sink.
    live: LiveServing = LiveServing()
    # A checkpoint costs O(state), so not after every batch: after this many batches or this
    # many seconds since the last one, whichever comes first (and at a graceful shutdown).
    checkpoint_every_batches: int = Field(default=50, ge=1)
    # The longest time between two checkpoints (see `checkpoint_every_batches`).
    checkpoint_every_s: float = Field(default=300.0, gt=0)
    # Once no batch has been committed for this many seconds, checkpoint the last committed
    # transaction if no checkpoint holds it: an idle pipeline's stop then has no final
    # checkpoint to write and a restart nothing to replay. 0: only the two rules above. (A
    # checkpoint that failed is tried again with the backoff below, idle or not.)
    checkpoint_when_idle_s: float = Field(default=2.0, ge=0)
    # Complete checkpoints kept in the location; older ones are deleted.
    checkpoints_kept: int = Field(default=2, ge=1)
    # SIGTERM: finish the current batch and checkpoint within this time, else exit without the
    # final checkpoint (the next start replays from the previous one). Below Kubernetes'
    # default grace period (30 s), which must be raised along with it.
    shutdown_timeout_s: float = Field(default=25.0, gt=0)
    # Kafka, PostgreSQL or the checkpoint storage unavailable (a failed checkpoint too):
    # retried with exponential backoff, first after this pause.
    retry_initial_backoff_s: float = Field(default=0.5, gt=0)
    # The longest pause between two such retries.
    retry_max_backoff_s: float = Field(default=30.0, gt=0)
    # Seconds between two status lines of `txstream run`.
    status_interval_s: float = Field(default=10.0, gt=0)
    # Log lines as text, or as one JSON object each.
    log_format: Literal["text", "json"] = "text"

    @model_validator(mode="after")
    def _check(self) -> PipelineConfig:
        problems = []
        if ":" not in self.pipeline:
            problems.append(f"pipeline: {self.pipeline!r} must be 'module:function'")
        if not self.kafka_bootstrap_servers:
            problems.append("kafka_bootstrap_servers: no Kafka: set it or "
                            "KAFKA_BOOTSTRAP_SERVERS")
        if any(s.settings.writes_postgres for s in self.sinks) and not self.database_url:
            problems.append("database_url: PostgreSQL sinks need DATABASE_URL (or "
                            "TXSTREAM_DATABASE_URL, or DATABASE_URL_FILE)")
        if self.retry_max_backoff_s < self.retry_initial_backoff_s:
            problems.append("retry_max_backoff_s: must be at least retry_initial_backoff_s")
        # A Kafka sink reads back its topic's last transaction to skip replays: a topic shared
        # with another sink would make it skip that one's transactions.
        kafka_topics = [topic for s in self.sinks if (topic := s.settings.kafka_topic)]
        for label, values in (("sources", [s.name for s in self.sources]),
                              ("sources (topics)", [s.topic for s in self.sources]),
                              ("sinks (Kafka topics, one sink each)", kafka_topics)):
            dupes = sorted({v for v in values if values.count(v) > 1})
            if dupes:
                problems.append(f"{label}: {', '.join(dupes)} given more than once")
        if problems:
            # Collected into one error, so a user sees every problem of this kind at once.
            raise ValueError("\n  ".join(problems))
        return self

    @property
    def database_dsn(self) -> str | None:
        """The connection string with the password, for the sinks; never log it."""
        if self.database_url is None:
            return None
        url = self.database_url.get_secret_value()
        if self.database_password is None:
            return url
        return make_conninfo(url, password=self.database_password.get_secret_value())

    @property
    def nets_batches(self) -> bool:
        """Whether the engine may compute a batch's transactions as one, their net change
        (`Changes.net`): no sink shows a state within a batch (every one is a PostgreSQL
        snapshot committed once per batch: its live rows depend only on the states at batch
        ends; a row's `time`, and whether a row inserted and deleted within a batch leaves a
        tombstone, depend on the batching then). Under a backlog this saves the engine the states
        between: a group-by whose keys all change in every transaction of a 100-transaction
        batch otherwise computes each key's row 100 times and hands the sinks every one. The
        runner nets only when the pipeline allows it too (`Engine.nets_exactly`: no temporal
        behavior, whose clock moves transaction by transaction)."""
        return self.postgres_commit == "batch" and all(
            s.settings.shows_batch_ends_only for s in self.sinks)

    @property
    def checkpoint_location(self) -> str:
        """Where this pipeline's checkpoints live: one directory per consumer group, so two
        pipelines sharing `checkpoint_dir` never read each other's state."""
        return f"{self.checkpoint_dir.rstrip('/')}/{self.consumer_group}"

    @property
    def live_state_dir(self) -> Path:
        """Where the live tables are saved (see `LiveServing.state_dir`)."""
        if self.live.state_dir is not None:
            return self.live.state_dir
        location = self.checkpoint_location
        if "://" in location and not location.startswith("file://"):
            raise ConfigError(f"live tables are saved in a local directory and the checkpoint "
                              f"location {location!r} is not one: set live.state_dir")
        return Path(location.removeprefix("file://")) / "live"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], env: Mapping[str, str] | None = None
                     ) -> PipelineConfig:
        """Validate the file's `data` with the environment's overrides applied; a ConfigError
        lists every problem, each with its path (and the variable it came from)."""
        env = dict(os.environ) if env is None else env
        problems = _secrets_in_file(data)
        merged: dict[str, Any] = copy.deepcopy(dict(data))
        sources: dict[str, str] = {}  # dotted path -> variable it came from
        for var, path, value in _overrides(env, problems):
            problem = _set_path(merged, path, value)
            if problem:
                problems.append(f"{var}: {problem}")
            else:
                sources[".".join(path)] = var
        if not problems:
            try:
                return cls.model_validate(merged)
            except ValidationError as exc:
                problems += [_describe(err, sources) for err in exc.errors()]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))

    @classmethod
    def load(cls, path: Path, env: Mapping[str, str] | None = None) -> PipelineConfig:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read configuration {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"configuration {path} must be a mapping at the top level")
        return cls.from_mapping(data, env)


def _secrets_in_file(data: Mapping[str, Any]) -> list[str]:
    problems = []
    if "database_password" in data:
        problems.append("database_password: secrets are not read from the configuration file; "
                        "set DATABASE_PASSWORD or DATABASE_PASSWORD_FILE in the environment")
    url = data.get("database_url")
    if isinstance(url, str):
        try:
            has_password = bool(conninfo_to_dict(url).get("password"))
        except Exception:  # psycopg's ProgrammingError; pydantic reports a bad URL later
            has_password = False
        if has_password:
            problems.append("database_url: contains a password; secrets are not read from the "
                            "configuration file: give the URL without it and set "
                            "DATABASE_PASSWORD (or DATABASE_URL) in the environment")
    live = data.get("live")
    if isinstance(live, Mapping) and "token" in live:
        problems.append("live.token: secrets are not read from the configuration file; set "
                        "TXSTREAM_LIVE__TOKEN or TXSTREAM_LIVE__TOKEN_FILE in the environment")
    security = data.get("kafka_security")
    if isinstance(security, Mapping):
        for field in SECRET_FIELDS:
            if field in security:
                var = ENV_VARIABLES[field]
                problems.append(f"kafka_security.{field}: secrets are not read from the "
                                f"configuration file; set {var} or {var}_FILE in the "
                                "environment")
    return problems


def _overrides(env: Mapping[str, str], problems: list[str]
               ) -> list[tuple[str, tuple[str, ...], Any]]:
    """(variable, field path, value) of every override, aliases first so TXSTREAM_ wins."""
    found: list[tuple[int, str, tuple[str, ...], Any]] = []
    for var in env:
        name = var.removesuffix("_FILE")
        if name in ENV_ALIASES:
            rank, path = 0, ENV_ALIASES[name]
        elif name.startswith(ENV_PREFIX) and \
                name[len(ENV_PREFIX):].split("__")[0].lower() in PipelineConfig.model_fields:
            rank, path = 1, tuple(p.lower() for p in name[len(ENV_PREFIX):].split("__"))
        else:  # other TXSTREAM_ variables configure the image or the tests, not the pipeline
            continue
        if var.endswith("_FILE"):
            try:
                text = Path(env[var]).read_text().rstrip("\r\n")
            except OSError as exc:
                problems.append(f"{var}: cannot read {env[var]}: {exc.strerror}")
                continue
        else:
            text = env[var]
        if not text:
            continue  # an empty variable is how shells and manifests leave a setting unset
        found.append((rank, var, path, _parse_env_value(text)))
    return [(var, path, value) for _, var, path, value in sorted(found, key=lambda f: f[0])]


def _parse_env_value(text: str) -> Any:
    if text == "null":
        return None
    if text[0] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text  # validation then says what type was expected
    return text


def _set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> str | None:
    """Set `value` at `path` in `data` (creating mappings as needed); a problem or None."""
    node: Any = data
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                where = ".".join(path[:i]) or "(top level)"
                return f"{where} has {len(node)} item(s); {part!r} is not one of their indexes"
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            return f"{'.'.join(path[:i])} is not a mapping or a list"
    return None


def _describe(err: Any, sources: dict[str, str]) -> str:
    """`path: message`, the path as written in the file (a sink's settings are flat there)."""
    parts = [str(p) for p in err["loc"]]
    if "settings" in parts:
        at = parts.index("settings")
        tail = parts[at + 1:]
        parts = parts[:at] + (tail[1:] if tail and tail[0] in SINK_KINDS else tail)
    path = ".".join(parts) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    origin = next((var for p, var in sources.items() if path == p or path.startswith(p + ".")),
                  None)
    if not err["loc"]:
        return msg  # the model check's own list, already with paths
    return f"{path}{f' (from {origin})' if origin else ''}: {msg}"
