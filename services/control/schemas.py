"""Schema registry (DESIGN guarantee 10): versions per table, one global sequence.

Each table's versions live in one KV entry; the global sequence is a KV counter. A
registration writes both in one compare-and-set, so replicas sharing a database never hand
out a version or a sequence twice; a lost race is retried. The same fingerprint registers
once per table: registering it again returns the first registration (so a capture service
re-reading old log after a restart gets the version it got then).
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import quote

import grpc
from prometheus_client import Counter

from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.status import InvalidArgument, require
from tailrace_services.control.storage import CasConflict, Storage

log = get_logger(__name__)

REGISTRATIONS = Counter("tailrace_control_schema_registrations", "New schema versions")

_SEQUENCE_KEY = "schema::sequence"
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


def _table_prefix(tenant: str = "", database: str = "") -> str:
    parts = [quote(p, safe="") for p in (tenant, database) if p]
    return "schema::table::" + "".join(p + "/" for p in parts)


def _table_key(tenant: str, database: str, table: str) -> str:
    return _table_prefix(tenant, database) + quote(table, safe="")


class SchemaRegistry:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def _versions(self, tenant: str, database: str, table: str
                  ) -> tuple[list[pb.SchemaRecord], int]:
        found = self._storage.kv_get(_table_key(tenant, database, table))
        if found is None:
            return [], 0
        return list(pb.ListSchemasResponse.FromString(found[0]).schemas), found[1]

    def register(self, request: pb.RegisterSchemaRequest) -> tuple[pb.SchemaRecord, bool]:
        """(record, created); idempotent per (table, fingerprint)."""
        require(request, "database", "table", "fingerprint")
        fingerprint = request.fingerprint.lower()
        if not _FINGERPRINT.match(fingerprint):
            raise InvalidArgument(f"fingerprint {request.fingerprint[:80]!r} is not a SHA-256: "
                                  "send the 64-character hex digest of the table's structure")
        try:
            json.loads(request.schema_json or "null")
        except ValueError as e:
            raise InvalidArgument(f"schema_json of {request.database}.{request.table} is not "
                                  f"JSON: {e}") from None
        tenant = request.tenant or "default"
        while True:
            versions, table_version = self._versions(tenant, request.database, request.table)
            for record in versions:
                if record.fingerprint == fingerprint:
                    return record, False
            counter = self._storage.kv_get(_SEQUENCE_KEY)
            sequence = int(counter[0]) + 1 if counter else 1
            record = pb.SchemaRecord(
                tenant=tenant, database=request.database, table=request.table,
                fingerprint=fingerprint, schema_json=request.schema_json,
                version=len(versions) + 1, sequence=sequence,
                created_unix_ms=int(time.time() * 1000))
            if request.HasField("position"):
                record.position.CopyFrom(request.position)
            value = pb.ListSchemasResponse(schemas=[*versions, record]).SerializeToString()
            try:
                self._storage.kv_cas([
                    (_SEQUENCE_KEY, str(sequence).encode(), counter[1] if counter else 0),
                    (_table_key(tenant, request.database, request.table), value, table_version)])
            except CasConflict:
                continue  # another registration won the race: look again
            REGISTRATIONS.inc()
            log.info("schema registered", tenant=tenant, database=request.database,
                     table=request.table, version=record.version, sequence=sequence)
            return record, True

    def list(self, tenant: str = "", database: str = "", table: str = "") -> list[pb.SchemaRecord]:
        if table and database:
            return self._versions(tenant or "default", database, table)[0]
        out: list[pb.SchemaRecord] = []
        for _, value, _ in self._storage.kv_scan(_table_prefix(tenant, database if tenant else "")):
            for record in pb.ListSchemasResponse.FromString(value).schemas:
                if (not database or record.database == database) and (
                        not table or record.table == table):
                    out.append(record)
        return out

    def get(self, tenant: str, database: str, table: str, version: int) -> pb.SchemaRecord | None:
        versions = self._versions(tenant or "default", database, table)[0]
        if not versions:
            return None
        if version == 0:
            return versions[-1]
        return versions[version - 1] if version <= len(versions) else None

    def at(self, tenant: str, database: str, table: str, sequence: int) -> pb.SchemaRecord | None:
        """The table's schema in force at `sequence`: its registration with the greatest
        sequence at or below it."""
        candidates = [r for r in self._versions(tenant or "default", database, table)[0]
                      if r.sequence <= sequence]
        return max(candidates, key=lambda r: r.sequence) if candidates else None


class SchemasServicer(rpc.SchemasServicer):
    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry

    def Register(self, request: pb.RegisterSchemaRequest, context: grpc.ServicerContext
                 ) -> pb.RegisterSchemaResponse:
        record, created = self._registry.register(request)
        return pb.RegisterSchemaResponse(schema=record, created=created)

    def List(self, request: pb.ListSchemasRequest, context: grpc.ServicerContext
             ) -> pb.ListSchemasResponse:
        return pb.ListSchemasResponse(schemas=self._registry.list(
            request.tenant, request.database, request.table))

    def Get(self, request: pb.GetSchemaRequest, context: grpc.ServicerContext
            ) -> pb.GetSchemaResponse:
        require(request, "database", "table")
        record = self._registry.get(request.tenant, request.database, request.table,
                                    request.version)
        return pb.GetSchemaResponse(found=record is not None, schema=record)

    def At(self, request: pb.SchemaAtRequest, context: grpc.ServicerContext
           ) -> pb.GetSchemaResponse:
        require(request, "database", "table")
        record = self._registry.at(request.tenant, request.database, request.table,
                                   request.sequence)
        return pb.GetSchemaResponse(found=record is not None, schema=record)
