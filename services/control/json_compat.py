"""Whether one JSON Schema can read what another wrote (`schemaType: JSON`): a conservative
check, refusing what it cannot show to be compatible.

`reads(reader, writer)` finds what a document valid under `writer` may be refused by
`reader` for:
- types: each type the writer allows must be allowed by the reader (`integer` is read as
  `number`); a writer with no `type` is read only by a reader with none;
- `oneOf`/`anyOf` (and `type` lists): each writer branch must be read by a reader branch; a
  reader's `oneOf` must have branches of disjoint types (else one value could match two);
- objects: a property in both is checked likewise; a property added must not be required,
  and the writer's object must have been closed (`additionalProperties: false`), since under
  an open one old data may hold that name with any value; a property removed must be read
  by the reader's `additionalProperties` (refused when the reader is closed); a property
  required now must have been required before; a closed reader refuses an open writer;
- arrays: `items` (one schema) likewise;
- `$ref` within the document (`#/definitions/...`, `#/$defs/...`) is followed; references
  to other documents are refused at registration;
- every other keyword (`enum`, `const`, `format`, `pattern`, bounds, `patternProperties`,
  `allOf`, `not`, `if`, tuple `items`, `connect.parameters`, ...) in the reader must be
  in the writer with the same value: a constraint added or changed is refused, whatever it
  is (so a decimal's precision or scale in `connect.parameters` must stay). Annotations
  (`title`, `description`, `$comment`, `default`, `examples`, `$schema`, `$id`,
  `readOnly`, `writeOnly`, `deprecated`) are not compared.
"""

from __future__ import annotations

import json
from typing import Any

from tailrace_services.control import compat_levels
from tailrace_services.control.compat_levels import InvalidSchema

_TYPES = {"null", "boolean", "object", "array", "number", "integer", "string"}
_ANNOTATIONS = {"title", "description", "$comment", "default", "examples", "$schema", "$id",
                "readOnly", "writeOnly", "deprecated"}
_CHECKED = {"type", "properties", "required", "additionalProperties", "items", "oneOf",
            "anyOf", "$ref", "definitions", "$defs"}
_OBJECT_KEYS = ("properties", "required", "additionalProperties")


class Doc:
    """A parsed schema: its root (for `$ref`s) and itself."""

    def __init__(self, root: Any) -> None:
        self.root = root

    def resolve(self, schema: Any, at: str) -> Any:
        for _ in range(32):
            if not (isinstance(schema, dict) and "$ref" in schema):
                return schema
            schema = _pointer(self.root, schema["$ref"], at)
        raise InvalidSchema(f"$ref at {at or 'the top'} goes round in circles")


def _pointer(root: Any, ref: Any, at: str) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise InvalidSchema(f"$ref {ref!r} at {at or 'the top'}: references to other "
                            "documents are not served by this registry")
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise InvalidSchema(f"$ref {ref} at {at or 'the top'} points at nothing")
        node = node[part]
    return node


def parse(text: str) -> Doc:
    """The schema, its keywords and local `$ref`s checked; raises `InvalidSchema`."""
    try:
        root = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidSchema(f"not JSON: {e}") from None
    doc = Doc(root)
    _check(doc, root, "")
    return doc


