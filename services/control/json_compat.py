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
  to other documents are refused at registration. Words beside a `$ref` apply too (as an
  `allOf` of its target and them), as do the words beside `oneOf`/`anyOf` in each branch:
  merged into one schema where that is plain (`required` joined, `properties` of other
  names or merged likewise, `type`s intersected), else kept as parts (a reader must read
  with each, one part of a writer must be read alone): never a guess;
- every other keyword (`enum`, `const`, `format`, `pattern`, bounds, `patternProperties`,
  `allOf`, `not`, `if`, tuple `items`, `connect.parameters`, ...) in the reader must be
  in the writer with the same value, `$ref`s in it replaced by what they point at (so a
  changed definition behind an unchanged `$ref` is a change): a constraint added or
  changed is refused, whatever it is (so a decimal's precision or scale in
  `connect.parameters` must stay). Annotations (`title`, `description`, `$comment`,
  `default`, `examples`, `$schema`, `$id`, `readOnly`, `writeOnly`, `deprecated`) are
  not compared.
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
_NOT_CONSTRAINTS = _ANNOTATIONS | {"definitions", "$defs"}
# keywords that act on others beside them: merged only when those are alike in both
_TOGETHER = (("items", "prefixItems", "additionalItems"), ("if", "then", "else"),
             ("contains", "minContains", "maxContains"))
