"""Deployment artifacts, checked as far as a machine without Docker or Kubernetes allows.

- helm/ is rendered by Helm's own Go library (helm-python-sdk binds libhelm_c) and every
  rendered object is validated against the Kubernetes JSON schemas that kubernetes-validate
  ships (no network); `helm lint --strict` runs through the same library.
- docker-compose.yml is parsed and validated by compose-spec (a Compose-spec parser), and
  every file it, or the image it builds, refers to exists.
- The Dockerfile's COPY sources exist, its entrypoint is the package's console script, and its
  HEALTHCHECK command is run against a real HTTP endpoint.

A missing tool fails these tests (with the package to install); none is skipped.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import pytest
import yaml
from support.kafka_settings import security_of

from txstream.kafka_client import client_settings
from txstream.schemas.config import PipelineConfig

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PIPELINE = ROOT / "deploy" / "pipeline.yaml"
# The oldest Kubernetes the chart supports and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.29", "latest")
# Kinds of CRDs (Prometheus Operator) that no Kubernetes schema covers.
CRD_KINDS = {"monitoring.coreos.com/v1": {"ServiceMonitor"}}


def _require(module: str, package: str) -> ModuleType:
    """Import a checking tool, failing (never skipping) the test when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{package} is not installed ({exc}); run `pip install -e .[test]`",
                    pytrace=False)


# ---------------------------------------------------------------------------- Helm chart

# Values of a production-like release: Spark on Kubernetes, object-store checkpoints,
# a ServiceMonitor, and every optional block filled in.
K8S_VALUES: dict[str, Any] = {
    "fullnameOverride": "orders-pipeline",
    "image": {"repository": "registry.example.com/txstream", "tag": "1.2.3"},
    "imagePullSecrets": [{"name": "registry"}],
    "kafka": {"bootstrapServers": "kafka-0.kafka:9092,kafka-1.kafka:9092"},
    "database": {"existingSecret": "orders-db", "secretKey": "DATABASE_URL"},
    "spark": {
        "master": "k8s://https://kubernetes.default.svc",
        "driverMemory": "2g",
        "executorImage": "registry.example.com/txstream-executor:1.2.3",
        "conf": {"spark.executor.instances": "3", "spark.executor.memory": "2g"},
    },
    "checkpoint": {"dir": "s3a://checkpoints/orders"},
    "service": {"port": 9100},
    "metrics": {"podAnnotations": False,
                "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "6Gi"}},
    "env": [{"name": "LOG_LEVEL", "value": "debug"}],
    "envFrom": [{"secretRef": {"name": "orders-s3"}}],
    "podAnnotations": {"team": "data"},
    "nodeSelector": {"pool": "spark"},
    "tolerations": [{"key": "spark", "operator": "Exists", "effect": "NoSchedule"}],
    "priorityClassName": "pipelines",
}
# A Spark standalone cluster and a pre-provisioned checkpoint claim.
STANDALONE_VALUES: dict[str, Any] = {
    "spark": {"master": "spark://spark-master.spark:7077"},
    "checkpoint": {"persistence": {"existingClaim": "orders-checkpoints"}},
}
# An active pod and a standby, the checkpoint on a claim both pods mount.
STANDBY_VALUES: dict[str, Any] = {
    "replicas": 2, "checkpoint": {"persistence": {"accessMode": "ReadWriteMany"}}}
VALUE_SETS = {"defaults": {}, "k8s": K8S_VALUES, "standalone": STANDALONE_VALUES,
              "no-persistence": {"checkpoint": {"persistence": {"enabled": False}}},
              "standby": STANDBY_VALUES, "standby-k8s": {**K8S_VALUES, "replicas": 2}}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's objects for `values`, rendered by Helm (release `orders` in `pipelines`)."""
    helm = _require("helm_python", "helm-python-sdk (Helm's Go library)")
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values=values, name="orders", namespace="pipelines",
                                 is_install=True)
    # NOTES.txt is the message `helm install` prints, not a manifest (`helm template` skips it).
    return [doc for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for obj in objects:
        assert obj["kind"] not in kinds, f"two {obj['kind']} objects; the tests expect one"
        kinds[obj["kind"]] = obj
    return kinds


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (main,) = by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["containers"]
    return main


def env_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objects)["env"]}


