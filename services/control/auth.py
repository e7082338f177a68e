"""Every call is checked against the role table; every accepted change of state is audited.

A call carries `authorization: Bearer <token>`; the token names a role (`tokens.py`) and
`roles.ACCESS` says what each RPC needs. No token or an unknown one is UNAUTHENTICATED, a
valid token of too small a role PERMISSION_DENIED, and both messages say which token is
needed and where a client takes it from. A method missing from the table is refused too.
Calls that change state (service and admin RPCs) are written to the audit log with the
caller's role, address, client certificate (mutual TLS) and a summary of the request.

Without tokens (`--insecure-no-auth`) every call is allowed and audited with role `none`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc

from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.audit import AuditLog, pipeline_of, summarize
from tailrace_services.control.roles import Access, Role, access_of, allows, audited
from tailrace_services.control.status import status_code
from tailrace_services.control.tokens import ADMIN_ENV, SERVICE_ENV, Tokens

log = get_logger(__name__)

AGENT_HEADER = "tailrace-client"
_VIA = " (sent as gRPC metadata 'authorization: Bearer <token>')"
_NEEDS = {
    Access.READ: "needs a token, service or admin: the tailrace CLI takes --token-file FILE or "
                 f"{ADMIN_ENV}; capture and delivery take control.token_file in the pipeline "
                 f"spec or {SERVICE_ENV}. Reads are open without a token only when "
                 "tailrace-control runs with --open-reads",
    Access.SERVICE: "needs the service token (or the admin token): set control.token_file in "
                    f"the pipeline spec or {SERVICE_ENV}",
    Access.ADMIN: f"needs the admin token: pass tailrace --token-file FILE or set {ADMIN_ENV}",
}

Behavior = Callable[[Any, grpc.ServicerContext], Any]
Metadata = Sequence[tuple[str, str | bytes]] | None


@dataclass(frozen=True)
class AuthPolicy:
    """`tokens` None: no authentication (`--insecure-no-auth`, or an in-process test server)."""

    tokens: Tokens | None
    open_reads: bool = False


@dataclass(frozen=True)
class Refused:
    code: grpc.StatusCode
    message: str
    why: str  # for the log: no token, unknown token, role service, not in the table


def _header(metadata: Metadata, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name:
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None


def bearer(metadata: Metadata) -> str | None:
    """The token of `authorization: Bearer <token>`; "" when the header is something else."""
    value = _header(metadata, "authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def decide(policy: AuthPolicy, method: str, token: str | None) -> tuple[Role | None, Refused | None]:
    """The caller's role and, when the call is not allowed, why."""
    name = method.strip("/").rsplit(".", 1)[-1]  # Admin/Pause
    access = access_of(method)
    if access is None:
        return None, Refused(grpc.StatusCode.PERMISSION_DENIED,
                             f"{name} has no role in the control service's access table, so "
                             "nobody may call it; this is a bug in tailrace-control",
                             "not in the table")
    if policy.tokens is None or access == Access.OPEN:
        return None, None
    role = policy.tokens.role_of(token)
    if token is not None and role is None:
        return None, Refused(grpc.StatusCode.UNAUTHENTICATED,
                             f"{name}: the token sent is not valid for this control service; "
                             f"{name} {_NEEDS.get(access, '')}{_VIA}", "unknown token")
    if allows(role, access, policy.open_reads):
        return role, None
    if role is None:
        return None, Refused(grpc.StatusCode.UNAUTHENTICATED,
                             f"{name} {_NEEDS[access]}{_VIA}", "no token")
    return role, Refused(grpc.StatusCode.PERMISSION_DENIED,
                         f"{name} needs the {access.name.lower()} role and the "
                         f"{role.name.lower()} token was sent; {name} {_NEEDS[access]}",
                         f"role {role.name.lower()}")


class AuthInterceptor(grpc.ServerInterceptor):
    def __init__(self, policy: AuthPolicy, audit: AuditLog) -> None:
        self.policy = policy
        self.audit = audit

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        metadata = handler_call_details.invocation_metadata
        return _rewrap(handler, lambda behavior, unary_request: self._guard(
            method, metadata, behavior, unary_request))

    def _guard(self, method: str, metadata: Metadata, behavior: Behavior, unary_request: bool
               ) -> Behavior:
        recorded = audited(method)

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            role, refused = decide(self.policy, method, bearer(metadata))
            if refused is not None:
                log.warning("call refused", method=method, why=refused.why, peer=context.peer())
                context.abort(refused.code, refused.message)
            if not recorded:
                return behavior(request, context)
            summary = request if unary_request else None
            try:
                result = behavior(request, context)
            except Exception:
                self._record(method, role, metadata, context, summary, _code(context))
                raise
            self._record(method, role, metadata, context, summary, _code(context))
            return result

        return guarded

    def _record(self, method: str, role: Role | None, metadata: Metadata,
                context: grpc.ServicerContext, request: Any, outcome: str) -> None:
        record = pb.AuditRecord(
            method=method.strip("/").rsplit(".", 1)[-1],
            role=role.name.lower() if role is not None else "none",
            peer=context.peer(), client_cert=_client_cert(context),
            agent=_printable(_header(metadata, AGENT_HEADER) or "", 120),
            pipeline=pipeline_of(request) if request is not None else "",
            summary=summarize(request) if request is not None else "", outcome=outcome)
        operator = record.role == "admin" or access_of(method) == Access.ADMIN
        emit = log.info if operator else log.debug  # service calls come several a second
        emit("audit", method=record.method, role=record.role, peer=record.peer,
             client_cert=record.client_cert or None, agent=record.agent or None,
             pipeline=record.pipeline or None, summary=record.summary, outcome=outcome)
        try:
            self.audit.append(record)
        except Exception as e:  # the change itself is done; losing its record is logged
            log.error("audit record not stored", method=record.method, error=str(e))


def _code(context: grpc.ServicerContext) -> str:
    code = status_code(context)
    if code is None or code == grpc.StatusCode.OK:
        return "ok"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)


def _client_cert(context: grpc.ServicerContext) -> str:
    # Each property maps to a list of values (types-grpcio says bytes).
    auth = cast(Mapping[str, list[bytes]], context.auth_context())
    for key in ("x509_subject", "x509_common_name"):
        if auth.get(key):
            return _printable(auth[key][0].decode(errors="replace"), 200)
    return ""


def _printable(text: str, limit: int) -> str:
    return "".join(c for c in text if c.isprintable())[:limit]


def _rewrap(handler: grpc.RpcMethodHandler[Any, Any],
            wrap: Callable[[Behavior, bool], Behavior]) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler with its behavior wrapped, whatever its streaming kind."""
    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary, True), **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(wrap(handler.unary_stream, True), **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary, False), **kwargs)
    # gRPC sets exactly one of the four behaviors
    stream_stream = cast(Behavior, handler.stream_stream)
    return grpc.stream_stream_rpc_method_handler(wrap(stream_stream, False), **kwargs)
