"""The edge bench's footprint of one real site: `mesh edge up` (its agent and site link
in one process, its leaf nats-server a child of it), its remote through a TCP proxy,
and 3 hollow site nodes on its leaf (a 4-node site, as the bench's sites are).

RSS: the `mesh edge up` process and every descendant (the leaf nats-server), summed,
sampled over the idle window (its maximum is reported), and the leaf's apart. Idle
uplink: the proxy's bytes site -> hub (the target's direction) and both ways, over the
idle window, per node of the site (4). Where `mesh edge up` is not there yet, the
figures are null and `not_run` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import psutil

from agent.hollow import GiB, HollowFleet, Inventory
from bench._util import spawn, stop_process
from mesh.server import free_port
from tests.integration.tcpproxy import TcpProxy

SITE = "fp"
NODE = "fp-n1"
HOLLOW = 3  # site nodes beside the real agent, on its leaf


def edge_up_available() -> bool:
    """Whether the CLI has `mesh edge up` (mesh/cli/edge.py, written in parallel)."""
    return Path(__file__).resolve().parents[1].joinpath("mesh", "cli", "edge.py").exists()


def tree_rss(pid: int) -> tuple[int, int]:
    """(the process and its descendants, the descendants alone: the leaf), RSS bytes."""
    try:
        p = psutil.Process(pid)
        children = p.children(recursive=True)
    except psutil.Error:
        return 0, 0
    own = kids = 0
    with contextlib.suppress(psutil.Error):
        own = p.memory_info().rss
    for q in children:
        with contextlib.suppress(psutil.Error):
            kids += q.memory_info().rss
    return own + kids, kids


async def _all_ready(client, node_ids: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for node_id in node_ids:
        while True:
            with contextlib.suppress(Exception):
                if (await client.node(node_id)).get("status") == "ready":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"site node {node_id} not ready at the hub in {timeout} s")
            await asyncio.sleep(0.5)


async def measure(hub, region: str, client, idle_s: float, state_dir: Path) -> dict:
    if not edge_up_available():
        return {"not_run": "mesh edge up is not in this tree yet (mesh/cli/edge.py)"}
    proxy = await TcpProxy(target_port=hub.config.leaf_port).start()
    home = state_dir / "fp-home"
    leaf_port = free_port()
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
        str(leaf_port),
    ]
    env = {**os.environ, "MESH_HOME": str(home)}
    env.pop("MESH_NATS_URL", None)
    proc = spawn(cmd, state_dir / "edge-up.log", env=env)
    fleet = None
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
        fleet = HollowFleet(
            f"nats://127.0.0.1:{leaf_port}",
            region=region,
            prefix="fp-h",
            inventories=[Inventory(4, 8 * GiB)] * HOLLOW,
            site=SITE,
        )
        await fleet.start()
        await _all_ready(client, sorted(fleet.nodes))
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
        nodes = 1 + HOLLOW
        return {
            "site_rss_mb": round(max(r for r, _ in rss) / 1e6, 1),
            "leaf_rss_mb": round(max(k for _, k in rss) / 1e6, 1),
            "site_processes": procs,
            "idle_s": round(wall, 1),
            "idle_uplink_bytes_per_s": round(both / wall, 1),
            "idle_uplink_up_bytes_per_s": round(up / wall, 1),
            "idle_uplink_up_bytes_per_s_per_node": round(up / wall / nodes, 1),
            "idle_uplink_kbit_s_per_node": round(up * 8 / wall / 1000.0 / nodes, 3),
            "idle_link_both_kbit_s_per_node": round(both * 8 / wall / 1000.0 / nodes, 3),
            "nodes": nodes,
        }
    finally:
        if fleet is not None:
            with contextlib.suppress(Exception):
                await fleet.stop()
        stop_process(proc, timeout=10)
        await proxy.close()