def executor_pod_template(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    template = by_kind(objects)["ConfigMap"]["data"].get("executor-pod-template.yaml")
    return None if template is None else yaml.safe_load(template)


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_chart_renders_valid_kubernetes_objects(case: str) -> None:
    kv = _require("kubernetes_validate", "kubernetes-validate")
    objects = render(VALUE_SETS[case])
    assert objects
    # Spark creates executor pods from this template: it must be a valid Pod as well.
    template = executor_pod_template(objects)
    if template is not None:
        objects.append({**template, "metadata": {"name": "executor-template",
                                                 **template["metadata"]}})
    for version in KUBE_VERSIONS:
        target = kv.utils.latest_version() if version == "latest" else version
        for obj in objects:
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            try:
                kv.validate(obj, target, strict=True)
            except kv.SchemaNotFoundError:
                assert obj["kind"] in CRD_KINDS.get(obj["apiVersion"], set()), (
                    f"{name}: no Kubernetes {target} schema for {obj['apiVersion']}"
                )
            except kv.ValidationError as exc:
                pytest.fail(f"{name} is not a valid Kubernetes {target} object: {exc.message} "
                            f"at {list(exc.path)}")


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_chart_passes_helm_lint_strict(case: str) -> None:
    helm = _require("helm_python", "helm-python-sdk (Helm's Go library)")
    report = helm.lint(str(CHART), VALUE_SETS[case], strict=True, namespace="pipelines")
    # Severity 1 is informational (e.g. "icon is recommended"); 2 and 3 are warnings and errors.
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def _assert_schema_rejects(values: dict[str, Any], complaint: str) -> None:
    """values.schema.json, applied by Helm itself, refuses `values` naming `complaint`."""
    helm = _require("helm_python", "helm-python-sdk (Helm's Go library)")
    with pytest.raises(helm.HelmValuesError, match="schema") as failure:
        render(values)
    assert complaint in str(failure.value)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"spark": {"master": "yarn"}}, "/spark/master"),
        ({"sprak": {"master": "local[2]"}}, "sprak"),
        ({"service": {"port": "8080"}}, "/service/port"),
        ({"pipeline": {"checkpoint_dir": "/data"}}, "/pipeline"),
        ({"pipeline": {"pipeline": "txstream.examples.orders:pipeline", "sources": [{}],
                       "sinks": [{}], "live": {"port": 1}}}, "/pipeline/live"),
        ({"live": {"port": 8815, "token": "s3cret"}}, "/live/token"),
        ({"spark": {"conf": {"executor.memory": "2g"}}}, "executor.memory"),
    ],
)
def test_chart_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    """values.schema.json, applied by Helm itself: a typo fails the render, not the pod."""
    _assert_schema_rejects(values, complaint)


