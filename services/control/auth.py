"""Admin mutations need `authorization: Bearer <token>` when the server has a token.

The token comes from `--token-file` or TAILRACE_CONTROL_TOKEN; it is compared in constant
time and never logged. Reads and the calls capture and delivery make (checkpoints, epochs,
commits, schemas, identities, DLQ append) are not gated here: put them behind TLS and the
network policy of the deployment.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from tailrace.logs import get_logger

log = get_logger(__name__)

PROTECTED = frozenset({
    "/tailrace.v1.Admin/Pause",
    "/tailrace.v1.Admin/Resume",
    "/tailrace.v1.Admin/Rewind",
    "/tailrace.v1.DeadLetters/Replay",
    "/tailrace.v1.DeadLetters/Ack",
    "/tailrace.v1.DeadLetters/Purge",
})


def load_token(token_file: str | None) -> str | None:
    """From the file when given (first line), else TAILRACE_CONTROL_TOKEN; None = no auth."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise ValueError(f"cannot read --token-file {token_file}: {e.strerror}") from None
        if not token:
            raise ValueError(f"--token-file {token_file} is empty; put the admin token in it")
        return token
    return os.environ.get("TAILRACE_CONTROL_TOKEN") or None


class TokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        if method not in PROTECTED or self._allowed(handler_call_details.invocation_metadata):
            return continuation(handler_call_details)
        log.warning("admin call refused: missing or wrong token", method=method)
        handler = continuation(handler_call_details)

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          f"{method.rsplit('/', 1)[-1]} needs the admin token: pass --token or "
                          "set TAILRACE_TOKEN (metadata authorization: Bearer <token>)")

        return grpc.unary_unary_rpc_method_handler(
            refuse, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
