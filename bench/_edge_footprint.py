"""The edge bench's footprint of one real site: `mesh edge up` (its agent and site link
in one process, its leaf nats-server a child of it), its remote through a TCP proxy.

RSS: the `mesh edge up` process and every descendant (the leaf nats-server), summed,
sampled over the idle window (its maximum is reported). Idle uplink: the proxy's bytes,
both ways, over the idle window, per node of the site (one: this machine's agent).
Where `mesh edge up` is not there yet, the figures are null and `not_run` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import psutil

from bench._util import spawn, stop_process
from mesh.server import free_port
from tests.integration.tcpproxy import TcpProxy

SITE = "fp"
NODE = "fp-n1"


def edge_up_available() -> bool:
    """Whether the CLI has `mesh edge up` (mesh/cli/edge.py, written in parallel)."""
    return Path(__file__).resolve().parents[1].joinpath("mesh", "cli", "edge.py").exists()


def tree_rss(pid: int) -> int:
    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        with contextlib.suppress(psutil.Error):
            total += q.memory_info().rss
    return total


async def measure(hub, region: str, client, idle_s: float, state_dir: Path) -> dict:
    if not edge_up_available():
        return {"not_run": "mesh edge up is not in this tree yet (mesh/cli/edge.py)"}
    proxy = await TcpProxy(target_port=hub.config.leaf_port).start()
    home = state_dir / "fp-home"
    cmd = [
        sys.executable,
        "-m",
        "mesh.cli.main",
        "--region",
        region,
        "--log-level",
        "warning",
        "edge",
        "up",
        "--site",
        SITE,
        "--hub",
        proxy.url,
        "--node-id",
        NODE,
        "--port",
        str(free_port()),
    ]
    env = {**os.environ, "MESH_HOME": str(home)}
    env.pop("MESH_NATS_URL", None)
    proc = spawn(cmd, state_dir / "edge-up.log", env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                tail = (state_dir / "edge-up.log").read_text(errors="replace")[-600:]
                return {"not_run": f"mesh edge up exited {proc.returncode}: {tail}"}
            with contextlib.suppress(Exception):
                node = await client.node(NODE)
                if node.get("status") == "ready":
                    break
            if time.monotonic() > deadline:
                return {"not_run": "the edge site's node was not ready at the hub within 60 s"}
            await asyncio.sleep(0.5)
        await asyncio.sleep(min(3.0, idle_s))  # start-up traffic over
        b0, t0 = proxy.stats.bytes_up + proxy.stats.bytes_down, time.monotonic()
        up0 = proxy.stats.bytes_up
        rss = []
        while time.monotonic() - t0 < idle_s:
            rss.append(tree_rss(proc.pid))
            await asyncio.sleep(min(1.0, idle_s / 4))
        wall = time.monotonic() - t0
        both = proxy.stats.bytes_up + proxy.stats.bytes_down - b0
        up = proxy.stats.bytes_up - up0
        procs = 1 + len(psutil.Process(proc.pid).children(recursive=True))
        return {
            "site_rss_mb": round(max(rss) / 1e6, 1),
            "site_processes": procs,
            "idle_s": round(wall, 1),
            "idle_uplink_bytes_per_s": round(both / wall, 1),
            "idle_uplink_up_bytes_per_s": round(up / wall, 1),
            "idle_uplink_kbit_s_per_node": round(both * 8 / wall / 1000.0, 3),
            "nodes": 1,
        }
    finally:
        stop_process(proc, timeout=10)
        await proxy.close()
