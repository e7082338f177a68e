"""Write docs/spec-reference.md from the pipeline spec's pydantic model.

    .venv/bin/python tools/gen_spec_reference.py           # rewrite the reference
    .venv/bin/python tools/gen_spec_reference.py --check   # exit 1 if it is out of date

Each section is one model of `tailrace.config._model`, reached from `PipelineSpec`; each row
one field: its YAML name, its type with the model's own constraints, its default, an example
and what it does. The text comes from the model's source, so there is one place to write it:
a class's docstring, and for a field the comment lines right above it and the comment at the
end of its line. The example is the default where that shows the field in use, otherwise
`EXAMPLES` below; a field with neither is an error, so a new field cannot go undocumented
(tests/unit/test_spec_reference.py runs `--check` and validates every example).
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
import types
import typing
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from tailrace.config import _model
from tailrace.config._model import PipelineSpec

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "spec-reference.md"
MODEL_SOURCE = Path(_model.__file__)

# Examples for fields whose default does not show them in use ("Class.field": value).
EXAMPLES: dict[str, Any] = {
    "PipelineSpec.apiVersion": "tailrace/v1",
    "PipelineSpec.kind": "Pipeline",
    "Metadata.name": "orders",
    "Metadata.tenant": "acme",
    "TlsSpec.ca": "/certs/ca.pem",
    "TlsSpec.cert": "/certs/capture.pem",
    "TlsSpec.key": "/certs/capture.key",
    "SnapshotSpec.mode": "initial",
    "SnapshotSpec.key_columns": {"public.events": ["tenant_id", "seq"]},
    "SnapshotSpec.signal_table": "tailrace.snapshot_signal",
    "PostgresSourceSpec.type": "postgres",
    "PostgresSourceSpec.id": "shop-primary",
    "PostgresSourceSpec.dsn": "${PG_DSN}",
    "PostgresSourceSpec.tables": ["public.orders", "public.order_%"],
    "PostgresSourceSpec.heartbeat_ms": 10000,
    "PostgresSourceSpec.max_retained": "50GiB",
    "PostgresSourceSpec.stream_transactions_over": "4MiB",
    "PostgresSourceSpec.slot": "tailrace_orders",
    "PostgresSourceSpec.publication": "tailrace_orders",
    "MysqlSourceSpec.type": "mysql",
    "MysqlSourceSpec.id": "inventory-primary",
    "MysqlSourceSpec.dsn": "${MYSQL_DSN}",
    "MysqlSourceSpec.tables": ["shop.*"],
    "MysqlSourceSpec.heartbeat_ms": 10000,
    "MysqlSourceSpec.max_retained": "20GiB",
    "MysqlSourceSpec.server_id": 4242,
    "RedisSinkSpec.start": "snapshot",
    "RedisSinkSpec.type": "redis",
    "RedisSinkSpec.id": "orders-redis",
    "RedisSinkSpec.url": "${REDIS_URL}",
    "RedisSinkSpec.maxlen": 1000000,
    "KafkaSinkSpec.start": "snapshot",
    "KafkaSinkSpec.type": "kafka",
    "KafkaSinkSpec.id": "orders-kafka",
    "KafkaSinkSpec.brokers": "kafka-1:9092,kafka-2:9092",
    "KafkaSinkSpec.exactly_once": True,
    "KafkaSinkSpec.checkpoint_topic": "__tailrace_checkpoints",
    "KafkaSinkSpec.client_config": {"security.protocol": "SASL_SSL",
                                    "sasl.mechanism": "SCRAM-SHA-512"},
    "KafkaSinkSpec.envelope": "debezium",
    "KafkaSinkSpec.format": "avro",
    "SchemaRegistrySpec.url": "http://control:8081",
    "SchemaRegistrySpec.token_file": "/run/secrets/service_token",
    "SchemaRegistrySpec.basic_auth_user_info": "${SR_USER_INFO}",
    "NatsSinkSpec.start": "snapshot",
    "NatsSinkSpec.type": "nats",
    "NatsSinkSpec.id": "orders-nats",
    "NatsSinkSpec.url": "nats://nats:4222",
    "NatsSinkSpec.credentials": "/secrets/tailrace.creds",
    "PostgresSinkSpec.start": "snapshot",
    "PostgresSinkSpec.type": "postgres",
    "PostgresSinkSpec.id": "replica",
    "PostgresSinkSpec.dsn": "${REPLICA_DSN}",
    "PostgresSinkSpec.follow_ddl": True,
    "BusSpec.brokers": "${KAFKA}",
    "BusSpec.topic": "tailrace.orders",
    "BusSpec.partitions": 4,
    "BusSpec.client_config": {"security.protocol": "SSL"},
    "ControlSpec.address": "control:50051,control-b:50051",
    "ControlSpec.token_file": "/run/secrets/service_token",
    "QuorumPolicy.quorum": 2,
    "FilterProcessor.type": "filter",
    "FilterProcessor.where": "total > 100 and status != 'draft'",
    "FilterProcessor.ops": ["insert", "update"],
    "FilterProcessor.tables": ["public.orders"],
    "TransformProcessor.type": "transform",
    "TransformProcessor.set": {"total_cents": "total * 100"},
    "TransformProcessor.drop": ["card_number"],
    "TransformProcessor.rename": {"cust_id": "customer_id"},
    "RouteProcessor.type": "route",
    "RouteProcessor.to": "cdc.{tenant}.{table}",
    "OutboxProcessor.type": "outbox",
    "OutboxProcessor.table": "public.outbox",
    "OutboxProcessor.additional_fields": {"type": "eventType"},
    "JournalSpec.enabled": True,
    "JournalSpec.ttl": "12h",
    "BatchSpec.max_bytes": "16MiB",
    "BatchSpec.max_ms": 500,
    "Spec.commit_policy": {"quorum": 2},
}

# Not written in a spec: accepted only to refuse them with a message that says why.
REFUSED_ONLY = {"PostgresSinkSpec.envelope"}


@dataclass
class Section:
    model: type[BaseModel]
    paths: list[str] = field(default_factory=list)


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _type_tag(model: type[BaseModel]) -> str:
    tag = model.model_fields.get("type")
    args = typing.get_args(tag.annotation) if tag is not None else ()
    return f" (type: {args[0]})" if args else ""


def sections() -> list[Section]:
    """Every model a spec can hold, in the order a spec reads, with the paths that reach it."""
    found: dict[type[BaseModel], Section] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        section = found.setdefault(model, Section(model))
        if path in section.paths:
            return
        section.paths.append(path)
        if len(section.paths) > 1:
            return
        for name, info in model.model_fields.items():
            for inner in _models_in(info.annotation):
                is_list = typing.get_origin(_unwrap(info.annotation)) is list
                visit(inner, f"{path}.{name}{'[]' if is_list else ''}".lstrip("."))

    visit(PipelineSpec, "")
    return list(found.values())


def _unwrap(annotation: Any) -> Any:
    """Optional[X] as X, Annotated[X, ...] as X."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if _is_union(annotation) and len(args) == 1:
            annotation = args[0]
            continue
        return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


