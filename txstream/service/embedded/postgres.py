"""A throwaway PostgreSQL cluster (initdb + pg_ctl on a free port), or an external one.

Resolution order used by `postgres_from_env`: `DATABASE_URL` if set; a testcontainers
PostgreSQL when a Docker engine answers; otherwise a local cluster built from the PostgreSQL
binaries found on this machine.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Protocol

import psycopg


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server could be found or started."""


class PostgresEndpoint(Protocol):
    url: str

    def stop(self) -> None: ...


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` free now, for a server about to listen on it: drawn below the kernel's
    ephemeral range, from which every outgoing connection (Spark's, Kafka clients') takes its
    local port, so none of those can take it before the server binds it (the port the kernel
    hands out for port 0 is in that range: it once went to a connection in between)."""
    low = _ephemeral_low()
    for _ in range(100):
        port = random.randrange(max(1024, low - 20_000), low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded range: any free port
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it is not read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if candidates:
        return candidates[0]
    raise PostgresUnavailableError(
        f"PostgreSQL binary '{name}' not found: install PostgreSQL (Debian: apt-get install "
        "postgresql) or set DATABASE_URL to an existing server"
    )


class EmbeddedPostgres:
    """A PostgreSQL cluster in `data_dir`, listening on 127.0.0.1:`port`, trust auth.

    PostgreSQL refuses to run as root, so under root the server runs as the `postgres`
    system user (created by Debian's package).
    """

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._run_as = self._server_user()

    @staticmethod
    def _server_user() -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam("postgres")
        except KeyError as exc:
            raise PostgresUnavailableError(
                "running as root needs the 'postgres' system user to start PostgreSQL "
                "(apt-get install postgresql creates it), or set DATABASE_URL"
            ) from exc
        return "postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._run_as:
            cmd = ["runuser", "-u", self._run_as, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    def start(self) -> EmbeddedPostgres:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as:
            user = pwd.getpwnam(self._run_as)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
        if not (self.data_dir / "PG_VERSION").exists():
            res = self._run(
                _pg_bin("initdb"), "-D", str(self.data_dir), "-U", "postgres",
                "--auth=trust", "--encoding=UTF8", "--no-sync",
            )
            if res.returncode != 0:
                raise PostgresUnavailableError(f"initdb failed: {res.stderr.strip()}")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            # TCP only: a socket path under a deep work dir can exceed the OS limit.
            "-c unix_socket_directories='' -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        res = self._run(
            _pg_bin("pg_ctl"), "-D", str(self.data_dir), "-o", options,
            "-l", str(self.data_dir / "server.log"), "-w", "-t", "60", "start",
        )
        if res.returncode != 0:
            log = (self.data_dir / "server.log")
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise PostgresUnavailableError(f"pg_ctl start failed: {res.stderr.strip()}\n{tail}")
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._run(_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop")


class ExternalPostgres:
    """A server the user runs; nothing to start or stop."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        return None


class ContainerPostgres:
    """testcontainers' PostgreSQL, used where a Docker engine answers."""

    def __init__(self) -> None:
        from testcontainers.postgres import PostgresContainer

        self._container = PostgresContainer("postgres:16-alpine", driver=None).start()
        self.url = self._container.get_connection_url()

    def stop(self) -> None:
        self._container.stop()


def docker_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


def postgres_from_env(work_dir: Path | None = None) -> PostgresEndpoint:
    """The PostgreSQL to use: `DATABASE_URL`, else testcontainers, else an embedded cluster."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return ExternalPostgres(url)
    if docker_available():
        return ContainerPostgres()
    base = work_dir or Path(tempfile.mkdtemp(prefix="txstream-pg-"))
    # The server may run as the 'postgres' user, which must be able to reach its data dir.
    base.chmod(0o755)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(base / "pgdata")
    return EmbeddedPostgres(base / "pgdata").start()
