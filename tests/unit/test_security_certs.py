"""`mesh certs`: the CA, client certificates, key modes and clear errors."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mesh.cli.main import main
from mesh.security import pki
from mesh.security.identity import Identity, IdentityError


def cn(path) -> str:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def test_init_and_issue(tmp_path):
    d = tmp_path / "certs"
    assert main(["certs", "init", str(d), "--host", "mesh.example.org", "--host", "10.0.0.7"]) == 0
    names = {p.name for p in d.iterdir()}
    for stem in ("ca", "server", "coordinator", "user-admin"):
        assert f"{stem}.crt" in names and f"{stem}.key" in names
    assert pki.signing_key_path(d).exists() and pki.verify_key_path(d).exists()
    for key in [*d.glob("*.key"), pki.signing_key_path(d)]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert cn(d / "coordinator.crt") == "coordinator"
    assert cn(d / "user-admin.crt") == "user:admin"

    server = x509.load_pem_x509_certificate((d / "server.crt").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.7"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "mesh.example.org"}
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku

    assert main(["certs", "issue", str(d), "--agent", "node-7"]) == 0
    assert main(["--certs", str(d), "certs", "issue", "--user", "bob"]) == 0
    assert cn(d / "agent-node-7.crt") == "agent:node-7"
    client = x509.load_pem_x509_certificate((d / "agent-node-7.crt").read_bytes())
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.issuer == x509.load_pem_x509_certificate((d / "ca.crt").read_bytes()).subject
    assert set(pki.identities(d)) == {
        Identity.coordinator(),
        Identity.user("admin"),
        Identity.user("bob"),
        Identity.agent("node-7"),
    }


def test_errors_are_clear(tmp_path, capsys):
    d = tmp_path / "certs"
    assert main(["certs", "issue", str(d), "--agent", "n1"]) == 2
    assert "holds no CA" in capsys.readouterr().err
    assert main(["certs", "init", str(d)]) == 0
    capsys.readouterr()
    assert main(["certs", "init", str(d)]) == 2  # never a second CA over the first
    assert "already holds a CA" in capsys.readouterr().err
    assert main(["certs", "issue", str(d), "--agent", "a.b"]) == 2
    assert main(["certs", "issue", str(d), "--agent", "*"]) == 2
    assert main(["certs", "issue", str(d), "--user", "admin"]) == 2  # exists: not replaced
    assert "already exists" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["certs", "init", str(tmp_path / "file")]) == 2


def test_nats_conf_lists_every_identity(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    pki.issue(d, Identity.agent("n1"))
    pki.issue(d, Identity.fleet("sim"))
    capsys.readouterr()
    assert main(["--region", "eu", "certs", "nats-conf", str(d), "--fleet-nodes", "sim=2"]) == 0
    conf = capsys.readouterr().out
    assert "verify_and_map: true" in conf
    for user in ("CN=coordinator", "CN=user:admin", "CN=agent:n1", "CN=fleet:sim"):
        assert f'"{user}"' in conf
    assert '"mesh.eu.state.sim-0001"' in conf and "sim-0002" not in conf


def test_issue_refuses_a_non_identity(tmp_path):
    pki.init(tmp_path)
    with pytest.raises(IdentityError):
        pki.issue(tmp_path, "agent:x")  # type: ignore[arg-type]
