"""The gRPC client capture, delivery and the `tailrace` CLI use to reach the control service.

Errors follow one table: UNAVAILABLE and DEADLINE_EXCEEDED are retried for up to
`retry_for` seconds and then raised as `ControlUnavailable` (a `RetryableError`);
RESOURCE_EXHAUSTED, ABORTED, INTERNAL and unknown codes are `ControlUnavailable` at once;
INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, ALREADY_EXISTS, OUT_OF_RANGE,
UNAUTHENTICATED and PERMISSION_DENIED are `ControlRefused` (a `NonRetryableError`): the
message says what to fix. A TLS mismatch (a plaintext client of a TLS server, an untrusted
certificate, a missing client certificate) is `ControlTlsError` (a `ConfigError`) at once,
not an endless retry of "Socket closed" (`control_tls.py`).

Replicas: `address` may name several control services sharing one PostgreSQL storage,
`host1:port,host2:port`. A call that finds its replica unavailable goes to the next one
at once, and the client stays there; only after a round of them all does it back off.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc

from tailrace.config import control_addresses
from tailrace.control_tls import SPEC_SETTINGS, ClientTls, ControlTlsError, TlsSettings, diagnose
from tailrace.errors import ConfigError, NonRetryableError, RetryableError
from tailrace.links import LINKS
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace.proto.event_pb2 import Position

T = TypeVar("T")
log = get_logger(__name__)
_RETRIED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS,
            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.PERMISSION_DENIED}

VERDICTS = {pb.IDENTITY_FIRST_SEEN: "first_seen", pb.IDENTITY_SAME: "same",
            pb.IDENTITY_CHANGED: "changed"}
HEALTH_STATES = {"running": pb.HEALTH_RUNNING, "position_lost": pb.HEALTH_POSITION_LOST,
                 "failed": pb.HEALTH_FAILED, "paused": pb.HEALTH_PAUSED,
                 "degraded": pb.HEALTH_DEGRADED}
PIPELINE_STATES = {pb.PIPELINE_UNKNOWN: "unknown", pb.PIPELINE_RUNNING: "running",
                   pb.PIPELINE_PAUSED: "paused", pb.PIPELINE_FAILED: "failed",
                   pb.PIPELINE_DEGRADED: "degraded"}
OVERFLOW = {"drop_oldest": pb.OVERFLOW_DROP_OLDEST, "reject": pb.OVERFLOW_REJECT,
            "block": pb.OVERFLOW_BLOCK}


def split_addresses(address: str | Sequence[str]) -> list[str]:
    """`host1:port,host2:port` (or a list) as its addresses, each checked as `host:port`."""
    try:
        return control_addresses(address if isinstance(address, str) else list(address))
    except ValueError as e:
        raise ConfigError(str(e)) from None


class _Replicas:
    """A channel per control address; `index` is the one calls go to.

    Many threads share a client: each attempt notes the index it used, and `advance` moves
    on only if no other thread has moved since, so two threads that see the same replica
    fail skip one replica, not two."""

    def __init__(self, addresses: list[str], tls: ClientTls | None) -> None:
        self.addresses = addresses
        self.channels = [grpc.secure_channel(a, tls.credentials()) if tls is not None
                         else grpc.insecure_channel(a) for a in addresses]
        self.index = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        return self.addresses[self.index]

    def advance(self, failed: int) -> int:
        """Leave replica `failed` for the next one, unless another thread already left it;
        the replica to use now."""
        with self._lock:
            if self.index == failed:
                self.index = (failed + 1) % len(self.addresses)
                log.warning("control replica unavailable; trying the next",
                            failed=self.addresses[failed], next=self.addresses[self.index])
            return self.index

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


class _Stub:
    """A service's stubs, one per replica: `stub.Get(request, replica=i, ...)`."""

    def __init__(self, make: Callable[[grpc.Channel], Any], replicas: _Replicas) -> None:
        self._stubs = [make(channel) for channel in replicas.channels]

    def __getattr__(self, method: str) -> Any:
        return lambda request, replica, **kwargs: getattr(self._stubs[replica], method)(
            request, **kwargs)


