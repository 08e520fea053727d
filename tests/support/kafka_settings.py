"""Reading what the service gives librdkafka."""

from __future__ import annotations

from typing import Any

from txstream.schemas.kafka import OWNED_SETTING_PREFIXES


def security_of(conf: dict[str, Any]) -> dict[str, Any]:
    """The TLS and SASL part of a librdkafka configuration."""
    return {k: v for k, v in conf.items() if k.startswith(OWNED_SETTING_PREFIXES)}