def test_chart_defaults_run_one_hardened_replica_with_probes() -> None:
    objects = render({})
    kinds = by_kind(objects)
    assert set(kinds) == {"ConfigMap", "Deployment", "PersistentVolumeClaim", "Service",
                          "ServiceAccount"}
    deployment = kinds["Deployment"]["spec"]
    assert deployment["replicas"] == 1
    assert deployment["strategy"] == {"type": "Recreate"}
    pod = deployment["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    main = container(objects)
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["args"] == ["/etc/txstream/pipeline.yaml"]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert main["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["resources"]["limits"]["memory"]
    annotations = deployment["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"

    env = env_of(objects)
    assert env["SPARK_MASTER"] == "local[2]"
    assert env["DATABASE_URL"] == {"secretKeyRef": {"name": "txstream-database", "key": "url"}}
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert "PYSPARK_SUBMIT_ARGS" not in env  # local mode: no executors to call back
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert mounts["/var/lib/txstream/checkpoints"] == "checkpoints"
    assert mounts["/tmp"] == "tmp"  # the writable scratch space of a read-only root
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = kinds["PersistentVolumeClaim"]["metadata"]["name"]
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == claim


def test_chart_default_pipeline_is_the_image_pipeline() -> None:
    """The chart's default config and deploy/pipeline.yaml describe the same pipeline."""
    config = yaml.safe_load(by_kind(render({}))["ConfigMap"]["data"]["pipeline.yaml"])
    assert config == yaml.safe_load(PIPELINE.read_text())


def test_chart_on_kubernetes_spark_with_object_store_and_service_monitor() -> None:
    objects = render(K8S_VALUES)
    kinds = by_kind(objects)
    assert {"Role", "RoleBinding", "ServiceMonitor"} <= set(kinds)
    assert "PersistentVolumeClaim" not in kinds  # checkpoints go to the object store

    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True  # the driver creates executor pods
    binding = kinds["RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": "pipelines"}]
    assert "prometheus.io/scrape" not in kinds["Deployment"]["spec"]["template"]["metadata"][
        "annotations"]

    env = env_of(objects)
    assert env["SPARK_MASTER"] == "k8s://https://kubernetes.default.svc"
    assert env["SPARK_DRIVER_MEMORY"] == "2g"
    assert env["DATABASE_URL"] == {"secretKeyRef": {"name": "orders-db", "key": "DATABASE_URL"}}
    assert env["LOG_LEVEL"] == "debug"
    submit = shlex.split(env["PYSPARK_SUBMIT_ARGS"])
    assert submit[-1] == "pyspark-shell"
    assert "spark.driver.host=$(POD_IP)" in submit
    assert "spark.kubernetes.driver.pod.name=$(POD_NAME)" in submit
    assert container(objects)["envFrom"] == [{"secretRef": {"name": "orders-s3"}}]
    assert "/var/lib/txstream/checkpoints" not in {
        m["mountPath"] for m in container(objects)["volumeMounts"]}

    service = kinds["Service"]
    data = kinds["ConfigMap"]["data"]
    config = yaml.safe_load(data["pipeline.yaml"])
    assert config["checkpoint_dir"] == "s3a://checkpoints/orders"
    assert config["http_port"] == 9100
    spark_conf = dict(line.split(" ", 1) for line in data["spark-defaults.conf"].splitlines())
    assert spark_conf["spark.kubernetes.namespace"] == "pipelines"
    assert spark_conf["spark.kubernetes.container.image"] == (
        "registry.example.com/txstream-executor:1.2.3")
    assert spark_conf["spark.executor.instances"] == "3"
    template_path = PurePosixPath(spark_conf["spark.kubernetes.executor.podTemplateFile"])
    mounted = {PurePosixPath("/etc/txstream") / item["path"]: item["key"]
               for volume in kinds["Deployment"]["spec"]["template"]["spec"]["volumes"]
               if volume["name"] == "config" for item in volume["configMap"]["items"]}
    assert mounted[template_path] == "executor-pod-template.yaml"
    template = executor_pod_template(objects)
    assert template is not None
    (executor,) = template["spec"]["containers"]
    assert executor["name"] == spark_conf["spark.kubernetes.executor.podTemplateContainerName"]
    assert in_image(executor["command"][0]), f"{executor['command'][0]} is not in the image"
    assert executor["securityContext"]["readOnlyRootFilesystem"] is True
    # Executors must not look like the driver to the Deployment's and Service's selectors.
    assert not service["spec"]["selector"].items() <= template["metadata"]["labels"].items()

    monitor = kinds["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    assert {"port": "http", "path": "/metrics"}.items() <= monitor["spec"]["endpoints"][0].items()
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["http"] == 9100


def test_chart_serves_live_tables_with_a_token_and_tls_from_secrets() -> None:
    objects = render({"live": {"port": 9815, "token": {"existingSecret": "live-auth"},
                               "tls": {"existingSecret": "live-cert"}},
                      "pipeline": {**yaml.safe_load((CHART / "values.yaml").read_text())
                                   ["pipeline"], "live": {"queue_updates": 64}}})
    main = container(objects)
    assert {"name": "flight", "containerPort": 9815} in main["ports"]
    service_ports = by_kind(objects)["Service"]["spec"]["ports"]
    assert {"name": "flight", "port": 9815, "targetPort": "flight"} in service_ports
    assert env_of(objects)["TXSTREAM_LIVE__TOKEN"] == {
        "secretKeyRef": {"name": "live-auth", "key": "token"}}
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in by_kind(objects)["Deployment"]["spec"]["template"]
               ["spec"]["volumes"]}
    assert volumes["live-tls"]["secret"]["secretName"] == "live-cert"
    config = yaml.safe_load(by_kind(objects)["ConfigMap"]["data"]["pipeline.yaml"])
    assert config["live"] == {"port": 9815, "queue_updates": 64,
                              "tls_cert_file": f"{mounts['live-tls']}/tls.crt",
                              "tls_key_file": f"{mounts['live-tls']}/tls.key"}
    without = render({})
    assert "TXSTREAM_LIVE__TOKEN" not in env_of(without)
    assert "live-tls" not in {m["name"] for m in container(without)["volumeMounts"]}


def test_chart_on_a_standalone_cluster_with_an_existing_claim() -> None:
    objects = render(STANDALONE_VALUES)
    kinds = by_kind(objects)
    assert "PersistentVolumeClaim" not in kinds and "Role" not in kinds
    volumes = {v["name"]: v for v in kinds["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "orders-checkpoints"}
    submit = shlex.split(env_of(objects)["PYSPARK_SUBMIT_ARGS"])
    assert "spark.driver.host=$(POD_IP)" in submit
    assert not any("kubernetes" in arg for arg in submit)
    assert executor_pod_template(objects) is None


def test_chart_with_a_standby_rolls_all_pods_at_once_and_never_evicts_the_active_one(
) -> None:
    """replicas: 2 (values.yaml, `replicas`): the same `txstream run` twice, the lease decides
    which one writes. A standby is never Ready, so the rollout must not wait for pods to become
    Ready one by one, and the budget counts the active pod only."""
    objects = render(STANDBY_VALUES)
    kinds = by_kind(objects)
    deployment = kinds["Deployment"]["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {
        "maxSurge": 0, "maxUnavailable": "100%"}}
    pod_labels = deployment["template"]["metadata"]["labels"]
    budget = kinds["PodDisruptionBudget"]["spec"]
    assert budget["minAvailable"] == 1 and "maxUnavailable" not in budget
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a standby may always go
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    (spread,) = deployment["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert spread["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= \
        pod_labels.items()
    # Both pods mount the one claim the standby restores from.
    claim = kinds["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    volumes = {v["name"]: v for v in deployment["template"]["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == \
        claim["metadata"]["name"]
    # The readiness probe is /readyz, which a standby fails: the Service resolves to the
    # writer only.
    assert container(objects)["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert kinds["Service"]["spec"]["selector"].items() <= pod_labels.items()
    # Every pod is a Spark driver: with executor pods, each names its own.
    def spark_conf(values: dict[str, Any]) -> dict[str, str]:
        text = by_kind(render(values))["ConfigMap"]["data"]["spark-defaults.conf"]
        return dict(line.split(" ", 1) for line in text.splitlines())

    assert spark_conf(K8S_VALUES)["spark.kubernetes.executor.podNamePrefix"] == (
        "orders-pipeline-exec")
    assert "spark.kubernetes.executor.podNamePrefix" not in spark_conf(
        {**K8S_VALUES, "replicas": 2})
    # An existing claim is taken to be ReadWriteMany (the chart cannot see its access mode).
    shared = render({"replicas": 2, "checkpoint": {"persistence": {"existingClaim": "ck"}}})
    assert "PersistentVolumeClaim" not in by_kind(shared)

    # An affinity of one's own replaces the spreading; no budget when asked for none.
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["pipelines"]}]}]}}}
    objects = render({**STANDBY_VALUES, "affinity": own,
                      "podDisruptionBudget": {"enabled": False}})
    assert by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["affinity"] == own
    assert "PodDisruptionBudget" not in by_kind(objects)
    assert "affinity" not in by_kind(render({}))["Deployment"]["spec"]["template"]["spec"]


