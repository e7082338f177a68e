"""Whether one Avro schema can read what another wrote: Avro's schema resolution rules, as
Confluent's compatibility levels (`compat_levels`) use them. A decimal's precision and scale
must stay as they are (Avro itself would read other ones, and change the numbers' meaning).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException, expand_schema

from tailrace_services.control import compat_levels
from tailrace_services.control.compat_levels import InvalidSchema

# writer type -> reader types that read it (Avro 1.11 spec, "Schema Resolution")
_PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"},
               "float": {"double"}, "string": {"bytes"}, "bytes": {"string"}}
_NAMED = ("record", "enum", "fixed")


def parse(text: str) -> Any:
    """The schema as JSON with named types expanded in place; raises `InvalidSchema`."""
    try:
        schema = json.loads(text)
        _require_fields(schema, "")  # before fastavro, which fills in what is missing
        fastavro.parse_schema(copy.deepcopy(schema))
        return expand_schema(schema)
    except InvalidSchema:
        raise
    except json.JSONDecodeError as e:
        raise InvalidSchema(f"not JSON: {e}") from None
    except (SchemaParseException, ValueError, TypeError, KeyError) as e:
        raise InvalidSchema(f"not an Avro schema: {e}") from None
    except RecursionError:
        raise InvalidSchema("nested too deeply to be checked") from None


def _require_fields(schema: Any, at: str) -> None:
    """What fastavro lets pass and Avro does not (a record without a list of fields), or
    trips on before fastavro sees it (a number, an array without `items`)."""
    where = at or "the top"
    if not isinstance(schema, str | list | dict):
        raise InvalidSchema(f"not an Avro schema at {where}: {json.dumps(schema)}, not a name, "
                            "an object or a union")
    if isinstance(schema, dict) and "type" not in schema:
        raise InvalidSchema(f"not an Avro schema: no \"type\" at {where}")
    shape = _shape(schema)
    if shape["type"] == "union":
        for branch in shape["branches"]:
            _require_fields(branch, at)
    elif shape["type"] == "record":
        if not isinstance(shape.get("fields"), list):
            raise InvalidSchema(f"not an Avro schema: record {_name(shape)} at "
                                f"{at or 'the top'} has no \"fields\" list")
        for field in shape["fields"]:
            if not isinstance(field, dict) or "name" not in field or "type" not in field:
                raise InvalidSchema(f"not an Avro schema: a field of {_name(shape)} needs a "
                                    f"name and a type: {field!r}")
            _require_fields(field["type"], f"{at}.{field['name']}" if at else field["name"])
    elif shape["type"] in ("array", "map"):
        key = "items" if shape["type"] == "array" else "values"
        if key not in shape:
            raise InvalidSchema(f"not an Avro schema: the {shape['type']} at {where} has no "
                                f"\"{key}\"")
        _require_fields(shape[key], f"{at}[]" if key == "items" else f"{at}{{}}")


def normalized(text: str) -> str:
    """One text per schema, whatever its spacing and key order: what stable ids key on."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def problems(level: str, new: Any, existing: list[Any]) -> list[str]:
    """Why `new` may not follow `existing` (oldest first) under `level`; [] when it may."""
    return compat_levels.problems(level, new, existing, reads)


def _shape(schema: Any) -> dict[str, Any]:
    if isinstance(schema, str):
        return {"type": schema}
    if isinstance(schema, list):
        return {"type": "union", "branches": schema}
    if isinstance(schema.get("type"), dict | list):  # {"type": {...}}: the inner one
        return _shape(schema["type"])
    return dict(schema)


def _name(schema: dict[str, Any]) -> str:
    name = str(schema.get("name", ""))
    namespace = schema.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name


def reads(reader: Any, writer: Any, at: str) -> list[str]:
    """What keeps `reader` from reading data written with `writer` (at path `at`)."""
    r, w = _shape(reader), _shape(writer)
    where = at or "the top"
    if w["type"] == "union":
        return [p for branch in w["branches"] for p in reads(reader, branch, at)]
    if r["type"] == "union":
        if any(not reads(branch, writer, at) for branch in r["branches"]):
            return []
        return [f"{where}: no branch of the reader's union reads the writer's {w['type']}"]
    if r["type"] != w["type"]:
        if r["type"] in _PROMOTIONS.get(w["type"], ()):
            return []
        return [f"{where}: {w['type']} written, {r['type']} read"]
    kind = r["type"]
    decimal = "decimal" in (r.get("logicalType"), w.get("logicalType"))
    if decimal and (r.get("logicalType"), r.get("precision"), r.get("scale", 0)) != \
            (w.get("logicalType"), w.get("precision"), w.get("scale", 0)):
        return [f"{where}: decimal({w.get('precision')},{w.get('scale', 0)}) written, "
                f"read as {r.get('logicalType') or kind}"
                f"({r.get('precision')},{r.get('scale', 0)})"]
    if kind in _NAMED and _name(r) != _name(w) and _name(w) not in r.get("aliases", []):
        return [f"{where}: {kind} {_name(w)} written, {_name(r)} read"]
    if kind == "record":
        return _record(r, w, at)
    if kind == "enum":
        missing = [s for s in w["symbols"] if s not in r["symbols"]]
        if missing and "default" not in r:
            return [f"{where}: enum symbols {missing} written, unknown to the reader"]
        return []
    if kind == "fixed" and r.get("size") != w.get("size"):
        return [f"{where}: fixed of {w.get('size')} bytes written, {r.get('size')} read"]
    if kind == "array":
        return reads(r["items"], w["items"], f"{at}[]")
    if kind == "map":
        return reads(r["values"], w["values"], f"{at}{{}}")
    return []


def _record(r: dict[str, Any], w: dict[str, Any], at: str) -> list[str]:
    written = {f["name"]: f for f in w["fields"]}
    found: list[str] = []
    for field in r["fields"]:
        path = f"{at}.{field['name']}" if at else field["name"]
        match = next((written[n] for n in [field["name"], *field.get("aliases", [])]
                      if n in written), None)
        if match is not None:
            found += reads(field["type"], match["type"], path)
        elif "default" not in field:
            found.append(f"{path}: added without a default")
    return found
