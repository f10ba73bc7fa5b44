"""Trust on real nats-server processes: TLS with verified client certificates, and
per-identity permissions. The negatives are the point: what an identity must not do
is tried, and must fail at the server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import ConsumerConfig

from agent.hollow import HollowFleet
from agent.service import Agent, AgentConfig
from mesh import subjects
from mesh.cli.certs import fleet_node_ids
from mesh.client import MeshClient
from mesh.connect import ClientTls, close_quietly, connect
from mesh.refusals import AuthorizationRefused
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.security.permissions import server_users
from mesh.server import EmbeddedServer, ServerConfig, TlsFiles
from tests.integration.conftest import Region, eventually, run_mesh

R = "default"
AGENT_A, AGENT_B = Identity.agent("node-a"), Identity.agent("node-b")
USER = Identity.user("alice")
FLEET = Identity.fleet("sim")
DENIED_WAIT = 0.5  # a denied request is dropped: it can only time out
DENIED = (TimeoutError, nats.errors.Error)  # nats-py's timeouts are both
REFUSED = (OSError, TimeoutError, nats.errors.Error)  # handshake, auth or no server


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki") / "certs"
    pki.init(d)
    for ident in (AGENT_A, AGENT_B, USER, FLEET):
        pki.issue(d, ident)
    return d


@pytest.fixture
def secure_server(tmp_path, certs):
    ca, cert, key = pki.server_files(certs)
    users = server_users(R, pki.identities(certs), fleets={"sim": fleet_node_ids("sim", 2)})
    server = EmbeddedServer(
        ServerConfig(
            store_dir=str(tmp_path / "nats"),
            tls=TlsFiles(str(ca), str(cert), str(key)),
            users=users,
        )
    )
    server.start()
    yield server
    server.stop()


class SecureRegion(Region):
    """The region fixture's components, each with its own identity's certificate."""

    def __init__(self, url: str, tmp: Path, certs: Path) -> None:
        super().__init__(url, tmp)
        self.certs = certs

    def tls(self, ident: Identity) -> ClientTls:
        return ClientTls.for_identity(self.certs, ident)

    async def coordinator(self, cid: str = "c1", **kw):
        kw.setdefault("connect_options", {"tls": self.tls(Identity.coordinator())})
        kw.setdefault("signing_key", str(pki.signing_key_path(self.certs)))
        return await super().coordinator(cid, **kw)

    async def agent(self, node_id: str = "node-a", **kw) -> Agent:
        a = Agent(
            AgentConfig(
                self.url,
                node_id=node_id,
                data_dir=str(self.tmp / f"agent-{node_id}"),
                tls=self.tls(Identity.agent(node_id)),
                verify_key=str(pki.verify_key_path(self.certs)),
                allow_root=os.geteuid() == 0,  # tests may run as root in containers
                **kw,
            )
        )
        await a.start()
        self.agents.append(a)
        return a

    async def fleet(self, count: int = 2, **kw) -> HollowFleet:
        f = HollowFleet(
            self.url,
            count=count,
            prefix="sim",
            tls=self.tls(FLEET),
            verify_key=str(pki.verify_key_path(self.certs)),
            **kw,
        )
        await f.start()
        self.fleets.append(f)
        return f

    async def connect_client(self) -> MeshClient:
        self.nc = await connect(self.url, name="alice", tls=self.tls(USER))
        self.client = MeshClient(self.nc)
        return self.client


@pytest.fixture
async def secure_region(secure_server, tmp_path, certs):
    r = SecureRegion(secure_server.url, tmp_path, certs)
    await r.connect_client()
    yield r
    await r.close()


async def as_identity(server, certs, ident: Identity, errors: list[str]):
    async def on_error(exc):
        errors.append(str(exc))

    return await connect(
        server.url, name=str(ident), tls=ClientTls.for_identity(certs, ident), error_cb=on_error
    )


async def denied(errors: list[str], what: str) -> None:
    await eventually(lambda: any("permissions violation" in e.lower() for e in errors), 5.0)
    errors.clear()


# ---------------------------------------------------------------- authentication


async def test_no_client_certificate_is_refused(secure_server, certs):
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))  # trusts the server, no cert
    with pytest.raises(REFUSED):
        await connect(secure_server.url, name="anon", tls=ctx, reconnect=False)
    # The server names the cause, unless the refused client hung up first (a race seen
    # once in CI): then the handshake's failure is what it logs.
    log = secure_server.log_tail(20000)
    assert "didn't provide a certificate" in log or "TLS handshake error" in log, log
    plain = secure_server.url.replace("tls://", "nats://")
    with pytest.raises(REFUSED):
        await connect(plain, name="plain", reconnect=False)


async def test_certificate_from_another_ca_is_refused(secure_server, certs, tmp_path):
    other = tmp_path / "other"
    pki.init(other)
    pki.issue(other, AGENT_A)  # the same name, the wrong CA
    forged = ClientTls(
        str(certs / "ca.crt"), str(AGENT_A.cert_path(other)), str(AGENT_A.key_path(other))
    )
    with pytest.raises(REFUSED):
        await connect(secure_server.url, name="forged", tls=forged, reconnect=False)

    # The server names the cause, once it has written its line (the client may see the
    # refusal first); on a loaded machine the client may hang up before the server's
    # verify runs, and the server then logs the handshake's end instead (seen in CI).
    def logged() -> bool:
        log = secure_server.log_tail(20000)
        return "certificate signed by unknown authority" in log or "TLS handshake error" in log

    await eventually(logged, timeout=5)


async def test_a_certificate_with_no_user_is_refused(secure_server, certs):
    pki.issue(certs, Identity.agent("late"))  # signed by the CA, not in the server's users
    try:
        with pytest.raises(AuthorizationRefused, match="no user for agent:late"):
            await connect(
                secure_server.url,
                name="late",
                tls=ClientTls.for_identity(certs, Identity.agent("late")),
                reconnect=False,
            )
    finally:
        for f in (Identity.agent("late").cert_path(certs), Identity.agent("late").key_path(certs)):
            f.unlink()


# ---------------------------------------------------------------- authorization


async def test_an_agent_speaks_only_for_itself(secure_region, secure_server, certs):
    r = secure_region
    coord = await r.coordinator()
    errors: list[str] = []
    nc = await as_identity(secure_server, certs, AGENT_A, errors)
    seen: list[str] = []

    async def spy_cb(msg) -> None:
        seen.append(msg.subject)

    spy = await coord.nc.subscribe(subjects.state_all(R), cb=spy_cb)
    await coord.nc.flush()  # the server has the subscription before anything is sent
    try:
        # Another node's state: refused by the server, never delivered.
        await nc.publish(subjects.state(R, "node-b"), b"forged")
        await nc.flush()
        await denied(errors, "state of B")
        await nc.publish(subjects.state(R, "node-a"), b"own")  # its own: delivered
        await nc.flush()
        await eventually(lambda: subjects.state(R, "node-a") in seen)
        assert subjects.state(R, "node-b") not in seen

        js = nc.jetstream(timeout=DENIED_WAIT)
        # Another node's task events.
        with pytest.raises(DENIED):
            await js.publish(subjects.events(R, "node-b"), b"forged")
        await denied(errors, "events of B")
        info = await coord.js.stream_info(subjects.events_stream(R))
        assert info.state.messages == 0

        # Another node's assignments: no plain subscription, no consumer of B's,
        # no consumer of its own name filtered on B's subject, no reply sniffing.
        await nc.subscribe(subjects.assign(R, "node-b"))
        await denied(errors, "subscribe to B's assignments")
        await nc.subscribe("_INBOX.>")
        await denied(errors, "everyone's replies")
        with pytest.raises(DENIED):
            await js.pull_subscribe(
                subjects.assign(R, "node-b"),
                durable=subjects.agent_consumer("node-b"),
                stream=subjects.assign_stream(R),
            )
        await denied(errors, "B's consumer")
        with pytest.raises(DENIED):
            await js.add_consumer(
                subjects.assign_stream(R),
                ConsumerConfig(
                    name=subjects.agent_consumer("node-a"),
                    durable_name=subjects.agent_consumer("node-a"),
                    filter_subject=subjects.assign(R, "node-b"),
                ),
            )
        await denied(errors, "own consumer name, B's filter")
        # The create subject without a filter token would let the body name any filter.
        body = json.dumps(
            {
                "stream_name": subjects.assign_stream(R),
                "config": {
                    "name": subjects.agent_consumer("node-a"),
                    "durable_name": subjects.agent_consumer("node-a"),
                    "filter_subject": subjects.assign(R, "node-b"),
                    "ack_policy": "explicit",
                },
            }
        ).encode()
        stream = subjects.assign_stream(R)
        with pytest.raises(DENIED):
            await nc.request(
                f"$JS.API.CONSUMER.CREATE.{stream}.{subjects.agent_consumer('node-a')}",
                body,
                timeout=DENIED_WAIT,
            )
        await denied(errors, "create with the filter only in the body")
        consumers = [c.name for c in await coord.js.consumers_info(stream)]
        assert consumers == []

        # The write API, and the leader's.
        for endpoint in ("job.submit", "pool.apply", "job.kill"):
            with pytest.raises(DENIED):
                await nc.request(subjects.api(R, endpoint), b"{}", timeout=DENIED_WAIT)
            await denied(errors, endpoint)
        with pytest.raises(DENIED):
            await nc.request(subjects.leader_api(R, "job.submit"), b"{}", timeout=DENIED_WAIT)
        await denied(errors, "leader api")
        # Nor may it touch the lease.
        with pytest.raises(DENIED):
            await js.key_value(subjects.lease_bucket(R))
        await denied(errors, "lease bucket")
    finally:
        await spy.unsubscribe()
        await close_quietly(nc)


async def test_a_user_may_only_call_the_api(secure_region, secure_server, certs):
    r = secure_region
    await r.coordinator()
    info = await eventually(r.client.cluster_info)
    assert info["ok"]
    errors: list[str] = []
    nc = await as_identity(secure_server, certs, USER, errors)
    try:
        await nc.publish(subjects.state(R, "node-a"), b"forged")
        await nc.flush()
        await denied(errors, "a user publishing node state")
        with pytest.raises(DENIED):
            await nc.jetstream(timeout=DENIED_WAIT).stream_info(subjects.assign_stream(R))
        await denied(errors, "a user reading streams")
    finally:
        await close_quietly(nc)


async def test_a_job_runs_end_to_end_over_tls(secure_region, secure_server):
    """Coordinator, a real agent and a hollow fleet, each with its own certificate and
    no more permission than it is given: jobs succeed, and the server refused nothing."""
    r = secure_region
    await r.coordinator()
    await r.agent("node-a")
    await r.fleet(2)
    await r.ready(3)
    real = await r.client.submit(
        "name: hello\ntasks:\n  - role: main\n    command: echo hello over tls\n"
        "    resources: {cpu: 100m, memory: 16Mi}\n"
    )
    sim = await r.client.submit(
        "name: sim\ntasks:\n  - role: t\n    count: 2\n    simulate: {duration: 0.1s}\n"
        "    resources: {cpu: 2}\n"
    )
    for job_id in (real, sim):
        job = await r.client.wait(job_id, timeout=20.0, poll=0.05)
        assert job["state"] == "SUCCEEDED", job
    assert "Violation" not in secure_server.log_tail(200_000)


# ---------------------------------------------------------------- `mesh up`


def _up(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    for var in ("MESH_NATS_URL", "MESH_CERTS", "MESH_INSECURE", "MESH_USER"):
        env.pop(var, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mesh.cli.main", "up", "--port", "0", "--no-agent", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("mesh is up"):
        proc.kill()
        raise AssertionError(line + proc.stdout.read())
    return proc, env


def _down(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


SIM_JOB = """
name: sim
tasks:
  - role: t
    simulate: {duration: 0.1s}
    resources: {cpu: 1}
