"""Certificates for TLS tests, made with the `openssl` command (plugin: `tests.fix_tls`).

`tls_files`: a CA; a server certificate for 127.0.0.1 and localhost; a client certificate
(CN=tailrace-service) signed by the CA; and a client certificate signed by another CA,
which a server trusting only the first refuses.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tailrace.control_tls import ClientTls


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # signed by another CA
    rogue_key: Path
    other_ca: Path

    def client(self, cert: bool = True) -> ClientTls:
        """Trust the CA; with `cert`, present the client certificate (mutual TLS)."""
        return ClientTls.from_files(str(self.ca), str(self.client_cert) if cert else None,
                                    str(self.client_key) if cert else None)

    def spec(self) -> str:
        """`tls: {...}` for spec.control."""
        return (f'tls: {{ca: "{self.ca}", cert: "{self.client_cert}", '
                f'key: "{self.client_key}"}}')

    def server_args(self, mutual: bool = True) -> tuple[str, ...]:
        args = ("--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key))
        return (*args, "--tls-client-ca", str(self.ca)) if mutual else args


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             f"/CN={name}", "-keyout", str(key), "-out", str(cert))
    return cert, key


def _signed(directory: Path, name: str, ca: tuple[Path, Path], extensions: str
            ) -> tuple[Path, Path]:
    cert, key, csr = (directory / f"{name}.pem", directory / f"{name}.key",
                      directory / f"{name}.csr")
    ext = directory / f"{name}.ext"
    ext.write_text(extensions + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key),
             "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(ext))
    return cert, key


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    d = tmp_path_factory.mktemp("tls")
    ca, other = _ca(d, "tailrace-test-ca"), _ca(d, "other-ca")
    server = _signed(d, "control", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                       "extendedKeyUsage=serverAuth")
    client = _signed(d, "tailrace-service", ca, "extendedKeyUsage=clientAuth")
    rogue = _signed(d, "rogue", other, "extendedKeyUsage=clientAuth")
    return TlsFiles(ca=ca[0], server_cert=server[0], server_key=server[1],
                    client_cert=client[0], client_key=client[1], rogue_cert=rogue[0],
                    rogue_key=rogue[1], other_ca=other[0])
