"""Loading a pipeline definition named `module:function`."""

from __future__ import annotations

import importlib

from txstream.engine import Pipeline, PipelineDefinitionError


def load_pipeline(ref: str) -> Pipeline:
    """Import `module` and call `function()`, which must return a `Pipeline`."""
    module_name, _, func_name = ref.partition(":")
    if not module_name or not func_name:
        raise PipelineDefinitionError(f"pipeline {ref!r} must be 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PipelineDefinitionError(f"pipeline {ref!r}: cannot import {module_name}: {exc}"
                                      ) from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise PipelineDefinitionError(f"pipeline {ref!r}: {module_name} has no function "
                                      f"{func_name}")
    pipeline = func()
    if not isinstance(pipeline, Pipeline):
        raise PipelineDefinitionError(
            f"pipeline {ref!r}: {func_name}() returned {type(pipeline).__name__}, not a Pipeline"
        )
    return pipeline
