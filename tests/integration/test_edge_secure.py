"""Secure edge sites on real nats-servers: a hub made by `mesh certs nats-conf
--leafnodes --site-nodes` (TLS, `verify_and_map` on the leafnodes listener), a site's
leaf presenting `site-s1.crt`. The site works through the link (`mesh edge up --certs`
runs a job); what the site's certificate must not do across the link is tried from a
client of the leaf and fails; an agent's certificate cannot open a leaf link, nor a
site's a client connection.

Direction: the site user's `publish` is what the site may send into the region and its
`subscribe` what the region delivers to the site. Each negative below has its positive
beside it (the site's own heartbeat reaches the hub; its agent's assignments reach it),
so a swapped direction fails one or the other."""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import subprocess
import sys
import time

import nats.errors
import pytest

from edge.leaf import site_server_config
from mesh import subjects
from mesh.cli.certs import nats_conf
from mesh.connect import ClientTls, close_quietly, connect
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.server import EmbeddedServer, TlsFiles, free_port
from tests.integration.conftest import cli_env, eventually
from tests.integration.test_security import SecureRegion

R = "default"
USER = Identity.user("alice")  # SecureRegion's client
SITE = "s1"
NODE, OTHER = "e1", "e2"  # e1 is the site's node; e2 a datacenter node of the region
MiB = 1024 * 1024
DENIED_WAIT = 0.5
DENIED = (TimeoutError, nats.errors.Error)  # a request that does not cross: no answer
REFUSED = (OSError, TimeoutError, nats.errors.Error)


@pytest.fixture
def certs(tmp_path):
    d = tmp_path / "certs"
    pki.init(d)
    for ident in (Identity.site(SITE), Identity.agent(NODE), Identity.agent(OTHER), USER):
        pki.issue(d, ident)
    return d


@pytest.fixture
def hub(tmp_path, certs):
    conf = nats_conf(
        certs,
        R,
        listen=f"127.0.0.1:{free_port()}",
        store_dir=str(tmp_path / "hub"),
        leafnodes=f"127.0.0.1:{free_port()}",
        sites=[f"{SITE}={NODE}"],
    )
    server = EmbeddedServer(conf.config).start()
    yield server
    server.stop()


@pytest.fixture
async def region(hub, tmp_path, certs):
    r = SecureRegion(hub.url, tmp_path, certs)
    await r.connect_client()
    await r.coordinator("c1")
    yield r
    await r.close()


def tls(certs, ident: Identity) -> ClientTls:
    return ClientTls.for_identity(certs, ident)


def leaf_for(tmp_path, certs, hub, ident: Identity) -> EmbeddedServer:
    """The site's leaf, as `mesh edge up --certs` makes it, presenting `ident`'s
    certificate on its link (the site's, or for the negative an agent's)."""
    t = tls(certs, ident)
    files = TlsFiles(t.ca, t.cert, t.key, verify_and_map=False)
    site_tls = tls(certs, Identity.site(SITE))
    local = TlsFiles(site_tls.ca, site_tls.cert, site_tls.key, verify_and_map=False)
    cfg = site_server_config(
        SITE, [hub.leaf_url], tmp_path / "leaf", leaf_tls=files, tls=local, store_bytes=64 * MiB
    )
    return EmbeddedServer(cfg).start()


async def linked(nc) -> bool:
    try:
        await nc.jetstream(domain=subjects.HUB_DOMAIN, timeout=1.0).account_info()
        return True
    except Exception:
        return False