_VALIDATOR_NAMES = {"_check_table_pattern": "table pattern (db.table, db.*, db.prefix%)",
                    "_check_condition": "expression", "_check_computed": "expression",
                    "parse_duration": "duration (30s, 12h, 7d)",
                    "parse_size": "size (bytes, or 500MiB, 50GiB)",
                    "_check_template": "template ({database}, {schema}, {table}, {op}, "
                                       "{source_id}, {tenant})"}


def _constraints(metadata: list[Any]) -> list[str]:
    shown = []
    for m in metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                shown.append(f"{sign} {getattr(m, attr):,}")
        if isinstance(m, annotated_types.MinLen) and m.min_length:
            shown.append(f"at least {m.min_length} long")
        if isinstance(m, annotated_types.MaxLen):
            shown.append(f"at most {m.max_length} long")
        pattern = getattr(m, "pattern", None)
        if isinstance(pattern, str):
            shown.append(f"matching `{pattern}`")
    return shown


def _metadata_of(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Annotated:
        metadata = list(annotation.__metadata__)
        expanded: list[Any] = []
        for m in metadata:
            expanded += m.metadata if isinstance(m, FieldInfo) else [m]
        return expanded
    return []


# a model's field validators by the attribute they are bound to: `_tpl = field_validator(...)`
_CHECKED_AS = {"_tpl": _VALIDATOR_NAMES["_check_template"],
               "_dsn": "string (secret: never logged; `${VAR}` recommended), a DSN checked "
                       "when the spec loads"}


def field_type(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    for attribute, decorator in model.__pydantic_decorators__.field_validators.items():
        if attribute in _CHECKED_AS and name in decorator.info.fields:
            return _CHECKED_AS[attribute]
    return type_name(info.annotation, info.metadata)


def type_name(annotation: Any, metadata: list[Any] | None = None) -> str:
    """The annotation as a reader of YAML thinks of it."""
    metadata = list(metadata or []) + _metadata_of(annotation)
    for m in metadata:
        func = getattr(getattr(m, "func", None), "__name__", "")
        if func in _VALIDATOR_NAMES:
            return _VALIDATOR_NAMES[func] + "".join(
                f", {c}" for c in _constraints(metadata))
    inner = annotation
    if typing.get_origin(inner) is typing.Annotated:
        inner = typing.get_args(inner)[0]
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if _is_union(inner):
        parts = [a for a in args if a is not type(None)]
        models = [p for p in (_unwrap(a) for a in parts)
                  if isinstance(p, type) and issubclass(p, BaseModel)]
        if models and len(models) == len(parts) and len(models) > 1:
            return "one of " + ", ".join(f"[{_type_tag(m).strip(' ()') or m.__name__}]"
                                         f"(#{_anchor(m)})" for m in models)
        return " or ".join(type_name(p) for p in parts) + (
            "" if len(parts) == len(args) else ", or null")
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}" + "".join(f", {c}" for c in _constraints(metadata))
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return f"[{inner.__name__}](#{_anchor(inner)})"
    names = {str: "string", int: "integer", bool: "boolean", float: "number",
             SecretStr: "string (secret: never logged; `${VAR}` recommended)",
             timedelta: "duration (30s, 12h, 7d)", type(None): "null"}
    name = names.get(inner, getattr(inner, "__name__", str(inner)))
    return name + "".join(f", {c}" for c in _constraints(metadata))


def _comments() -> dict[str, dict[str, str]]:
    """Class name → field name → the comment lines above the field and at its line's end."""
    text = MODEL_SOURCE.read_text()
    lines = text.splitlines()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ClassDef):
            continue
        fields = found.setdefault(node.name, {})
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above, number = [], item.lineno - 1
            while number >= 1 and lines[number - 1].strip().startswith("#"):
                above.insert(0, comments[number])
                number -= 1
            end = item.end_lineno or item.lineno
            trailing = [comments[n] for n in range(item.lineno, end + 1) if n in comments]
            words = " ".join(above + trailing)
            fields[item.target.id] = words.replace("noqa: N815 - the YAML field name",
                                                   "the spec format's version").strip()
    return found


