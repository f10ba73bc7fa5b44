"""A node joins a secure region the way docs/install.md says, on real processes:

- `mesh certs nats-conf ... -o FILE --reload` adds a new agent identity to a running
  nats-server (refused before, accepted after) without a restart and without dropping
  connections, also with a second server on the host (where a bare
  `nats-server --signal reload` cannot tell which to signal);
- the command line of the unit `mesh agent install` wrote, run with the environment
  file it wrote, is a working agent: it becomes ready in the region and runs a job.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import nats.errors
import pytest

from coordinator.service import Coordinator, CoordinatorConfig
from mesh.cli.unit import SYSTEMD_PATH, parse_env, parse_exec_start
from mesh.client import MeshClient
from mesh.connect import ClientTls, close_quietly, connect
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.server import find_server_binary, free_port
from tests.integration.conftest import eventually, run_mesh

REGION = "eu"
REFUSED = (OSError, TimeoutError, nats.errors.Error)


class ConfServer:
    """A nats-server run from a config file `mesh certs nats-conf -o` wrote, as an
    operator runs it (`nats-server -c FILE`)."""

    def __init__(self, tmp: Path, certs: Path, name: str, env: dict) -> None:
        self.port = free_port()
        self.conf = tmp / f"{name}.conf"
        self.store = tmp / f"{name}-js"
        self.pid_file = self.store / "nats-server.pid"
        self.log = tmp / f"{name}.log"
        self.certs, self.env = certs, env
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def nats_conf(self, *more: str) -> subprocess.CompletedProcess:
        argv = ["certs", "nats-conf", str(self.certs), "--region", REGION]
        argv += ["--listen", f"127.0.0.1:{self.port}", "--store-dir", str(self.store)]
        return run_mesh(*argv, "-o", str(self.conf), *more, env=self.env)

    def start(self) -> ConfServer:
        r = self.nats_conf()
        assert r.returncode == 0, r.stderr
        self.store.mkdir(exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [find_server_binary(), "-c", str(self.conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    if s.recv(16).startswith(b"INFO") and self.pid_file.exists():
                        return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nats-server not ready: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def certs(tmp_path):
    d = tmp_path / "certs"
    pki.init(d)
    pki.issue(d, Identity.agent("node-1"))
    return d


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "MESH_HOME": str(tmp_path / "home")}


@pytest.fixture
def servers(tmp_path, certs, env):
    started: list[ConfServer] = []

    def make(name: str) -> ConfServer:
        s = ConfServer(tmp_path, certs, name, env).start()
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


async def as_identity(server: ConfServer, ident: Identity):
    tls = ClientTls.for_identity(server.certs, ident)
    return await connect(server.url, name=str(ident), tls=tls, reconnect=False)


async def refused(server: ConfServer, ident: Identity) -> bool:
    try:
        nc = await as_identity(server, ident)
    except REFUSED:
        return True
    await close_quietly(nc)
    return False


async def test_adding_a_node_is_one_command_and_a_reload(servers, certs, env):
    a = servers("a")
    b = servers("b")  # a second server on this host: the reload must reach `a` only
    new = Identity.agent("node-2")
    admin = await as_identity(a, Identity.user("admin"))
    node1 = await as_identity(a, Identity.agent("node-1"))
    try:
        r = run_mesh("certs", "issue", str(certs), "--agent", "node-2", env=env)
        assert r.returncode == 0, r.stderr
        assert await refused(a, new)  # a certificate from the CA, not yet in the config

        r = a.nats_conf("--reload")
        assert r.returncode == 0, r.stderr
        assert f"reload signalled to nats-server pid {a.proc.pid}" in r.stderr
        assert "agent: node-1, node-2" in r.stderr

        async def accepted():
            return not await refused(a, new)

        await eventually(accepted, 10.0)
        assert await refused(b, new)  # b was not reloaded
        # The connections that were up stayed up: no reconnect, and they still work.
        for nc in (admin, node1):
            await nc.flush(timeout=2)
            assert nc.is_connected and nc.stats["reconnects"] == 0
        assert a.proc.poll() is None and b.proc.poll() is None

        # The documented form reaches `b` by its pid file, with `a` running beside it.
        r = b.nats_conf()
        assert r.returncode == 0, r.stderr
        signal_cmd = [find_server_binary(), "--signal", f"reload={b.pid_file}"]
        done = subprocess.run(signal_cmd, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr

        async def accepted_b():
            return not await refused(b, new)

        await eventually(accepted_b, 10.0)
    finally:
        await close_quietly(admin)
        await close_quietly(node1)


async def test_installed_unit_command_line_runs_a_working_agent(servers, certs, env, tmp_path):
    server = servers("region")
    b = tmp_path / "node-1.tar.gz"
    r = run_mesh("certs", "bundle", str(certs), "--agent", "node-1", "-o", str(b), env=env)
    assert r.returncode == 0, r.stderr
    root = tmp_path / "root"
    install = ["agent", "install", "--nats", server.url, "--region", REGION, "--bundle", str(b)]
    install += ["--root", str(root), "--allow-root", "--label", "site=lab"]
    r = run_mesh(*install, env=env)
    assert r.returncode == 0, r.stderr

    # What systemd would run: ExecStart= with EnvironmentFile= over its bare environment.
    unit = (root / "etc/systemd/system/mesh-agent.service").read_text()
    argv = parse_exec_start(unit)
    env_file = root / "etc/mesh/agent.env"
    assert f"EnvironmentFile={env_file}" in unit
    unit_env = {"PATH": SYSTEMD_PATH, **parse_env(env_file.read_text())}
    log = open(tmp_path / "agent.log", "wb")
    agent = subprocess.Popen(argv, env=unit_env, stdout=log, stderr=subprocess.STDOUT)

    coord = Coordinator(
        CoordinatorConfig(
            server.url,
            region=REGION,
            candidate_id="c1",
            signing_key=str(pki.signing_key_path(certs)),
            connect_options={"tls": ClientTls.for_identity(certs, Identity.coordinator())},
        )
    )
    await coord.start()
    nc = await as_identity(server, Identity.user("admin"))
    try:
        client = MeshClient(nc, REGION)

        async def ready_node():
            nodes = [n for n in await client.nodes() if n["node_id"] == "node-1"]
            return nodes and nodes[0]["status"] == "ready" and nodes[0]

        node = await eventually(ready_node, 30.0)
        assert node["labels"].get("site") == "lab"
        job = await client.submit(
            {
                "name": "installed",
                "tasks": [
                    {
                        "role": "main",
                        "command": ["sh", "-c", "echo hi"],
                        "resources": {"cpu": "100m"},
                    }
                ],
            }
        )
        done = await client.wait(job, timeout=60)
        assert done["state"] == "SUCCEEDED", (done, (tmp_path / "agent.log").read_text())
        assert (root / "var/lib/mesh/agent/agent.db").exists()  # the installed data dir
    finally:
        await close_quietly(nc)
        await coord.stop()
        agent.send_signal(signal.SIGTERM)  # what `systemctl stop` sends (KillMode=process)
        try:
            code = await asyncio.to_thread(agent.wait, 15)
        finally:
            if agent.poll() is None:
                agent.kill()
            log.close()
    assert code == 0, (tmp_path / "agent.log").read_text()
    assert sys.executable == argv[0]
