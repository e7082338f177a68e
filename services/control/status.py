"""gRPC status for the control service: servicers raise a `Refusal`; one interceptor answers it.

A refusal's message says what was wrong and how to fix it. Storage that cannot be reached is
UNAVAILABLE (clients retry); anything else is INTERNAL, logged with its traceback, and answered
without secrets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from tailrace.logs import get_logger, redact
from tailrace_services.control.storage import StorageUnavailable

log = get_logger(__name__)


class Refusal(Exception):
    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidArgument(Refusal):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(Refusal):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(Refusal):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(Refusal):
    """A concurrent change got there first; read again and retry."""

    code = grpc.StatusCode.ABORTED


def require(request: Any, *fields: str) -> None:
    """Refuse with INVALID_ARGUMENT naming every empty field of `fields`."""
    missing = [f for f in fields if not getattr(request, f)]
    if missing:
        raise InvalidArgument(f"{type(request).__name__}: {', '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} required")


def status_code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    """The status code set on the RPC so far (None: none yet)."""
    # ServicerContext.code() is in grpc (an experimental API) but not in types-grpcio.
    code: grpc.StatusCode | None = context.code()  # type: ignore[attr-defined]
    return code


def _guarded(method: str, behavior: Callable[[Any, grpc.ServicerContext], Any]
             ) -> Callable[[Any, grpc.ServicerContext], Any]:
    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behavior(request, context)
        except Refusal as e:
            context.abort(e.code, redact(str(e)))
        except StorageUnavailable as e:
            log.warning("storage unavailable", method=method, error=str(e))
            context.abort(grpc.StatusCode.UNAVAILABLE, redact(str(e)))
        except Exception as e:
            if status_code(context) is not None:  # the servicer aborted on its own
                raise
            log.exception("control request failed", method=method)
            context.abort(grpc.StatusCode.INTERNAL,
                          f"internal error in {method}: {type(e).__name__}: {redact(str(e))}")

    return handle


class RefusalInterceptor(grpc.ServerInterceptor):
    """Turns `Refusal` and storage errors raised by unary servicer methods into gRPC status."""

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            _guarded(handler_call_details.method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