FILE_SINKS_ONLY = {**yaml.safe_load((CHART / "values.yaml").read_text())["pipeline"],
                   "sinks": [{"output": "paid_orders", "kind": "file", "path": "/tmp/paid"}]}


@pytest.mark.parametrize(("values", "complaint"), [
    ({"replicas": 0}, "/replicas"),
    # The default claim is ReadWriteOnce: a standby on another node could not mount it.
    ({"replicas": 2}, "/checkpoint/persistence"),
    ({"replicas": 2, "checkpoint": {"persistence": {"enabled": False}}},
     "/checkpoint/persistence"),
    ({"replicas": 2, "checkpoint": {"dir": "s3a://ck/orders"}, "pipeline": FILE_SINKS_ONLY},
     "/pipeline/sinks"),
])
def test_chart_rejects_a_standby_that_could_not_take_over(values: dict[str, Any],
                                                          complaint: str) -> None:
    _assert_schema_rejects(values, complaint)


def test_pipeline_config_is_a_pipeline_config() -> None:
    """deploy/pipeline.yaml is what `txstream run` accepts, with connections from the env."""
    from txstream.schemas.config import PipelineConfig

    config = PipelineConfig.from_mapping(
        yaml.safe_load(PIPELINE.read_text()),
        env={"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092",
             "DATABASE_URL": "postgresql://txstream@postgres/txstream"},
    )
    assert {source.name for source in config.sources} == {"customers", "orders"}
    assert all(s.semantics == "upsert" and s.schema.primary_key for s in config.sources)
    module, function = config.pipeline.split(":")
    outputs = getattr(importlib.import_module(module), function)().outputs
    assert {sink.output for sink in config.sinks} == set(outputs)