class ControlUnavailable(RetryableError):
    """The control service could not answer now; back off and try again."""

    def __init__(self, message: str, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        super().__init__(message)


class ControlRefused(NonRetryableError):
    """The control service refused the request; the message says what to fix."""

    def __init__(self, message: str, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        super().__init__(message)


@dataclass(frozen=True)
class SinkOutcome:
    """One sink's part in a batch, for `report_batch`."""

    sink_id: str
    required: bool
    acknowledged: bool
    checkpoint: pb.Checkpoint | None = None  # what to store when the batch commits
    expected_version: int = 0                # the version read before the batch
    error: str = ""

    def to_proto(self) -> pb.SinkOutcome:
        return pb.SinkOutcome(sink_id=self.sink_id, required=self.required,
                              acknowledged=self.acknowledged, checkpoint=self.checkpoint,
                              expected_version=self.expected_version, error=self.error)


class RegisteredSchema:
    """A `SchemaRecord` (version, sequence, fingerprint, ...) plus whether this call created it."""

    def __init__(self, record: pb.SchemaRecord, created: bool) -> None:
        self.record = record
        self.created = created

    def __getattr__(self, name: str) -> Any:
        return getattr(self.record, name)

    def __repr__(self) -> str:
        return (f"RegisteredSchema({self.record.database}.{self.record.table} "
                f"v{self.record.version} seq {self.record.sequence}, created={self.created})")


def to_commit_policy(policy: object) -> pb.CommitPolicy:
    """The spec's value — "required" | "all" | {"quorum": N} | an object with `.quorum`."""
    if isinstance(policy, pb.CommitPolicy):
        return policy
    if policy is None or policy == "required":
        return pb.CommitPolicy(kind=pb.POLICY_REQUIRED)
    if policy == "all":
        return pb.CommitPolicy(kind=pb.POLICY_ALL)
    quorum = policy.get("quorum") if isinstance(policy, Mapping) else getattr(policy, "quorum",
                                                                              None)
    if isinstance(quorum, int) and not isinstance(quorum, bool):
        return pb.CommitPolicy(kind=pb.POLICY_QUORUM, quorum=quorum)
    raise ConfigError(f"commit_policy {policy!r} is not valid; use required, all or {{quorum: N}}")


def identity(flavor: str, attributes: Mapping[str, str], fingerprint: str = ""
             ) -> pb.ServerIdentity:
    return pb.ServerIdentity(flavor=flavor, attributes={k: str(v) for k, v in attributes.items()},
                             fingerprint=fingerprint)


def _secret(value: object) -> str:
    getter = getattr(value, "get_secret_value", None)
    return str(getter() if callable(getter) else value)


def default_agent() -> str:
    """`program host:pid`: what a client tells the control service it is (for the audit log)."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return f"{program} {socket.gethostname()}:{os.getpid()}"


class ControlClient:
    """Thin, typed wrapper; transient failures are retried for up to `retry_for` seconds.

    `token`: sent as `authorization: Bearer <token>` on every call (the service or the
    admin token). `tls`: talk TLS (mutual with a client certificate); `root_cert` — PEM
    bytes or a path — is the short form for TLS trusting one CA. `tls_settings` names the
    client's TLS settings in the message a TLS mismatch gets (the spec's `control.tls` by
    default). `agent` says who is calling, for the audit log (default `program host:pid`).
    `address`: one control service, or replicas as `host1:port,host2:port` (or a list).
    """

    def __init__(self, address: str | Sequence[str], timeout: float = 10.0,
                 retry_for: float = 30.0,
                 token: object | None = None, root_cert: bytes | str | None = None,
                 tls: ClientTls | None = None, tls_settings: TlsSettings = SPEC_SETTINGS,
                 agent: str | None = None) -> None:
        self.address = address if isinstance(address, str) else ",".join(address)
        self._link = f"control service at {self.address}"  # its name in `tailrace.links`
        if tls is None and root_cert is not None:
            pem = Path(root_cert).read_bytes() if isinstance(root_cert, str) else root_cert
            tls = ClientTls(ca=pem)
        self._tls = tls
        self._tls_settings = tls_settings
        self._replicas = _Replicas(split_addresses(address), tls)
        metadata = [("tailrace-client", agent or default_agent())]
        if token:
            metadata.append(("authorization", f"Bearer {_secret(token)}"))
        self._metadata = tuple(metadata)
        self._checkpoints = cast(rpc.CheckpointsStub, _Stub(rpc.CheckpointsStub, self._replicas))
        self._epochs = cast(rpc.EpochsStub, _Stub(rpc.EpochsStub, self._replicas))
        self._commits = cast(rpc.CommitsStub, _Stub(rpc.CommitsStub, self._replicas))
        self._schemas = cast(rpc.SchemasStub, _Stub(rpc.SchemasStub, self._replicas))
        self._identities = cast(rpc.IdentitiesStub, _Stub(rpc.IdentitiesStub, self._replicas))
        self._dlq = cast(rpc.DeadLettersStub, _Stub(rpc.DeadLettersStub, self._replicas))
        self._admin = cast(rpc.AdminStub, _Stub(rpc.AdminStub, self._replicas))
        self._audit = cast(rpc.AuditStub, _Stub(rpc.AuditStub, self._replicas))
        self._snapshots = cast(rpc.SnapshotsStub, _Stub(rpc.SnapshotsStub, self._replicas))
        self._leases = cast(rpc.LeasesStub, _Stub(rpc.LeasesStub, self._replicas))
        self._specs = cast(rpc.SpecsStub, _Stub(rpc.SpecsStub, self._replicas))
        self.capture_generation = 0  # stamped on recorded epochs: the lease that fences them
        self._timeout = timeout
        self._retry_for = retry_for

    def __repr__(self) -> str:
        return f"ControlClient({self.address!r})"

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def current_address(self) -> str:
        """The replica calls go to now."""
        return self._replicas.current

    def close(self) -> None:
        self._replicas.close()

    def _call(self, what: str, fn: Callable[..., T], request: object) -> T:
        deadline = time.monotonic() + self._retry_for
        delay = 0.1
        next_look = 0.0  # a TLS probe is a connection of its own: at most one every 5 s
        untried = len(self._replicas.addresses) - 1  # replicas to try before backing off
        replica = self._replicas.index
        while True:
            try:
                answer = fn(request, replica=replica, timeout=self._timeout,
                            metadata=self._metadata)
                LINKS.ok(self._link)
                return answer
            except grpc.RpcError as e:
                code, details = e.code(), e.details() or ""
                address = self._replicas.addresses[replica]
                message = f"control service at {address}: {what} failed: {code.name}: {details}"
                if code in _REFUSED:
                    LINKS.ok(self._link)  # it answered
                    raise ControlRefused(message, code, details) from None
                replicas = len(self._replicas.addresses)
                LINKS.failed(self._link, f"{what}: {code.name}: {details}"
                             + (f" (replica {address})" if replicas > 1 else ""))
                if code == grpc.StatusCode.UNAVAILABLE and time.monotonic() >= next_look:
                    next_look = time.monotonic() + 5.0
                    mismatch = diagnose(address, details, self._tls, self._tls_settings)
                    if mismatch is not None:
                        raise ControlTlsError(mismatch, code, details) from None
                if code not in _RETRIED:
                    raise ControlUnavailable(message, code, details) from None
                if untried:  # another replica may answer: go there at once, deadline or not
                    replica = self._replicas.advance(replica)
                    untried -= 1
                    continue
                if time.monotonic() > deadline:
                    raise ControlUnavailable(message, code, details) from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                if len(self._replicas.addresses) > 1:
                    replica = self._replicas.advance(replica)
                    untried = len(self._replicas.addresses) - 1

    # pipeline specs
    def apply_spec(self, text: str, dry_run: bool = False) -> pb.ApplySpecResponse:
        """Store `text` as its pipeline's next spec version (unless it is the current one);
        with `dry_run`, only validate it and show the diff."""
        answer: pb.ApplySpecResponse = self._call(
            "apply spec", self._specs.Apply, pb.ApplySpecRequest(text=text, dry_run=dry_run))
        return answer

    def get_spec(self, name: str, version: int = 0) -> pb.SpecVersion:
        answer: pb.SpecVersion = self._call("get spec", self._specs.Get,
                                            pb.SpecRef(name=name, version=version))
        return answer

    def list_specs(self) -> list[pb.SpecVersion]:
        return list(self._call("list specs", self._specs.List, pb.ListSpecsRequest()).specs)

    def spec_history(self, name: str) -> list[pb.SpecVersion]:
        return list(self._call("spec history", self._specs.History,
                               pb.SpecRef(name=name)).versions)

    def delete_spec(self, name: str, confirm: str) -> pb.SpecVersion:
        answer: pb.SpecVersion = self._call("delete spec", self._specs.Delete,
                                            pb.DeleteSpecRequest(name=name, confirm=confirm))
        return answer

    # checkpoints
    def get_checkpoint(self, source_id: str, sink_id: str) -> pb.Checkpoint | None:
        r = self._call("get checkpoint", self._checkpoints.Get,
                       pb.CheckpointRef(source_id=source_id, sink_id=sink_id))
        return r.checkpoint if r.found else None

    def commit_checkpoint(self, cp: pb.Checkpoint, expected_version: int
                          ) -> tuple[bool, pb.Checkpoint]:
        r = self._call("commit checkpoint", self._checkpoints.Commit,
                       pb.CommitCheckpointRequest(checkpoint=cp,
                                                  expected_version=expected_version))
        return r.committed, r.current

    def list_checkpoints(self, source_id: str = "") -> list[pb.Checkpoint]:
        r = self._call("list checkpoints", self._checkpoints.List,
                       pb.ListCheckpointsRequest(source_id=source_id))
        return list(r.checkpoints)

    def minimum_checkpoint(self, source_id: str, sink_ids: list[str]) -> pb.Checkpoint | None:
        r = self._call("minimum checkpoint", self._checkpoints.Minimum,
                       pb.MinimumCheckpointRequest(source_id=source_id, sink_ids=sink_ids))
        return r.checkpoint if r.found else None

    # epochs
    def record_epoch(self, epoch: pb.Epoch) -> None:
        """Record it, stamped with this capture's lease generation (`capture_generation`) so
        that the service refuses it once another instance took the lease."""
        if self.capture_generation and not epoch.capture_generation:
            epoch.capture_generation = self.capture_generation
        self._call("record epoch", self._epochs.Record, epoch)

    # leases
    def acquire_lease(self, name: str, owner: str, ttl_s: float, take_over_from: str = ""
                      ) -> pb.Lease:
        """Hold (or renew) `name` for `ttl_s`; the answer says who holds it (`held`: we do)."""
        lease: pb.Lease = self._call("acquire lease", self._leases.Acquire, pb.LeaseRequest(
            name=name, owner=owner, ttl_ms=int(ttl_s * 1000), take_over_from=take_over_from))
        return lease

    def release_lease(self, name: str, owner: str) -> bool:
        r = self._call("release lease", self._leases.Release,
                       pb.ReleaseLeaseRequest(name=name, owner=owner))
        return bool(r.released)

    def latest_epoch(self, source_id: str) -> pb.Epoch | None:
        r = self._call("latest epoch", self._epochs.Latest,
                       pb.LatestEpochRequest(source_id=source_id))
        return r.epoch if r.found else None

    def epoch_range(self, source_id: str, after_epoch_id: int = 0, up_to_epoch_id: int = 0,
                    limit: int = 0) -> list[pb.Epoch]:
        r = self._call("epoch range", self._epochs.Range, pb.EpochRangeRequest(
            source_id=source_id, after_epoch_id=after_epoch_id, up_to_epoch_id=up_to_epoch_id,
            limit=limit))
        return list(r.epochs)

    # commit policy
    def report_batch(self, pipeline: str, source_id: str, policy: object,
                     outcomes: Sequence[SinkOutcome | pb.SinkOutcome], batch_id: int = 0,
                     generation: int = 0) -> pb.ReportBatchResponse:
        """Answer: `satisfied`, `committed`, `checkpoints`, `reason`; `conflict` means another
        delivery process moved a checkpoint, `fenced` that a newer delivery instance claimed
        the pipeline (stop, in both cases). `generation`: from `claim_delivery`."""
        sinks = [o.to_proto() if isinstance(o, SinkOutcome) else o for o in outcomes]
        return self._call("report batch", self._commits.ReportBatch, pb.ReportBatchRequest(
            pipeline=pipeline, source_id=source_id, policy=to_commit_policy(policy), sinks=sinks,
            batch_id=batch_id, generation=generation))

    def claim_delivery(self, pipeline: str, instance: str) -> pb.ClaimDeliveryResponse:
        """Become the pipeline's delivery owner (the newest claim wins and fences the older
        instance); answer: `owner` (with our generation) and the `previous` owner."""
        return self._call("claim delivery", self._commits.ClaimDelivery,
                          pb.ClaimDeliveryRequest(pipeline=pipeline, instance=instance))

    # schema registry
    def register_schema(self, tenant: str, database: str, table: str, fingerprint: str,
                        schema_json: str, position: Position | None = None) -> RegisteredSchema:
        r = self._call("register schema", self._schemas.Register, pb.RegisterSchemaRequest(
            tenant=tenant, database=database, table=table, fingerprint=fingerprint,
            schema_json=schema_json, position=position))
        return RegisteredSchema(r.schema, r.created)

    def list_schemas(self, tenant: str = "", database: str = "", table: str = ""
                     ) -> list[pb.SchemaRecord]:
        r = self._call("list schemas", self._schemas.List,
                       pb.ListSchemasRequest(tenant=tenant, database=database, table=table))
        return list(r.schemas)

    def get_schema(self, tenant: str, database: str, table: str, version: int = 0
                   ) -> pb.SchemaRecord | None:
        r = self._call("get schema", self._schemas.Get, pb.GetSchemaRequest(
            tenant=tenant, database=database, table=table, version=version))
        return r.schema if r.found else None

    def schema_at(self, tenant: str, database: str, table: str, sequence: int
                  ) -> pb.SchemaRecord | None:
        r = self._call("schema at sequence", self._schemas.At, pb.SchemaAtRequest(
            tenant=tenant, database=database, table=table, sequence=sequence))
        return r.schema if r.found else None

    # identities, reconcile records, health
    def compare_identity(self, source_id: str, flavor: str, attributes: dict[str, str],
                         fingerprint: str) -> tuple[str, pb.ServerIdentity | None]:
        """("first_seen" (now stored) | "same" | "changed" (not stored), the stored identity)."""
        r = self._call("compare identity", self._identities.Compare, pb.CompareIdentityRequest(
            source_id=source_id, identity=identity(flavor, attributes, fingerprint)))
        return VERDICTS[r.verdict], (r.previous if r.HasField("previous") else None)

    def store_identity(self, source_id: str, flavor: str, attributes: dict[str, str],
                       fingerprint: str) -> pb.ServerIdentity | None:
        """Store after reconciling; returns the identity it replaced."""
        r = self._call("store identity", self._identities.Store, pb.StoreIdentityRequest(
            source_id=source_id, identity=identity(flavor, attributes, fingerprint)))
        return r.previous if r.replaced else None

    def add_reconcile_record(self, source_id: str, old: pb.ServerIdentity | None,
                             new: pb.ServerIdentity | None, drift: list[str], decision: str
                             ) -> int:
        r = self._call("add reconcile record", self._identities.AddReconcile, pb.ReconcileRecord(
            source_id=source_id, old_identity=old, new_identity=new, drift=drift,
            decision=decision))
        return int(r.sequence)

    def list_reconcile_records(self, source_id: str = "", limit: int = 100
                               ) -> list[pb.ReconcileRecord]:
        r = self._call("list reconcile records", self._identities.ListReconcile,
                       pb.ListReconcileRequest(source_id=source_id, limit=limit))
        return list(r.records)

    def report_health(self, subject_id: str, state: str, reason: str = "") -> None:
        """`state`: running | position_lost | failed | paused | degraded."""
        if state not in HEALTH_STATES:
            raise ValueError(f"health state {state!r}: use one of {', '.join(HEALTH_STATES)}")
        self._call("report health", self._identities.ReportHealth, pb.HealthReport(
            subject_id=subject_id, state=HEALTH_STATES[state], reason=reason))

    def report_retained(self, source_id: str, retained_bytes: int, what: str,
                        max_retained: int | None = None) -> pb.ReportHealthResponse:
        """How much log the source's server keeps for it now, `what` holds it; the source's
        reported state stays as it is. Past `max_retained` the service detaches the laggiest
        optional sink; the answer says what it did."""
        report = pb.HealthReport(subject_id=source_id, retained_bytes=retained_bytes,
                                 retained_what=what)
        if max_retained is not None:
            report.max_retained_bytes = max_retained
        answer: pb.ReportHealthResponse = self._call(
            "report retained log", self._identities.ReportHealth, report)
        return answer

    def report_pipeline_health(self, pipeline: str, state: str, reason: str = "",
                               sinks: Sequence[pb.SinkHealth] = ()) -> None:
        """A pipeline's health (as `report_health`) with each sink that failed its last batch:
        its last error, since when, how many batches in a row."""
        if state not in HEALTH_STATES:
            raise ValueError(f"health state {state!r}: use one of {', '.join(HEALTH_STATES)}")
        self._call("report health", self._identities.ReportHealth, pb.HealthReport(
            subject_id=pipeline, state=HEALTH_STATES[state], reason=reason, sinks=sinks))

    def get_health(self, subject_id: str) -> pb.HealthReport | None:
        r = self._call("get health", self._identities.GetHealth,
                       pb.GetHealthRequest(subject_id=subject_id))
        return r.report if r.found else None

    def list_health(self) -> list[pb.HealthReport]:
        return list(self._call("list health", self._identities.ListHealth,
                               pb.ListHealthRequest()).reports)

    # dead-letter queue
    def dlq_append(self, pipeline: str, entries: list[tuple[str, str, bytes]], overflow: str,
                   max_entries: int, ttl_s: float, block_timeout_s: float = 60.0
                   ) -> tuple[int, int, int]:
        """Append (sink_id, reason, event bytes) entries; returns (appended, dropped, rejected).

        `overflow` "block" waits here while the queue is full and sends the rest again; after
        `block_timeout_s` it raises `ControlUnavailable` (RESOURCE_EXHAUSTED) — the entries
        stored so far stay stored.
        """
        if overflow not in OVERFLOW:
            raise ConfigError(f"journal.overflow {overflow!r}: use drop_oldest, reject or block")
        todo = [pb.DeadLetterInput(sink_id=s, reason=r, event=e) for s, r, e in entries]
        appended = dropped = rejected = 0
        deadline = time.monotonic() + block_timeout_s
        delay = 0.1
        while True:
            r = self._call("append dead letters", self._dlq.Append, pb.AppendDeadLettersRequest(
                pipeline=pipeline, entries=todo, overflow=OVERFLOW[overflow],
                max_entries=max_entries, ttl_s=int(ttl_s)))
            appended, dropped, rejected = (appended + r.appended, dropped + r.dropped,
                                           rejected + r.rejected)
            todo = todo[r.appended:]
            if not r.blocked or not todo:
                return appended, dropped, rejected
            if time.monotonic() > deadline:
                raise ControlUnavailable(
                    f"dead-letter queue of pipeline {pipeline} is full ({max_entries} entries, "
                    f"overflow block): {len(todo)} of {len(entries)} entries still waiting after "
                    f"{block_timeout_s:.0f} s; replay or purge it (tailrace dlq)",
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "blocked")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def dlq_stats(self, pipeline: str) -> pb.DeadLetterCount:
        """Count plus totals dropped, expired and rejected."""
        return self._call("count dead letters", self._dlq.Count,
                          pb.DeadLettersRequest(pipeline=pipeline))

    def dlq_count(self, pipeline: str) -> int:
        return int(self.dlq_stats(pipeline).count)

    def dlq_list(self, pipeline: str, limit: int = 100, after: int = 0) -> list[pb.DeadLetter]:
        r = self._call("list dead letters", self._dlq.List,
                       pb.ListDeadLettersRequest(pipeline=pipeline, limit=limit, after=after))
        return list(r.entries)

    def dlq_replay(self, pipeline: str, limit: int = 100, after: int = 0) -> list[pb.DeadLetter]:
        """Entries to re-deliver (admin token); confirm each done prefix with `dlq_ack`."""
        r = self._call("replay dead letters", self._dlq.Replay,
                       pb.ListDeadLettersRequest(pipeline=pipeline, limit=limit, after=after))
        return list(r.entries)

    def dlq_ack(self, pipeline: str, up_to: int) -> int:
        r = self._call("acknowledge dead letters", self._dlq.Ack,
                       pb.AckDeadLettersRequest(pipeline=pipeline, up_to=up_to))
        return int(r.removed)

    def dlq_purge(self, pipeline: str) -> int:
        r = self._call("purge dead letters", self._dlq.Purge,
                       pb.DeadLettersRequest(pipeline=pipeline))
        return int(r.removed)

    # admin
    def register_pipeline(self, name: object, tenant: str = "default", source_id: str = "",
                          source_type: str = "", sinks: Sequence[object] = (),
                          commit_policy: object = "required") -> pb.PipelineInfo:
        """Register a pipeline by ids and types (never DSNs or URLs).

        Either `register_pipeline(spec)` with a `PipelineSpec`, or the fields; `sinks` are
        objects with `id`, `type`, `required`, `start` (sink specs), mappings, or (id, type,
        required). A sink with `start: now` or `snapshot` and no checkpoint yet gets its
        first one from this registration, which is logged here.
        """
        if hasattr(name, "metadata") and hasattr(name, "spec"):
            spec: Any = name
            name, tenant = spec.metadata.name, spec.metadata.tenant
            source_id, source_type = spec.spec.source.id, spec.spec.source.type
            sinks, commit_policy = spec.spec.sinks, spec.spec.commit_policy
        info = pb.PipelineInfo(name=str(name), tenant=tenant, source_id=source_id,
                               source_type=source_type,
                               commit_policy=to_commit_policy(commit_policy))
        for sink in sinks:
            start = "earliest"
            if isinstance(sink, tuple):
                sid, kind, required = sink
            elif isinstance(sink, Mapping):
                sid, kind, required = sink["id"], sink.get("type", ""), sink.get("required", True)
                start = sink.get("start", start)
            else:
                item: Any = sink  # a sink spec
                sid, kind, required, start = item.id, item.type, item.required, item.start
            info.sinks.append(pb.SinkInfo(id=sid, type=kind, required=bool(required),
                                          start=start))
        response = self._call("register pipeline", self._admin.RegisterPipeline, info)
        for started in response.started:
            log.warning("sink had no checkpoint: it starts where its spec's start says",
                        pipeline=info.name, sink=started.sink_id, start=started.start,
                        after_epoch=started.epoch_id or None,
                        tx=f"{started.checkpoint.position.tx_seq}."
                           f"{started.checkpoint.position.event_index}",
                        bus_offsets=dict(started.checkpoint.bus_offsets) or None,
                        snapshot_tables=list(started.snapshot_tables) or None,
                        note=started.note or None)
        return response.pipeline

    def pipeline_state(self, name: str) -> tuple[str, str]:
        """(state, reason); state: running | paused | failed | degraded | unknown (not
        registered)."""
        r = self._call("pipeline state", self._admin.GetPipeline, pb.PipelineRef(name=name))
        return PIPELINE_STATES.get(r.state, "unknown"), r.reason

    def get_pipeline(self, name: str) -> pb.PipelineInfo:
        return self._call("get pipeline", self._admin.GetPipeline, pb.PipelineRef(name=name))

    def list_pipelines(self) -> list[pb.PipelineInfo]:
        return list(self._call("list pipelines", self._admin.ListPipelines,
                               pb.ListPipelinesRequest()).pipelines)

    def pause(self, name: str, reason: str = "") -> pb.PipelineInfo:
        return self._call("pause", self._admin.Pause, pb.PauseRequest(name=name, reason=reason))

    def resume(self, name: str) -> pb.PipelineInfo:
        return self._call("resume", self._admin.Resume, pb.PipelineRef(name=name))

    def sink_checkpoints(self, pipeline: str) -> pb.SinkCheckpointsResponse:
        """Each sink's checkpoint with its lag (offsets and seconds behind the latest epoch)."""
        return self._call("sink checkpoints", self._admin.Checkpoints, pb.PipelineRef(name=pipeline))

    def rewind(self, pipeline: str, sink_id: str, confirm: str, to_sequence: int | None = None,
               reset: bool = False) -> pb.RewindResponse:
        """Set a sink's checkpoint back (the pipeline must be paused); `confirm` = `sink_id`."""
        request = pb.RewindRequest(pipeline=pipeline, sink_id=sink_id, confirm=confirm)
        if reset:
            request.reset = True
        elif to_sequence is not None:
            request.to_sequence = to_sequence
        return self._call("rewind", self._admin.Rewind, request)

    def attach(self, pipeline: str, sink_id: str, confirm: str) -> pb.AttachResponse:
        """A detached sink back from where the other sinks are (the pipeline must be paused);
        `confirm` = `sink_id`."""
        return self._call("attach", self._admin.Attach, pb.AttachRequest(
            pipeline=pipeline, sink_id=sink_id, confirm=confirm))

    # audit
    def list_audit(self, role: str = "", pipeline: str = "", limit: int = 100
                   ) -> list[pb.AuditRecord]:
        """The newest `limit` audit records, oldest first (admin token); `role`: admin,
        service or none; empty = all."""
        r = self._call("list audit records", self._audit.List,
                       pb.ListAuditRequest(role=role, pipeline=pipeline, limit=limit))
        return list(r.records)

    # snapshots (docs/snapshots.md)
    def snapshot_state(self, pipeline: str) -> pb.SnapshotState:
        """The pipeline's snapshot work and progress (version 0: never stored)."""
        return self._call("snapshot state", self._snapshots.Get,
                          pb.SnapshotRef(pipeline=pipeline))

    def update_snapshot(self, state: pb.SnapshotState, expected_version: int
                        ) -> pb.UpdateSnapshotResponse:
        """Capture's progress; `updated` false means it moved: merge into `state` and retry."""
        return self._call("update snapshot", self._snapshots.Update,
                          pb.UpdateSnapshotRequest(state=state,
                                                   expected_version=expected_version))

    def request_snapshot(self, pipeline: str, tables: Sequence[str] = (), where: str = ""
                         ) -> pb.SnapshotState:
        """Queue tables (empty: every captured table) for a snapshot (admin token)."""
        return self._call("request snapshot", self._snapshots.Request,
                          pb.SnapshotRequest(pipeline=pipeline, tables=list(tables), where=where))

    def cancel_snapshot(self, pipeline: str, tables: Sequence[str] = ()) -> pb.SnapshotState:
        return self._call("cancel snapshot", self._snapshots.Cancel,
                          pb.CancelSnapshotRequest(pipeline=pipeline, tables=list(tables)))

    def resnapshot(self, pipeline: str, confirm: str) -> pb.SnapshotState:
        """Accept the source's server as it is now and read every table again (admin token;
        the pipeline paused; `confirm` = its source id)."""
        return self._call("resnapshot", self._snapshots.Resnapshot,
                          pb.ResnapshotRequest(pipeline=pipeline, confirm=confirm))
