"""Kafka over TLS and SASL: the `kafka_security` block, how it is loaded and validated, that
it reaches every Kafka client the service creates, and that its secrets show up nowhere.

No broker here speaks TLS or SASL (the embedded one is librdkafka's mock cluster), so what is
tested is what the clients are given and what librdkafka accepts, not a secured handshake:
clients are recorded with the configuration the service gives them, and opened against the
plaintext test broker without their TLS and SASL settings, so the service's own code paths
run for real.
"""

from __future__ import annotations

import logging
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
import yaml
from pydantic import SecretStr, ValidationError
from support.kafka_settings import security_of
from support.service_process import scrape

from txstream.kafka_client import client_settings
from txstream.schemas.config import ConfigError, PipelineConfig
from txstream.schemas.kafka import OWNED_SETTING_PREFIXES, KafkaSecurity
from txstream.schemas.tables import TableSchema
from txstream.service.check import run_checks
from txstream.service.embedded.kafka import KafkaEndpoint
from txstream.service.health import HealthServer, Readiness
from txstream.service.input_reports import InputReports
from txstream.service.metrics import Metrics
from txstream.service.outputs import open_sinks
from txstream.sources.kafka_input import KafkaInput
from txstream.sources.kafka_monitor import KafkaMonitor
from txstream.sources.source_state import SourceState

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "deploy" / "pipeline.yaml"

PASSWORD = "s3cr3t-sasl-password-7f1c"
CLIENT_SECRET = "s3cr3t-oidc-client-4b2e"
KEY_PASSWORD = "s3cr3t-key-password-9a0d"
SECRETS = (PASSWORD, CLIENT_SECRET, KEY_PASSWORD)
SCRAM = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
         "sasl_username": "svc-orders"}
# What librdkafka must get for SCRAM above, with PASSWORD from the environment.
SCRAM_SETTINGS = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                  "sasl.username": "svc-orders", "sasl.password": PASSWORD}
REGION_TOTALS = TableSchema.of({"region": "text", "orders": "bigint"}, primary_key=["region"])


def pipeline_config(bootstrap: str, security: dict[str, Any], env: dict[str, str]
                    ) -> PipelineConfig:
    """deploy/pipeline.yaml with topics of its own, a dead-letter topic, a Kafka sink and
    `security`, loaded the way `txstream run` loads it."""
    suffix = uuid.uuid4().hex[:10]
    data = yaml.safe_load(PIPELINE.read_text())
    for source in data["sources"]:
        source["topic"] = f"{source['topic']}-{suffix}"
    data.update(
        consumer_group=f"g-{suffix}", dead_letter_topic=f"dead-{suffix}",
        sinks=[{"output": "region_totals", "kind": "kafka", "topic": f"totals-{suffix}",
                "transactional_id": f"tx-{suffix}"}],
        kafka_security=security,
    )
    return PipelineConfig.from_mapping(data, {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, **env})


def topics_of(config: PipelineConfig) -> list[str]:
    assert config.dead_letter_topic is not None
    return [*(s.topic for s in config.sources), config.dead_letter_topic,
            *(cfg.settings.topic for cfg in config.sinks if cfg.settings.kind == "kafka")]


# ---------------------------------------------------------------------------- every client


@dataclass
class Recorded:
    kind: str  # Consumer, Producer, AdminClient
    conf: dict[str, Any]


