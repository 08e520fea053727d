"""Settings every Kafka client of the service shares."""

from __future__ import annotations

import logging
from typing import Any

# librdkafka's own lines (connections set up and closed, a broker going away at shutdown) go
# through Python logging instead of straight to stderr; the informational ones are routine.
LOG = logging.getLogger("librdkafka")
LOG.setLevel(logging.WARNING)


def client_settings(bootstrap_servers: str, **settings: Any) -> dict[str, Any]:
    """A client configuration: the brokers, librdkafka logging through `LOG` (served by the
    client's poll/consume/flush calls), then `settings` (dotted librdkafka names)."""
    return {"bootstrap.servers": bootstrap_servers, "logger": LOG, **settings}
