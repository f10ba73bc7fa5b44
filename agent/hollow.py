"""Simulated ("hollow") nodes: many virtual nodes in one process, over the real protocol.

They stand in for hardware we do not have. Each publishes a declared inventory as its
state, consumes its own assignments and reports real events; a task "runs" for the
duration its spec declares. A hollow node never pretends to run a real command: a
task without a `simulate` section is refused and reported FAILED.

One fleet process carries thousands of nodes (a 2-core machine: 1,000 comfortably,
5,000 workably). What makes that possible, and why it is built this way:

- Assignments: ONE durable pull consumer per fleet (`fleet_<prefix>`, see
  `agent.link.FleetFeed`) whose `filter_subjects` lists every node's own subject
  `mesh.<r>.assign.<node>`; one fetch loop hands each message to the node its subject
  names. The subject tree stays as DESIGN.md has it, and the consumer overlaps no
  other: the ASSIGN stream is WORK_QUEUE, which refuses two consumers with overlapping
  filters, so the obvious alternative, one consumer on `mesh.<r>.assign.*`, is refused
  as soon as a real agent has its per-node consumer (`mesh up` runs both).
  `filter_subjects` has no count limit of its own (the consumer config must fit in one
  API request: max_payload, 1 MiB by default, about 30,000 subjects of this length),
  but it has two costs, measured on nats-server 2.15.1 on this 2-core machine:
  * creating (or changing) the consumer grows about quadratically with its filters
    (the server checks them for overlap): 0.2 s for 1,000 nodes, 3.3-5.9 s for 5,000.
    An existing consumer with the same node set is bound as it is (0.02 s).
  * picking the next message costs the server time in proportion to the number of
    distinct subjects that hold pending messages. In steady flow (a few hundred
    assignments in flight) that is nothing: 8,600 assignments/s through one consumer
    over 5,000 subjects, like a `*` consumer (11,000/s). Draining a backlog spread over
    all 5,000 subjects slows to ~5,800/s at 2,000 pending and ~800/s at 20,000 pending.
  Splitting the nodes over 10 or 20 consumers measured no better (3.3-3.6 s to create
  them all, 600-750/s to drain 20,000), so the fleet keeps one.
  One consumer per node is also capped: nats-server 2.15 gives every stream a default
  limit of 1,000 consumers (unless the stream sets `max_consumers`), so per-node
  consumers stopped at 1,000 nodes per region, real agents included ("maximum
  consumers limit reached"); a fleet takes one, whatever its size.
  Per-node consumers left by an older fleet with these node ids (`agent_<node>`) are
  deleted at start, so their subjects can pass to the fleet's consumer; messages they
  had not acknowledged stay in the stream and come to the new consumer. Two fleet
  processes with the same prefix would share one consumer (and node ids): use distinct
  prefixes.
- Idempotency: each node remembers the (task, attempt) pairs it was given, so a
  redelivered assignment never starts twice; the memory of a finished attempt is
  dropped after `SEEN_TTL_S`, far longer than the consumer's ack wait (30 s) and the
  stream's duplicate window (120 s).
- A simulated run is a timer (`loop.call_later`), not a task: thousands at once cost
  little. A kill cancels the timer and reports KILLED.
- Heartbeats: one NodeState per node per period on `mesh.<r>.state.<node>`, spread
  evenly over the period in ticks of `HEARTBEAT_TICK_S` (a 5,000-node fleet sends 250
  every 50 ms, not 5,000 at once). The parts of a node's state that never change are
  msgpack-encoded once; each beat packs only seq, ts and the live tasks, byte for byte
  what `mesh.codec.encode` would produce. Publishes are buffered, never flushed one by
  one.
- Events: `agent.link.EventPublisher`: concurrent JetStream publishes over one
  connection, in order per task attempt (RUNNING is acknowledged before SUCCEEDED is
  sent), retried until acknowledged, de-duplicated by the same message ids as a real
  agent's.

Measured (2 cores, nats-server 2.15.1, the fleet in its own process): 1,000 nodes start
in 0.2 s, idle at 2 % CPU and 31 MB RSS; 5,000 nodes in ~5 s, 6 % CPU, 38 MB. Driven
directly on the wire, the fleet takes ~2,000-2,200 short tasks/s from assignment to
acknowledged SUCCEEDED at either size, with the machine's two cores saturated (fleet
~80 %, nats-server ~45 %, the driver the rest). Per-node consumers managed 1,000 nodes
at most: 3.5 s to start, 36 % CPU idle, ~500 tasks/s.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field

import msgpack

from agent.link import EventPublisher, FleetFeed
from mesh import subjects
from mesh.codec import to_wire
from mesh.connect import close_quietly, connect
from mesh.schema import Assignment, GpuStatus, NodeState, Resources, TaskEvent
from mesh.streams import ensure_streams
from mesh.tasks import cancel_and_wait
from workloads.lifecycle import TaskState

log = logging.getLogger("mesh.hollow")

GiB = 1024**3

HEARTBEAT_TICK_S = 0.05  # a period's heartbeats go out in slices this long
SEEN_TTL_S = 900.0  # how long a node remembers a finished attempt (redelivery guard)


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


_DYNAMIC = ("seq", "ts", "tasks")
_EMPTY_ARRAY = msgpack.packb([])


class StateWire:
    """A node's NodeState as msgpack, with the fields that never change packed once.

    `encode(seq, ts, tasks)` equals `mesh.codec.encode` of the same NodeState: a map in
    field order whose static key/value pairs are kept as bytes between the three
    values that change."""

    __slots__ = ("_c0", "_c1", "_c2", "_c3")

    def __init__(self, template: NodeState) -> None:
        wire = to_wire(template)
        chunks: list[bytes] = []
        cur = bytearray(msgpack.Packer().pack_map_header(len(wire)))
        order = []
        for key, value in wire.items():
            cur += msgpack.packb(key, use_bin_type=True)
            if key in _DYNAMIC:
                order.append(key)
                chunks.append(bytes(cur))
                cur = bytearray()
            else:
                cur += msgpack.packb(value, use_bin_type=True)
        chunks.append(bytes(cur))
        if tuple(order) != _DYNAMIC:
            raise RuntimeError(f"NodeState field order changed: {order}")
        self._c0, self._c1, self._c2, self._c3 = chunks

    def encode(self, seq: int, ts: float, tasks: list[str]) -> bytes:
        return self.encode_packed(seq, msgpack.packb(ts), tasks)

    def encode_packed(self, seq: int, ts_packed: bytes, tasks: list[str]) -> bytes:
        """`encode` with ts already packed (one packing serves a whole tick of nodes)."""
        return b"".join(
            (
                self._c0,
                msgpack.packb(seq),
                self._c1,
                ts_packed,
                self._c2,
                msgpack.packb(tasks, use_bin_type=True) if tasks else _EMPTY_ARRAY,
                self._c3,
            )
        )


@dataclass(eq=False)
class HollowNode:
    node_id: str
    inventory: Inventory
    seq: int = 0
    # live simulated runs: (task, attempt) -> the timer that ends it
    running: dict[tuple[str, int], asyncio.TimerHandle] = field(default_factory=dict)
    seen: set[tuple[str, int]] = field(default_factory=set)
    _wire: StateWire | None = field(default=None, repr=False)

    def _state(self, region: str, seq: int, ts: float, tasks: tuple[str, ...]) -> NodeState:
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
            seq=seq,
            ts=ts,
            capacity=inv.capacity(),
            zone=inv.zone,
            simulated=True,
            labels=labels,
            gpus=gpus,
            tasks=tasks,
        )

    def live_tasks(self) -> list[str]:
        return [f"{t}#{a}" for t, a in self.running]

    def state(self, region: str) -> NodeState:
        """The next heartbeat as a NodeState."""
        self.seq += 1
        return self._state(region, self.seq, time.time(), tuple(self.live_tasks()))

    def encode_state(self, region: str, ts: float | None = None, ts_packed: bytes = b"") -> bytes:
        """The next heartbeat, encoded: what `encode(self.state(region))` gives, cheaply."""
        if self._wire is None:
            self._wire = StateWire(self._state(region, 0, 0.0, ()))
        self.seq += 1
        if not ts_packed:
            ts_packed = msgpack.packb(time.time() if ts is None else float(ts))
        return self._wire.encode_packed(self.seq, ts_packed, self.live_tasks())


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
        self.prefix = subjects.token(prefix, "fleet prefix")
        invs = inventories or inventory_mix(count, seed)
        self.nodes = {
            f"{prefix}-{i:04d}": HollowNode(f"{prefix}-{i:04d}", inv) for i, inv in enumerate(invs)
        }
        for node_id in self.nodes:
            subjects.token(node_id, "node id")
        self.heartbeat_s = heartbeat_s
        self.feed: FleetFeed | None = None
        self.events: EventPublisher | None = None
        self.started_s = 0.0  # how long start() took
        self.counts = {"runs": 0, "refused": 0, "duplicates": 0, "kills": 0, "ended": 0}
        self._tasks: list[asyncio.Task[None]] = []
        self._ended: deque[tuple[float, HollowNode, tuple[str, int]]] = deque()
        self._stopping = False
        self.nc = None

    async def start(self) -> None:
        t0 = time.monotonic()
        self.nc = await connect(self.nats_url, name=f"hollow:{self.prefix}:{len(self.nodes)}")
        try:
            self.js = self.nc.jetstream(timeout=10.0)
            await ensure_streams(self.js, self.region)
            self.events = EventPublisher(self.js, self.region)
            self.events.start()
            self.feed = FleetFeed(
                self.js, self.region, self.prefix, list(self.nodes), self._on_assignment
            )
            await self.feed.start()
        except BaseException:
            await self.stop()
            raise
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="hollow-heartbeat"))
        self.started_s = time.monotonic() - t0
        log.info(
            "hollow fleet %s: %d nodes in region %s, started in %.2f s",
            self.prefix,
            len(self.nodes),
            self.region,
            self.started_s,
        )

    async def stop(self) -> None:
        self._stopping = True  # runs cut short by a shutdown were not killed: report nothing
        for t in self._tasks:
            await cancel_and_wait(t)
        self._tasks = []
        if self.feed is not None:
            await self.feed.stop()
        for node in self.nodes.values():
            for timer in node.running.values():
                timer.cancel()
            node.running.clear()
        if self.events is not None:
            await self.events.stop(flush_timeout=2.0)  # what already ended still gets told
        if self.nc is not None:
            await close_quietly(self.nc)

    # ------------------------------------------------------------ heartbeats

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        nodes = list(self.nodes.values())
        period = self.heartbeat_s
        slices = max(1, min(len(nodes), round(period / HEARTBEAT_TICK_S)))
        groups = [
            [(subjects.state(self.region, n.node_id), n) for n in nodes[i::slices]]
            for i in range(slices)
        ]
        step = period / slices
        due = loop.time()
        publish = self.nc.publish
        while True:
            for group in groups:
                now = msgpack.packb(time.time())
                for subject, node in group:
                    try:
                        await publish(subject, node.encode_state(self.region, ts_packed=now))
                    except Exception as exc:
                        log.debug("hollow heartbeat: %s", exc)
                due += step
                delay = due - loop.time()
                if delay < -period:  # fell a whole period behind: carry on, don't burst
                    due = loop.time()
                await asyncio.sleep(max(0.0, delay))
            self._forget_old()

    def _forget_old(self) -> None:
        horizon = time.monotonic() - SEEN_TTL_S
        ended = self._ended
        while ended and ended[0][0] < horizon:
            _, node, key = ended.popleft()
            node.seen.discard(key)

    # ------------------------------------------------------------ assignments

    def _on_assignment(self, node_id: str, a: Assignment) -> None:
        """Called by the feed for each assignment; never waits."""
        node = self.nodes[node_id]
        key = (a.task_id, a.attempt)
        if a.kind == "kill":
            timer = node.running.pop(key, None)
            if timer is not None:
                timer.cancel()
                self.counts["kills"] += 1
                self._report(node, a, TaskState.KILLED, message="killed")
                self._end(node, key)
            return
        if key in node.seen:
            self.counts["duplicates"] += 1
            return
        node.seen.add(key)
        if a.spec is None or a.spec.simulate is None:
            self.counts["refused"] += 1
            self._report(
                node,
                a,
                TaskState.FAILED,
                message="refused: a hollow node never runs a real command",
            )
            self._end(node, key)
            return
        self.counts["runs"] += 1
        self._report(node, a, TaskState.RUNNING)
        loop = asyncio.get_running_loop()
        node.running[key] = loop.call_later(a.spec.simulate.duration_s, self._finish, node, a)

    def _finish(self, node: HollowNode, a: Assignment) -> None:
        key = (a.task_id, a.attempt)
        if node.running.pop(key, None) is None or self._stopping:
            return
        sim = a.spec.simulate
        if sim.exit_code == 0:
            self._report(node, a, TaskState.SUCCEEDED, exit_code=0)
        else:
            self._report(
                node,
                a,
                TaskState.FAILED,
                exit_code=sim.exit_code,
                message=f"simulated exit code {sim.exit_code}",
            )
        self._end(node, key)

    def _end(self, node: HollowNode, key: tuple[str, int]) -> None:
        self.counts["ended"] += 1
        self._ended.append((time.monotonic(), node, key))

    def _report(
        self,
        node: HollowNode,
        a: Assignment,
        state: TaskState,
        exit_code: int | None = None,
        message: str = "",
    ) -> None:
        self.events.send(
            TaskEvent(
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
        )