def _check(doc: Doc, schema: Any, at: str) -> None:
    where = at or "the top"
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidSchema(f"not a JSON Schema at {where}: {type(schema).__name__}, not an "
                            "object or boolean")
    if "$ref" in schema:
        doc.resolve(schema, at)
    kinds = schema.get("type", [])
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if kind not in _TYPES:
            raise InvalidSchema(f"type {kind!r} at {where}: use one of {sorted(_TYPES)}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidSchema(f"required at {where} must be a list of names")
    for key in ("properties", "definitions", "$defs"):
        children = schema.get(key, {})
        if not isinstance(children, dict):
            raise InvalidSchema(f"{key} at {where} must be an object")
        for name, child in children.items():
            _check(doc, child, f"{at}.{name}" if at else name)
    for key in ("oneOf", "anyOf", "allOf"):
        branches = schema.get(key, [])
        if not isinstance(branches, list) or not branches and key in schema:
            raise InvalidSchema(f"{key} at {where} must be a non-empty list")
        for i, branch in enumerate(branches):
            _check(doc, branch, f"{at}<{key}{i}>")
    for key in ("items", "additionalProperties", "not"):
        if key in schema and not isinstance(schema[key], list):
            _check(doc, schema[key], f"{at}[]" if key == "items" else f"{at}<{key}>")


def normalized(text: str) -> str:
    """One text per schema, whatever its spacing and key order: what stable ids key on."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def problems(level: str, new: Doc, existing: list[Doc]) -> list[str]:
    return compat_levels.problems(level, new, existing, reads)


def reads(reader: Doc, writer: Doc, at: str) -> list[str]:
    """What keeps `reader` from reading every document valid under `writer`."""
    return list(dict.fromkeys(_Check(reader, writer).reads(reader.root, writer.root, at)))


class _Check:
    def __init__(self, reader: Doc, writer: Doc) -> None:
        self.reader, self.writer = reader, writer
        self.memo: dict[tuple[int, int], list[str] | None] = {}
        self.kept: list[Any] = []  # what the memo's ids are of, alive while it is

    def reads(self, r: Any, w: Any, at: str) -> list[str]:
        r, w = self.reader.resolve(r, at), self.writer.resolve(w, at)
        key = (id(r), id(w))
        if key in self.memo:
            return self.memo[key] or []  # None: a recursive definition being checked
        self.memo[key] = None
        self.kept += [r, w]
        found = self._reads(r, w, at)
        self.memo[key] = found
        return found

    def _reads(self, r: Any, w: Any, at: str) -> list[str]:
        where = at or "the top"
        if _accepts_all(r) or w is False:
            return []
        if r is False:
            return [f"{where}: the reader accepts nothing"]
        if _accepts_all(w):
            return [f"{where}: anything written, the reader constrains it"]
        w_branches, r_branches = self._branches(w, self.writer, at), \
            self._branches(r, self.reader, at)
        if len(w_branches) > 1:
            return [p for b in w_branches for p in self.reads(r, b, at)]
        if len(r_branches) > 1:
            if "oneOf" in r and not _disjoint(r_branches):
                return [] if r == w else [f"{where}: the reader's oneOf has branches of "
                                          "overlapping types (not checked): refused"]
            if any(not self.reads(b, w, at) for b in r_branches):
                return []
            alike = [b for b in r_branches if _same_kind(b, w)]
            if len(alike) == 1:  # the branch meant for it: why it does not
                return self.reads(alike[0], w, at)
            return [f"{where}: no branch of the reader's union reads the writer's "
                    f"{_describe(w)}"]
        return self._one(r_branches[0], w_branches[0], at)

    def _branches(self, schema: dict[str, Any], doc: Doc, at: str) -> list[Any]:
        """One schema as a union: its oneOf/anyOf branches (each with the keywords beside
        them), or its `type` list's types."""
        for key in ("oneOf", "anyOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                out = []
                for branch in schema[key]:
                    branch = doc.resolve(branch, at)
                    if isinstance(branch, bool):
                        out.append(branch if not rest else {**rest} if branch else False)
                    else:
                        out.append({**rest, **branch})
                return [b for branch in out for b in
                        (self._branches(branch, doc, at) if isinstance(branch, dict) else [branch])]
        kinds = schema.get("type")
        if isinstance(kinds, list) and len(kinds) > 1:
            return [{**schema, "type": k} for k in kinds]
        return [schema]

    def _one(self, r: Any, w: Any, at: str) -> list[str]:
        if isinstance(r, bool) or isinstance(w, bool):
            return self.reads(r, w, at)
        where = at or "the top"
        found: list[str] = []
        r_types, w_types = _types(r), _types(w)
        if r_types is not None:
            if w_types is None:
                found.append(f"{where}: any type written, {sorted(r_types)} read")
            else:
                unread = {t for t in w_types if t not in r_types
                          and not (t == "integer" and "number" in r_types)}
                if unread:
                    found.append(f"{where}: {sorted(unread)} written, {sorted(r_types)} read")
        if any(k in r or k in w for k in _OBJECT_KEYS):
            found += self._object(r, w, at)
        if isinstance(r.get("items"), dict | bool):
            if isinstance(w.get("items"), list):  # tuple items written: not reasoned about
                found.append(f"{where}: items is a list (tuple items) before, one schema now")
            else:
                found += self.reads(r["items"], w.get("items", True), f"{at}[]")
        others = set(r) - _ANNOTATIONS - _CHECKED
        if isinstance(r.get("items"), list):
            others.add("items")  # tuple items: compared as a whole
        for key in sorted(others):
            if r[key] != w.get(key):
                found.append(f"{where}: {key} is {r[key]!r} in the new reader, "
                             f"{w.get(key)!r} before (a constraint added or changed)")
        return found

    def _object(self, r: dict[str, Any], w: dict[str, Any], at: str) -> list[str]:
        found: list[str] = []
        r_props, w_props = r.get("properties", {}), w.get("properties", {})
        r_required, w_required = set(r.get("required", [])), set(w.get("required", []))
        r_more, w_more = r.get("additionalProperties", True), w.get("additionalProperties", True)
        if w.get("patternProperties"):
            w_more = True  # old data may hold properties the patterns allowed: open
        for name, prop in r_props.items():
            path = f"{at}.{name}" if at else name
            if name in w_props:
                found += self.reads(prop, w_props[name], path)
            elif name in r_required:
                found.append(f"{path}: added as required (old data lacks it)")
            else:
                found += [f"{path}: added to an open object (old data may hold it as "
                          f"anything): {p}" for p in self.reads(prop, w_more, path)]
        for name, prop in w_props.items():
            if name not in r_props:
                path = f"{at}.{name}" if at else name
                found += [f"{path}: removed, and the reader's additionalProperties refuses "
                          f"it: {p}" for p in self.reads(r_more, prop, path)]
        for name in sorted(r_required - w_required):
            if name in w_props or name not in r_props:
                found.append(f"{at + '.' if at else ''}{name}: required now, not before")
        if r_more is not True and w_more is not False:
            found += [f"{at or 'the top'}: other properties old data may hold: {p}"
                      for p in self.reads(r_more, w_more, f"{at}.*")]
        return found


def _accepts_all(schema: Any) -> bool:
    return schema is True or isinstance(schema, dict) and not set(schema) - _ANNOTATIONS


def _types(schema: dict[str, Any]) -> set[str] | None:
    kinds = schema.get("type")
    if kinds is None:
        return None
    return set(kinds) if isinstance(kinds, list) else {kinds}


def _disjoint(branches: list[Any]) -> bool:
    seen: set[str] = set()
    for branch in branches:
        kinds = _types(branch) if isinstance(branch, dict) else None
        if kinds is None:
            return False
        kinds = kinds | ({"number"} if "integer" in kinds else set()) | \
            ({"integer"} if "number" in kinds else set())
        if seen & kinds:
            return False
        seen |= kinds
    return True


def _same_kind(r: Any, w: Any) -> bool:
    r_types = _types(r) if isinstance(r, dict) else None
    w_types = _types(w) if isinstance(w, dict) else None
    return r_types is not None and w_types is not None and bool(r_types & w_types)


def _describe(schema: Any) -> str:
    if isinstance(schema, dict) and "type" in schema:
        return str(schema["type"])
    return "schema"
