"""docs/configuration.md is generated from the configuration's pydantic models: a pure test
(no Spark, Kafka or PostgreSQL) that fails when the file no longer matches them."""

from __future__ import annotations

from pathlib import Path

import pytest

from txstream.schemas.config import PipelineConfig
from txstream.schemas.reference import COMMAND, NO_DESCRIPTION, models, render

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_reference_matches_the_models() -> None:
    if not REFERENCE.exists() or REFERENCE.read_text() != render():
        pytest.fail(f"docs/configuration.md is stale (a model of the configuration changed): "
                    f"regenerate it from the repository's root with `{COMMAND}` and commit it")


def test_every_field_of_every_model_is_described() -> None:
    text = render()
    reached = models(PipelineConfig)
    assert {m.__name__ for m in reached} >= {"PipelineConfig", "SourceSpec", "SinkConfig",
                                             "BatchPolicy", "KafkaSecurity", "LiveServing"}
    for model in reached:
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in text, f"{model.__name__}.{name} is missing"
    undescribed = [line for line in text.splitlines() if NO_DESCRIPTION in line]
    assert not undescribed, ("fields without a description: give each a comment above it in "
                             f"its model: {undescribed}")
