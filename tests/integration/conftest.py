"""A region on real processes: a nats-server child process, and coordinators and
agents either in this process (fast) or as `mesh` child processes (for crash tests)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.hollow import HollowFleet
from agent.service import Agent, AgentConfig
from coordinator.service import Coordinator, CoordinatorConfig
from mesh.client import MeshClient
from mesh.connect import close_quietly, connect
from mesh.server import EmbeddedServer, ServerConfig, supercluster


async def eventually(pred, timeout=15.0, interval=0.05):
    """Poll an (async or plain) predicate until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def run_mesh(
    *args: str, env: dict, timeout: float = 60.0, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """The `mesh` CLI as a user runs it, in a child process; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "mesh.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment a `mesh` CLI child runs in: no MESH_* settings of whoever runs
    the suite, a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_")}
    env["MESH_HOME"] = str(tmp_path / "home")
    return env


async def leader_is(client: MeshClient, cid: str) -> bool:
    """Whether candidate `cid` leads now (False while no one answers)."""
    try:
        return (await client.cluster_info())["leader"] == cid
    except Exception:
        return False


class Region:
    """Components started in-process against one real nats-server."""

    def __init__(self, url: str, tmp: Path, name: str = "default") -> None:
        self.url = url
        self.tmp = tmp
        self.name = name
        self.coordinators: list[Coordinator] = []
        self.agents: list[Agent] = []
        self.fleets: list[HollowFleet] = []
        self.nc = None
        self.client: MeshClient | None = None

    async def coordinator(self, cid: str = "c1", **kw) -> Coordinator:
        kw.setdefault("region", self.name)
        c = Coordinator(CoordinatorConfig(self.url, candidate_id=cid, **kw))
        await c.start()
        self.coordinators.append(c)
        return c

    async def agent(self, node_id: str = "node-1", **kw) -> Agent:
        # These tests run as whoever runs the suite (root in CI containers): say so, as an
        # operator would, or a root agent refuses to run tasks as root.
        kw.setdefault("allow_root", os.geteuid() == 0)
        kw.setdefault("data_dir", str(self.tmp / f"agent-{node_id}"))
        kw.setdefault("region", self.name)
        a = Agent(AgentConfig(self.url, node_id=node_id, **kw))
        await a.start()
        self.agents.append(a)
        return a

    async def fleet(self, count: int = 3, **kw) -> HollowFleet:
        kw.setdefault("region", self.name)
        f = HollowFleet(self.url, count=count, **kw)
        await f.start()
        self.fleets.append(f)
        return f

    async def connect_client(self) -> MeshClient:
        self.nc = await connect(self.url, name="test-client")
        self.client = MeshClient(self.nc, region=self.name)
        return self.client

    async def ready(self, nodes: int) -> dict:
        async def check():
            info = await self.client.cluster_info()
            return info if info["leader"] and info["nodes"].get("ready", 0) >= nodes else None

        return await eventually(check)

    async def close(self) -> None:
        for f in self.fleets:
            await f.stop()
        for a in self.agents:
            await a.stop(kill_tasks=True)
        for c in self.coordinators:
            await c.stop()
        if self.nc is not None:
            await close_quietly(self.nc)


class SpareSuperclusters:
    """Superclusters started ahead of the test that takes one. A fresh supercluster's
    JetStream spends ~10 s electing its meta leader (nats-server's Raft election timer,
    not configurable), idle time: once a set of region names has been asked for, a
    fresh spare of the same names is started at once, so the next test that asks for
    them finds its election over. Each test still gets servers nobody else used."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spares: dict[tuple[str, ...], dict[str, EmbeddedServer]] = {}
        self.count = 0

    def _start(self, names: tuple[str, ...]) -> dict[str, EmbeddedServer]:
        self.count += 1
        servers = supercluster(list(names), self.root / f"supercluster-{self.count}")
        try:
            for s in servers.values():
                s.start()
        except Exception:
            for s in servers.values():
                s.stop()
            raise
        return servers

    def take(self, names: tuple[str, ...]) -> dict[str, EmbeddedServer]:
        """A started supercluster of `names` (the spare if there is one), and a new spare."""
        servers = self.spares.pop(names, None) or self._start(names)
        if any(s.proc is None or s.proc.poll() is not None for s in servers.values()):
            for s in servers.values():  # a spare that died meanwhile: start another
                s.stop()
            servers = self._start(names)
        self.spares[names] = self._start(names)
        return servers

    def close(self) -> None:
        for servers in self.spares.values():
            for s in servers.values():
                s.stop()
        self.spares.clear()


@pytest.fixture(scope="session")
def spare_superclusters(tmp_path_factory):
    pool = SpareSuperclusters(tmp_path_factory.mktemp("superclusters"))
    yield pool
    pool.close()


@pytest.fixture
async def regions(tmp_path, spare_superclusters):
    """A local supercluster (mesh.server.supercluster): `await regions("a", "b", "c")`
    starts one nats-server per region joined by gateways and returns {name: Region},
    each with its client connected to its own server. `Region.server` is that region's
    EmbeddedServer (kill it to lose the region). `configs=` starts those server configs
    instead (mesh.server.supercluster_configs changed first, e.g. a link through a proxy,
    tests/integration/tcpproxy.py), one region per config. Without `configs` the
    servers come started ahead (SpareSuperclusters), their store dirs outside tmp_path."""
    started: list[tuple[dict, dict]] = []

    async def start(*names: str, configs: dict[str, ServerConfig] | None = None):
        if configs is None:
            servers = await asyncio.to_thread(spare_superclusters.take, tuple(names))
        else:
            servers = {name: EmbeddedServer(c) for name, c in configs.items()}
            await asyncio.gather(*(s.astart() for s in servers.values()))
        out = {}
        for name, server in servers.items():
            r = Region(server.url, tmp_path / name, name)
            r.server = server
            await r.connect_client()
            out[name] = r
        started.append((servers, out))

        async def jetstream_ready(r: Region) -> bool:  # the supercluster's meta leader
            try:
                await r.nc.jetstream().account_info()
                return True
            except Exception:
                return False

        for r in out.values():
            await eventually(lambda r=r: jetstream_ready(r), timeout=30)
        return out

    yield start
    for servers, out in started:
        for r in out.values():
            await r.close()
        for s in servers.values():
            s.stop()


@pytest.fixture
async def region(nats_server, tmp_path):
    r = Region(nats_server.url, tmp_path)
    await r.connect_client()
    yield r
    await r.close()


class Proc:
    """A `mesh` command as a child process in its own session (as an operator runs it)."""

    def __init__(self, url: str, args: list[str], log: Path) -> None:
        self.args = args
        self.url = url
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mesh.cli.main",
                    "--nats",
                    self.url,
                    "--log-level",
                    "info",
                    *self.args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return self

    def kill9(self) -> None:
        """SIGKILL the process alone: its task processes live in their own sessions."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def procs(tmp_path):
    started: list[Proc] = []

    def spawn(url: str, *args: str, name: str = "proc") -> Proc:
        p = Proc(url, list(args), tmp_path / f"{name}.log").start()
        started.append(p)
        return p

    yield spawn
    for p in started:
        p.stop()