def _recording(cls: type, recorded: list[Recorded]) -> type:
    class Recording(cls):  # type: ignore[valid-type, misc]
        def __init__(self, conf: dict[str, Any]) -> None:
            recorded.append(Recorded(cls.__name__, dict(conf)))
            # The test broker speaks plaintext only.
            super().__init__({k: v for k, v in conf.items()
                              if not k.startswith(OWNED_SETTING_PREFIXES)})

    return Recording


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[Recorded]:
    """Every Kafka client created from now on by the service's modules (whichever of them
    are loaded, so a new one is covered as soon as it is imported) or through
    `confluent_kafka`'s own names (function-local imports)."""
    recorded: list[Recorded] = []
    wrappers = {cls: _recording(cls, recorded) for cls in (
        confluent_kafka.Consumer, confluent_kafka.Producer, confluent_kafka.admin.AdminClient)}
    for name, module in list(sys.modules.items()):
        if module is None or not (name.startswith("txstream.")
                                  or name in ("confluent_kafka", "confluent_kafka.admin")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value in wrappers:
                monkeypatch.setattr(module, attr, wrappers[value])
    return recorded


def test_every_client_of_a_configured_pipeline_gets_the_security_block(
        kafka: KafkaEndpoint, clients: list[Recorded], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """The service's own code paths, from a loaded configuration: the input (source consumer,
    dead-letter producer, the monitor's two consumers), the runner's sinks (a Kafka sink's
    transactional producer) and `txstream check`."""
    (tmp_path / "password").write_text(PASSWORD + "\n")
    config = pipeline_config(kafka.bootstrap_servers, SCRAM,
                             {"KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "password")})
    for topic in topics_of(config):
        kafka.create_topic(topic)
    group = config.consumer_group

    state = SourceState(next_number=1, offsets={}, upsert_rows={
        s.name: s.table_schema.arrow_schema().empty_table() for s in config.sources})
    metrics, readiness = Metrics(), Readiness(config.ready_max_lag)
    source = KafkaInput(config, state, [],
                        InputReports(metrics.source, readiness, KafkaInput.name))
    source.close()

    # The runner's own sink opening, without the Spark engine it takes output schemas from.
    sinks, _ = open_sinks(config, {"region_totals": REGION_TOTALS}, resuming=False, live=None)
    for opened in sinks.values():
        for _, sink in opened:
            sink.close()

    def no_spark(*_: object, **__: object) -> None:
        raise RuntimeError("no Spark in this test")

    monkeypatch.setattr("txstream.service.spark.get_spark", no_spark)
    checks = {name: (ok, detail) for name, ok, detail in run_checks(config)}
    assert checks["kafka"][0], checks["kafka"]

    sink_id = getattr(config.sinks[0].settings, "transactional_id", None)
    roles = {
        "source consumer": [c for c in clients if c.conf.get("group.id") == group],
        "monitor consumers": [c for c in clients if c.conf.get("group.id") == f"{group}-monitor"],
        "dead-letter producer": [c for c in clients if c.kind == "Producer"
                                 and "transactional.id" not in c.conf],
        "Kafka sink producer": [c for c in clients if c.conf.get("transactional.id") == sink_id],
        "check consumer": [c for c in clients if c.conf.get("group.id") == f"{group}-check"],
    }
    assert {role: len(found) for role, found in roles.items()} == {
        "source consumer": 1, "monitor consumers": 2, "dead-letter producer": 1,
        "Kafka sink producer": 1, "check consumer": 1}
    assert len(clients) == 6, [c.conf.get("group.id") for c in clients]
    for client in clients:
        assert security_of(client.conf) == SCRAM_SETTINGS, client


# ---------------------------------------------------------------------------- librdkafka


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, Path]:
    """A CA location librdkafka accepts without a real certificate (a directory of CA files
    is loaded lazily), and client certificate and key paths (contents never read here)."""
    (tmp_path / "cas").mkdir()
    files = {"ca": tmp_path / "cas", "cert": tmp_path / "client.crt",
             "key": tmp_path / "client.key"}
    files["cert"].write_text("certificate")
    files["key"].write_text("key")
    return files


CASES: dict[str, tuple[Callable[[dict[str, Path]], dict[str, Any]], dict[str, str], bool]] = {
    # name: (block, its librdkafka settings, whether a client can be opened with them here)
    "plaintext": (lambda _: {}, {"security.protocol": "PLAINTEXT"}, True),
    "sasl plain": (
        lambda _: {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                   "sasl_username": "u", "sasl_password": PASSWORD},
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
         "sasl.username": "u", "sasl.password": PASSWORD}, True),
    "scram over tls, own CA, no hostname check": (
        lambda f: {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
                   "sasl_username": "u", "sasl_password": PASSWORD, "ssl_ca_file": f["ca"],
                   "ssl_endpoint_identification": False},
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
         "sasl.username": "u", "sasl.password": PASSWORD,
         "ssl.endpoint.identification.algorithm": "none", "ssl.ca.location": "{ca}"}, True),
    "oauthbearer oidc": (
        lambda _: {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                   "oauthbearer_token_endpoint_url": "https://127.0.0.1:1/token",
                   "oauthbearer_client_id": "txstream", "oauthbearer_client_secret":
                   CLIENT_SECRET, "oauthbearer_scope": "kafka"},
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
         "sasl.oauthbearer.method": "oidc",
         "sasl.oauthbearer.token.endpoint.url": "https://127.0.0.1:1/token",
         "sasl.oauthbearer.client.id": "txstream",
         "sasl.oauthbearer.client.secret": CLIENT_SECRET, "sasl.oauthbearer.scope": "kafka",
         "ssl.endpoint.identification.algorithm": "https"}, True),
    # librdkafka reads the certificate and key when a client opens: dictionary only.
    "mutual tls": (
        lambda f: {"security_protocol": "SSL", "ssl_ca_file": f["ca"], "ssl_cert_file": f["cert"],
                   "ssl_key_file": f["key"], "ssl_key_password": KEY_PASSWORD},
        {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "https",
         "ssl.ca.location": "{ca}", "ssl.certificate.location": "{cert}",
         "ssl.key.location": "{key}", "ssl.key.password": KEY_PASSWORD}, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_client_settings_are_what_librdkafka_accepts(case: str, tls_files: dict[str, Path]
                                                     ) -> None:
    block, expected, openable = CASES[case]
    security = KafkaSecurity.model_validate(block(tls_files))
    consumer = client_settings("127.0.0.1:1", security, **{"group.id": "g"})
    producer = client_settings("127.0.0.1:1", security, **{"linger.ms": 5})
    paths = {name: str(path) for name, path in tls_files.items()}
    assert security_of(consumer) == security_of(producer) == {
        k: v.format(**paths) for k, v in expected.items()}
    assert consumer["bootstrap.servers"] == "127.0.0.1:1" and consumer["group.id"] == "g"
    if openable:  # librdkafka rejects an unknown setting or value when a client opens
        confluent_kafka.Consumer(consumer).close()
        confluent_kafka.Producer(producer).flush(0)


def test_no_client_setting_overrides_the_block() -> None:
    security = KafkaSecurity.model_validate({**SCRAM, "sasl_password": PASSWORD})
    conf = client_settings("b:9092", security, **{"security.protocol": "PLAINTEXT",
                                                  "sasl.password": "other"})
    assert security_of(conf) == SCRAM_SETTINGS


# ---------------------------------------------------------------------------- validation


def _problems(security: dict[str, Any], env: dict[str, str] | None = None,
              **config: Any) -> str:
    data = yaml.safe_load(PIPELINE.read_text())
    data.update(kafka_security=security, **config)
    with pytest.raises(ConfigError) as failure:
        PipelineConfig.from_mapping(data, {"KAFKA_BOOTSTRAP_SERVERS": "b:9092",
                                           "DATABASE_URL": "postgresql://u@db/x", **(env or {})})
    return str(failure.value)


@pytest.mark.parametrize(("security", "env", "expected"), [
    ({"security_protocol": "SASL_SSL"}, {},
     ["kafka_security: security_protocol SASL_SSL needs sasl_mechanism: PLAIN, SCRAM-SHA-256, "
      "SCRAM-SHA-512 or OAUTHBEARER"]),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, {},
     ["sasl_mechanism PLAIN needs sasl_username (the user name: set it in kafka_security, or "
      "set KAFKA_SASL_USERNAME or KAFKA_SASL_USERNAME_FILE in the environment)",
      "sasl_mechanism PLAIN needs sasl_password (the password: set KAFKA_SASL_PASSWORD or "
      "KAFKA_SASL_PASSWORD_FILE in the environment)"]),
    ({**SCRAM, "oauthbearer_client_id": "c"}, {"KAFKA_SASL_PASSWORD": PASSWORD},
     ["oauthbearer_client_id given, but sasl_mechanism is SCRAM-SHA-512: set sasl_mechanism "
      "to OAUTHBEARER, or remove them"]),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "sasl_username": "u",
      "oauthbearer_client_id": "c"}, {},
     ["sasl_username given, but OAUTHBEARER authenticates with oauthbearer_client_id and its "
      "secret: remove them",
      "sasl_mechanism OAUTHBEARER needs oauthbearer_token_endpoint_url",
      "sasl_mechanism OAUTHBEARER needs oauthbearer_client_secret (the client's secret: set "
      "KAFKA_OAUTHBEARER_CLIENT_SECRET or KAFKA_OAUTHBEARER_CLIENT_SECRET_FILE"]),
    ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"},
     {"KAFKA_SASL_PASSWORD": PASSWORD},
     ["sasl_mechanism, sasl_username, sasl_password given, but security_protocol SSL does not "
      "use SASL: set security_protocol to SASL_SSL (or SASL_PLAINTEXT), or remove them"]),
    ({**SCRAM, "ssl_ca_file": "/etc/hosts"}, {"KAFKA_SASL_PASSWORD": PASSWORD},
     ["ssl_ca_file given, but security_protocol SASL_PLAINTEXT does not use TLS: set "
      "security_protocol to SSL (or SASL_SSL), or remove them"]),
    ({"security_protocol": "SSL", "ssl_cert_file": "/etc/hosts"},
     {"KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD},
     ["ssl_cert_file and ssl_key_file go together (the client's certificate and its private "
      "key): give both, or neither",
      "ssl_key_password given without ssl_key_file: give the key file, or remove the "
      "password"]),
    ({"security_protocol": "SSL", "ssl_ca_file": "/nowhere/ca.crt"}, {},
     ["ssl_ca_file: /nowhere/ca.crt does not exist; mount it there or fix the path"]),
    ({"security_protocol": "TLS"}, {},
     ["kafka_security.security_protocol: Input should be 'PLAINTEXT', 'SSL', "
      "'SASL_PLAINTEXT' or 'SASL_SSL'"]),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, {},
     ["kafka_security.sasl_mechanism: Input should be 'PLAIN'"]),
    ({"sasl_pasword": "x"}, {}, ["kafka_security.sasl_pasword: Extra inputs are not permitted"]),
], ids=["SASL without a mechanism", "PLAIN without credentials", "OAUTHBEARER settings with SCRAM",
        "OAUTHBEARER incomplete", "SASL settings without SASL", "TLS settings without TLS",
        "a certificate without its key", "a missing CA file", "an unknown protocol",
        "GSSAPI", "a misspelt field"])
