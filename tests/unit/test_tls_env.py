"""The TLS identity handed over in the environment (mesh.tls_env): what an agent writes
for a task, how the task's programs read it back, and which wins in the CLI."""

from __future__ import annotations

import pytest

from agent.service import Agent, AgentConfig
from mesh import tls_env
from mesh.cli.context import Context, load_context
from mesh.cli.main import main
from mesh.connect import ClientTls, TlsConfigError
from mesh.security import pki
from mesh.security.identity import Identity

WORKER = Identity.worker("n1")


@pytest.fixture(autouse=True)
def clean(bare_client_env):
    for var in tls_env.ENV_VARS:
        bare_client_env.delenv(var, raising=False)
    return bare_client_env


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki") / "certs"
    pki.init(d)
    pki.issue(d, WORKER)
    return d


def _handed(certs) -> dict[str, str]:
    return tls_env.to_env(ClientTls.for_identity(certs, WORKER))


def test_nothing_handed_is_no_tls():
    assert tls_env.from_env({}) is None
    # A prefix alone is no identity (the CLI then connects as it would anyway).
    assert tls_env.from_env({tls_env.INBOX_VAR: "_INBOX.worker.n1"}) is None
    assert tls_env.from_env({tls_env.CA_VAR: ""}) is None


def test_what_the_agent_writes_reads_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tls = ClientTls("ca.crt", "w.crt", "w.key", WORKER.inbox_prefix, WORKER.common_name)
    env = tls_env.to_env(tls)
    assert set(env) == set(tls_env.ENV_VARS)
    assert env[tls_env.CERT_VAR] == str(tmp_path / "w.crt")  # absolute: tasks chdir
    back = tls_env.from_env(env)
    assert (back.ca, back.cert, back.key) == tuple(
        str(tmp_path / f) for f in ("ca.crt", "w.crt", "w.key")
    )
    assert back.inbox_prefix == "_INBOX.worker.n1"
    assert back.identity == "worker:n1"  # named in refusals; read off the prefix


def test_os_environ_is_the_default(monkeypatch):
    for var, value in zip(tls_env.TLS_VARS, ("/c/ca.crt", "/c/w.crt", "/c/w.key"), strict=True):
        monkeypatch.setenv(var, value)
    tls = tls_env.from_env()
    assert (tls.key, tls.inbox_prefix, tls.identity) == ("/c/w.key", "_INBOX", "")


@pytest.mark.parametrize(
    "env",
    [
        {tls_env.CA_VAR: "/ca.crt"},
        {tls_env.CERT_VAR: "/w.crt", tls_env.KEY_VAR: "/w.key"},
    ],
)
def test_a_partial_identity_is_refused(env):
    with pytest.raises(TlsConfigError, match=r"\$MESH_TLS_CA, \$MESH_TLS_CERT and "):
        tls_env.from_env(env)


@pytest.mark.parametrize("prefix", ["_INBOX.>", "_INBOX.*", "a..b", "a b"])
def test_a_prefix_must_be_a_literal_subject(prefix):
    env = {tls_env.CA_VAR: "/a", tls_env.CERT_VAR: "/b", tls_env.KEY_VAR: "/c"}
    with pytest.raises(TlsConfigError, match=r"\$MESH_INBOX_PREFIX .* no wildcard"):
        tls_env.from_env({**env, tls_env.INBOX_VAR: prefix})
    with pytest.raises(TlsConfigError, match="--inbox-prefix"):
        tls_env.client_tls("", "", "", prefix, inbox_name="--inbox-prefix")


@pytest.mark.parametrize(
    ("prefix", "identity"),
    [
        ("_INBOX.worker.n1", "worker:n1"),
        ("_INBOX.user.admin", "user:admin"),
        ("_INBOX.coordinator", "coordinator"),
        ("_INBOX", ""),
        ("_INBOX.worker", ""),
        ("_INBOX.worker.a.b", ""),
        ("_INBOX.nobody.x", ""),
        ("_INBOX.coordinator.x", ""),
        ("OTHER.worker.n1", ""),
    ],
)
def test_identity_read_off_the_prefix(prefix, identity):
    assert tls_env.identity_of(prefix) == identity


def test_agent_hands_its_task_identity_through_to_env(certs, tmp_path):
    tls = ClientTls.for_identity(certs, WORKER)
    agent = Agent(
        AgentConfig(
            "tls://127.0.0.1:1",
            node_id="n1",
            data_dir=str(tmp_path / "a"),
            tls=ClientTls.for_identity(certs, Identity.user("admin")),
            task_tls=tls,
        )
    )
    assert agent.task_identity_env() == tls_env.to_env(tls)
    assert tls_env.from_env(agent.task_identity_env()) == tls


# ---------------------------------------------------------------- the CLI


def test_cli_without_certs_connects_as_the_handed_identity(certs):
    handed = _handed(certs)
    ctx = load_context(None, None)
    assert ctx.certs is None
    tls = ctx.client_tls(handed)
    assert tls.cert == str(WORKER.cert_path(certs)) and tls.inbox_prefix == WORKER.inbox_prefix
    tls.context()  # loads
    assert ctx.client_tls({}) is None  # nothing handed: an insecure mesh


def test_cli_certs_dir_keeps_priority(certs, monkeypatch):
    handed = _handed(certs)
    monkeypatch.setenv("MESH_CERTS", str(certs))
    tls = load_context(None, None).client_tls(handed)
    assert tls.cert.endswith("user-admin.crt") and tls.identity == "user:admin"
    monkeypatch.delenv("MESH_CERTS")
    tls = Context("tls://x:1", "eu", str(certs)).client_tls(handed)  # a saved context's
    assert tls.cert.endswith("user-admin.crt")


def test_cli_insecure_ignores_the_handed_identity(certs, monkeypatch):
    handed = _handed(certs)
    assert load_context(None, None, insecure=True).client_tls(handed) is None
    monkeypatch.setenv("MESH_INSECURE", "1")
    assert load_context(None, None).client_tls(handed) is None


def test_cli_refuses_unreadable_handed_files(certs, tmp_path):
    handed = {**_handed(certs), tls_env.KEY_VAR: str(tmp_path / "gone.key")}
    with pytest.raises(TlsConfigError, match="gone.key is missing .*task identity"):
        load_context(None, None).client_tls(handed)


def test_cli_reports_a_bad_handed_identity_before_connecting(monkeypatch, capsys):
    monkeypatch.setenv(tls_env.CA_VAR, "/ca.crt")  # the other two missing
    monkeypatch.setenv("MESH_NATS_URL", "tls://127.0.0.1:1")
    assert main(["job", "hosts", "j-1"]) == 2
    err = capsys.readouterr().err
    assert "$MESH_TLS_CA, $MESH_TLS_CERT and $MESH_TLS_KEY go together" in err
    assert "cannot reach" not in err