# ---- the chart's Kafka security: secrets by reference, never in the ConfigMap ------------

# A client secret the chart must pass by reference only.
CLIENT_SECRET = "s3cr3t-oidc-client-4b2e"
SECURED_VALUES: dict[str, Any] = {"kafka": {"bootstrapServers": "kafka.example:9093",
                                            "security": {
    "protocol": "SASL_SSL",
    "sasl": {"mechanism": "SCRAM-SHA-512", "existingSecret": "orders-kafka"},
    "tls": {"existingSecret": "orders-kafka-tls", "certificateKey": "tls.crt",
            "keyKey": "tls.key", "keyPasswordKey": "key-password"},
}}}


def test_chart_passes_kafka_secrets_by_reference_and_files_never_in_the_configmap() -> None:
    kv = _require("kubernetes_validate", "kubernetes-validate")
    helm = _require("helm_python", "helm-python-sdk (Helm's Go library)")
    report = helm.lint(str(CHART), SECURED_VALUES, strict=True, namespace="pipelines")
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2]
    objects = render(SECURED_VALUES)
    for obj in objects:
        kv.validate(obj, kv.utils.latest_version(), strict=True)
    env = env_of(objects)
    assert env["KAFKA_SASL_USERNAME"] == {"secretKeyRef": {"name": "orders-kafka",
                                                           "key": "username"}}
    assert env["KAFKA_SASL_PASSWORD"] == {"secretKeyRef": {"name": "orders-kafka",
                                                           "key": "password"}}
    assert env["KAFKA_SSL_KEY_PASSWORD_FILE"] == "/etc/kafka-tls/key-password"
    mounts = {m["mountPath"]: m for m in container(objects)["volumeMounts"]}
    assert mounts["/etc/kafka-tls"]["readOnly"] is True
    volumes = {v["name"]: v for v in
               by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/etc/kafka-tls"]["name"]]["secret"]["secretName"] == "orders-kafka-tls"

    configmap = by_kind(objects)["ConfigMap"]["data"]["pipeline.yaml"]
    assert yaml.safe_load(configmap)["kafka_security"] == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "ssl_endpoint_identification": True, "ssl_ca_file": "/etc/kafka-tls/ca.crt",
        "ssl_cert_file": "/etc/kafka-tls/tls.crt", "ssl_key_file": "/etc/kafka-tls/tls.key"}
    assert not any(field in configmap for field in ("password", "secret"))


