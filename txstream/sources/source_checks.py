"""The checks of a pipeline's sources that only make sense together: names and topics unique,
the id-change rule only under read_committed, Debezium metadata topics apart from the sources
and one source per data collection."""

from __future__ import annotations

from collections.abc import Sequence

from txstream.schemas.sources import BatchPolicy, SourceSpec, SourceSpecError


def check_sources(sources: Sequence[SourceSpec], policy: BatchPolicy) -> dict[str, dict[str, str]]:
    """Raise SourceSpecError on the first problem; return, per Debezium transaction metadata
    topic, the source of each data collection."""
    if not sources:
        raise SourceSpecError("a pipeline needs at least one source")
    names = [s.name for s in sources]
    topics = [s.topic for s in sources]
    for label, values in (("source names", names), ("topics", topics)):
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise SourceSpecError(f"duplicate {label}: {', '.join(dupes)}; give each "
                                  "source its own name and topic")
    if policy.isolation_level != "read_committed":
        by_change = [s.name for s in sources if s.upstream and s.upstream.count is None
                     and not s.upstream.needs_end]
        if by_change:
            raise SourceSpecError(
                f"sources {by_change} close upstream transactions on id changes, which is "
                "only sound with isolation_level='read_committed'; set it, or carry counts"
            )
    collections: dict[str, dict[str, str]] = {}
    for spec in sources:
        up = spec.upstream
        if up is None or up.metadata_topic is None or up.data_collection is None:
            continue
        if up.metadata_topic in topics:
            raise SourceSpecError(f"topic {up.metadata_topic!r} is both a source and the "
                                  f"transaction metadata topic of source {spec.name!r}")
        named = collections.setdefault(up.metadata_topic, {})
        if up.data_collection in named:
            raise SourceSpecError(
                f"sources {named[up.data_collection]!r} and {spec.name!r} both read data "
                f"collection {up.data_collection!r}; give each its own table")
        named[up.data_collection] = spec.name
    return collections


def metadata_connectors(sources: Sequence[SourceSpec]) -> dict[str, str | None]:
    """Per Debezium transaction metadata topic, the connector its sources name (None: none
    does; its `END` events' ids are then read by their shape). Sources sharing a metadata topic
    share a connector: raise SourceSpecError when they name different ones."""
    named: dict[str, str | None] = {}
    for spec in sources:
        topic = spec.upstream.metadata_topic if spec.upstream else None
        if topic is None:
            continue
        if named.get(topic) not in (None, spec.connector) and spec.connector is not None:
            raise SourceSpecError(
                f"sources of transaction metadata topic {topic!r} name connectors "
                f"{named[topic]!r} and {spec.connector!r}; one connector writes that topic")
        named[topic] = named.get(topic) or spec.connector
    return named
