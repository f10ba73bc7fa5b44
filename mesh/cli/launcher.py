"""`mesh up` and `mesh demo`: a whole region on one machine, as real processes.

An embedded nats-server, coordinator candidates, one real agent for this machine and
optionally a process of hollow nodes, each a child process started the way an
operator would start it (`mesh coordinator`, `mesh agent`). `stop()` ends them all,
children first, and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.service import default_node_id
from mesh.client import MeshClient
from mesh.connect import close_quietly, connect
from mesh.server import EmbeddedServer, ServerConfig


@dataclass
class LocalMeshConfig:
    state_dir: Path
    region: str = "default"
    candidates: int = 2
    real_agent: bool = True
    sim_nodes: int = 0
    port: int = 0
    lease_ttl: float = 2.0
    log_level: str = "warning"
    extra_env: dict[str, str] = field(default_factory=dict)


class LocalMesh:
    def __init__(self, config: LocalMeshConfig) -> None:
        self.config = config
        self.server: EmbeddedServer | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.node_id = default_node_id()

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        logs = self.config.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "mesh.cli.main",
            "--nats",
            self.url,
            "--region",
            self.config.region,
            "--log-level",
            self.config.log_level,
            *args,
        ]
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.config.extra_env},
            )
        self.children[name] = proc
        return proc

    def start(self) -> None:
        c = self.config
        c.state_dir.mkdir(parents=True, exist_ok=True)
        self.server = EmbeddedServer(ServerConfig(port=c.port, store_dir=str(c.state_dir / "nats")))
        self.server.start()
        for i in range(1, c.candidates + 1):
            self.start_coordinator(f"coordinator-{i}")
        if c.real_agent:
            self._spawn(
                "agent",
                [
                    "agent",
                    "--node-id",
                    self.node_id,
                    "--data-dir",
                    str(c.state_dir / "agent"),
                    "--kill-tasks-on-exit",
                ],
            )
        if c.sim_nodes:
            self._spawn("hollow", ["agent", "--simulate", str(c.sim_nodes)])

    def start_coordinator(self, name: str) -> subprocess.Popen[bytes]:
        return self._spawn(
            name, ["coordinator", "--id", name, "--lease-ttl", str(self.config.lease_ttl)]
        )

    async def wait_ready(self, timeout: float = 30.0) -> dict:
        """Until a leader answers and every expected node reports ready."""
        want = (1 if self.config.real_agent else 0) + self.config.sim_nodes
        nc = await connect(self.url, name="mesh-up")
        client = MeshClient(nc, self.config.region, timeout=2.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                self.check_children()
                try:
                    info = await client.cluster_info()
                    if info.get("leader") and info["nodes"].get("ready", 0) >= want:
                        return info
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"mesh not ready after {timeout}s; logs in {self.config.state_dir / 'logs'}"
                    )
                await asyncio.sleep(0.1)
        finally:
            await close_quietly(nc)

    def check_children(self) -> None:
        for name, proc in self.children.items():
            if proc.poll() is not None:
                log = self.config.state_dir / "logs" / f"{name}.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self, timeout: float = 10.0) -> None:
        # Agents first (they stop their tasks), then coordinators, then the server.
        order = sorted(self.children, key=lambda n: (not n.startswith(("agent", "hollow")), n))
        for name in order:
            proc = self.children[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in order:
            proc = self.children[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.children.clear()
        if self.server is not None:
            self.server.stop()
