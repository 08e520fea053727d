"""Settings every Kafka client of the service shares: the brokers, logging, TLS and SASL."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import SecretStr

from txstream.schemas.kafka import KafkaSecurity

# librdkafka's own lines (connections set up and closed, a broker going away at shutdown) go
# through Python logging instead of straight to stderr; the informational ones are routine.
# librdkafka redacts secrets in them (its configuration dump prints `[redacted]`).
LOG = logging.getLogger("librdkafka")
LOG.setLevel(logging.WARNING)


def client_settings(bootstrap_servers: str, security: KafkaSecurity, **settings: Any
                    ) -> dict[str, Any]:
    """A client configuration: the brokers, librdkafka logging through `LOG` (served by the
    client's poll/consume/flush calls), `settings` (dotted librdkafka names), then `security`,
    which no per-client setting overrides. It holds the secrets in clear: hand it to a client,
    never log it."""
    return {"bootstrap.servers": bootstrap_servers, "logger": LOG, **settings,
            **_security_settings(security)}


def _security_settings(security: KafkaSecurity) -> dict[str, str]:
    """`security` as librdkafka settings (secrets in clear). The model has already rejected
    incomplete or contradictory combinations, so this only translates."""
    conf = {"security.protocol": security.security_protocol}
    mechanism = security.sasl_mechanism
    if security.uses_sasl and mechanism is not None:
        conf["sasl.mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            # librdkafka fetches and refreshes the tokens itself (client credentials grant).
            conf["sasl.oauthbearer.method"] = "oidc"
            _put(conf, "sasl.oauthbearer.token.endpoint.url",
                 security.oauthbearer_token_endpoint_url)
            _put(conf, "sasl.oauthbearer.client.id", security.oauthbearer_client_id)
            _put(conf, "sasl.oauthbearer.client.secret", security.oauthbearer_client_secret)
            _put(conf, "sasl.oauthbearer.scope", security.oauthbearer_scope)
        else:
            _put(conf, "sasl.username", security.sasl_username)
            _put(conf, "sasl.password", security.sasl_password)
    if security.uses_tls:
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if security.ssl_endpoint_identification else "none")
        _put(conf, "ssl.ca.location", security.ssl_ca_file)
        _put(conf, "ssl.certificate.location", security.ssl_cert_file)
        _put(conf, "ssl.key.location", security.ssl_key_file)
        _put(conf, "ssl.key.password", security.ssl_key_password)
    return conf


def _put(conf: dict[str, str], key: str, value: object) -> None:
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is not None:
        conf[key] = str(value)
