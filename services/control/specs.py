"""Pipeline specs kept by the control service: `tailrace apply|get|delete|diff`, and what
managed capture and delivery (`--managed`) run.

Every version of every spec is kept (`specs/<name>/<version>`); a delete is a version
without text, and applying again afterwards starts the next version. A spec is validated
before it is stored, every `${VAR}` left for the services that expand it with their own
environment (and secrets): the control service checks all the rest. Who applied what, when,
is in the version (`applied_by`) and in the audit log (Apply and Delete need the admin
token, and are audited as every admin call).
"""

from __future__ import annotations

import difflib
from typing import Any

import grpc
import yaml

from tailrace.config import parse_pipeline
from tailrace.errors import ConfigError
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.status import FailedPrecondition, InvalidArgument, NotFound, require
from tailrace_services.control.storage import CasConflict, Storage

log = get_logger(__name__)

_PREFIX = "specs/"
_UNSET = ": environment variable "  # a problem the services' own environment answers


def spec_name(text: str) -> str:
    """`metadata.name` of a spec's YAML, or "" (for the audit log: which pipeline)."""
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError:
        return ""
    metadata = tree.get("metadata") if isinstance(tree, dict) else None
    return str(metadata.get("name") or "") if isinstance(metadata, dict) else ""


def spec_problems(text: str) -> tuple[str, list[str]]:
    """The spec's pipeline name and what is wrong with it, `${VAR}`s aside."""
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        return "", [f"not valid YAML: {e}"]
    name = spec_name(text)
    try:
        parse_pipeline(text, source="spec", env={})
    except ConfigError as e:
        return name, [p for p in e.problems if _UNSET not in p or "is not set" not in p]
    return name, []


def unified_diff(old: str, new: str, name: str, old_version: int) -> str:
    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"{name} v{old_version}" if old_version else "/dev/null",
        tofile=f"{name} (applied)"))


class SpecStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def history(self, name: str) -> list[pb.SpecVersion]:
        return [pb.SpecVersion.FromString(value) for _, value, _
                in self._storage.kv_scan(f"{_PREFIX}{name}/")]

    def latest(self, name: str) -> pb.SpecVersion | None:
        versions = self.history(name)
        return versions[-1] if versions else None

    def get(self, name: str, version: int = 0) -> pb.SpecVersion:
        versions = self.history(name)
        if not versions:
            raise NotFound(f"no spec of pipeline {name!r}: `tailrace apply -f FILE` stores one")
        if version == 0:
            if versions[-1].deleted:
                raise NotFound(f"pipeline {name!r} was deleted (version "
                               f"{versions[-1].version}); `tailrace get {name} --version N` "
                               "shows an earlier one")
            return versions[-1]
        for found in versions:
            if found.version == version:
                return found
        raise NotFound(f"pipeline {name!r} has versions 1 to {versions[-1].version}, not "
                       f"{version}")

    def names(self) -> list[str]:
        return sorted({key[len(_PREFIX):].rsplit("/", 1)[0]
                       for key, _, _ in self._storage.kv_scan(_PREFIX)})

    def live(self) -> list[pb.SpecVersion]:
        found = [self.latest(name) for name in self.names()]
        return [s for s in found if s is not None and not s.deleted]

    def apply(self, text: str, applied_by: str, now_ms: int, dry_run: bool = False
              ) -> pb.ApplySpecResponse:
        name, problems = spec_problems(text)
        if problems:
            raise InvalidArgument("the spec does not validate, nothing was stored:\n"
                                  + "\n".join(problems))
        while True:
            current = self.latest(name)
            live = current is not None and not current.deleted
            old_text = current.text if current is not None and live else ""
            old_version = current.version if current is not None and live else 0
            changed = not live or old_text != text
            diff = unified_diff(old_text, text, name, old_version) if changed else ""
            if not changed or dry_run:
                shown = current if live and current is not None else pb.SpecVersion(name=name)
                return pb.ApplySpecResponse(spec=shown, created=not live, changed=changed,
                                            diff=diff)
            record = pb.SpecVersion(name=name, version=(current.version if current else 0) + 1,
                                    text=text, applied_by=applied_by, applied_unix_ms=now_ms)
            if self._store(record):
                log.info("pipeline spec applied", pipeline=name, version=record.version,
                         by=applied_by)
                return pb.ApplySpecResponse(spec=record, created=not live, changed=True,
                                            diff=diff)

    def delete(self, name: str, confirm: str, applied_by: str, now_ms: int) -> pb.SpecVersion:
        current = self.get(name)  # NotFound when none or deleted already
        if confirm != name:
            raise FailedPrecondition(f"deleting pipeline {name}'s spec stops its managed capture "
                                     f"and delivery; repeat its name to confirm: --confirm "
                                     f"{name}")
        record = pb.SpecVersion(name=name, version=current.version + 1, deleted=True,
                                applied_by=applied_by, applied_unix_ms=now_ms)
        if not self._store(record):
            raise FailedPrecondition(f"pipeline {name}'s spec changed meanwhile; look again "
                                     "(`tailrace get`) and retry")
        log.info("pipeline spec deleted", pipeline=name, version=record.version, by=applied_by)
        return record

    def _store(self, record: pb.SpecVersion) -> bool:
        try:
            self._storage.kv_cas([(f"{_PREFIX}{record.name}/{record.version:08d}",
                                   record.SerializeToString(), 0)])
        except CasConflict:
            return False  # another apply took this version: look again
        return True


def _agent(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "tailrace-client":
            return value if isinstance(value, str) else value.decode(errors="replace")
    return context.peer()


class SpecsServicer(rpc.SpecsServicer):
    def __init__(self, store: SpecStore, clock: Any) -> None:
        self._store = store
        self._now_ms = clock

    def Apply(self, request: pb.ApplySpecRequest, context: grpc.ServicerContext
              ) -> pb.ApplySpecResponse:
        require(request, "text")
        return self._store.apply(request.text, _agent(context), self._now_ms(), request.dry_run)

    def Get(self, request: pb.SpecRef, context: grpc.ServicerContext) -> pb.SpecVersion:
        require(request, "name")
        return self._store.get(request.name, request.version)

    def List(self, request: pb.ListSpecsRequest, context: grpc.ServicerContext
             ) -> pb.ListSpecsResponse:
        return pb.ListSpecsResponse(specs=self._store.live())

    def History(self, request: pb.SpecRef, context: grpc.ServicerContext
                ) -> pb.SpecHistoryResponse:
        require(request, "name")
        versions = self._store.history(request.name)
        if not versions:
            raise NotFound(f"no spec of pipeline {request.name!r}")
        return pb.SpecHistoryResponse(versions=versions)

    def Delete(self, request: pb.DeleteSpecRequest, context: grpc.ServicerContext
               ) -> pb.SpecVersion:
        require(request, "name")
        return self._store.delete(request.name, request.confirm, _agent(context), self._now_ms())