def test_chart_release_runs_with_its_kafka_secrets() -> None:
    """The rendered config, with the Deployment's environment resolved the way the kubelet
    would (values, Secret keys by reference), is a valid configuration whose clients carry the
    Secret's credentials."""
    objects = render({"kafka": {"security": {
        "protocol": "SASL_SSL",
        "sasl": {"mechanism": "OAUTHBEARER", "existingSecret": "orders-kafka",
                 "oauthbearer": {"tokenEndpointUrl": "https://idp.example/token",
                                 "clientId": "orders", "scope": "kafka"}}}}})
    secrets = {("orders-kafka", "client-secret"): CLIENT_SECRET,
               ("txstream-database", "url"): "postgresql://u@db/x"}
    env = {name: value if isinstance(value, str) else
           secrets[(value["secretKeyRef"]["name"], value["secretKeyRef"]["key"])]
           for name, value in env_of(objects).items()
           if isinstance(value, str) or "secretKeyRef" in value}
    config = PipelineConfig.from_mapping(
        yaml.safe_load(by_kind(objects)["ConfigMap"]["data"]["pipeline.yaml"]), env)
    assert security_of(client_settings("b", config.kafka_security)) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        "sasl.oauthbearer.client.id": "orders", "sasl.oauthbearer.client.secret": CLIENT_SECRET,
        "sasl.oauthbearer.scope": "kafka", "ssl.endpoint.identification.algorithm": "https"}


@pytest.mark.parametrize(("values", "complaint"), [
    ({"kafka": {"security": {"protocol": "SASL_SSL"}}}, "/kafka/security/sasl"),
    ({"kafka": {"security": {"protocol": "SASL_SSL", "sasl": {
        "mechanism": "OAUTHBEARER", "existingSecret": "s"}}}}, "tokenEndpointUrl"),
    ({"kafka": {"security": {"protocol": "TLS"}}}, "/kafka/security/protocol"),
    ({"kafka": {"security": {"protocol": "SASL_SSL", "sasl": {
        "mechanism": "PLAIN", "existingSecret": "s", "password": "inline"}}}}, "password"),
    ({"pipeline": {"kafka_security": {"security_protocol": "SSL"}}}, "/pipeline"),
])
def test_chart_rejects_incomplete_or_inline_kafka_security(values: dict[str, Any],
                                                           complaint: str) -> None:
    _assert_schema_rejects(values, complaint)


# ---------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def image_files() -> dict[PurePosixPath, Path]:
    """What the image holds from the repository: path in the image -> source in the repo."""
    files: dict[PurePosixPath, Path] = {}
    workdir = PurePosixPath("/")
    for keyword, args in dockerfile_instructions():
        if keyword == "WORKDIR":
            workdir = workdir / args
        elif keyword == "COPY":
            *sources, dest = [a for a in shlex.split(args) if not a.startswith("--")]
            target = workdir / dest
            for source in sources:
                path = target / PurePosixPath(source).name if dest.endswith("/") else target
                files[path] = ROOT / source
    return files


def in_image(path: str) -> bool:
    """Whether the image holds `path` from a repository file or directory that exists."""
    wanted = PurePosixPath(path)
    return any((wanted == dest or dest in wanted.parents) and source.exists()
               and (source / wanted.relative_to(dest)).exists()
               for dest, source in image_files().items())