_SCHEMA_KEYS = ("items", "additionalProperties", "not", "additionalItems", "contains", "if",
                "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_DATA_KEYS = {"enum", "const"} | _ANNOTATIONS  # values, not schemas: no `$ref` in them
_EXPANDED_MAX = 100_000  # nodes one comparison may expand `$ref`s into


class Doc:
    """A parsed schema: its root (for `$ref`s) and itself."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.checked: set[str] = set()  # the `$ref`s whose targets `_check` has seen
        self.refs: list[tuple[Any, str]] = []  # the `$ref` nodes `_check` met, and where
        self.nodes: dict[int, tuple[Any, str]] = {}  # the schemas `_check` met, and where
        # id of a `$ref` node of root -> (it, what it stands for): one object each time,
        # which the compatibility check's memo needs to see a recursion
        self._resolved: dict[int, tuple[Any, Any]] = {}

    def resolve(self, schema: Any, at: str) -> Any:
        """What a `$ref` points at, the words beside it applied too (an allOf of the two, as
        since draft 2019-09; annotations beside it change nothing)."""
        if not (isinstance(schema, dict) and "$ref" in schema):
            return schema
        done = self._resolved.get(id(schema))
        if done is not None and done[0] is schema:
            return done[1]
        beside: list[dict[str, Any]] = []
        target = schema
        for _ in range(32):
            if not (isinstance(target, dict) and "$ref" in target):
                break
            beside.append({k: v for k, v in target.items() if k != "$ref"})
            target = _pointer(self.root, target["$ref"], at)
        else:
            raise InvalidSchema(f"$ref at {at or 'the top'} goes round in circles")
        if not isinstance(target, dict | bool):
            raise InvalidSchema(f"$ref at {at or 'the top'} points at a "
                                f"{type(target).__name__}, not a schema")
        for words in reversed(beside):
            if set(words) - _NOT_CONSTRAINTS:
                target = _conjoin(target, words)
        self._resolved[id(schema)] = (schema, target)
        return target


class _AllOf:
    """Schemas that all hold (an allOf) which could not be merged into one without a guess
    (a key in both with different values, or one acting on the other's words)."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts


def _conjoin(a: Any, b: Any) -> Any:
    """`a` and `b` both holding, as one schema where that is plain, else an `_AllOf`."""
    if a is True or b is False or a == b:
        return b
    if b is True or a is False:
        return a
    if not (isinstance(a, dict) and isinstance(b, dict)) or _tangled(a, b):
        return _AllOf(a, b)
    out = dict(a)
    for key, value in b.items():
        if key not in out or out[key] == value or key in _NOT_CONSTRAINTS:
            out[key] = value
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "allOf":
            out[key] = [*out[key], *value]
        elif key == "type":
            kinds = _meet(_types(a) or set(), _types(b) or set())
            if not kinds:
                return _AllOf(a, b)
            out[key] = sorted(kinds) if len(kinds) > 1 else kinds.pop()
        elif key == "properties":
            merged = dict(out[key])
            for name, prop in value.items():
                merged[name] = _conjoin(merged[name], prop) if name in merged else prop
                if isinstance(merged[name], _AllOf):
                    return _AllOf(a, b)
            out[key] = merged
        else:
            return _AllOf(a, b)
    return out


def _tangled(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether words of one would act on the other's once merged (`additionalProperties` on
    properties named beside it only in the other, a `then` on the other's `if`, ...)."""
    if "$ref" in a or "$ref" in b:
        return True
    for x, y in ((a, b), (b, a)):
        if any(k.startswith("unevaluated") for k in x):
            return True
        more = x.get("additionalProperties", True)
        if more is not True and (
                set(y.get("properties", {})) - set(x.get("properties", {}))
                or set(y.get("patternProperties", {})) - set(x.get("patternProperties", {}))
                or y.get("additionalProperties", True) not in (True, more)):
            return True
    for group in _TOGETHER:
        in_a, in_b = ({k: s[k] for k in group if k in s} for s in (a, b))
        if in_a and in_b and in_a != in_b:
            return True
    return False


def _meet(a: set[str], b: set[str]) -> set[str]:
    """Types both allow (`integer` is a `number`)."""
    both = a & b
    if "integer" in a and "number" in b or "number" in a and "integer" in b:
        both.add("integer")
    return both


class _TooLarge(Exception):
    pass


def _expanded(root: Any, value: Any, left: set[str], seen: frozenset[str],
              budget: list[int]) -> Any:
    """`value` with each `$ref` replaced by what it points at, expanded likewise, for a
    comparison as text; a `$ref` met again within itself stays, named in `left`."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge
    if isinstance(value, list):
        return [_expanded(root, v, left, seen, budget) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: v if k in _DATA_KEYS else _expanded(root, v, left, seen, budget)
           for k, v in value.items() if k != "$ref"}
    ref = value.get("$ref")
    if isinstance(ref, str):
        if ref in seen:
            left.add(ref)
            out["$ref"] = ref
        else:
            out["$ref"] = _expanded(root, _pointer(root, ref, ""), left, seen | {ref}, budget)
    elif "$ref" in value:
        out["$ref"] = _expanded(root, ref, left, seen, budget)
    return out


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
    except RecursionError:
        raise InvalidSchema("nested too deeply to be checked") from None
    doc = Doc(root)
    try:
        _check(doc, root, "")
        _endless(doc)
        for node, at in doc.refs:  # once all is checked: what is beside a `$ref` merges
            doc.resolve(node, at)
    except RecursionError:
        raise InvalidSchema("nested too deeply to be checked") from None
    return doc


def _endless(doc: Doc) -> None:
    """Refuses a schema that is part of itself for the same value (through `$ref`,
    `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`, not into a property or item):
    no validator gets to its end, nor would the compatibility check."""
    state: dict[int, int] = {}  # 1: being walked, 2: done
    for start, at in doc.nodes.values():
        stack = [(start, iter(_in_place(doc, start)))]
        state[id(start)] = state.get(id(start), 1)
        if state[id(start)] == 2:
            continue
        while stack:
            node, following = stack[-1]
            child = next(following, None)
            if child is None:
                state[id(node)] = 2
                stack.pop()
            elif state.get(id(child)) == 1:
                raise InvalidSchema(f"the schema at {at or 'the top'} is part of itself (through "
                                    "$ref, allOf, anyOf, oneOf, not or if) for the same value: "
                                    "it never ends")
            elif id(child) not in state:
                state[id(child)] = 1
                stack.append((child, iter(_in_place(doc, child))))


def _in_place(doc: Doc, schema: Any) -> list[Any]:
    """The schemas that apply to the same value as `schema` does."""
    if not isinstance(schema, dict):
        return []
    out = [b for key in ("allOf", "anyOf", "oneOf") for b in schema.get(key, [])]
    out += [schema[key] for key in ("not", "if", "then", "else") if key in schema]
    out += list(schema.get("dependentSchemas", {}).values())
    if "$ref" in schema:
        out.append(_pointer(doc.root, schema["$ref"], ""))
    return out


def _check(doc: Doc, schema: Any, at: str) -> None:
    where = at or "the top"
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidSchema(f"not a JSON Schema at {where}: {type(schema).__name__}, not an "
                            "object or boolean")
    doc.nodes.setdefault(id(schema), (schema, at))
    if "$ref" in schema:
        ref = schema["$ref"]
        target = _pointer(doc.root, ref, at)
        if ref not in doc.checked:  # once each: a recursive definition comes back to it
            doc.checked.add(ref)
            _check(doc, target, ref)
        doc.refs.append((schema, at))
    kinds = schema.get("type", [])
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if not isinstance(kind, str) or kind not in _TYPES:
            raise InvalidSchema(f"type {kind!r} at {where}: use one of {sorted(_TYPES)}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidSchema(f"required at {where} must be a list of names")
    for key in ("properties", "definitions", "$defs", "patternProperties", "dependentSchemas"):
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
    for key in ("items", "prefixItems"):  # tuple items: a schema for each place
        entries = schema.get(key)
        if key == "prefixItems" and key in schema and not isinstance(entries, list):
            raise InvalidSchema(f"prefixItems at {where} must be a list")
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            _check(doc, entry, f"{at}[{i}]")
    for key in _SCHEMA_KEYS:
        if key in schema and not (key == "items" and isinstance(schema[key], list)):
            _check(doc, schema[key], f"{at}[]" if key == "items" else f"{at}<{key}>")


def normalized(text: str) -> str:
    """One text per schema, whatever its spacing and key order: what stable ids key on."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def problems(level: str, new: Doc, existing: list[Doc]) -> list[str]:
    return compat_levels.problems(level, new, existing, reads)


def reads(reader: Doc, writer: Doc, at: str) -> list[str]:
    """What keeps `reader` from reading every document valid under `writer`."""
    try:
        return list(dict.fromkeys(_Check(reader, writer).reads(reader.root, writer.root, at)))
    except RecursionError:
        return [f"{at or 'the top'}: nested too deeply to be checked: refused"]


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
        if isinstance(r, _AllOf):  # read with each part: exactly what reading with all is
            return [p for part in r.parts for p in self.reads(part, w, at)]
        r_branches = self._branches(r, self.reader, at)
        if _accepts_all(w):  # a reader's union may have a branch that accepts all
            return self._union(r, w, r_branches, at) if len(r_branches) > 1 else \
                [f"{where}: anything written, the reader constrains it"]
        w_branches = self._branches(w, self.writer, at) if isinstance(w, dict) else [w]
        if len(r_branches) > 1 and "oneOf" in r and not _disjoint(r_branches) and \
                self._same(r, w):
            return []  # not checked, but unchanged (before the writer's union is split)
        if len(w_branches) > 1:
            return [p for b in w_branches for p in self.reads(r, b, at)]
        found = self._union(r, w, r_branches, at) if len(r_branches) > 1 else []
        if isinstance(w, _AllOf) and (found or len(r_branches) == 1):
            # written with all its parts: one part read alone is enough (if not, unknown)
            by_part = [self.reads(r, part, at) for part in w.parts]
            if any(not f for f in by_part):
                return []
            return [f"{where}: the writer's schema holds parts that could not be merged (a "
                    "key beside a $ref or in a oneOf/anyOf branch with another value than "
                    f"in the other part), none read alone, not checked further: {p}"
                    for p in found or by_part[0]]
        return found if len(r_branches) > 1 else self._one(r_branches[0], w_branches[0], at)

    def _union(self, r: dict[str, Any], w: Any, r_branches: list[Any], at: str) -> list[str]:
        """What keeps a reader of more than one branch from reading `w`."""
        where = at or "the top"
        if "oneOf" in r and not _disjoint(r_branches):
            return [] if self._same(r, w) else [
                f"{where}: the reader's oneOf has branches of overlapping types (not "
                "checked): refused"]
        if any(not self.reads(b, w, at) for b in r_branches):
            return []
        alike = [b for b in r_branches if _same_kind(b, w)]
        if len(alike) == 1:  # the branch meant for it: why it does not
            return self.reads(alike[0], w, at)
        return [f"{where}: no branch of the reader's union reads the writer's "
                f"{_describe(w)}"]

    def _branches(self, schema: dict[str, Any], doc: Doc, at: str) -> list[Any]:
        """One schema as a union: its oneOf/anyOf branches (each with the keywords beside
        them applied too: `_conjoin`), or its `type` list's types."""
        for key in ("oneOf", "anyOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                out = [_conjoin(rest, doc.resolve(branch, at)) if rest else
                       doc.resolve(branch, at) for branch in schema[key]]
                return [b for branch in out for b in
                        (self._branches(branch, doc, at) if isinstance(branch, dict) else [branch])]
        kinds = schema.get("type")
        if isinstance(kinds, list) and len(kinds) > 1:
            return [{**schema, "type": k} for k in kinds]
        return [schema]

    def _one(self, r: Any, w: Any, at: str) -> list[str]:
        if not isinstance(r, dict) or not isinstance(w, dict):
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
            if key in w and self._same(r[key], w[key]):
                continue
            if key in w and r[key] == w[key]:
                found.append(f"{where}: {key} is unchanged, but a definition its $ref points "
                             "at is not (a constraint changed)")
            else:
                found.append(f"{where}: {key} is {r[key]!r} in the new reader, "
                             f"{w.get(key)!r} before (a constraint added or changed)")
        return found

    def _same(self, r: Any, w: Any) -> bool:
        """Whether a reader's value and a writer's say the same once their `$ref`s are
        replaced by what they point at (a recursive one: its definitions compared too)."""
        budget = [_EXPANDED_MAX]
        r_left: set[str] = set()
        w_left: set[str] = set()
        try:
            if _expanded(self.reader.root, r, r_left, frozenset(), budget) != \
                    _expanded(self.writer.root, w, w_left, frozenset(), budget):
                return False
            done: set[str] = set()
            todo = r_left | w_left
            while todo:
                ref = todo.pop()
                done.add(ref)
                r_left, w_left = set(), set()
                if _expanded(self.reader.root, {"$ref": ref}, r_left, frozenset(), budget) != \
                        _expanded(self.writer.root, {"$ref": ref}, w_left, frozenset(), budget):
                    return False
                todo |= (r_left | w_left) - done
        except (InvalidSchema, _TooLarge):
            return False  # a definition missing from one, or too large: not shown alike
        return True

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
