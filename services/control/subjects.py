"""The Confluent Schema Registry's subjects, versions and ids, kept in the control storage.

Ids are global and stable: one schema text (spacing and key order aside) has one id in every
subject it is registered under, and keeps it. Versions count from 1 per subject. Every write
is a compare-and-set, so control replicas on one PostgreSQL storage may serve it together.
Schema types (`schemaType`): AVRO (the default), JSON and PROTOBUF (`schema_types`); a
subject's versions are checked by their own type's rules, and a change of type is refused
unless the level is NONE.

    confluent/ids/<id>            {"schema": text, "schemaType": "AVRO" | "JSON" | "PROTOBUF"}
    confluent/fingerprints/<sha>  <id> (the sha of the normalized text; of the type and it
                                  for types other than AVRO)
    confluent/next-id             the last id handed out
    confluent/subjects/<s>/<v>    {"id": id}
    confluent/config              the global compatibility level
    confluent/config-of/<s>       a subject's own level
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tailrace.logs import get_logger
from tailrace_services.control.compat_levels import DEFAULT_LEVEL, LEVELS, InvalidSchema
from tailrace_services.control.schema_types import TYPES, SchemaType
from tailrace_services.control.storage import CasConflict, Storage

log = get_logger(__name__)

_PREFIX = "confluent/"
_VERSION_DIGITS = 8


class RegistryError(Exception):
    """A refusal in the Confluent API's terms: an HTTP status and an error code."""

    def __init__(self, status: int, code: int, message: str) -> None:
        self.status, self.code = status, code
        super().__init__(message)


def _not_found(code: int, message: str) -> RegistryError:
    return RegistryError(404, code, message)


@dataclass(frozen=True)
class Version:
    subject: str
    version: int
    id: int
    schema: str
    schema_type: str = "AVRO"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"subject": self.subject, "version": self.version, "id": self.id,
                               "schema": self.schema}
        if self.schema_type != "AVRO":  # as Confluent: AVRO goes without it
            doc["schemaType"] = self.schema_type
        return doc