def test_dockerfile_copies_only_files_that_exist() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for dest, source in image_files().items():
        assert source.exists(), f"Dockerfile copies {source.relative_to(ROOT)}, which is missing"
        top = source.relative_to(ROOT).parts[0]
        assert top not in ignored, f".dockerignore leaves out {top}, which the Dockerfile copies"
        assert dest.is_absolute()


def test_dockerfile_runs_txstream_as_non_root_with_java_17() -> None:
    instructions = dockerfile_instructions()
    keywords = [k for k, _ in instructions]
    user = [args for k, args in instructions if k == "USER"][-1]
    assert user.split(":")[0] not in {"root", "0"}
    assert any("openjdk-17" in args for k, args in instructions if k == "RUN")
    assert keywords.count("HEALTHCHECK") == 1
    entrypoint = json.loads([args for k, args in instructions if k == "ENTRYPOINT"][-1])
    assert entrypoint[-2:] == ["txstream", "run"]
    cmd = json.loads([args for k, args in instructions if k == "CMD"][-1])
    assert in_image(cmd[0]), f"the default config {cmd[0]} is not copied into the image"


def test_dockerfile_entrypoint_is_the_packages_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["txstream"] == "txstream.service.cli:main"
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name="txstream")
    assert callable(entry.load()), \
        "txstream's entry point txstream.service.cli:main is not callable"
    # `txstream run` is the image's command: the subcommand must exist.
    txstream = Path(sys.executable).with_name("txstream")
    result = subprocess.run([str(txstream), "run", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"`txstream run --help` failed:\n{result.stderr[-2000:]}"


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        """Silent: the test asserts on exit codes, not on the access log."""


@pytest.fixture
def health_server() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_dockerfile_healthcheck_probes_healthz(health_server: HTTPServer) -> None:
    """The image's HEALTHCHECK command, run here: 0 on a healthy /healthz, non-zero on 503."""
    instructions = dockerfile_instructions()
    (healthcheck,) = [args for k, args in instructions if k == "HEALTHCHECK"]
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3:].strip())
    assert command[0] == "python"
    env = {**os.environ, "TXSTREAM_HEALTHCHECK_PORT": str(health_server.server_address[1])}
    image_env = [args for k, args in instructions if k == "ENV" and "HEALTHCHECK_PORT" in args]
    assert image_env, "the image must set TXSTREAM_HEALTHCHECK_PORT"

    def probe() -> int:
        return subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True,
                              timeout=30).returncode

    _Health.status = 200
    assert probe() == 0
    _Health.status = 503
    assert probe() != 0


