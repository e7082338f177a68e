"""Load a pipeline spec: parse, expand `${ENV}`, validate, and report every problem at once."""

from __future__ import annotations

import difflib
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tailrace.config._checks import cross_field_problems
from tailrace.config._env import expand
from tailrace.config._model import PipelineSpec
from tailrace.errors import ConfigError

_SECRET_FIELDS = {"dsn", "url", "token", "password"}  # never echoed in an error


def load_pipeline(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Read and validate the spec at `path`; raise `ConfigError` listing one line per problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the pipeline spec: {e.strerror}") from None
    return parse_pipeline(text, source=str(p), env=env)


def parse_pipeline(text: str, source: str = "<spec>", env: Mapping[str, str] | None = None
                   ) -> PipelineSpec:
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: expected a mapping with apiVersion, kind, metadata, spec")
    tree, missing = expand(tree, env)
    problems = [
        f"{source}: {field}: environment variable {var} is not set; export it or write the value"
        for field, var in missing
    ]
    unset_fields = {field for field, _ in missing}
    try:
        spec = PipelineSpec.model_validate(tree)
    except ValidationError as e:
        for err in e.errors():
            field = _field_path(err["loc"], tree)
            if field in unset_fields:
                continue  # already reported as an unset variable
            problems.append(f"{source}: {field}: {_explain(err, tree)}")
        raise ConfigError(problems) from None
    problems += [f"{source}: {field}: {problem}" for field, problem in cross_field_problems(spec)]
    if problems:
        raise ConfigError(problems)
    return spec


def _field_path(loc: tuple[Any, ...], tree: Any) -> str:
    """`spec.sinks[0].topic`; drops pydantic's union-tag steps (e.g. 'redis') from the path."""
    parts: list[str] = []
    node = tree
    for step in loc:
        if isinstance(step, int):
            parts.append(f"[{step}]")
            node = node[step] if isinstance(node, list) and step < len(node) else None
        elif isinstance(node, dict) and step in node:
            parts.append(f".{step}" if parts else str(step))
            node = node[step]
        elif isinstance(node, dict) and node.get("type") == step:
            continue  # discriminated union tag
        else:
            parts.append(f".{step}" if parts else str(step))
            node = None
    return "".join(parts) or "<root>"


def _model_at(loc: tuple[Any, ...], tree: Any) -> type[BaseModel] | None:
    """The spec model that owns the last step of `loc`, to list its allowed fields.

    Each step is resolved against the part of the spec it names, so an error in
    `spec.sinks[1]` is explained with the second sink's model, not the first's.
    """
    annotation: Any = PipelineSpec
    node = tree
    for step in loc[:-1]:
        annotation = _resolve(annotation, node)
        if isinstance(step, int):
            annotation = _item_annotation(annotation)
            node = node[step] if isinstance(node, list) and step < len(node) else None
            continue
        if isinstance(node, dict) and node.get("type") == step and step not in node:
            continue  # a discriminated union's tag step
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        field = annotation.model_fields.get(step)
        if field is None:
            return None
        annotation = field.annotation
        node = node.get(step) if isinstance(node, dict) else None
    model = _resolve(annotation, node)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _item_annotation(annotation: Any) -> Any:
    """`X` for `list[X]` (or `tuple[X, ...]`); None when `annotation` is not a sequence."""
    if typing.get_origin(annotation) in (list, tuple):
        args = typing.get_args(annotation)
        return args[0] if args else None
    return None


def _resolve(annotation: Any, value: Any) -> Any:
    """The model `value` is validated as: Annotated unwrapped, a union picked by `type` tag."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _resolve(typing.get_args(annotation)[0], value)
    if origin in (list, tuple, dict):
        return annotation
    args = typing.get_args(annotation)
    if args:  # a union (Optional included): pick by the `type` tag when there is one
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        for m in models:
            tag = m.model_fields.get("type")
            if tag and isinstance(value, dict) and value.get("type") in typing.get_args(
                    tag.annotation):
                return m
        if len(models) == 1:
            return models[0]
        sequences = [a for a in args if typing.get_origin(a) in (list, tuple)]
        return sequences[0] if len(sequences) == 1 and isinstance(value, list) else None
    return annotation


def _explain(err: ErrorDetails, tree: Any) -> str:
    kind, loc, msg = err["type"], err["loc"], err["msg"]
    if kind == "extra_forbidden":
        model = _model_at(loc, tree)
        if model is not None:
            allowed = sorted(model.model_fields)
            hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            return f"unknown field{did_you_mean}; allowed: {', '.join(allowed)}"
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "union_tag_invalid" or kind == "literal_error":
        return f"{msg.lower()}; got {err.get('input')!r}"
    if kind == "union_tag_not_found":
        return "field 'type' is missing; " + msg.split(".")[0].lower()
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    got = err.get("input")
    secret = bool(loc) and str(loc[-1]) in _SECRET_FIELDS  # a DSN or URL may hold a password
    shown = "" if secret or isinstance(got, dict | list) else f"; got {got!r}"
    return f"{msg[0].lower()}{msg[1:]}{shown}"
