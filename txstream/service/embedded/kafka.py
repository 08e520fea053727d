"""Kafka endpoints: librdkafka's mock cluster as a separate broker process, testcontainers'
Apache Kafka where a Docker engine answers, or an existing cluster (`KAFKA_BOOTSTRAP_SERVERS`).

The mock cluster ships inside confluent-kafka's librdkafka. It speaks the Kafka protocol over
TCP (produce, fetch, consumer groups, offset commits, idempotent and transactional producers),
but it is not Apache Kafka: it has no CreateTopics admin API (topics are created through
librdkafka's mock API, see `create_topic`) and it does not hide aborted transactional records
from `read_committed` consumers.

Run as a process: `python -m txstream.service.embedded.kafka` prints its bootstrap address on the
first line of stdout, then reads commands on stdin: `create TOPIC PARTITIONS` answers `ok` or
`error ...`. It exits when stdin closes.
"""

from __future__ import annotations

import ctypes
import glob
import os
import signal
import subprocess
import sys
import threading
from typing import Protocol

from confluent_kafka.admin import AdminClient, NewTopic

from txstream.kafka_client import client_settings
from txstream.schemas.kafka import PLAINTEXT


class KafkaUnavailableError(RuntimeError):
    """No Kafka-protocol broker could be reached or started."""


class KafkaEndpoint(Protocol):
    bootstrap_servers: str

    def create_topic(self, name: str, partitions: int = 1) -> None: ...

    def stop(self) -> None: ...


class _MockCluster:
    """librdkafka's mock cluster, driven through the library's C API (in this process)."""

    def __init__(self, brokers: int = 1) -> None:
        import confluent_kafka

        package_dir = os.path.dirname(confluent_kafka.__file__)
        libdir = os.path.join(package_dir, "..", "confluent_kafka.libs")
        paths = glob.glob(os.path.join(libdir, "librdkafka*.so*"))
        if not paths:
            raise KafkaUnavailableError("librdkafka shared library not found in confluent-kafka")
        lib = ctypes.CDLL(paths[0])
        lib.rd_kafka_conf_new.restype = ctypes.c_void_p
        lib.rd_kafka_conf_set.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
        ]
        lib.rd_kafka_new.restype = ctypes.c_void_p
        lib.rd_kafka_new.argtypes = [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
        ]
        lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
        lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
        lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_topic_create.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
        ]
        lib.rd_kafka_mock_push_request_errors_array.argtypes = [
            ctypes.c_void_p, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int),
        ]
        lib.rd_kafka_err2str.restype = ctypes.c_char_p
        self._lib = lib
        errbuf = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # The handle only hosts the cluster; keep its own logging quiet.
        lib.rd_kafka_conf_set(conf, b"log_level", b"3", errbuf, 512)
        self._rk = lib.rd_kafka_new(1, conf, errbuf, 512)
        if not self._rk:
            raise KafkaUnavailableError(f"rd_kafka_new failed: {errbuf.value.decode()}")
        self._cluster = lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._cluster:
            raise KafkaUnavailableError("rd_kafka_mock_cluster_new failed")
        self.bootstrap_servers = lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, name: str, partitions: int) -> str | None:
        err = self._lib.rd_kafka_mock_topic_create(self._cluster, name.encode(), partitions, 1)
        return None if err == 0 else self._lib.rd_kafka_err2str(err).decode()

    def fail_requests(self, api_key: int, error: int, count: int) -> None:
        """The next `count` requests of `api_key` (0 = Produce) get `error` from the broker."""
        errors = (ctypes.c_int * count)(*[error] * count)
        self._lib.rd_kafka_mock_push_request_errors_array(self._cluster, api_key, count, errors)


def serve() -> None:
    cluster = _MockCluster()
    print(cluster.bootstrap_servers, flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "create" and parts[2].isdigit():
            error = cluster.create_topic(parts[1], int(parts[2]))
            print("ok" if error is None else f"error {error}", flush=True)
        elif len(parts) == 4 and parts[0] == "fail" and all(p.isdigit() for p in parts[1:]):
            cluster.fail_requests(*(int(p) for p in parts[1:]))
            print("ok", flush=True)
        elif parts:
            print(f"error unknown command: {line.strip()}", flush=True)


class MockKafkaBroker:
    """The mock cluster in a child process, reached over TCP like any broker."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "txstream.service.embedded.kafka"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        assert self._proc.stdout is not None
        first = self._proc.stdout.readline().strip()
        if not first:
            raise KafkaUnavailableError("mock Kafka broker process exited before serving")
        self.bootstrap_servers = first
        self._lock = threading.Lock()

    def _command(self, line: str) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(f"{line}\n")
            self._proc.stdin.flush()
            return self._proc.stdout.readline().strip()

    def create_topic(self, name: str, partitions: int = 1) -> None:
        answer = self._command(f"create {name} {partitions}")
        if answer != "ok":
            raise KafkaUnavailableError(f"could not create topic {name!r}: {answer or 'no answer'}")

    def fail_requests(self, api_key: int, error: int, count: int) -> None:
        """Make the broker answer the next `count` requests of `api_key` with `error` (fault
        injection for tests: librdkafka's mock cluster does it, a real broker cannot)."""
        answer = self._command(f"fail {api_key} {error} {count}")
        if answer != "ok":
            raise KafkaUnavailableError(f"could not inject broker errors: {answer or 'no answer'}")

    def pause(self) -> None:
        """Freeze the broker's process (SIGSTOP): connections stay open and nothing answers,
        as a broker stalled by a long GC or a partitioned network (fault injection)."""
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused broker run again (SIGCONT)."""
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


class ExternalKafka:
    """An existing Kafka cluster; topics are created with the admin API."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers

    def create_topic(self, name: str, partitions: int = 1) -> None:
        admin = AdminClient(client_settings(self.bootstrap_servers, PLAINTEXT))
        futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
        for future in futures.values():
            try:
                future.result()
            except Exception as exc:  # an existing topic is fine
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise KafkaUnavailableError(f"could not create topic {name!r}: {exc}") from exc

    def stop(self) -> None:
        return None


class ContainerKafka(ExternalKafka):
    """testcontainers' Apache Kafka, used where a Docker engine answers."""

    def __init__(self) -> None:
        from testcontainers.kafka import KafkaContainer

        self._container = KafkaContainer().with_kraft().start()
        super().__init__(self._container.get_bootstrap_server())

    def stop(self) -> None:
        self._container.stop()


def kafka_from_env() -> KafkaEndpoint:
    """`KAFKA_BOOTSTRAP_SERVERS`, else testcontainers' Kafka, else the mock broker process."""
    from txstream.service.embedded.postgres import docker_available

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        return ExternalKafka(bootstrap)
    if docker_available():
        return ContainerKafka()
    return MockKafkaBroker()


if __name__ == "__main__":
    serve()
