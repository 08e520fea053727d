"""The configuration reference, `docs/configuration.md`, rendered from the pydantic models of
the pipeline configuration (`PipelineConfig` and every model its fields reach): each field's
name as written in the file, its type and constraints, its default and its description.

A field's description is its `Field(description=...)`, else the comment block right above it
in the model's source, else the string right below it (an attribute docstring), else a pointer
to the model's docstring when that names the field in backticks. The models stay the one
place a setting is explained; this module only reads them. A test
(`tests/test_configuration_reference.py`) fails when the file is stale. Regenerate it with:

    python -m txstream.schemas.reference > docs/configuration.md
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import sys
import textwrap
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from txstream.schemas import config
from txstream.schemas.config import PipelineConfig
from txstream.schemas.tables import ColumnType

COMMAND = "python -m txstream.schemas.reference > docs/configuration.md"
NO_DESCRIPTION = "(no description)"

# annotated_types' bound classes, the attribute holding each bound, and how it reads.
_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
           (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"),
           (annotated_types.MinLen, "min_length", "length >="),
           (annotated_types.MaxLen, "max_length", "length <="))


def models(root: type[BaseModel] = PipelineConfig) -> list[type[BaseModel]]:
    """`root` and every model its fields reach, in the order a reader meets them."""
    found: list[type[BaseModel]] = []
    queue = [root]
    while queue:
        model = queue.pop(0)
        if model in found:
            continue
        found.append(model)
        for field in model.model_fields.values():
            queue += [m for m in _reached(field.annotation) if m not in found]
    return found


def _reached(annotation: Any) -> list[type[BaseModel]]:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _reached(arg)]


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _type(annotation: Any) -> str:
    """A field's type in the words of the YAML file."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        given = [a for a in args if a is not type(None)]
        text = " \\| ".join(_type(a) for a in given)
        return f"{text} \\| `null`" if len(given) < len(args) else text
    if origin in (list, tuple):
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}"
    if inspect.isclass(annotation):
        if issubclass(annotation, BaseModel):
            return f"[{annotation.__name__}](#{_anchor(annotation)})"
        if issubclass(annotation, Enum):
            return " \\| ".join(f"`{json.dumps(m.value)}`" for m in annotation)
        if annotation is ColumnType:
            named = ", ".join(f"`{t.value}`" for t in ColumnType.named())
            return f"column type ({named}, `decimal(p,s)`)"
        words = {str: "text", int: "integer", float: "number", bool: "boolean",
                 Path: "path", SecretStr: "secret text"}
        if annotation in words:
            return words[annotation]
    return f"`{annotation}`"


def _constraints(field: FieldInfo) -> str:
    """The bounds and patterns pydantic checks, e.g. `>= 1`."""
    found = []
    for item in field.metadata:
        for kind, attribute, sign in _BOUNDS:
            if isinstance(item, kind):
                found.append(f"{sign} {getattr(item, attribute)}")
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            found.append(f"matches `{pattern}`")
    # A bound inside Annotated[...] of one member of a union (`parallelism`) is in its args.
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            found += [_constraints(m) for m in typing.get_args(arg)[1:]
                      if isinstance(m, FieldInfo)]
    return ", ".join(f for f in found if f)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return f"[{type(value).__name__}](#{_anchor(type(value))}) defaults"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value)}`"


@functools.cache
def _source_notes(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the comment block above its line, or the string below it."""
    source = textwrap.dedent(inspect.getsource(model))
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    notes: dict[str, str] = {}
    for i, node in enumerate(body.body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        row = node.lineno - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip().startswith("#"):
            comment.insert(0, lines[row].strip().removeprefix("#").strip())
            row -= 1
        following = body.body[i + 1] if i + 1 < len(body.body) else None
        if comment:
            notes[node.target.id] = " ".join(comment)
        elif (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
              and isinstance(following.value.value, str)):
            notes[node.target.id] = " ".join(following.value.value.split())
    return notes


def _description(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    if field.description:
        return field.description
    # An inherited field (a PostgreSQL sink's `table`) is explained where it is declared.
    for owner in model.__mro__:
        if inspect.isclass(owner) and issubclass(owner, BaseModel) and owner is not BaseModel \
                and name in owner.__annotations__:
            note = _source_notes(owner).get(name)
            if note:
                return note
    if f"`{name}`" in (model.__doc__ or ""):
        return "See the text above the table."
    return NO_DESCRIPTION


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_model(model: type[BaseModel]) -> str:
    """One model's section: its docstring, then a row per field."""
    doc = inspect.cleandoc(model.__doc__ or "")
    out = [f"## {model.__name__}", "", f"`{model.__module__}.{model.__qualname__}`", ""]
    if doc:
        out += [doc, ""]
    out += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        shown = field.alias or name
        kind = _type(field.annotation)
        bounds = _constraints(field)
        if bounds:
            kind = f"{kind} ({bounds})"
        out.append(f"| `{shown}` | {kind} | {_default(field)} | "
                   f"{_cell(_description(model, name, field))} |")
    return "\n".join(out) + "\n"


def render() -> str:
    """The whole reference, as `docs/configuration.md` holds it."""
    intro = inspect.cleandoc(config.__doc__ or "")
    found = models()
    contents = "\n".join(f"- [{m.__name__}](#{_anchor(m)})" for m in found)
    about = textwrap.fill(
        "A pipeline is one YAML file, validated at start against `PipelineConfig`; a wrong file "
        "fails with every problem listed, each with its path. `deploy/pipeline.yaml` is a "
        "complete example. This page is generated from the models "
        "(`txstream/schemas/reference.py`); what each setting does in depth is in "
        "[the guide](guide.md) and [operations](operations.md).", 96)
    head = (f"# Configuration reference\n\n<!-- Generated from the pydantic models by `{COMMAND}`:"
            f" do not edit by hand. -->\n\n{about}\n\n{intro}\n\n{contents}\n")
    return "\n".join([head, *(render_model(m) for m in found)])


if __name__ == "__main__":
    sys.stdout.write(render())