def test_invalid_blocks_fail_at_start_saying_what_to_fix(
        security: dict[str, Any], env: dict[str, str], expected: list[str]) -> None:
    message = _problems(security, env)
    for problem in expected:
        assert problem in message
    assert not any(secret in message for secret in SECRETS)


@pytest.mark.parametrize("field", ["sasl_password", "ssl_key_password",
                                   "oauthbearer_client_secret"])
def test_secrets_in_the_configuration_file_are_refused(field: str) -> None:
    message = _problems({**SCRAM, field: PASSWORD})
    var = {"sasl_password": "KAFKA_SASL_PASSWORD", "ssl_key_password": "KAFKA_SSL_KEY_PASSWORD",
           "oauthbearer_client_secret": "KAFKA_OAUTHBEARER_CLIENT_SECRET"}[field]
    assert (f"kafka_security.{field}: secrets are not read from the configuration file; set "
            f"{var} or {var}_FILE in the environment") in message
    assert PASSWORD not in message


def test_a_kafka_sink_may_not_set_security_of_its_own() -> None:
    message = _problems({}, sinks=[{"output": "statuses", "kind": "kafka", "topic": "t",
                                    "transactional_id": "x", "producer_config": {
                                        "sasl.password": PASSWORD, "linger.ms": "5",
                                        "security.protocol": "SASL_SSL"}}])
    assert ("sinks.0.producer_config: sasl.password, security.protocol: TLS and SASL are set in "
            "kafka_security, which every Kafka client of the service shares; remove them here"
            ) in message
    assert PASSWORD not in message


