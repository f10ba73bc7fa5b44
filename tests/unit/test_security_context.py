"""Which mesh and certificates a CLI command uses: flags, environment, then the
selected saved context (`mesh context`, or the one `mesh up` writes); a context file
that cannot be read is refused."""

from __future__ import annotations

import json

import pytest

from mesh.cli.context import Context, ContextError, load_context, read_store, save_context
from mesh.cli.main import main
from mesh.connect import ClientTls, TlsConfigError
from mesh.security import pki
from mesh.security.identity import Identity


@pytest.fixture(autouse=True)
def home(tmp_path, bare_client_env):
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


def _home(tmp_path):
    return tmp_path / "home"


def test_up_context_joins_saved_ones_and_legacy_file_reads_as_local(tmp_path):
    home = _home(tmp_path)
    home.mkdir()
    (home / "context.json").write_text('{"url": "tls://127.0.0.1:5000", "region": "r1"}')
    store = read_store()
    assert store.current == "local" and store.contexts["local"].url == "tls://127.0.0.1:5000"
    certs = tmp_path / "eu-certs"
    certs.mkdir()
    args = ["context", "add", "eu", "--nats", "tls://eu:4222", "--region", "eu"]
    assert main([*args, "--certs", str(certs), "--user", "ops"]) == 0
    assert load_context(None, None).url == "tls://127.0.0.1:5000"  # still current: local
    assert main(["context", "use", "eu"]) == 0
    ctx = load_context(None, None)
    assert (ctx.url, ctx.region, ctx.certs, ctx.user) == ("tls://eu:4222", "eu", str(certs), "ops")
    # `mesh up` writes its context beside the others and makes it current.
    save_context(Context("tls://127.0.0.1:6000", "default", "/up-certs"))
    store = read_store()
    assert store.current == "local" and set(store.contexts) == {"local", "eu"}
    # Scripts that read the file's top-level url (as written before contexts had
    # names) still find the current context there.
    data = json.loads((home / "context.json").read_text())
    assert (data["url"], data["certs"], data["user"]) == (
        "tls://127.0.0.1:6000",
        "/up-certs",
        "admin",
    )
    assert data["contexts"]["eu"]["url"] == "tls://eu:4222"


def test_precedence_flags_env_context(monkeypatch):
    save_context(Context("tls://a:1", "ra", "/ca", "ua"), "a")
    save_context(Context("tls://b:1", "rb", "/cb", "ub"), "b")  # current
    assert load_context(None, None).url == "tls://b:1"
    assert load_context(None, None, name="a").region == "ra"
    monkeypatch.setenv("MESH_CONTEXT", "a")
    assert load_context(None, None).user == "ua"
    assert load_context(None, None, name="b").user == "ub"  # --context over MESH_CONTEXT
    monkeypatch.setenv("MESH_REGION", "renv")
    assert load_context(None, None).region == "renv"
    assert load_context(None, "rflag").region == "rflag"
    with pytest.raises(ContextError, match="no context 'nope'.*known: a, b"):
        load_context(None, None, name="nope")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "not usable"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"contexts": {"x": {"region": "eu"}}}', "contexts.x.url"),
        (b'{"current": "y", "contexts": {"x": {"url": "tls://x:1"}}}', "'y' is not one of"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_corrupt_context_file_is_refused_not_skipped(tmp_path, capsys, content, says):
    home = _home(tmp_path)
    home.mkdir()
    path = home / "context.json"
    path.write_bytes(content)
    with pytest.raises(ContextError, match=says):
        load_context(None, None)
    assert main(["job", "list"]) == 2  # before any connection to localhost:4222
    err = capsys.readouterr().err
    assert str(path) in err and says.strip("'") in err and "remove it" in err.replace("\n", " ")


def test_context_commands(tmp_path, capsys):
    assert main(["context", "list"]) == 0
    assert "no contexts" in capsys.readouterr().out
    assert main(["context", "add", "a", "--nats", "tls://a:1"]) == 0  # first: current
    assert main(["context", "add", "b", "--nats", "nats://b:1", "--region", "rb"]) == 0
    capsys.readouterr()
    assert main(["context", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("*  a ") and lines[2].startswith("   b ")
    assert main(["context", "list", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["current"]) for c in listed] == [("a", True), ("b", False)]
    assert main(["context", "show", "--context", "b", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {"context": "b", "url": "nats://b:1", "region": "rb"}
    assert main(["context", "use", "nope"]) == 2
    assert "no context 'nope'" in capsys.readouterr().err
    assert main(["context", "add", "c", "--nats", "x", "--certs", str(tmp_path / "none")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["context", "add", "bad name", "--nats", "x"]) == 2
    assert main(["context", "remove", "a"]) == 0
    assert read_store().current is None and set(read_store().contexts) == {"b"}
    assert main(["--context", "gone", "job", "list"]) == 2
    assert "no context 'gone'" in capsys.readouterr().err
