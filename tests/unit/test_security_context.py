"""Which certificates a CLI command uses: flags, environment, then the `mesh up` context."""

from __future__ import annotations

import pytest

from mesh.cli.context import Context, load_context, save_context
from mesh.connect import ClientTls, TlsConfigError
from mesh.security import pki
from mesh.security.identity import Identity


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MESH_HOME", str(tmp_path / "home"))
    for var in ("MESH_NATS_URL", "MESH_REGION", "MESH_CERTS", "MESH_USER", "MESH_INSECURE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_context_carries_the_certificates(tmp_path, monkeypatch):
    save_context(Context("tls://127.0.0.1:4222", "eu", "/certs", "alice"))
    ctx = load_context(None, None)
    assert (ctx.url, ctx.region, ctx.certs, ctx.user) == (
        "tls://127.0.0.1:4222",
        "eu",
        "/certs",
        "alice",
    )
    assert load_context(None, None, "/flag").certs == "/flag"
    monkeypatch.setenv("MESH_CERTS", "/env")
    assert load_context(None, None).certs == "/env"
    assert load_context(None, None, insecure=True).certs is None
    monkeypatch.setenv("MESH_INSECURE", "1")
    assert load_context(None, None).certs is None
    assert load_context(None, None).connect_options(Identity.user("x")) == {}


def test_insecure_context_has_no_certificates():
    save_context(Context("nats://127.0.0.1:4222", "default"))
    ctx = load_context(None, None)
    assert ctx.certs is None and ctx.tls(Identity.coordinator()) is None


def test_identity_files_by_convention(tmp_path):
    d = tmp_path / "certs"
    pki.init(d)
    tls = ClientTls.for_identity(d, Identity.user("admin"))
    assert tls.cert.endswith("user-admin.crt") and tls.inbox_prefix == "_INBOX.user.admin"
    tls.context()  # loads
    with pytest.raises(TlsConfigError, match="agent-n9.crt"):
        ClientTls.for_identity(d, Identity.agent("n9"))
