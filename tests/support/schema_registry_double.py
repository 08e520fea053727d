"""A TEST DOUBLE of Confluent's Schema Registry, not a registry: the subset of its REST API that
confluent-kafka's `SchemaRegistryClient` and its serializers call for txstream's tests, in
memory, run as its own process (like the embedded broker) so that the service under test talks
HTTP to it exactly as to a real one.

    POST /subjects/{subject}/versions     register {"schema", "schemaType"?, "references"?}
                                          -> {"id"}; the same schema (and references) gets
                                          the same id in every subject
    POST /subjects/{subject}              look a schema up: its version there, or 404 40403
    GET  /schemas/ids/{id}                {"schema", "schemaType"?, "references"?} or 404,
                                          error code 40403
    GET  /subjects                        the subjects
    GET  /subjects/{subject}/versions     their versions
    GET  /subjects/{subject}/versions/{n|latest}   {"subject", "version", "id", "schema",
                                                    "schemaType"?, "references"?}

It checks no compatibility and keeps nothing across restarts. With
SCHEMA_REGISTRY_DOUBLE_USER_INFO=`user:password` in its environment it requires that basic auth
(401, error code 40101, otherwise). Tests use a real registry instead when SCHEMA_REGISTRY_URL is
set (`registry_url`).

Run: `python -m tests.support.schema_registry_double` prints `listening on <url>` once it
serves on a free port of 127.0.0.1 (on SCHEMA_REGISTRY_DOUBLE_PORT when set: a registry that
comes up at an address the service already tries).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

_ROOT = Path(__file__).resolve().parents[2]


class _Registry:
    def __init__(self) -> None:
        # (schema, schemaType, references as JSON); id = index + 1
        self.schemas: list[tuple[str, str, str]] = []
        self.subjects: dict[str, list[int]] = {}  # subject -> schema id of each version

    @staticmethod
    def _key(schema: str, schema_type: str, references: list[dict[str, Any]]
             ) -> tuple[str, str, str]:
        return schema, schema_type, json.dumps(references, sort_keys=True)

    def find(self, schema: str, schema_type: str, references: list[dict[str, Any]]
             ) -> int | None:
        key = self._key(schema, schema_type, references)
        return self.schemas.index(key) + 1 if key in self.schemas else None

    def register(self, subject: str, schema: str, schema_type: str,
                 references: list[dict[str, Any]]) -> int:
        key = self._key(schema, schema_type, references)
        if key not in self.schemas:
            self.schemas.append(key)
        schema_id = self.schemas.index(key) + 1
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def by_id(self, schema_id: int) -> dict[str, Any]:
        schema, schema_type, references = self.schemas[schema_id - 1]
        return {"schema": schema,
                **({"schemaType": schema_type} if schema_type != "AVRO" else {}),
                **({"references": json.loads(references)} if references != "[]" else {})}

    def version(self, subject: str, version: int) -> dict[str, Any]:
        schema_id = self.subjects[subject][version - 1]
        return {"subject": subject, "version": version, "id": schema_id,
                **self.by_id(schema_id)}


_REGISTRY = _Registry()


class _NotFound(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests' output is no place for an access log."""

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        user_info = os.environ.get("SCHEMA_REGISTRY_DOUBLE_USER_INFO")
        if not user_info:
            return True
        expected = "Basic " + base64.b64encode(user_info.encode()).decode()
        if self.headers.get("Authorization") == expected:
            return True
        self._send(401, {"error_code": 40101, "message": "Unauthorized"})
        return False

    def _route(self, method: str) -> None:
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        try:
            self._send(200, self._answer(method, path))
        except _NotFound as exc:
            self._send(404, {"error_code": exc.code, "message": str(exc)})

    def _answer(self, method: str, path: str) -> Any:
        reg = _REGISTRY
        body = (json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if method == "POST" else {})
        key = (body.get("schema", ""), body.get("schemaType", "AVRO"),
               body.get("references") or [])
        if method == "POST" and (m := re.fullmatch(r"/subjects/([^/]+)/versions", path)):
            return {"id": reg.register(unquote(m[1]), *key)}
        if method == "POST" and (m := re.fullmatch(r"/subjects/([^/]+)", path)):
            subject = unquote(m[1])
            schema_id = reg.find(*key)
            versions = reg.subjects.get(subject, [])
            if schema_id not in versions:
                raise _NotFound(40403, "Schema not found")
            return reg.version(subject, versions.index(schema_id) + 1)
        if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
            if not 0 < int(m[1]) <= len(reg.schemas):
                raise _NotFound(40403, "Schema not found")
            return reg.by_id(int(m[1]))
        if path == "/subjects":
            return sorted(reg.subjects)
        if m := re.fullmatch(r"/subjects/([^/]+)/versions(?:/(\w+))?", path):
            subject = unquote(m[1])
            if subject not in reg.subjects:
                raise _NotFound(40401, f"Subject '{subject}' not found.")
            versions = reg.subjects[subject]
            if m[2] is None:
                return list(range(1, len(versions) + 1))
            version = len(versions) if m[2] == "latest" else int(m[2])
            if not 0 < version <= len(versions):
                raise _NotFound(40402, "Version not found.")
            return reg.version(subject, version)
        raise _NotFound(404, f"{method} {path} is not part of this test double")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


@contextmanager
def running_double(env: dict[str, str] | None = None) -> Iterator[str]:
    """The URL of a test double run as a child process for the block."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.schema_registry_double"],
                            cwd=_ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the Schema Registry double did not start: {line!r}")
        yield line.removeprefix("listening on ").strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    port = int(os.environ.get("SCHEMA_REGISTRY_DOUBLE_PORT", "0"))
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
