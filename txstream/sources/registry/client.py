"""Writer schemas read by id from a Confluent Schema Registry over its REST API (confluent-kafka's
`SchemaRegistryClient`: `GET /schemas/ids/{id}`, which the client caches; each kind of framed
value parses a schema once per id, `txstream.sources.registry.framed`).

Credentials come from the environment, like Kafka's, never from the configuration file:
`SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO` (`user:password`, the client's `basic.auth.user.info`),
`SCHEMA_REGISTRY_SSL_CA_LOCATION` (a CA file for an https registry with a private CA),
`SCHEMA_REGISTRY_SSL_CERTIFICATE_LOCATION` and `SCHEMA_REGISTRY_SSL_KEY_LOCATION` (a client
certificate).

A registry that cannot be reached when the service starts stops the start
(`SchemaRegistryUnavailable`, from `check`); one that fails later fails only the records whose
schema is not cached yet, after the client's retries (`SchemaUnavailable`, which the decoder
dead-letters with the original bytes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

# The transport errors of the client's HTTP library (httpx or its successor httpx2: whichever
# the client chose), raised once its retries are spent.
from confluent_kafka.schema_registry.common._httpx_compat import httpx

from txstream.sources.kafka_source import KafkaSourceError
from txstream.sources.registry.framed import Reference, SchemaUnavailable, WriterSchema

# Environment variable -> the client's setting.
_ENV_SETTINGS = {
    "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "basic.auth.user.info",
    "SCHEMA_REGISTRY_SSL_CA_LOCATION": "ssl.ca.location",
    "SCHEMA_REGISTRY_SSL_CERTIFICATE_LOCATION": "ssl.certificate.location",
    "SCHEMA_REGISTRY_SSL_KEY_LOCATION": "ssl.key.location",
}
# The Schema Registry's error code for an id it never assigned.
_SCHEMA_NOT_FOUND = 40403


class SchemaRegistryUnavailable(KafkaSourceError):
    """The Schema Registry cannot be reached or refuses the service (at start)."""


def client_settings(url: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The client's settings for the registry at `url`, credentials from `env`."""
    env = os.environ if env is None else env
    return {"url": url, **{setting: env[var] for var, setting in _ENV_SETTINGS.items()
                           if env.get(var)}}


class RegistrySchemas:
    """The writer schemas of one registry by id (see the module doc)."""

    def __init__(self, url: str, env: Mapping[str, str] | None = None, **retries: Any) -> None:
        """`retries`: the client's `max.retries`, `retries.wait.ms`, ... (its defaults: 3
        retries, backoff from 1 s)."""
        self.url = url
        self._client = SchemaRegistryClient({**client_settings(url, env), **retries})

    def check(self) -> None:
        """Raise SchemaRegistryUnavailable unless the registry answers (`GET /subjects`)."""
        try:
            self._client.get_subjects()
        except (SchemaRegistryError, httpx.TransportError) as exc:
            raise SchemaRegistryUnavailable(
                f"Schema Registry at {self.url} does not answer ({exc}); check "
                "schema_registry_url, that the registry runs and, for a secured registry, "
                f"{' / '.join(_ENV_SETTINGS)} in the environment") from exc

    def schema(self, schema_id: int) -> WriterSchema:
        """The schema registered as `schema_id`; SchemaUnavailable says why there is none."""
        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.error_code == _SCHEMA_NOT_FOUND or exc.http_status_code == 404:
                raise SchemaUnavailable(
                    f"schema id {schema_id} is unknown to the Schema Registry at {self.url}; "
                    "point schema_registry_url at the registry the producer writes to") from exc
            raise SchemaUnavailable(
                f"Schema Registry at {self.url} refused schema id {schema_id} ({exc}); check "
                "its credentials, then replay this dead letter") from exc
        except httpx.TransportError as exc:
            raise SchemaUnavailable(
                f"Schema Registry at {self.url} unreachable for schema id {schema_id} after "
                f"retries ({exc}); replay this dead letter once it answers") from exc
        return _writer_schema(schema)

    def version(self, subject: str, version: int) -> WriterSchema:
        """Version `version` of `subject`, a schema another one imports; SchemaUnavailable
        says why there is none."""
        try:
            return _writer_schema(self._client.get_version(subject, version).schema)
        except SchemaRegistryError as exc:
            raise SchemaUnavailable(
                f"Schema Registry at {self.url} has no version {version} of subject "
                f"{subject!r}, which a schema imports ({exc})") from exc
        except httpx.TransportError as exc:
            raise SchemaUnavailable(
                f"Schema Registry at {self.url} unreachable for version {version} of subject "
                f"{subject!r} after retries ({exc}); replay this dead letter once it "
                "answers") from exc


def _writer_schema(schema: Schema) -> WriterSchema:
    return WriterSchema(schema.schema_str or "", schema.schema_type or "AVRO", tuple(
        Reference(r.name or "", r.subject or "", r.version or 0)
        for r in schema.references or ()))
