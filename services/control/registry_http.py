"""The Confluent Schema Registry REST API on the control service's HTTP side port.

What Confluent's clients and serializers call (`SchemaRegistryClient`, `AvroSerializer`,
Kafka Connect's converters): `GET /subjects`, `/subjects/{s}/versions[/{v}[/schema]]`,
`/schemas/ids/{id}`, `POST /subjects/{s}/versions` (register), `POST /subjects/{s}`
(look up), `POST /compatibility/subjects/{s}/versions/{v}`, `GET|PUT /config[/{s}]`.
Errors are Confluent's: `{"error_code": 40401, "message": ...}`. Schema types AVRO, JSON and
PROTOBUF (`schemaType`, answered as Confluent does: absent for AVRO); `?format=serialized`
serves a PROTOBUF schema as the base64 of its FileDescriptorProto, as Confluent's Python
deserializer asks.

Tokens as for gRPC: reads need a token (service or admin) unless the service runs with
`--open-reads`; registering and setting levels need the service or admin token. A client
sends it as `Authorization: Bearer <token>`, or as the password of basic auth (Confluent's
`basic.auth.user.info: tailrace:<token>`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from tailrace.httpside import Request, Response
from tailrace.logs import get_logger
from tailrace_services.control.auth import AuthPolicy
from tailrace_services.control.roles import Access, allows
from tailrace_services.control.subjects import RegistryError, Subjects

log = get_logger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

Handler = Callable[[Subjects, Request, dict[str, str]], Any]
_ROUTES: list[tuple[str, re.Pattern[str], Access, Handler]] = []


def _route(method: str, pattern: str, access: Access) -> Callable[[Handler], Handler]:
    def add(handler: Handler) -> Handler:
        _ROUTES.append((method, re.compile(f"^{pattern}/?$"), access, handler))
        return handler
    return add


def _body(request: Request) -> dict[str, Any]:
    try:
        doc = json.loads(request.body or b"{}")
    except json.JSONDecodeError as e:
        raise RegistryError(422, 42201, f"the request body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise RegistryError(422, 42201, "the request body must be a JSON object")
    return doc


def _schema_of(request: Request) -> tuple[str, str]:
    doc = _body(request)
    if not isinstance(doc.get("schema"), str):
        raise RegistryError(422, 42201, "the request body needs \"schema\": the schema as a "
                            "JSON string")
    if doc.get("references"):
        raise RegistryError(422, 42201, "schema references are not served by this registry")
    return doc["schema"], str(doc.get("schemaType") or "AVRO")


@_route("GET", "/subjects", Access.READ)
def _subjects(registry: Subjects, request: Request, _: dict[str, str]) -> Any:
    return registry.subjects()


@_route("GET", r"/subjects/(?P<subject>[^/]+)/versions", Access.READ)
def _versions(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    return registry.versions(p["subject"])


@_route("GET", r"/subjects/(?P<subject>[^/]+)/versions/(?P<version>[^/]+)", Access.READ)
def _version(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    return registry.version(p["subject"], p["version"], request.query.get("format")).to_json()


@_route("GET", r"/subjects/(?P<subject>[^/]+)/versions/(?P<version>[^/]+)/schema", Access.READ)
def _version_schema(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    found = registry.version(p["subject"], p["version"], request.query.get("format"))
    return _raw(found.schema, found.schema_type)


@_route("GET", r"/schemas/ids/(?P<id>\d+)", Access.READ)
def _by_id(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    text, kind = registry.schema(int(p["id"]), request.query.get("format"))
    return {"schema": text} if kind == "AVRO" else {"schema": text, "schemaType": kind}


@_route("GET", r"/schemas/ids/(?P<id>\d+)/schema", Access.READ)
def _raw_by_id(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    return _raw(*registry.schema(int(p["id"]), request.query.get("format")))


def _raw(text: str, kind: str) -> Any:
    """A schema alone: AVRO and JSON as the JSON they are, PROTOBUF as its text."""
    if kind == "PROTOBUF":
        return Response(200, text.encode(), "text/plain; charset=utf-8")
    return json.loads(text)


@_route("POST", r"/subjects/(?P<subject>[^/]+)/versions", Access.SERVICE)
def _register(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    text, schema_type = _schema_of(request)
    return {"id": registry.register(p["subject"], text, schema_type)}


@_route("POST", r"/subjects/(?P<subject>[^/]+)", Access.READ)
def _lookup(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    text, schema_type = _schema_of(request)
    return registry.lookup(p["subject"], text, schema_type).to_json()


@_route("POST", r"/compatibility/subjects/(?P<subject>[^/]+)/versions/(?P<version>[^/]+)",
        Access.READ)
def _compatible(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    text, schema_type = _schema_of(request)
    found = registry.problems(p["subject"], text, p["version"], schema_type)
    answer: dict[str, Any] = {"is_compatible": not found}
    if request.query.get("verbose") == "true":
        answer["messages"] = found
    return answer


@_route("GET", "/config", Access.READ)
def _global_level(registry: Subjects, request: Request, _: dict[str, str]) -> Any:
    return {"compatibilityLevel": registry.level()}


@_route("GET", r"/config/(?P<subject>[^/]+)", Access.READ)
def _subject_level(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    level = registry.level(p["subject"],
                           default_to_global=request.query.get("defaultToGlobal") == "true")
    if level is None:
        raise RegistryError(404, 40408, f"Subject '{p['subject']}' does not have subject-level "
                            "compatibility configured")
    return {"compatibilityLevel": level}


@_route("PUT", "/config", Access.ADMIN)
def _set_global_level(registry: Subjects, request: Request, _: dict[str, str]) -> Any:
    return {"compatibility": registry.set_level(_level(request))}


@_route("PUT", r"/config/(?P<subject>[^/]+)", Access.SERVICE)
def _set_subject_level(registry: Subjects, request: Request, p: dict[str, str]) -> Any:
    return {"compatibility": registry.set_level(_level(request), p["subject"])}


def _level(request: Request) -> str:
    level = _body(request).get("compatibility")
    if not isinstance(level, str):
        raise RegistryError(422, 42203, "the request body needs \"compatibility\": a level "
                            "such as BACKWARD")
    return level


def _token(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, credentials = value.strip().partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(credentials).decode().partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return ""
    return ""


def _refusal(policy: AuthPolicy, access: Access, headers: dict[str, str]) -> RegistryError | None:
    if policy.tokens is None:
        return None
    token = _token(headers)
    role = policy.tokens.role_of(token)
    if token is not None and role is None:
        return RegistryError(401, 40101, "the token sent is not valid for this control "
                             "service")
    if allows(role, access, policy.open_reads):
        return None
    needs = {Access.READ: "a token (service or admin)", Access.SERVICE: "the service or "
             "admin token", Access.ADMIN: "the admin token"}[access]
    if role is None:
        return RegistryError(401, 40101, f"this call needs {needs}: send 'Authorization: "
                             "Bearer <token>', or basic auth with the token as password")
    return RegistryError(403, 40301, f"this call needs {needs}")


def registry_routes(registry: Subjects, policy: AuthPolicy
                    ) -> Callable[[Request], Response | None]:
    """The HTTP side's `routes` for the registry API."""

    def answer(request: Request) -> Response | None:
        path = request.path
        for method, pattern, access, handler in _ROUTES:
            match = pattern.match(path)
            if match is None or method != request.method:
                continue
            params = {k: unquote(v) for k, v in match.groupdict().items()}
            try:
                refused = _refusal(policy, access, request.headers)
                if refused is not None:
                    raise refused
                result = handler(registry, request, params)
                if isinstance(result, Response):
                    return result
                return Response(200, json.dumps(result).encode(), CONTENT_TYPE)
            except RegistryError as e:
                if e.status >= 409:
                    log.warning("schema registry refused", method=request.method, path=path,
                                code=e.code, reason=str(e))
                return Response(e.status, json.dumps({"error_code": e.code,
                                                      "message": str(e)}).encode(), CONTENT_TYPE)
        if any(pattern.match(path) for _, pattern, _, _ in _ROUTES):
            return Response(405, json.dumps({"error_code": 405, "message": f"{request.method} "
                                             f"is not allowed on {path}"}).encode(), CONTENT_TYPE)
        return None

    return answer