def test_validation_errors_never_echo_secrets() -> None:
    """pydantic puts a failed model's input into its message unless told not to."""
    with pytest.raises(ValidationError) as failure:
        KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                      sasl_password=SecretStr(PASSWORD))
    assert failure.value.errors()[0]["type"] == "kafka_security"
    assert "needs sasl_username" in str(failure.value)
    assert PASSWORD not in str(failure.value) and PASSWORD not in repr(failure.value)
    with pytest.raises(ValidationError) as failure:
        PipelineConfig.model_validate({
            "pipeline": "txstream.examples.orders", "sources": [], "sinks": [],
            "kafka_security": {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                               "sasl_password": PASSWORD}})
    assert "needs sasl_username" in str(failure.value)
    assert PASSWORD not in str(failure.value)


# ---------------------------------------------------------------------------- secrets


def test_secrets_come_from_the_environment_or_files(tmp_path: Path) -> None:
    (tmp_path / "client-secret").write_text(CLIENT_SECRET + "\n")
    oauth = {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
             "oauthbearer_token_endpoint_url": "https://idp.example/token",
             "oauthbearer_client_id": "txstream"}
    from_file = pipeline_config("b:9092", oauth, {
        "KAFKA_OAUTHBEARER_CLIENT_SECRET_FILE": str(tmp_path / "client-secret")})
    assert client_settings("b:9092", from_file.kafka_security)[
        "sasl.oauthbearer.client.secret"] == CLIENT_SECRET

    # The conventional variables, and TXSTREAM_<FIELD> paths winning over them.
    plain = pipeline_config("b:9092", {"security_protocol": "SASL_SSL",
                                       "sasl_mechanism": "PLAIN"},
                            {"KAFKA_SASL_USERNAME": "from-alias", "KAFKA_SASL_PASSWORD": "alias",
                             "TXSTREAM_KAFKA_SECURITY__SASL_PASSWORD": PASSWORD})
    conf = client_settings("b:9092", plain.kafka_security)
    assert (conf["sasl.username"], conf["sasl.password"]) == ("from-alias", PASSWORD)

    (tmp_path / "client.crt").write_text("certificate")
    (tmp_path / "client.key").write_text("key")
    mtls = pipeline_config("b:9092", {"security_protocol": "SSL",
                                      "ssl_cert_file": str(tmp_path / "client.crt"),
                                      "ssl_key_file": str(tmp_path / "client.key")},
                           {"KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD})
    assert client_settings("b:9092", mtls.kafka_security)["ssl.key.password"] == KEY_PASSWORD

    message = _problems(SCRAM, {"KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "missing")})
    assert f"KAFKA_SASL_PASSWORD_FILE: cannot read {tmp_path / 'missing'}" in message


def test_secrets_stay_out_of_reprs_and_dumps(tmp_path: Path) -> None:
    (tmp_path / "c.crt").write_text("certificate")
    (tmp_path / "c.key").write_text("key")
    config = pipeline_config("b:9092", {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": "u", "ssl_cert_file": str(tmp_path / "c.crt"),
        "ssl_key_file": str(tmp_path / "c.key")},
        {"KAFKA_SASL_PASSWORD": PASSWORD, "KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD})
    oauth = KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                          oauthbearer_token_endpoint_url="https://idp.example/token",
                          oauthbearer_client_id="c",
                          oauthbearer_client_secret=SecretStr(CLIENT_SECRET))
    shown = [repr(config), str(config), repr(config.kafka_security), str(config.kafka_security),
             config.model_dump_json(), str(config.model_dump()), repr(oauth),
             oauth.model_dump_json()]
    for text in shown:
        assert not any(secret in text for secret in SECRETS), text
    assert "sasl_password=SecretStr('**********')" in repr(config.kafka_security)
    # ...while the clients get them.
    assert client_settings("b:9092", config.kafka_security)["sasl.password"] == PASSWORD


def test_librdkafka_logs_carry_no_secrets(caplog: pytest.LogCaptureFixture,
                                          tls_files: dict[str, Path]) -> None:
    """Even at librdkafka's most talkative (its configuration dump, the SASL and OIDC steps),
    through the service's logger."""
    caplog.set_level(logging.DEBUG, logger="librdkafka")
    blocks = [
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u",
         "sasl_password": PASSWORD, "ssl_ca_file": tls_files["ca"]},
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
         "oauthbearer_token_endpoint_url": "https://127.0.0.1:1/token",
         "oauthbearer_client_id": "c", "oauthbearer_client_secret": CLIENT_SECRET},
    ]
    producers = [confluent_kafka.Producer(client_settings(
        "127.0.0.1:1", KafkaSecurity.model_validate(block), debug="conf,security,broker"))
        for block in blocks]
    deadline = time.monotonic() + 10
    dumped = ("sasl.password", "sasl.oauthbearer.client.secret", "Failed to retrieve OIDC token")
    while time.monotonic() < deadline and not all(d in caplog.text for d in dumped):
        for producer in producers:
            producer.poll(0.1)
    for producer in producers:
        producer.flush(0)
    assert all(d in caplog.text for d in dumped), caplog.text[-3000:]
    assert all(r.name == "librdkafka" for r in caplog.records if "sasl." in r.getMessage())
    for record in caplog.records:
        assert not any(secret in record.getMessage() for secret in SECRETS), record.getMessage()


@pytest.fixture
def health() -> Iterator[HealthServer]:
    metrics, readiness = Metrics(), Readiness(max_lag=100)
    readiness.started.set()
    server = HealthServer(0, metrics, readiness, host="127.0.0.1").start()
    yield server
    server.stop()


def _get(server: HealthServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_broker_refusing_the_credentials_shows_no_secret_in_readiness_metrics_or_logs(
        kafka: KafkaEndpoint, health: HealthServer, caplog: pytest.LogCaptureFixture) -> None:
    """The lag monitor with the SASL block against a broker that does not take SASL clients:
    the failure reaches readiness, metrics and the logs as an authentication failure would."""
    caplog.set_level(logging.DEBUG)
    config = pipeline_config(kafka.bootstrap_servers, SCRAM, {"KAFKA_SASL_PASSWORD": PASSWORD})
    reports = InputReports(health.metrics.source, health.readiness, KafkaInput.name)
    # interval_s: the next measurement waits a second, so closing right after the first
    # failure does not wait for a second one.
    monitor = KafkaMonitor(config.kafka_bootstrap_servers or "", config.consumer_group,
                           [s.topic for s in config.sources], reports, interval_s=1.0,
                           security=config.kafka_security).start()
    try:
        deadline = time.monotonic() + 30
        while health.readiness.up("kafka") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        monitor.close()
    assert not health.readiness.up("kafka"), "the broker did not refuse the SASL client"

    status, body = scrape(health.port, "/readyz")
    assert status == 503 and "kafka" in body
    _, metrics = scrape(health.port, "/metrics")
    assert 'txstream_dependency_up{dependency="kafka"} 0' in metrics
    detail = " ".join(health.readiness.problems(health.metrics))  # the log-only detail
    assert "kafka" in detail
    for text in (body, metrics, detail, caplog.text):
        assert not any(secret in text for secret in SECRETS), text