def _render(value: Any) -> str:
    if isinstance(value, timedelta):
        days, seconds = value.days, value.seconds
        return f"{days}d" if not seconds else f"{int(value.total_seconds())}s"
    if isinstance(value, BaseModel):
        return ""
    shown = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return shown.removesuffix("\n...").removesuffix("...").strip()


def example_of(model: type[BaseModel], name: str, info: FieldInfo) -> Any:
    key = f"{model.__name__}.{name}"
    if key in EXAMPLES:
        return EXAMPLES[key]
    if _models_in(_unwrap(info.annotation)) and not _is_union(_unwrap(info.annotation)):
        return None  # a section of its own shows it
    if info.default is not PydanticUndefined and info.default not in (None, {}, []):
        return info.default
    if _models_in(info.annotation):
        return None  # a section of its own shows it
    raise SystemExit(f"gen_spec_reference: {key} has no example: add one to EXAMPLES")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    comments = _comments()
    out = [
        "# Pipeline spec reference",
        "",
        "<!-- written by tools/gen_spec_reference.py from tailrace.config's pydantic model; "
        "do not edit -->",
        "",
        "Every field a pipeline spec (`tailrace/v1`, kind `Pipeline`) accepts: its type, its "
        "default and an example. The loader refuses any other field, and every refusal names "
        "the field (`spec.sinks[1].topic: ...`). Any value may be `${VAR}` or "
        "`${VAR:-default}`, expanded from the environment when the spec is loaded. A whole "
        "spec: `deploy/pipelines/orders.yaml`; how the parts fit: README.",
        "",
    ]
    for section in sections():
        model = section.model
        title = section.paths[0] or "(top level)"
        out += [f"## <a id=\"{_anchor(model)}\"></a>`{title}`{_type_tag(model)}", ""]
        if len(section.paths) > 1:
            out += ["Also at " + ", ".join(f"`{p}`" for p in section.paths[1:]) + ".", ""]
        doc = (model.__doc__ or "").strip()
        if doc and model.__doc__ != BaseModel.__doc__:
            out += [" ".join(doc.split()), ""]
        out += ["| field | type | default | example | what it does |", "|---|---|---|---|---|"]
        notes = comments.get(model.__name__, {})
        for klass in model.__mro__[1:]:
            for name, words in comments.get(klass.__name__, {}).items():
                notes.setdefault(name, words)
        for name, info in model.model_fields.items():
            key = f"{model.__name__}.{name}"
            if key in REFUSED_ONLY:
                continue
            default = ("required" if info.is_required() else
                       "null" if info.default is None else
                       "—" if isinstance(info.default, BaseModel) else
                       f"`{_render(info.default)}`")
            example = example_of(model, name, info)
            shown = "" if example is None else f"`{name}: {_render(example)}`"
            if not notes.get(name) and name == "type":
                notes[name] = "selects this kind; the other fields here are its own"
            if not notes.get(name):
                raise SystemExit(f"gen_spec_reference: {key} says nothing of what it does: "
                                 "write a comment above it or at its line's end in "
                                 f"{MODEL_SOURCE.name}")
            out.append(f"| `{name}` | {_cell(field_type(model, name, info))} | "
                       f"{_cell(default)} | {_cell(shown)} | {_cell(notes.get(name, ''))} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if DOC.read_text() != text:
            print(f"{DOC.relative_to(ROOT)} is out of date: run "
                  ".venv/bin/python tools/gen_spec_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