def test_spark_executor_entrypoint_starts_the_kubernetes_executor_backend() -> None:
    """deploy/spark-executor.sh with the environment Spark gives an executor pod.

    No driver listens at the driver URL: the executor backend, loaded from pyspark's jars,
    must start with the driver's Java options in order and then fail to reach the driver.
    """
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SPARK_JAVA_OPT_0": "-Dtxstream.check=first",
        "SPARK_JAVA_OPT_1": "-XshowSettings:properties",
        "SPARK_EXECUTOR_MEMORY": "256m",
        "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{port}",
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "spark-application-1",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "orders-exec-1",
    }
    script = ROOT / "deploy" / "spark-executor.sh"
    assert in_image("/app/deploy/spark-executor.sh")
    result = subprocess.run([str(script), "executor"], env=env, capture_output=True,
                            text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "txstream.check = first" in output, output[-3000:]
    assert f"Failed to connect to /127.0.0.1:{port}" in output, output[-3000:]
    assert "KubernetesExecutorBackend" in output, output[-3000:]

    usage = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert usage.returncode == 64 and "usage" in usage.stderr


# ---------------------------------------------------------------------------- Compose


def compose() -> dict[str, Any]:
    """docker-compose.yml, parsed and validated against the Compose specification."""
    spec = _require("compose_spec", "compose-spec (Compose-spec parser)")
    try:
        parsed: dict[str, Any] = spec.PyCompose.from_yaml(COMPOSE.read_text()).to_dict()
    except ValueError as exc:
        pytest.fail(f"docker-compose.yml is not a valid Compose file: {exc}", pytrace=False)
    return parsed


def test_compose_file_is_valid_and_has_the_stack() -> None:
    services = compose()["services"]
    assert {"kafka", "postgres", "txstream", "generator"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    spark = {name for name, svc in services.items() if "spark" in svc.get("profiles", [])}
    assert spark == {"spark-master", "spark-worker"}
    assert not any(svc.get("profiles") for name, svc in services.items() if name not in spark)
    env = services["txstream"]["environment"]
    assert {"KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "SPARK_MASTER"} <= set(env)
    for name, svc in services.items():
        image = svc.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag"


def test_compose_binds_ports_to_localhost() -> None:
    for name, svc in compose()["services"].items():
        for port in svc.get("ports", []):
            published = port if isinstance(port, str) else f"{port.get('host_ip')}:"
            assert published.startswith("127.0.0.1:"), f"{name}: port {port} is not local"


def test_compose_references_only_files_that_exist() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        build = svc.get("build")
        if build is not None:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile",
                                                                               "Dockerfile")
            assert (context / dockerfile).is_file(), f"{name}: no {dockerfile} in {context}"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source")
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: mounts missing {source}"
        for dependency in svc.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        # What the service runs from the project's image must be in it: files copied into it,
        # or programs the project's install puts on the PATH (python, pyspark's spark-class).
        if svc.get("image") == "txstream:dev":
            program = svc.get("entrypoint", ["txstream"])[0]
            assert program.startswith("/") or Path(sys.executable).with_name(program).exists(), (
                f"{name}: {program} is not installed with the project")
            for arg in [*svc.get("entrypoint", []), *svc.get("command", [])]:
                if arg.startswith("/app/") or arg.startswith("/etc/txstream/"):
                    mounted = any(str(v).split(":")[1] == arg for v in svc.get("volumes", []))
                    assert mounted or in_image(arg), f"{name}: {arg} is not in the image"


# ---------------------------------------------------------------------------- Generator


def test_generator_feeds_the_pipelines_sources(kafka: Any) -> None:
    """deploy/generator.py against a Kafka-protocol broker; what it wrote, decoded by the Kafka
    input with deploy/pipeline.yaml's source specs, is all valid upserts and deletes."""
    from confluent_kafka import Consumer

    from txstream.schemas.sources import SourceSpec
    from txstream.sources.consumed import raw_records
    from txstream.sources.decoder import SourceDecoder
    from txstream.sources.kafka_source import DELETE

    sys.path.insert(0, str(ROOT / "deploy"))
    try:
        generator = importlib.import_module("generator")
    finally:
        sys.path.remove(str(ROOT / "deploy"))
    specs = {s["name"]: SourceSpec.model_validate(s)
             for s in yaml.safe_load(PIPELINE.read_text())["sources"]}
    topics = {name: f"t-{uuid.uuid4().hex[:12]}" for name in specs}
    for topic in topics.values():
        kafka.create_topic(topic)
    total = 400
    generator.main(["--bootstrap-servers", kafka.bootstrap_servers,
                    "--customers-topic", topics["customers"], "--orders-topic", topics["orders"],
                    "--customers", "5", "--events", str(total), "--rate", "100000",
                    "--seed", "3"])

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                         "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"})
    consumer.subscribe(list(topics.values()))
    messages: list[Any] = []
    try:
        for _ in range(200):
            if len(messages) == total:
                break
            messages += [m for m in consumer.consume(500, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    assert len(messages) == total

    deletes = 0
    for name, topic in topics.items():
        batch = [m for m in messages if m.topic() == topic]
        decoded = SourceDecoder(specs[name]).decode(raw_records(batch, topic),
                                                    list(range(len(batch))))
        assert not decoded.bad, decoded.bad[:3]
        assert decoded.rows.num_rows == len(batch)
        deletes += sum(decoded.rows.column(DELETE).to_pylist())
    assert deletes == sum(1 for m in messages if m.value() is None) > 0
