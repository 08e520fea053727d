"""How the service's Kafka clients authenticate and encrypt: one block (`KafkaSecurity`, the
configuration's `kafka_security`) that every client the service creates shares.

`txstream.kafka_client.client_settings` is the one place that turns it into librdkafka
settings. Secrets are `SecretStr` (neither `repr` nor an error message shows them) and the
configuration file may not hold them: they come from the environment or from files
(`txstream.schemas.config`, variables in `ENV_VARIABLES`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator
from pydantic_core import PydanticCustomError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
# GSSAPI (Kerberos) is left out: the librdkafka in confluent-kafka's wheels is built without it.
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

# Conventional variables for the fields a deployment takes from a Kubernetes or Docker secret
# (beside the generic TXSTREAM_KAFKA_SECURITY__<FIELD>; each also as <VARIABLE>_FILE).
ENV_VARIABLES: Final = {
    "sasl_username": "KAFKA_SASL_USERNAME",
    "sasl_password": "KAFKA_SASL_PASSWORD",
    "ssl_key_password": "KAFKA_SSL_KEY_PASSWORD",
    "oauthbearer_client_secret": "KAFKA_OAUTHBEARER_CLIENT_SECRET",
}
# Never read from the configuration file, which lives in ConfigMaps and repositories.
SECRET_FIELDS: Final = ("sasl_password", "ssl_key_password", "oauthbearer_client_secret")
# librdkafka settings this block owns; no other setting of the configuration may set them.
OWNED_SETTING_PREFIXES: Final = ("security.protocol", "sasl.", "ssl.")

_SASL_FIELDS = ("sasl_mechanism", "sasl_username", "sasl_password")
_OAUTH_FIELDS = ("oauthbearer_token_endpoint_url", "oauthbearer_client_id",
                 "oauthbearer_client_secret", "oauthbearer_scope")
_TLS_FIELDS = ("ssl_ca_file", "ssl_cert_file", "ssl_key_file", "ssl_key_password")


def _from_env(field: str) -> str:
    var = ENV_VARIABLES[field]
    return f"{var} or {var}_FILE in the environment"


class KafkaSecurity(BaseModel):
    """TLS and SASL settings of every Kafka client of the service.

    `security_protocol` says what is used: TLS (`SSL`, `SASL_SSL`) verifies the brokers with
    `ssl_ca_file` (else the system's CAs) and, with `ssl_cert_file` and `ssl_key_file`,
    authenticates the client by certificate; SASL (`SASL_PLAINTEXT`, `SASL_SSL`) authenticates
    with `sasl_mechanism`: a user name and password (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) or
    OAUTHBEARER tokens that librdkafka fetches itself from an OIDC provider's token endpoint
    (client credentials grant). Settings the protocol would not use are rejected, not ignored.
    """

    # Validation errors must not echo their input: it holds the secrets.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    # PLAIN and SCRAM: the user name (or KAFKA_SASL_USERNAME).
    sasl_username: str | None = None
    # PLAIN and SCRAM: the password, only from the environment (KAFKA_SASL_PASSWORD).
    sasl_password: SecretStr | None = None
    # OAUTHBEARER: the OIDC provider's token endpoint URL.
    oauthbearer_token_endpoint_url: str | None = None
    # OAUTHBEARER: the client id at that provider.
    oauthbearer_client_id: str | None = None
    # OAUTHBEARER: the client's secret, only from the environment
    # (KAFKA_OAUTHBEARER_CLIENT_SECRET).
    oauthbearer_client_secret: SecretStr | None = None
    # OAUTHBEARER: the scope asked for, if the provider needs one.
    oauthbearer_scope: str | None = None
    # PEM CA certificates (a file, or a directory of them); none: the system's CAs.
    ssl_ca_file: Path | None = None
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None
    # The password of an encrypted `ssl_key_file`, only from the environment
    # (KAFKA_SSL_KEY_PASSWORD).
    ssl_key_password: SecretStr | None = None
    # Whether a broker's certificate must name the host it was reached at; turning it off
    # lets anyone with a certificate from the CA pose as a broker.
    ssl_endpoint_identification: bool = True

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    @model_validator(mode="after")
    def _check(self) -> KafkaSecurity:
        problems = self._sasl_problems() + self._tls_problems()
        if problems:
            # One error listing every problem, each naming the field and the fix; the error
            # type lets callers tell it from pydantic's own.
            raise PydanticCustomError("kafka_security", "{problems}",
                                      {"problems": "\n  ".join(problems)})
        return self

    def _given(self, fields: tuple[str, ...]) -> list[str]:
        given = []
        for name in fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if value not in (None, ""):
                given.append(name)
        return given

    def _sasl_problems(self) -> list[str]:
        protocol, mechanism = self.security_protocol, self.sasl_mechanism
        if not self.uses_sasl:
            stray = self._given(_SASL_FIELDS + _OAUTH_FIELDS)
            return [f"{', '.join(stray)} given, but security_protocol {protocol} does not use "
                    "SASL: set security_protocol to SASL_SSL (or SASL_PLAINTEXT), or remove "
                    "them"] if stray else []
        if mechanism is None:
            return [f"security_protocol {protocol} needs sasl_mechanism: PLAIN, SCRAM-SHA-256, "
                    "SCRAM-SHA-512 or OAUTHBEARER"]
        problems = []
        if mechanism == "OAUTHBEARER":
            needed = {
                "oauthbearer_token_endpoint_url": "the OIDC provider's token endpoint URL",
                "oauthbearer_client_id": "the client id at that provider",
                "oauthbearer_client_secret":
                    f"the client's secret: set {_from_env('oauthbearer_client_secret')}",
            }
            stray = self._given(("sasl_username", "sasl_password"))
            if stray:
                problems.append(f"{', '.join(stray)} given, but OAUTHBEARER authenticates with "
                                "oauthbearer_client_id and its secret: remove them")
        else:
            needed = {
                "sasl_username": "the user name: set it in kafka_security, or set "
                                 f"{_from_env('sasl_username')}",
                "sasl_password": f"the password: set {_from_env('sasl_password')}",
            }
            stray = self._given(_OAUTH_FIELDS)
            if stray:
                problems.append(f"{', '.join(stray)} given, but sasl_mechanism is {mechanism}: "
                                "set sasl_mechanism to OAUTHBEARER, or remove them")
        given = self._given(tuple(needed))
        problems += [f"sasl_mechanism {mechanism} needs {name} ({what})"
                     for name, what in needed.items() if name not in given]
        return problems

    def _tls_problems(self) -> list[str]:
        if not self.uses_tls:
            stray = self._given(_TLS_FIELDS)
            return [f"{', '.join(stray)} given, but security_protocol {self.security_protocol} "
                    "does not use TLS: set security_protocol to SSL (or SASL_SSL), or remove "
                    "them"] if stray else []
        problems = []
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            problems.append("ssl_cert_file and ssl_key_file go together (the client's "
                            "certificate and its private key): give both, or neither")
        if self._given(("ssl_key_password",)) and self.ssl_key_file is None:
            problems.append("ssl_key_password given without ssl_key_file: give the key file, "
                            "or remove the password")
        # Checked here, not when a client starts: librdkafka's error would look like an
        # unreachable broker, which the service retries forever.
        problems += [f"{name}: {path} does not exist; mount it there or fix the path"
                     for name in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file")
                     if (path := getattr(self, name)) is not None and not path.exists()]
        return problems


PLAINTEXT: Final = KafkaSecurity()
"""No TLS, no SASL: the embedded broker and the demo."""
