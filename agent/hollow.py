"""Simulated ("hollow") nodes: many virtual nodes in one process, over the real protocol.

They stand in for hardware we do not have. Each publishes a declared inventory as its
state, consumes its own assignments and reports real events; a task "runs" for the
duration its spec declares. A hollow node never pretends to run a real command: a
task without a `simulate` section is refused and reported FAILED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field

from agent.link import AssignmentFeed, publish_event
from mesh import subjects
from mesh.codec import encode
from mesh.connect import close_quietly, connect
from mesh.schema import Assignment, GpuStatus, NodeState, Resources, TaskEvent
from mesh.streams import ensure_streams
from workloads.lifecycle import TaskState

log = logging.getLogger("mesh.hollow")

GiB = 1024**3


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a hollow node declares it has."""

    cpus: int
    memory: int
    gpu_model: str = ""
    gpus: int = 0
    gpu_memory: int = 0  # per GPU
    zone: str = "zone-a"
    edge: bool = False

    def capacity(self) -> Resources:
        return Resources(
            cpu=self.cpus * 1000,
            memory=self.memory,
            disk=100 * GiB,
            gpu=self.gpus * 1000,
            gpu_memory=self.gpus * self.gpu_memory,
        )


# A small datacenter-and-edge mix; `inventory_mix` draws from it with a seed.
MIX: tuple[tuple[float, Inventory], ...] = (
    (0.50, Inventory(16, 64 * GiB)),
    (0.20, Inventory(32, 256 * GiB, "A100", 8, 80 * GiB)),
    (0.15, Inventory(16, 128 * GiB, "L4", 4, 24 * GiB, zone="zone-b")),
    (0.15, Inventory(4, 8 * GiB, zone="edge-1", edge=True)),
)


def inventory_mix(count: int, seed: int = 0) -> list[Inventory]:
    rng = random.Random(seed)
    weights = [w for w, _ in MIX]
    return [rng.choices([inv for _, inv in MIX], weights)[0] for _ in range(count)]


@dataclass
class HollowNode:
    node_id: str
    inventory: Inventory
    seq: int = 0
    running: dict[tuple[str, int], asyncio.Task[None]] = field(default_factory=dict)
    seen: set[tuple[str, int]] = field(default_factory=set)

    def state(self, region: str) -> NodeState:
        self.seq += 1
        inv = self.inventory
        gpus = tuple(
            GpuStatus(i, f"GPU-{self.node_id}-{i}", inv.gpu_model, inv.gpu_memory)
            for i in range(inv.gpus)
        )
        labels = {"kind": "edge" if inv.edge else "datacenter"}
        if inv.gpu_model:
            labels["gpu_model"] = inv.gpu_model
        return NodeState(
            node_id=self.node_id,
            region=region,
            seq=self.seq,
            ts=time.time(),
            capacity=inv.capacity(),
            zone=inv.zone,
            simulated=True,
            labels=labels,
            gpus=gpus,
            tasks=tuple(f"{t}#{a}" for t, a in self.running),
        )


class HollowFleet:
    def __init__(
        self,
        nats_url: str,
        region: str = "default",
        count: int = 4,
        *,
        prefix: str = "hollow",
        seed: int = 0,
        heartbeat_s: float = 1.0,
        inventories: list[Inventory] | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.region = subjects.token(region, "region")
        invs = inventories or inventory_mix(count, seed)
        self.nodes = {
            f"{prefix}-{i:04d}": HollowNode(f"{prefix}-{i:04d}", inv) for i, inv in enumerate(invs)
        }
        self.heartbeat_s = heartbeat_s
        self._feeds: list[AssignmentFeed] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.nc = None

    async def start(self) -> None:
        self.nc = await connect(self.nats_url, name=f"hollow:{len(self.nodes)}")
        self.js = self.nc.jetstream(timeout=5.0)
        await ensure_streams(self.js, self.region)
        for node in self.nodes.values():
            feed = AssignmentFeed(
                self.js, self.region, node.node_id, lambda a, n=node: self._on_assignment(n, a)
            )
            await feed.start()
            self._feeds.append(feed)
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="hollow-heartbeat"))

    async def stop(self) -> None:
        self._stopping = True  # tasks cut short by a shutdown were not killed: report nothing
        for t in self._tasks:
            t.cancel()
        for feed in self._feeds:
            await feed.stop()
        for node in self.nodes.values():
            for t in node.running.values():
                t.cancel()
        for t in [*self._tasks, *(t for n in self.nodes.values() for t in n.running.values())]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.nc is not None:
            await close_quietly(self.nc)

    async def _heartbeat_loop(self) -> None:
        while True:
            for node in self.nodes.values():
                try:
                    await self.nc.publish(
                        subjects.state(self.region, node.node_id), encode(node.state(self.region))
                    )
                except Exception as exc:
                    log.debug("hollow heartbeat: %s", exc)
            await asyncio.sleep(self.heartbeat_s)

    async def _on_assignment(self, node: HollowNode, a: Assignment) -> None:
        key = (a.task_id, a.attempt)
        if a.kind == "kill":
            task = node.running.get(key)
            if task is not None:
                task.cancel()
            return
        if key in node.seen:
            return
        node.seen.add(key)
        if a.spec is None or a.spec.simulate is None:
            await self._report(
                node,
                a,
                TaskState.FAILED,
                message="refused: a hollow node never runs a real command",
            )
            return
        node.running[key] = asyncio.create_task(self._run(node, a))

    async def _run(self, node: HollowNode, a: Assignment) -> None:
        key = (a.task_id, a.attempt)
        sim = a.spec.simulate
        try:
            await self._report(node, a, TaskState.RUNNING)
            await asyncio.sleep(sim.duration_s)
            if sim.exit_code == 0:
                await self._report(node, a, TaskState.SUCCEEDED, exit_code=0)
            else:
                await self._report(
                    node,
                    a,
                    TaskState.FAILED,
                    exit_code=sim.exit_code,
                    message=f"simulated exit code {sim.exit_code}",
                )
        except asyncio.CancelledError:
            if not self._stopping:
                with contextlib.suppress(Exception):
                    await self._report(node, a, TaskState.KILLED, message="killed")
            raise
        finally:
            node.running.pop(key, None)

    async def _report(
        self,
        node: HollowNode,
        a: Assignment,
        state: TaskState,
        exit_code: int | None = None,
        message: str = "",
    ) -> None:
        ev = TaskEvent(
            node.node_id,
            a.job_id,
            a.task_id,
            a.attempt,
            state,
            time.time(),
            exit_code,
            None,
            message,
        )
        for _ in range(10):
            try:
                await publish_event(self.js, self.region, ev)
                return
            except Exception as exc:
                log.debug("hollow event retry: %s", exc)
                await asyncio.sleep(0.5)
