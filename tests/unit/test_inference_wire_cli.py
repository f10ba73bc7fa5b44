"""How the inference router, worker and load generator take their connection settings:
flags, else the ``MESH_*`` environment an agent gives a task, else one-machine defaults."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference import loadgen, router, worker
from inference.wire import id_token, run
from mesh import subjects

ENV = (
    "MESH_NATS_URL",
    "MESH_REGION",
    "MESH_TLS_CA",
    "MESH_TLS_CERT",
    "MESH_TLS_KEY",
    "MESH_INBOX_PREFIX",
    "MESH_TASK_ID",
)
PARSERS = (router.parse_args, worker.parse_args, loadgen.parse_args)


@pytest.fixture
def env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("parse", PARSERS)
def test_defaults_work_on_one_machine(env, parse):
    c = parse([])
    assert c.url == "nats://127.0.0.1:4222"
    assert c.region == "local"
    assert c.tls is None
    assert c.inbox_prefix == "_INBOX"


@pytest.mark.parametrize("parse", PARSERS)
def test_environment_gives_defaults_and_flags_win(env, parse):
    env.setenv("MESH_NATS_URL", "tls://nats-a:4222,tls://nats-b:4222")
    env.setenv("MESH_REGION", "eu1")
    env.setenv("MESH_TLS_CA", "/certs/ca.crt")
    env.setenv("MESH_TLS_CERT", "/certs/me.crt")
    env.setenv("MESH_TLS_KEY", "/certs/me.key")
    env.setenv("MESH_INBOX_PREFIX", "_INBOX_me")
    c = parse([])
    assert c.url == "tls://nats-a:4222,tls://nats-b:4222"
    assert c.region == "eu1"
    assert (c.tls.ca, c.tls.cert, c.tls.key) == ("/certs/ca.crt", "/certs/me.crt", "/certs/me.key")
    assert c.tls.inbox_prefix == c.inbox_prefix == "_INBOX_me"
    c = parse(
        [
            "--nats",
            "nats://x:1",
            "--region",
            "us2",
            "--inbox-prefix",
            "_INBOX.user.bob",
            "--tls-key",
            "/other.key",
        ]
    )
    assert (c.url, c.region, c.inbox_prefix) == ("nats://x:1", "us2", "_INBOX.user.bob")
    assert c.tls.key == "/other.key" and c.tls.inbox_prefix == "_INBOX.user.bob"


@pytest.mark.parametrize("parse", PARSERS)
def test_inbox_prefix_without_tls_is_kept(env, parse):
    env.setenv("MESH_INBOX_PREFIX", "_INBOX_x")
    c = parse([])
    assert c.tls is None and c.inbox_prefix == "_INBOX_x"


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(
    "argv",
    [
        ["--tls-ca", "/ca.crt"],  # the three TLS files go together
        ["--tls-cert", "/c", "--tls-key", "/k"],
        ["--inbox-prefix", "_INBOX.>"],  # a literal subject, no wildcard
        ["--inbox-prefix", "_INBOX.*"],
        ["--inbox-prefix", "a..b"],
        ["--inbox-prefix", ""],
        ["--region", "a.b"],  # a subject token
    ],
)
def test_bad_settings_are_refused(env, parse, argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_router_and_worker_keep_their_other_flags(env):
    s = router.parse_args(
        [
            "--name",
            "r9",
            "--dispatch-lead-ms",
            "3",
            "--reply-margin-ms",
            "4",
            "--batch-slack-ms",
            "60",
        ]
    )
    assert (s.name, s.dispatch_lead_ms, s.reply_margin_ms, s.batch_slack_ms) == ("r9", 3, 4, 60)
    w = worker.parse_args(
        [
            "--model",
            "m",
            "--runtime",
            "profile",
            "--a-ms",
            "5",
            "--b-ms",
            "1",
            "--max-batch",
            "16",
            "--worker-id",
            "w7",
            "--in-dim",
            "4",
        ]
    )
    assert (w.model, w.runtime, w.a_ms, w.b_ms, w.max_batch, w.worker_id, w.in_dim) == (
        "m",
        "profile",
        5,
        1,
        16,
        "w7",
        4,
    )
    g = loadgen.parse_args(["--rate", "10", "--concurrency", "3", "--echo"])
    assert (g.rate, g.concurrency, g.echo) == (10, 3, True)


def test_worker_id_is_the_task_id_made_a_token(env):
    assert worker.parse_args([]).worker_id == ""  # random, chosen by the Worker
    env.setenv("MESH_TASK_ID", "serve-1a2b3c4d.worker.3")
    assert worker.parse_args([]).worker_id == "serve-1a2b3c4d-worker-3"
    assert worker.parse_args(["--worker-id", "w1"]).worker_id == "w1"  # the flag wins
    assert worker.parse_args(["--worker-id", "a.b"]).worker_id == "a-b"


def test_id_token_keeps_tokens_and_long_ids_distinct():
    assert id_token("w-1_x") == "w-1_x"
    long_a = "j" * 63 + "-0123abcd.worker.1"
    long_b = "j" * 63 + "-0123abcd.worker.2"
    ta, tb = id_token(long_a), id_token(long_b)
    assert len(ta) == len(tb) == 64 and ta != tb
    with pytest.raises(ValueError):
        id_token("")


@given(st.text(min_size=1, max_size=200))
def test_id_token_always_gives_a_token(value):
    t = id_token(value)
    assert subjects.is_token(t)
    assert id_token(t) == t  # stable
    if subjects.is_token(value):
        assert t == value


def test_run_on_the_chosen_event_loop():
    async def answer():
        return 42

    assert run(answer(), "asyncio") == 42
    assert run(answer()) == 42
    with pytest.raises(ValueError):
        run(answer(), "trio")
