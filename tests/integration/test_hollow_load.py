"""Simulated load on a hollow fleet over a real nats-server and coordinator: a
long-running replica with a diurnal load, beside a batch task, and the node's reported
busy (as `mesh node get` shows it) following the sum of what runs on it."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent.hollow import GiB, Inventory, node_seed
from mesh import subjects
from mesh.codec import decode
from mesh.schema import NodeState
from workloads.load import jitter, load_at, parse_load

from .conftest import eventually

PERIOD = 12.0
CORES = 8


async def node_readings(client, node_id: str, seconds: float) -> list[tuple[float, float, float]]:
    """(heartbeat time, cpu_percent, load1) of the node, every 0.3 s for `seconds`."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n = await client.node(node_id)
        out.append((time.time() - n["heartbeat_age_s"], n["cpu_percent"], n["load1"]))
        await asyncio.sleep(0.3)
    return out


async def test_a_nodes_busy_follows_its_replicas_diurnal_load(region):
    await region.coordinator()
    fleet = await region.fleet(
        1, inventories=[Inventory(CORES, 32 * GiB)], heartbeat_s=0.2, seed=11
    )
    await region.ready(1)
    (node_id,) = fleet.nodes
    origin = round(time.time(), 3)
    load = {
        "curve": "diurnal",
        "peak": 0.9,
        "trough": 0.1,
        "period": f"{PERIOD}s",
        "noise": 0.02,
        "origin": origin,
    }
    service = await region.client.submit(
        {
            "name": "web",
            "tasks": [
                {
                    "role": "replica",
                    "resources": {"cpu": 4, "memory": "1Gi"},
                    "simulate": {"duration": "forever", "load": load},
                }
            ],
        }
    )
    batch = await region.client.submit(
        {
            "name": "crunch",
            "tasks": [
                {
                    "role": "w",
                    "resources": {"cpu": 2, "memory": "1Gi"},
                    "simulate": {"duration": "forever"},
                }
            ],
        }
    )

    async def both_running():
        jobs = [await region.client.job(j) for j in (service, batch)]
        return all(j["task_list"][0]["state"] == "RUNNING" for j in jobs)

    await eventually(both_running, timeout=20)
    await eventually(lambda: len(fleet.nodes[node_id].running) == 2)
    started = time.time()

    async def heard_since_both_started():
        n = await region.client.node(node_id)
        return time.time() - n["heartbeat_age_s"] > started + 0.05

    await eventually(heard_since_both_started, timeout=10)

    curve = parse_load(load, "load")
    seed = node_seed(11, 0)
    readings = await node_readings(region.client, node_id, PERIOD + 1.0)
    assert len(readings) >= 10
    for ts, cpu, load1 in readings:
        # the replica scales its curve to its 4-core request; the batch task is busy at 1.0
        cores = load_at(curve, ts, 4.0) + 2.0
        assert abs(load1 - cores) <= 0.02 * 4 + 0.3, (ts, load1, cores)  # noise + timing
        assert abs(cpu - 100 * load1 / CORES) <= 0.15  # each rounded (0.1 %, 0.01 core)
    # over a whole period it went from near the trough to near the peak
    loads = [r[2] for r in readings]
    assert min(loads) < 2.0 + 0.2 * 4 and max(loads) > 2.0 + 0.8 * 4, loads
    # each heartbeat on the wire is exactly the curve at its own time plus the node's
    # seeded noise (no coordinator in between: the beat's own ts)
    beats: list[NodeState] = []

    async def keep(msg) -> None:
        beats.append(decode(NodeState, msg.data))

    sub = await region.nc.subscribe(subjects.state("default", node_id), cb=keep)
    await eventually(lambda: len(beats) >= 15, timeout=10)
    await sub.unsubscribe()
    noisy = 0
    for st in beats:
        quiet = load_at(curve, st.ts, 4.0) + 2.0
        amplitude = 0.02 * 4
        assert st.load1 == pytest.approx(quiet + amplitude * jitter(seed, int(st.ts)), abs=0.006)
        assert st.cpu_percent == pytest.approx(100 * st.load1 / CORES, abs=0.12)
        noisy += abs(st.load1 - quiet) > 0.01
    assert noisy >= len(beats) // 2  # the noise is there, not only the curve

    # killing the replica leaves the batch task's 2 cores
    await region.client.kill(service, reason="test")
    await region.client.wait(service, timeout=20)
    (task,) = (await region.client.job(service))["task_list"]
    assert task["state"] == "KILLED"

    async def batch_only():
        n = await region.client.node(node_id)
        return n if n["load1"] == 2.0 else None

    n = await eventually(batch_only, timeout=10)
    assert n["cpu_percent"] == 25.0
    await region.client.kill(batch, reason="test")
    await region.client.wait(batch, timeout=20)

    async def idle():
        n = await region.client.node(node_id)
        return n["load1"] == 0.0 and n["cpu_percent"] == 0.0

    await eventually(idle, timeout=10)
