"""The configuration file: each problem listed with its path, environment overrides, secrets
only from the environment, and how `txstream run` and `txstream check` report a bad file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.service_process import ROOT

from txstream.schemas.config import ConfigError, PipelineConfig
from txstream.service.cli import main

DEPLOY = ROOT / "deploy" / "pipeline.yaml"
ENV = {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092", "DATABASE_URL": "postgresql://u@db/x"}


def _deploy_config() -> dict[str, Any]:
    data = yaml.safe_load(DEPLOY.read_text())
    assert isinstance(data, dict)
    return data

def test_every_problem_is_listed_with_its_path() -> None:
    data = _deploy_config()
    del data["pipeline"]
    data["batch_transactions"] = 0
    data["sources"][1]["semantics"] = "sometimes"
    data["sinks"][2]["kind"] = "carrier_pigeon"
    data["transactions"]["max_events"] = -1
    data["checkpoint_every_s"] = "often"
    data["colour"] = "blue"
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(data, env=ENV)
    lines = str(err.value).splitlines()[1:]
    assert [line.strip() for line in lines] == [
        "pipeline: Field required",
        "sources.1.semantics: Input should be 'append_only', 'upsert' or 'insert_delete'",
        "sinks.2: Input tag 'carrier_pigeon' found using 'kind' does not match any of the "
        "expected tags: 'postgres_snapshot', 'postgres_append', 'kafka', 'file', 'live'",
        "transactions.max_events: Input should be greater than 0",
        "batch_transactions: Input should be greater than or equal to 1",
        "checkpoint_every_s: Input should be a valid number, unable to parse string as a number",
        "colour: Extra inputs are not permitted",
    ]

def test_checks_across_fields_are_listed_together() -> None:
    data = {**_deploy_config(), "pipeline": "no_colon", "retry_max_backoff_s": 0.1}
    kafka = {"kind": "kafka", "topic": "out", "transactional_id": "t1"}
    data["sinks"] += [{"output": "statuses", **kafka}, {"output": "paid_orders", **kafka}]
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(data, env={})
    assert [line.strip() for line in str(err.value).splitlines()[1:]] == [
        "pipeline: 'no_colon' must be 'module:function'",
        "kafka_bootstrap_servers: no Kafka: set it or KAFKA_BOOTSTRAP_SERVERS",
        "database_url: PostgreSQL sinks need DATABASE_URL (or TXSTREAM_DATABASE_URL, or "
        "DATABASE_URL_FILE)",
        "retry_max_backoff_s: must be at least retry_initial_backoff_s",
        "sinks (Kafka topics, one sink each): out given more than once",
    ]

def test_environment_overrides_every_field(tmp_path: Path) -> None:
    secret = tmp_path / "kafka"
    secret.write_text("broker-from-file:9092\n")
    config = PipelineConfig.from_mapping(_deploy_config(), env={
        **ENV,
        "KAFKA_BOOTSTRAP_SERVERS_FILE": str(secret),
        "TXSTREAM_BATCH_TRANSACTIONS": "7",
        "TXSTREAM_TRANSACTIONS__MAX_EVENTS": "2000",
        "TXSTREAM_SINKS__0__MODE": "replace",
        "TXSTREAM_SOURCES__1__TOPIC": "orders-v2",
        "TXSTREAM_HTTP_PORT": "null",
        "TXSTREAM_LOG_FORMAT": "json",
        "TXSTREAM_CHECKPOINT_DIR": "s3a://bucket/txstream",
        "TXSTREAM_HEALTHCHECK_PORT": "8080",  # the image's own setting, not an override
    })
    assert config.kafka_bootstrap_servers == "broker-from-file:9092"
    assert config.batch_transactions == 7 and config.transactions.max_events == 2000
    assert config.transactions.max_delay_ms == 500, "the rest of the mapping is the file's"
    assert config.sinks[0].settings.mode == "replace"  # type: ignore[union-attr]
    assert config.sources[1].topic == "orders-v2"
    assert config.http_port is None and config.log_format == "json"
    assert config.checkpoint_location == "s3a://bucket/txstream/txstream-orders"

def test_environment_override_problems_name_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(_deploy_config(), env={
            **ENV, "TXSTREAM_TRANSACTIONS__MAX_EVENTS": "0", "TXSTREAM_SINKS__9__MODE": "create",
            "DATABASE_PASSWORD_FILE": "/nonexistent/secret"})
    assert [line.strip() for line in str(err.value).splitlines()[1:]] == [
        "DATABASE_PASSWORD_FILE: cannot read /nonexistent/secret: No such file or directory",
        "TXSTREAM_SINKS__9__MODE: sinks has 4 item(s); '9' is not one of their indexes",
    ]
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(_deploy_config(), env={
            **ENV, "TXSTREAM_TRANSACTIONS__MAX_EVENTS": "0"})
    assert str(err.value).splitlines()[1].strip() == (
        "transactions.max_events (from TXSTREAM_TRANSACTIONS__MAX_EVENTS): Input should be "
        "greater than 0")

def test_secrets_only_from_the_environment_and_never_shown(tmp_path: Path) -> None:
    data = {**_deploy_config(), "database_url": "postgresql://app:hunter2@db/x",
            "database_password": "hunter2"}
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_mapping(data, env={"KAFKA_BOOTSTRAP_SERVERS": "k:9092"})
    assert "hunter2" not in str(err.value)
    assert [line.strip() for line in str(err.value).splitlines()[1:]] == [
        "database_password: secrets are not read from the configuration file; set "
        "DATABASE_PASSWORD or DATABASE_PASSWORD_FILE in the environment",
        "database_url: contains a password; secrets are not read from the configuration file: "
        "give the URL without it and set DATABASE_PASSWORD (or DATABASE_URL) in the environment",
    ]
    password = tmp_path / "password"
    password.write_text("s3cr3t\n")
    config = PipelineConfig.from_mapping(
        {**_deploy_config(), "database_url": "postgresql://app@db:5432/x"},
        env={"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "DATABASE_PASSWORD_FILE": str(password)})
    assert config.database_dsn is not None and "password=s3cr3t" in config.database_dsn
    assert "s3cr3t" not in repr(config) and "s3cr3t" not in str(config.model_dump())

def test_the_live_endpoint_token_comes_from_the_environment_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"live\.token: secrets are not read from the "
                                          r"configuration file; set TXSTREAM_LIVE__TOKEN"):
        PipelineConfig.from_mapping({**_deploy_config(), "live": {"token": "abc"}}, env=ENV)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    config = PipelineConfig.from_mapping(
        _deploy_config(), env={**ENV, "TXSTREAM_LIVE__TOKEN_FILE": str(token)})
    assert config.live.token is not None and config.live.token.get_secret_value() == "t0ken"
    assert "t0ken" not in repr(config)
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file go together"):
        PipelineConfig.from_mapping({**_deploy_config(), "live": {"tls_cert_file": "c.pem"}},
                                    env=ENV)
    remote = PipelineConfig.from_mapping(
        {**_deploy_config(), "checkpoint_dir": "hdfs://nn/ck"}, env=ENV)
    with pytest.raises(ConfigError, match=r"set live\.state_dir"):
        _ = remote.live_state_dir
    assert config.live_state_dir == Path(config.checkpoint_location) / "live"

def test_cli_reports_config_errors_and_exits_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**_deploy_config(), "batch_transactions": 0}))
    assert main(["run", str(path)]) == 2
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("batch_transactions: Input should be greater than or equal to 1") == 2
    path.write_text("- not a mapping\n")
    assert main(["check", str(path)]) == 2
    assert "must be a mapping at the top level" in capsys.readouterr().err


def test_only_snapshots_committed_per_batch_net_batches() -> None:
    """`nets_batches`: no sink shows a state within a batch (see `PipelineConfig`)."""
    data = {**_deploy_config(), "sinks": [{"output": o, "kind": "postgres_snapshot"}
                                          for o in ("region_totals", "statuses")]}
    assert PipelineConfig.from_mapping(data, env=ENV).nets_batches
    each = {**data, "postgres_commit": "transaction"}
    assert not PipelineConfig.from_mapping(each, env=ENV).nets_batches
    for other in ({"kind": "postgres_append", "table": "statuses_changes"},
                  {"kind": "kafka", "topic": "out", "transactional_id": "t1"},
                  {"kind": "file", "path": "/tmp/statuses.jsonl"}, {"kind": "live"}):
        streamed = {**data, "sinks": [*data["sinks"], {"output": "statuses", **other}]}
        assert not PipelineConfig.from_mapping(streamed, env=ENV).nets_batches, other