async def test_mesh_edge_up_secure_runs_a_job(tmp_path, certs, hub, region):
    """`mesh --certs DIR edge up`: the leaf links over TLS as site:s1 and its agent
    (agent:e1, on the leaf's TLS port) runs a job the hub placed, with signed
    assignments verified."""
    port = free_port()
    env = {**cli_env(tmp_path), "PYTHONUNBUFFERED": "1", "MESH_CERTS": str(certs)}
    log_path = tmp_path / "edge.log"
    proc = None
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mesh.cli.main", "edge", "up", "--site", SITE]
                + ["--hub", f"nats-leaf://127.0.0.1:{hub.config.leaf_port}"]
                + ["--port", str(port), "--node-id", NODE],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            await region.ready(1)
            job = await region.client.submit(
                {"name": "secure-edge", "tasks": [{"role": "w", "command": "true"}]}
            )
            assert (await region.client.wait(job, timeout=30))["state"] == "SUCCEEDED"
            text = log_path.read_text()
            assert f"over TLS as site:{SITE}" in text, text
            assert "does not verify" not in text  # assignments.pub was found and used
            proc.send_signal(signal.SIGINT)
            assert proc.wait(15) == 0
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_a_site_may_only_what_crosses_its_link(tmp_path, certs, hub, region):
    """A client of the site's leaf (with any certificate the leaf accepts) reaches the
    region only as site:s1 may: its node's heartbeat crosses, another node's does not;
    it cannot publish another node's assignment or the job log, call the JetStream or
    mesh API as an admin, or receive another node's or another region's subjects."""
    leaf = leaf_for(tmp_path, certs, hub, Identity.site(SITE))
    on_leaf = on_hub = on_hub_agent = None
    try:
        on_leaf = await connect(leaf.url, name="leaf-client", tls=tls(certs, Identity.agent(NODE)))
        assert await eventually(lambda: linked(on_leaf), timeout=15)
        on_hub = await connect(hub.url, name="hub-coord", tls=tls(certs, Identity.coordinator()))
        hub_js = on_hub.jetstream()
        before = {
            s: (await hub_js.stream_info(s)).state.messages
            for s in (subjects.assign_stream(R), subjects.log_stream(R))
        }

        # Heartbeats: the site's node crosses, another node's does not.
        heard: list[str] = []

        async def on_state(msg) -> None:
            heard.append(msg.subject)

        await on_hub.subscribe(subjects.state_all(R), cb=on_state)
        await on_hub.flush()

        async def crossed() -> bool:
            await on_leaf.publish(subjects.state(R, OTHER), b"{}")
            await on_leaf.publish(subjects.state(R, NODE), b"{}")
            return subjects.state(R, NODE) in heard

        assert await eventually(crossed, timeout=10)
        await on_leaf.flush()
        await asyncio.sleep(0.3)
        assert subjects.state(R, OTHER) not in heard

        # Another node's assignment and the job log: not stored at the hub.
        await on_leaf.publish(subjects.assign(R, OTHER), b"run this")
        await on_leaf.publish(subjects.assign(R, NODE), b"nor this: assignments come down")
        await on_leaf.publish(subjects.job_log(R), b"forged")
        leaf_hub_js = on_leaf.jetstream(domain=subjects.HUB_DOMAIN, timeout=DENIED_WAIT)
        with pytest.raises(DENIED):
            await leaf_hub_js.publish(subjects.job_log(R), b"forged", stream=subjects.log_stream(R))
        # Admin JetStream calls and the mesh API.
        with pytest.raises(DENIED):
            await leaf_hub_js.delete_stream(subjects.assign_stream(R))
        with pytest.raises(DENIED):
            await leaf_hub_js.add_consumer(subjects.assign_stream(R), durable_name="agent_e2")
        with pytest.raises(DENIED):
            await on_leaf.request(subjects.api(R, "job.list"), b"{}", timeout=DENIED_WAIT)
        await asyncio.sleep(0.3)
        for s, n in before.items():
            assert (await hub_js.stream_info(s)).state.messages == n, s
        assert subjects.agent_consumer(OTHER) not in [
            c.name for c in await hub_js.consumers_info(subjects.assign_stream(R))
        ]

        # Subscribing: another node's assignments, another region's subjects and another
        # node's heartbeats do not come down the link.
        got: list[str] = []

        async def on_msg(msg) -> None:
            got.append(msg.subject)

        for s in (subjects.assign(R, OTHER), "mesh.us.api.job.submit", subjects.state_all(R)):
            await on_leaf.subscribe(s, cb=on_msg)
        await on_leaf.flush()
        on_hub_agent = await connect(hub.url, name="e2", tls=tls(certs, Identity.agent(OTHER)))
        await asyncio.sleep(0.5)  # the leaf's interest has crossed, were it allowed
        for _ in range(3):
            await on_hub.publish(subjects.assign(R, OTHER), b"secret")
            await on_hub.publish("mesh.us.api.job.submit", b"{}")
            await on_hub_agent.publish(subjects.state(R, OTHER), b"{}")
        await on_hub.flush()
        await on_hub_agent.flush()
        await asyncio.sleep(0.5)
        assert got == []
        assert "Violation" not in hub.log_tail(20000)  # the leaf obeyed: nothing was cut
    finally:
        for nc in (on_leaf, on_hub, on_hub_agent):
            if nc is not None:
                await close_quietly(nc)
        leaf.stop()


async def test_only_a_site_certificate_opens_a_leaf_link(tmp_path, certs, hub):
    """An agent's certificate (of the same CA) is refused on the leafnodes port, and a
    site's on the client port."""
    leaf = leaf_for(tmp_path, certs, hub, Identity.agent(NODE))
    nc = None
    try:
        nc = await connect(leaf.url, name="leaf-client", tls=tls(certs, Identity.agent(NODE)))
        await asyncio.sleep(2.0)  # a few redials (every 250 ms)
        assert not await linked(nc)
        assert "Leafnode connection closed: Authentication Failure" in hub.log_tail(20000)
    finally:
        if nc is not None:
            await close_quietly(nc)
        leaf.stop()
    with pytest.raises(REFUSED):
        await connect(
            hub.url, name="site-as-client", tls=tls(certs, Identity.site(SITE)), reconnect=False
        )


