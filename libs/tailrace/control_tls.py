"""TLS from a client of the control service, and plain words when the two sides disagree.

gRPC answers a plaintext client of a TLS server with UNAVAILABLE "Socket closed", which
looks like a server that is restarting and would be retried for ever. `diagnose` tells
the cases apart: the handshake errors gRPC names are read from the answer, and a bare
"Socket closed" is followed by one TLS handshake of our own (`probe`) — a server that
completes it speaks TLS; one that then hangs up wants a client certificate.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc

from tailrace.errors import ConfigError

Probe = Literal["plaintext", "tls", "tls-closed", "unreachable"]


class ControlTlsError(ConfigError):
    """The client's TLS settings do not fit the control service's; the message says which."""

    def __init__(self, message: str, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        super().__init__(message)


@dataclass(frozen=True)
class ClientTls:
    """PEM bytes; `ca` None trusts the system's CAs; `cert` and `key` make it mutual TLS."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_files(cls, ca: str | None, cert: str | None, key: str | None,
                   names: tuple[str, str, str] = ("ca", "cert", "key")) -> ClientTls:
        """Read the files; a missing or unreadable one is a `ConfigError` naming its setting
        (`names`: how the caller calls the three, e.g. `spec.control.tls.ca` or `--tls-ca`)."""
        if bool(cert) != bool(key):
            raise ConfigError(f"{names[1]} and {names[2]} go together; give both or neither")
        return cls(ca=_read(ca, names[0]), cert=_read(cert, names[1]), key=_read(key, names[2]))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path}: {e.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what}: {path} is not PEM (no '-----BEGIN' line)")
    return data


def probe(address: str, timeout: float = 3.0) -> Probe:
    """Open one TLS connection to `address` without verifying anything and see what happens."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            tls.settimeout(0.5)
            try:
                return "tls" if tls.recv(1) else "tls-closed"
            except TimeoutError:
                return "tls"
            except (ssl.SSLError, ConnectionError):
                return "tls-closed"
    except ssl.SSLError:
        return "plaintext"
    except (OSError, ValueError):
        return "unreachable"


@dataclass(frozen=True)
class TlsSettings:
    """How a kind of client names its TLS settings, for messages."""

    tls: str         # the whole setting
    ca: str          # trust
    client: str      # certificate and key


SPEC_SETTINGS = TlsSettings("control.tls in the pipeline spec", "control.tls.ca",
                            "control.tls.cert and control.tls.key")
CLI_SETTINGS = TlsSettings("--tls-ca/--tls-cert/--tls-key", "--tls-ca", "--tls-cert and --tls-key")


def diagnose(address: str, details: str, tls: ClientTls | None,
             settings: TlsSettings = SPEC_SETTINGS) -> str | None:
    """Why a client with `tls` (None = plaintext) cannot talk to `address`, when the cause is
    TLS; None when it is not (the server may be restarting: retry)."""
    lowered = details.lower()
    if tls is None:
        if "socket closed" not in lowered and "connection reset" not in lowered:
            return None
        seen = probe(address)
        if seen == "tls":
            return (f"control service at {address} serves TLS and this client speaks "
                    f"plaintext: set {settings.ca} to the CA that signed control's certificate")
        if seen == "tls-closed":
            return (f"control service at {address} serves mutual TLS and this client speaks "
                    f"plaintext: set {settings.ca}, and {settings.client} to a client "
                    "certificate signed by the CA given to tailrace-control --tls-client-ca")
        return None
    if "wrong_version_number" in lowered or "packet_length_too_long" in lowered:
        return (f"control service at {address} speaks plaintext and this client uses TLS "
                f"({settings.tls}): start tailrace-control with --tls-cert and --tls-key, or "
                "talk plaintext")
    if "certificate_verify_failed" in lowered:
        return (f"the certificate of the control service at {address} is not signed by a CA "
                f"this client trusts: set {settings.ca} to the CA that signed it "
                f"({_reason(details)})")
    if "hostname verification" in lowered or "peer name" in lowered:
        host = address.rpartition(":")[0]
        return (f"the certificate of the control service at {address} does not name {host}: "
                "reach it by a name its certificate lists (subjectAltName), or reissue the "
                "certificate with this name")
    if "socket closed" in lowered and probe(address) == "tls-closed":
        if tls.cert is None:
            return (f"control service at {address} requires a client certificate (mutual "
                    f"TLS): set {settings.client}")
        return (f"control service at {address} refused this client's certificate: "
                f"{settings.client} must name a certificate signed by the CA given to "
                "tailrace-control --tls-client-ca")
    return None


def _reason(details: str) -> str:
    """The last `: `-separated phrase gRPC gives, e.g. 'unable to get local issuer certificate'."""
    parts = [p.strip() for p in details.split(":") if p.strip() and p.strip() != "OK"]
    return parts[-1] if parts else details
