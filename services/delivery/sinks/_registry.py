"""The Kafka sink's schema registry client (Confluent's REST API) for the registry formats
(`format: avro | json_schema | protobuf`), and Confluent's wire format header: magic byte
0, then the schema's 4-byte big-endian id."""

from __future__ import annotations

import base64
import json
import struct
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from tailrace.config import KafkaSinkSpec
from tailrace.errors import ConfigError, NonRetryableError, RetryableError
from tailrace.logs import get_logger, redact

log = get_logger(__name__)

_MAGIC = b"\x00"


def header(schema_id: int) -> bytes:
    """Confluent's wire format header: what comes before the payload."""
    return _MAGIC + struct.pack(">I", schema_id)


class RegistryRefused(Exception):
    """The registry refused a schema (incompatible, invalid): the event cannot be written."""


class SchemaRegistryClient:
    """Registers schemas over Confluent's REST API; a schema's id is cached per process."""

    def __init__(self, url: str, *, token: str | None = None, basic: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif basic:
            self._headers["Authorization"] = "Basic " + base64.b64encode(basic.encode()).decode()
        self._timeout_s = timeout_s
        self._ids: dict[tuple[str, str], int] = {}

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        """The schema's id under `subject` (registered now unless it is already)."""
        cached = self._ids.get((subject, schema))
        if cached is not None:
            return cached
        doc: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            doc["schemaType"] = schema_type
        answer = self._call("POST", f"/subjects/{quote(subject, safe='')}/versions", doc,
                            subject)
        schema_id = int(answer["id"])
        if (subject, schema) not in self._ids:
            log.info("schema registered", subject=subject, id=schema_id, type=schema_type)
        self._ids[(subject, schema)] = schema_id
        return schema_id

    def latest(self, subject: str, fmt: str | None = None) -> dict[str, Any] | None:
        """The subject's latest version (`schema`, `schemaType`, ...), None if it has none;
        `fmt` as Confluent's `format` (`serialized`: a Protobuf schema as a base64
        FileDescriptorProto)."""
        query = f"?format={quote(fmt)}" if fmt else ""
        found: dict[str, Any] | None = self._call(
            "GET", f"/subjects/{quote(subject, safe='')}/versions/latest{query}", None, subject,
            missing_ok=True)
        return found

    def _call(self, method: str, path: str, doc: dict[str, Any] | None, subject: str, *,
              missing_ok: bool = False) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}", data=None if doc is None else json.dumps(doc).encode(),
            headers=self._headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as e:
            detail = _detail(e)
            if e.code == 404 and missing_ok:
                return None
            if e.code in (401, 403):
                raise NonRetryableError(f"schema registry {self.url} refused the sink's "
                                        f"credentials ({e.code}: {detail}); check "
                                        "schema_registry.token_file or basic_auth_user_info"
                                        ) from None
            if e.code in (409, 422):
                raise RegistryRefused(f"schema registry {self.url} refused the schema of "
                                      f"subject {subject} ({e.code}: {detail})") from None
            raise RetryableError(f"schema registry {self.url}: {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            raise RetryableError(f"schema registry {self.url} unreachable: "
                                 f"{redact(str(getattr(e, 'reason', e)))}") from None


def _detail(error: urllib.error.HTTPError) -> str:
    """The registry's `message`, or what the answer says when it has none (a proxy's page,
    a JSON answer that is not Confluent's error object)."""
    try:
        body = json.loads(error.read())
    except (ValueError, OSError):
        return str(error.reason)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{error.reason}: {str(body)[:200]}"


def registry_client(spec: KafkaSinkSpec) -> SchemaRegistryClient:
    registry = spec.schema_registry
    if registry is None:
        raise ConfigError(f"kafka sink {spec.id}: format {spec.format} needs "
                          "schema_registry.url")
    token = None
    if registry.token_file:
        try:
            with open(registry.token_file) as f:
                token = f.readline().strip()
        except OSError as e:
            raise ConfigError(f"kafka sink {spec.id}: schema_registry.token_file "
                              f"{registry.token_file}: {e.strerror}") from None
    basic = registry.basic_auth_user_info.get_secret_value() \
        if registry.basic_auth_user_info else None
    return SchemaRegistryClient(registry.url, token=token, basic=basic)