class RogueLeaf:
    """A hand-made leaf connection with the site's certificate, speaking the leafnode
    protocol itself: a real leaf obeys the permissions the hub sends it (so nothing
    forbidden ever leaves it), and this one does not, to show the hub's own check."""

    def __init__(self, certs, hub: EmbeddedServer) -> None:
        t = tls(certs, Identity.site(SITE))
        ctx = ssl.create_default_context(cafile=t.ca)
        ctx.load_cert_chain(t.cert, t.key)
        raw = socket.create_connection(("127.0.0.1", hub.config.leaf_port), timeout=5)
        assert raw.recv(65536).startswith(b"INFO")  # before TLS: the hub's first INFO
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.send(b'CONNECT {"tls_required":true,"name":"rogue","headers":true}\r\n')

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def alive(self) -> bool:
        """PING answered with PONG (skipping what else the hub sent)."""
        self.send(b"PING\r\n")
        got = b""
        deadline = time.monotonic() + 3
        while b"PONG" not in got and time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return False
            if not chunk:
                return False
            got += chunk
        return b"PONG" in got

    def close(self) -> None:
        self.sock.close()


ADMIN = "STREAM.DELETE.MESH_ASSIGN_default"


@pytest.mark.parametrize(
    ("frame", "violation"),
    [
        # another node's assignment, the job log
        (
            b"LMSG mesh.default.assign.e2 3\r\nrun\r\n",
            'Publish Violation on "mesh.default.assign.e2"',
        ),
        (b"LMSG mesh.default.log 1\r\nx\r\n", 'Publish Violation on "mesh.default.log"'),
        # an admin call through the hub's domain (logged as the hub maps it)
        (
            f"LMSG $JS.hub.API.{ADMIN} _INBOX.site.s1.x 2\r\n{{}}\r\n".encode(),
            f'Publish Violation on "$JS.API.{ADMIN}"',
        ),
        # another region's subjects, another node's assignments
        (b"LS+ mesh.us.state.n1\r\n", 'Subscription Violation on "mesh.us.state.n1"'),
        (b"LS+ mesh.default.assign.e2\r\n", 'Subscription Violation on "mesh.default.assign.e2"'),
    ],
)
async def test_the_hub_cuts_a_leaf_that_oversteps(certs, hub, frame, violation):
    """What a well-behaved leaf never sends (test above), the hub refuses itself: the
    site's own heartbeat and hub probe are accepted, then the forbidden frame closes
    the link with nats-server's permission violation."""
    rogue = await asyncio.to_thread(RogueLeaf, certs, hub)
    try:
        rogue.send(b"LMSG mesh.default.state.e1 2\r\n{}\r\n")
        rogue.send(b"LMSG $JS.hub.API.INFO _INBOX.site.s1.x 2\r\n{}\r\n")
        assert await asyncio.to_thread(rogue.alive)
        rogue.send(frame)
        assert not await asyncio.to_thread(rogue.alive)
        assert violation in hub.log_tail(20000)
    finally:
        rogue.close()


def test_mesh_up_hub_accepts_sites(tmp_path):
    """`mesh up --leafnodes PORT --site-nodes S=...`: the same leafnodes block and site
    user as nats-conf's, the site's certificate made with the others."""
    from mesh.cli.launcher import LocalMesh, LocalMeshConfig

    mesh = LocalMesh(
        LocalMeshConfig(
            state_dir=tmp_path / "up", real_agent=False, leaf_port=0, site_nodes=("s3=e3",)
        )
    )
    (cfg,) = mesh._server_configs()
    text = cfg.render()
    leaf = text.split("leafnodes {")[1].split("\n}")[0]
    assert "verify_and_map: true" in leaf and 'domain: "hub"' in text
    site = next(line for line in text.splitlines() if '"CN=site:s3"' in line)
    assert '"mesh.default.state.e3"' in site and '["LEAFNODE"]' in site
    assert (mesh.certs_dir / "site-s3.crt").exists()


def test_mesh_edge_up_without_the_sites_certificate_is_a_usage_error(tmp_path, capsys):
    """A secure site whose directory lacks site-S.crt stops at once, saying which file
    and how to make it; nothing is started."""
    from mesh.cli.main import main

    d = tmp_path / "certs"
    pki.init(d)
    argv = ["--certs", str(d), "edge", "up", "--site", "s9", "--hub", "nats-leaf://h:7422"]
    assert main([*argv, "--node-id", "e9"]) == 2
    err = capsys.readouterr().err
    assert "site-s9.crt is missing" in err and "mesh certs issue" in err
