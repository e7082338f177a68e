"""How capture, delivery and the CLI reach control: the spec's token and TLS settings, the
admin token of the CLI, and what a TLS mismatch is called."""

from __future__ import annotations

import argparse

import pytest

from tailrace.config import parse_pipeline
from tailrace.control_access import service_token
from tailrace.control_tls import CLI_SETTINGS, ClientTls, diagnose
from tailrace.errors import ConfigError
from tailrace_services.cli.connect import admin_token

SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: orders}}
spec:
  source: {{type: postgres, id: pg1, dsn: "host=db dbname=shop", tables: [public.orders]}}
  sinks: [{{id: r1, type: redis, url: "redis://h"}}]
  bus: {{brokers: "k:9092"}}
  control: {control}
"""
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def control(text: str):  # noqa: ANN201 - a ControlSpec
    return parse_pipeline(SPEC.format(control=text)).spec.control


def test_the_spec_never_holds_a_token():
    with pytest.raises(ConfigError) as e:
        control('{address: "c:50051", token: "s3cret-token"}')
    (problem,) = e.value.problems
    assert problem.startswith("<spec>: spec.control: token is not accepted")
    assert "token_file" in problem and "TAILRACE_SERVICE_TOKEN" in problem
    assert "s3cret-token" not in problem


def test_service_token_from_the_file_else_the_environment(tmp_path):
    path = tmp_path / "service.token"
    path.write_text("from-the-file-0123456789\n")
    assert service_token(control(f'{{token_file: "{path}"}}'),
                         env={"TAILRACE_SERVICE_TOKEN": "env"}) == "from-the-file-0123456789"
    assert service_token(control("{}"), env={"TAILRACE_SERVICE_TOKEN": "env"}) == "env"
    assert service_token(control("{}"), env={}) is None
    with pytest.raises(ConfigError, match=r"spec.control.token_file: cannot read .*/nope"):
        service_token(control(f'{{token_file: "{tmp_path / "nope"}"}}'), env={})


def test_tls_settings(tmp_path):
    with pytest.raises(ConfigError, match="cert and key go together"):
        control("{tls: {ca: /ca.pem, cert: /c.pem}}")
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    assert ClientTls.from_files(str(ca), None, None).ca == PEM.encode()
    with pytest.raises(ConfigError, match=r"--tls-ca: cannot read .*/missing.pem"):
        ClientTls.from_files(str(tmp_path / "missing.pem"), None, None,
                             names=("--tls-ca", "--tls-cert", "--tls-key"))
    (tmp_path / "junk").write_text("not a certificate")
    with pytest.raises(ConfigError, match="is not PEM"):
        ClientTls.from_files(str(tmp_path / "junk"), None, None)
    assert "key=" not in repr(ClientTls(key=b"private"))


def test_the_cli_admin_token(tmp_path, capsys):
    path = tmp_path / "admin.token"
    path.write_text("from-file\n")
    args = argparse.Namespace(token=None, token_file=None)
    assert admin_token(args, env={"TAILRACE_ADMIN_TOKEN": "env"}) == "env"
    assert admin_token(argparse.Namespace(token=None, token_file=str(path)),
                       env={"TAILRACE_ADMIN_TOKEN": "env"}) == "from-file"
    assert admin_token(argparse.Namespace(token="flag", token_file=str(path)), env={}) == "flag"
    assert admin_token(args, env={"TAILRACE_TOKEN": "old"}) == "old"
    assert "TAILRACE_TOKEN is deprecated; set $TAILRACE_ADMIN_TOKEN" in capsys.readouterr().err
    assert admin_token(args, env={}) is None


@pytest.mark.parametrize(("details", "expected"), [
    ("last error: UNKNOWN: ipv4:127.0.0.1:5: Tls handshake failed (TSI_PROTOCOL_FAILURE): "
     "SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: OK",
     "speaks plaintext and this client uses TLS (--tls-ca/--tls-cert/--tls-key)"),
    ("Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
     "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK",
     "not signed by a CA this client trusts: set --tls-ca to the CA that signed it (unable to "
     "get local issuer certificate)"),
    ("Custom verification check failed with error: UNAUTHENTICATED: Hostname Verification "
     "Check failed.", "does not name 127.0.0.1"),
    ("Failed to connect to remote host: Connection refused", None),
])
def test_tls_mismatches_are_named(details, expected):
    found = diagnose("127.0.0.1:5", details, ClientTls(ca=PEM.encode()), CLI_SETTINGS)
    assert found == expected if expected is None else expected in found


def test_a_plaintext_client_with_an_unrelated_failure_keeps_retrying():
    assert diagnose("127.0.0.1:5", "Failed to connect to remote host: Connection refused",
                    None) is None


def test_nats_tls_and_credentials_are_passed_through(tmp_path):
    from tailrace.errors import ConfigError
    from tailrace_services.delivery.sinks.nats import connect_security

    def sink(extra: str):  # noqa: ANN202 - a NatsSinkSpec
        spec = SPEC.format(control="{}").replace(
            '{id: r1, type: redis, url: "redis://h"}',
            '{id: n1, type: nats, url: "tls://n:4222"' + extra + "}")
        return parse_pipeline(spec).spec.sinks[0]

    assert connect_security(sink("")) == {}
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\n")
    assert connect_security(sink(f', credentials: "{creds}"')) == {
        "user_credentials": str(creds)}
    with pytest.raises(ConfigError, match="spec.sinks\\[\\].tls: .*No such file"):
        connect_security(sink(f', tls: {{ca: "{tmp_path / "missing.pem"}"}}'))
    with pytest.raises(ConfigError, match="spec.sinks\\[\\].credentials: cannot read"):
        connect_security(sink(f', credentials: "{tmp_path / "none.creds"}"'))


def test_kafka_client_config_secrets_never_print():
    spec = SPEC.replace("{{id: r1, type: redis, url: \"redis://h\"}}",
                        "{{id: k1, type: kafka, brokers: \"k:9093\", client_config: "
                        "{{security.protocol: SASL_SSL, sasl.password: hunter2, "
                        "ssl.key.password: k3y}}}}")
    spec = spec.replace('bus: {{brokers: "k:9092"}}',
                        'bus: {{brokers: "k:9092", client_config: {{sasl.password: pw-bus}}}}')
    pipeline = parse_pipeline(spec.format(control="{}"))
    shown = repr(pipeline) + str(pipeline.spec.sinks[0].client_config)
    assert "hunter2" not in shown and "k3y" not in shown and "pw-bus" not in shown
    assert "'security.protocol': 'SASL_SSL'" in shown
    assert dict(pipeline.spec.sinks[0].client_config)["sasl.password"] == "hunter2", \
        "the client still gets the value"
    assert pipeline.spec.bus.client_config["sasl.password"] == "pw-bus"