"""


def test_mesh_up_is_secure_by_default(tmp_path):
    t0 = time.monotonic()
    proc, env = _up(tmp_path, "--sim-nodes", "1", "--candidates", "1")
    try:
        ctx = json.loads((tmp_path / "home" / "context.json").read_text())
        assert ctx["url"].startswith("tls://") and ctx["certs"]
        spec = tmp_path / "job.yaml"
        spec.write_text(SIM_JOB)
        done = run_mesh("job", "run", str(spec), "--wait", "--timeout", "20", env=env, timeout=30.0)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCEEDED" in done.stdout
        # Without the context's certificates the same mesh refuses the CLI, which says
        # where certificates are given.
        refused = run_mesh("--insecure", "node", "list", env=env, timeout=30.0)
        assert refused.returncode == 2, refused.stderr
        assert "--certs DIR" in refused.stderr
        assert time.monotonic() - t0 < 30
    finally:
        _down(proc)
    assert proc.returncode == 0


def test_mesh_up_insecure_nats_cluster_of_three(tmp_path):
    proc, env = _up(
        tmp_path, "--insecure", "--nats-cluster", "3", "--sim-nodes", "1", "--candidates", "1"
    )
    try:
        ctx = json.loads((tmp_path / "home" / "context.json").read_text())
        urls = ctx["url"].split(",")
        assert len(urls) == 3 and all(u.startswith("nats://") for u in urls)
        assert "certs" not in ctx
        spec = tmp_path / "job.yaml"
        spec.write_text(SIM_JOB)
        done = run_mesh("job", "run", str(spec), "--wait", "--timeout", "30", env=env, timeout=30.0)
        assert done.returncode == 0, done.stdout + done.stderr
        info = json.loads(run_mesh("--json", "cluster", "info", env=env, timeout=30.0).stdout)
        assert info["leader"]

        async def replicas() -> int:
            nc = await connect(urls, name="check")
            try:
                si = await nc.jetstream().stream_info(subjects.assign_stream(R))
                return si.config.num_replicas
            finally:
                await close_quietly(nc)

        assert asyncio.run(replicas()) == 3
    finally:
        _down(proc)
    assert proc.returncode == 0


async def test_a_user_discovers_the_api_service(secure_region, secure_server, certs):
    """`$SRV.PING/INFO/STATS` (NATS micro discovery, `nats micro ls`) answer a user
    identity in the secure default; the rest of `$SRV` stays closed to it."""
    r = secure_region
    await r.coordinator()
    await eventually(r.client.cluster_info)
    errors: list[str] = []
    nc = await as_identity(secure_server, certs, USER, errors)
    try:
        ping = json.loads((await nc.request("$SRV.PING", b"", timeout=5)).data)
        assert ping["type"] == "io.nats.micro.v1.ping_response" and ping["name"] == "mesh"
        sid = ping["id"]
        info = json.loads((await nc.request("$SRV.INFO.mesh", b"", timeout=5)).data)
        assert info["type"] == "io.nats.micro.v1.info_response" and info["id"] == sid
        assert subjects.api(R, "job.submit") in {e["subject"] for e in info["endpoints"]}
        stats = json.loads((await nc.request(f"$SRV.STATS.mesh.{sid}", b"", timeout=5)).data)
        assert stats["type"] == "io.nats.micro.v1.stats_response" and stats["id"] == sid
        assert errors == []
        await nc.publish("$SRV.OTHER", b"")
        await nc.flush()
        await denied(errors, "a user publishing elsewhere under $SRV")
    finally:
        await close_quietly(nc)
