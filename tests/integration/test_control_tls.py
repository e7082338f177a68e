"""TLS to a real `tailrace-control` process: mutual TLS works and names the client in the
audit log; every mismatch (plaintext against TLS and back, a missing or foreign client
certificate, an untrusted server) fails at once with a message naming the setting, instead
of retrying "Socket closed" until the retry budget runs out."""

from __future__ import annotations

import time

import pytest

from tailrace.control_client import ControlClient
from tailrace.control_tls import ClientTls, ControlTlsError
from tailrace_services.cli.main import main
from tests.fix_control import ControlProcess

pytestmark = pytest.mark.integration

RETRY_FOR = 60  # what a mismatch would cost if it were retried; it must fail long before


@pytest.fixture(scope="module")
def mtls_control(tmp_path_factory, tls_files):
    directory = tmp_path_factory.mktemp("mtls")
    with ControlProcess(directory, "memory://", tls=(tls_files.server_cert, tls_files.server_key),
                        client_ca=tls_files.ca) as proc:
        yield proc


def fails_fast(client: ControlClient, match: str) -> None:
    started = time.monotonic()
    with client, pytest.raises(ControlTlsError, match=match):
        client.list_pipelines()
    assert time.monotonic() - started < 10, "a TLS mismatch is not retried"


def test_mutual_tls_names_the_client_in_the_audit_log(mtls_control, tls_files):
    with mtls_control.client("service", tls=tls_files.client(), retry_for=10) as service:
        service.register_pipeline("secure", source_id="pg", sinks=[("s", "redis", True)])
    with mtls_control.client(tls=tls_files.client(), retry_for=10) as admin:
        (record,) = admin.list_audit(pipeline="secure")
    assert (record.role, record.method, record.client_cert) == (
        "service", "Admin/RegisterPipeline", "CN=tailrace-service")


def test_a_plaintext_client_is_told_the_server_wants_tls(mtls_control):
    fails_fast(mtls_control.client("service", retry_for=RETRY_FOR),
               "serves mutual TLS and this client speaks plaintext: set control.tls.ca, and "
               "control.tls.cert and control.tls.key")


def test_a_client_without_a_certificate_is_told_to_set_one(mtls_control, tls_files):
    fails_fast(mtls_control.client("service", tls=tls_files.client(cert=False),
                                   retry_for=RETRY_FOR),
               "requires a client certificate \\(mutual TLS\\): set control.tls.cert and "
               "control.tls.key")


def test_a_foreign_client_certificate_is_refused(mtls_control, tls_files):
    rogue = ClientTls.from_files(str(tls_files.ca), str(tls_files.rogue_cert),
                                 str(tls_files.rogue_key))
    fails_fast(mtls_control.client("service", tls=rogue, retry_for=RETRY_FOR),
               "refused this client's certificate")


def test_an_untrusted_server_certificate(mtls_control, tls_files):
    other = ClientTls.from_files(str(tls_files.other_ca), str(tls_files.client_cert),
                                 str(tls_files.client_key))
    fails_fast(mtls_control.client("service", tls=other, retry_for=RETRY_FOR),
               "not signed by a CA this client trusts: set control.tls.ca")


def test_a_tls_client_of_a_plaintext_server(tmp_path, tls_files):
    with ControlProcess(tmp_path, "memory://") as plain:
        fails_fast(plain.client("service", tls=tls_files.client(), retry_for=RETRY_FOR),
                   "speaks plaintext and this client uses TLS")


def test_the_cli_over_mutual_tls(mtls_control, tls_files, capsys):
    base = ["pipelines", "--control", mtls_control.address, "--token-file",
            str(mtls_control.admin_token_file)]
    tls = ["--tls-ca", str(tls_files.ca), "--tls-cert", str(tls_files.client_cert),
           "--tls-key", str(tls_files.client_key)]
    assert main([*base, *tls]) == 0
    capsys.readouterr()
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tailrace: control service at {mtls_control.address} serves mutual "
                          "TLS and this client speaks plaintext: set --tls-ca, and --tls-cert "
                          "and --tls-key")
    assert len(err.splitlines()) == 1