class Subjects:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    # reads ------------------------------------------------------------------------------
    def subjects(self) -> list[str]:
        prefix = f"{_PREFIX}subjects/"
        return sorted({key[len(prefix):].rsplit("/", 1)[0]
                       for key, _, _ in self._storage.kv_scan(prefix)})

    def versions(self, subject: str) -> list[int]:
        found = [int(key.rsplit("/", 1)[1]) for key, _, _
                 in self._storage.kv_scan(f"{_PREFIX}subjects/{subject}/")]
        if not found:
            raise _not_found(40401, f"Subject '{subject}' not found.")
        return found

    def version(self, subject: str, version: str | int, fmt: str | None = None) -> Version:
        """`fmt`: Confluent's `format` (`serialized`: a PROTOBUF schema as the base64 of its
        FileDescriptorProto); ignored where a type has no such format."""
        versions = self.versions(subject)
        if version in ("latest", -1, "-1"):
            number = versions[-1]
        else:
            try:
                number = int(version)
            except ValueError:
                raise RegistryError(422, 42202, f"The specified version '{version}' is not a "
                                    "valid version id; use a positive integer or latest") from None
            if number not in versions:
                raise _not_found(40402, f"Version {number} not found.")
        stored = self._storage.kv_get(self._version_key(subject, number))
        assert stored is not None, "listed a moment ago"  # versions are never deleted
        schema_id = json.loads(stored[0])["id"]
        return Version(subject, number, schema_id, *self.schema(schema_id, fmt))

    def schema(self, schema_id: int, fmt: str | None = None) -> tuple[str, str]:
        """The schema of this id and its type; `fmt` as for `version`."""
        stored = self._storage.kv_get(f"{_PREFIX}ids/{schema_id}")
        if stored is None:
            raise _not_found(40403, f"Schema {schema_id} not found")
        doc = json.loads(stored[0])
        text, kind = str(doc["schema"]), str(doc.get("schemaType", "AVRO"))
        served = TYPES[kind].formats.get(fmt or "")
        return (served(text) if served else text), kind

    def lookup(self, subject: str, text: str, schema_type: str = "AVRO") -> Version:
        """The version of `subject` that holds this schema."""
        kind = _kind(schema_type)
        versions = self.versions(subject)
        _checked(kind, text)
        schema_id = self._id_of(kind, text)
        for number in versions:
            found = self.version(subject, number)
            if found.id == schema_id:
                return found
        raise _not_found(40403, f"Schema not found under subject '{subject}'")

    # compatibility ----------------------------------------------------------------------
    def level(self, subject: str | None = None, default_to_global: bool = True) -> str | None:
        key = f"{_PREFIX}config-of/{subject}" if subject else f"{_PREFIX}config"
        stored = self._storage.kv_get(key)
        if stored is not None:
            return stored[0].decode()
        if subject and not default_to_global:
            return None
        return self.level() if subject else DEFAULT_LEVEL

    def set_level(self, level: str, subject: str | None = None) -> str:
        level = level.upper()
        if level not in LEVELS:
            raise RegistryError(422, 42203, f"Invalid compatibility level {level!r}; use one "
                                f"of {', '.join(LEVELS)}")
        self._storage.kv_put(f"{_PREFIX}config-of/{subject}" if subject else f"{_PREFIX}config",
                             level.encode())
        return level

    def problems(self, subject: str, text: str, against: str | int | None = None,
                 schema_type: str = "AVRO") -> list[str]:
        """Why `text` may not be registered under `subject` (its level; one version or all)."""
        kind = _kind(schema_type)
        new = _checked(kind, text)
        try:
            numbers = self.versions(subject)
        except RegistryError:
            return []
        if against is not None:
            numbers = [self.version(subject, against).version]
        level = self.level(subject) or DEFAULT_LEVEL
        if against is not None and level.endswith("_TRANSITIVE"):
            level = level.removesuffix("_TRANSITIVE")
        if level == "NONE":
            return []
        if not level.endswith("_TRANSITIVE"):
            numbers = numbers[-1:]  # the latest alone
        versions = [self.version(subject, n) for n in numbers]
        changed = [v.version for v in versions if v.schema_type != kind.name]
        if changed:
            return [f"version(s) {changed} of {subject} are not {kind.name} schemas: a "
                    "subject keeps one schema type unless its compatibility is NONE"]
        return kind.problems(level, new, [kind.parse(v.schema) for v in versions])

    # writes -----------------------------------------------------------------------------
    def register(self, subject: str, text: str, schema_type: str = "AVRO") -> int:
        """The schema's id, registered under `subject` as its next version unless it is one
        already. Raises `RegistryError` 409 when the subject's compatibility level refuses it."""
        kind = _kind(schema_type)
        _check_subject(subject)
        _checked(kind, text)
        schema_id = self._id_of(kind, text)  # an id is global: another subject's, if any
        while True:
            try:
                numbers = self.versions(subject)
            except RegistryError:
                numbers = []
            for number in numbers:
                if schema_id and self.version(subject, number).id == schema_id:
                    return schema_id  # registered before: the same id, no new version
            found = self.problems(subject, text, schema_type=kind.name)
            if found:  # refused before it has an id: ids name only schemas some subject holds
                raise RegistryError(409, 409, "Schema being registered is incompatible with "
                                    f"an earlier schema for subject '{subject}' (compatibility "
                                    f"{self.level(subject)}): " + "; ".join(found))
            schema_id = schema_id or self._new_id(kind, text)
            number = (numbers[-1] if numbers else 0) + 1
            try:
                self._storage.kv_cas([(self._version_key(subject, number),
                                       json.dumps({"id": schema_id}).encode(), 0)])
            except CasConflict:
                continue  # another replica added a version meanwhile: look again
            log.info("schema registered", subject=subject, version=number, id=schema_id)
            return schema_id

    def _id_of(self, kind: SchemaType, text: str) -> int:
        stored = self._storage.kv_get(_fingerprint_key(kind, text))
        return int(stored[0]) if stored is not None else 0

    def _new_id(self, kind: SchemaType, text: str) -> int:
        while True:
            counter = self._storage.kv_get(f"{_PREFIX}next-id")
            last, version = (int(counter[0]), counter[1]) if counter else (0, 0)
            schema_id = last + 1
            try:
                self._storage.kv_cas([
                    (f"{_PREFIX}next-id", str(schema_id).encode(), version),
                    (_fingerprint_key(kind, text), str(schema_id).encode(), 0),
                    (f"{_PREFIX}ids/{schema_id}",
                     json.dumps({"schema": text, "schemaType": kind.name}).encode(), 0)])
                return schema_id
            except CasConflict:
                existing = self._id_of(kind, text)
                if existing:
                    return existing  # another replica gave it its id first

    @staticmethod
    def _version_key(subject: str, number: int) -> str:
        return f"{_PREFIX}subjects/{subject}/{number:0{_VERSION_DIGITS}d}"


def _fingerprint_key(kind: SchemaType, text: str) -> str:
    normal = kind.normalized(text)
    if kind.name != "AVRO":  # AVRO's as before there were other types: its ids stay
        normal = f"{kind.name}\n{normal}"
    return f"{_PREFIX}fingerprints/{hashlib.sha256(normal.encode()).hexdigest()}"


def _checked(kind: SchemaType, text: str) -> Any:
    try:
        return kind.parse(text)
    except InvalidSchema as e:
        raise RegistryError(422, 42201, f"Invalid schema: {e}") from None


def _kind(schema_type: str | None) -> SchemaType:
    kind = TYPES.get((schema_type or "AVRO").upper())
    if kind is None:
        raise RegistryError(422, 42201, f"schemaType {schema_type} is not served by this "
                            f"registry: use one of {', '.join(TYPES)}")
    return kind


def _check_subject(subject: str) -> None:
    if not subject or "/" in subject or len(subject) > 255:
        raise RegistryError(422, 42208, f"Invalid subject {subject!r}: 1 to 255 characters, "
                            "no '/'")
