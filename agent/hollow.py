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
  little. A kill cancels the timer and reports KILLED: at once, or after the run's
  `simulate.stop` (at most the kill's grace period), the time a process handling
  SIGTERM takes to stop, which drains and preemptions then wait for.
- Heartbeats: one NodeState per node per period on `mesh.<r>.state.<node>`, spread
  evenly over the period in ticks of `HEARTBEAT_TICK_S` (a 5,000-node fleet sends 250
  every 50 ms, not 5,000 at once). The parts of a node's state that never change are
  msgpack-encoded once; each beat packs only seq, ts, the CPU busy (cpu_percent, load1),
  the live tasks and the GPU list, byte for byte what `mesh.codec.encode` would produce.
  The GPU list is re-packed only after a run started or ended on the node (or its
  background load changed), from per-GPU chunks shared by all nodes of one inventory
  (`GpuWire`); the CPU busy likewise, unless a run on the node has a load curve, whose
  value moves with time. Publishes are buffered, never flushed one by one.
- Events: `agent.link.EventPublisher`: concurrent JetStream publishes over one
  connection, in order per task attempt (RUNNING is acknowledged before SUCCEEDED is
  sent), a node's events that are ready together in one message, retried until
  acknowledged, de-duplicated by the same message ids as a real agent's.

The region (`MIX`, `inventory_mix(count, seed)`): CPU-only datacenter nodes, 8x A100
80 GB, 8x H100 80 GB and 4x L4 24 GB nodes in zones zone-a/b/c, and small edge nodes in
edge-1/edge-2, in exact shares (the table above `MIX` gives the 5,000-node totals),
shuffled by the seed. Labels: `kind` (edge or datacenter) and, on GPU nodes,
`gpu_model`; the zone is `NodeState.zone`. Each GPU reports the enforcement its node
delivers: H100 nodes mig or mps, A100 mps or watchdog, L4 watchdog.

GPU state is measured from what runs (see `HollowNode`): memory from the grants, and
utilization from the granted share scaled by a per-node busy factor, plus any
background load a test puts on a GPU (`gpu_background=`, `set_gpu_background`).
CPU busy too: the sum of the runs' simulated loads (`simulate.load`, a curve over time:
workloads.load) and of the cpu requests of runs without one (`BATCH_BUSY` of each),
plus seeded noise, so hotness and partition moves can be driven at scale. A hollow node
reports no PSI (cpu_pressure, mem_pressure None) and no memory use.
A run of `duration: forever` lasts until it is killed (a service replica).

Failures: `HollowFleet.crash(node, down_s)` drops the node's runs without a word, stops
its heartbeats for `down_s` and brings it back empty. A failing task is the spec's own
`simulate: {exit_code: N}`.

Measured (2 cores, nats-server 2.15.1, the fleet as `mesh agent --simulate N` in its own
process beside a bare nats-server, no coordinator; start = the fleet's own "started in"
figure, CPU over 20 s of idle after 3 s to settle, RSS at the end): with the region mix
above and its GPU heartbeats, 1,000 nodes start in 0.2 s, idle at 2.2 % CPU and 32 MB
RSS; 5,000 nodes in 4.8-7.0 s (the server's consumer creation, which varies run to run),
6.0-6.5 % CPU, 39 MB (the older CPU/A100/L4 mix with static GPUs, measured the same way
the same day: 0.3 s, 2.1 %, 31 MB; 6.4 s, 6.3 %, 39 MB). A GPU node's heartbeat is
~1.2 KB (8 GPUs) against ~250 bytes for a CPU node; an unchanged one costs the same
~3 us to encode, a re-measured one ~14 us. The CPU busy in each beat (issue 19),
measured in process over the 5,000-node mix (best of 40 rounds, a shared 2-core machine):
an idle node's beat 1.3 -> 1.65 us, one with 4 batch runs 2.9 -> 3.4 us; a node with a
load curve computes it at every beat, ~5 us more (a diurnal replica on every node: 8.9 us
a beat). Driven directly on the wire, the fleet
takes ~2,000-2,200 short tasks/s in steady flow from assignment to acknowledged
SUCCEEDED at either size, with the machine's two cores saturated (fleet ~80 %,
nats-server ~45 %, the driver the rest); measured before the GPU state was added and not
re-measured since. A backlog of 20,000 zero-length tasks published at once over 5,000
nodes (GPU tasks granted a quarter GPU each) drains at ~730 tasks/s, against ~680/s for
the older fleet under the same driver: the server's pick over pending subjects bounds
it. Per-node consumers managed 1,000 nodes at most: 3.5 s to start, 36 % CPU idle,
~500 tasks/s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import msgpack

from agent.autonomy import Uplink
from agent.ledger import Run, RunBook
from agent.link import SITE_ACK_WAIT_S, AssignmentMessage, EventPublisher, FleetFeed
from agent.training import DEFAULT_PORT_RANGE
from mesh import subjects
from mesh.codec import to_wire
from mesh.connect import ClientTls, close_quietly, connect, describe, endpoint
from mesh.logs import fields
from mesh.schema import Assignment, GpuStatus, NodeState, Resources, TaskEvent, TaskSpec
from mesh.signing import AssignmentRefused, VerifyKey, key_id, load_verify_key, open_message
from mesh.streams import node_streams
from mesh.tasks import cancel_and_wait
from workloads.lifecycle import ENDED, TaskState
from workloads.load import LoadCurve, jitter, load_at

log = logging.getLogger("mesh.hollow")

GiB = 1024**3

HEARTBEAT_TICK_S = 0.05  # a period's heartbeats go out in slices this long
SEEN_TTL_S = 900.0  # how long a node remembers a finished attempt (redelivery guard)
BUSY_RANGE = (0.5, 1.0)  # how hard a node's tasks drive the GPU share they were granted
# The share of its cpu request a simulated task without `load` keeps busy: all of it, so
# batch work shows as busy as it is (a batch job asks for what it uses).
BATCH_BUSY = 1.0


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a hollow node declares it has. `enforcement` is what each of its GPUs
    delivers (mesh.schema.GpuStatus.enforcement)."""

    cpus: int
    memory: int
    gpu_model: str = ""
    gpus: int = 0
    gpu_memory: int = 0  # per GPU
    zone: str = "zone-a"
    edge: bool = False
    enforcement: str = "none"

    def capacity(self) -> Resources:
        return Resources(
            cpu=self.cpus * 1000,
            memory=self.memory,
            disk=100 * GiB,
            gpu=self.gpus * 1000,
            gpu_memory=self.gpus * self.gpu_memory,
        )


@dataclass(frozen=True, slots=True)
class NodeKind:
    """One kind of node in the mix: its share of the region, its hardware, the zones it
    is spread over and the GPU enforcement modes its nodes are split between."""

    share: float
    inventory: Inventory
    zones: tuple[str, ...]
    enforcement: tuple[str, ...] = ("none",)


DATACENTER_ZONES = ("zone-a", "zone-b", "zone-c")
EDGE_ZONES = ("edge-1", "edge-2")

# A datacenter-and-edge region. The GPU enforcement per model follows what the hardware
# can do: only H100s are partitioned with MIG (the rest of them share by MPS), A100s share
# by MPS or are only watched (watchdog), L4s are only watched. Every GPU of a node has
# the same mode (it is a node-wide driver setting). At 5,000 nodes this is exactly:
#   kind   nodes  cores  memory    GPUs/node    cores    GPUs  enforcement (GPUs)
#   cpu     2750     32  128 GiB   -           88,000       -
#   A100     400     96    1 TiB   8 x 80 GiB  38,400   3,200  1,608 mps, 1,592 watchdog
#   H100     250    112    2 TiB   8 x 80 GiB  28,000   2,000  1,008 mig, 992 mps
#   L4       600     48  192 GiB   4 x 24 GiB  28,800   2,400  2,400 watchdog
#   edge    1000      4    8 GiB   -            4,000       -  (zones edge-1, edge-2)
#   total   5000                              187,200   7,600
MIX: tuple[NodeKind, ...] = (
    NodeKind(0.55, Inventory(32, 128 * GiB), DATACENTER_ZONES),
    NodeKind(
        0.08, Inventory(96, 1024 * GiB, "A100", 8, 80 * GiB), DATACENTER_ZONES, ("mps", "watchdog")
    ),
    NodeKind(
        0.05, Inventory(112, 2048 * GiB, "H100", 8, 80 * GiB), DATACENTER_ZONES, ("mig", "mps")
    ),
    NodeKind(0.12, Inventory(48, 192 * GiB, "L4", 4, 24 * GiB), DATACENTER_ZONES, ("watchdog",)),
    NodeKind(0.20, Inventory(4, 8 * GiB, edge=True), EDGE_ZONES),
)


def inventory_mix(count: int, seed: int = 0, mix: tuple[NodeKind, ...] = MIX) -> list[Inventory]:
    """`count` nodes in the mix's exact shares (largest remainder), each kind spread
    evenly over its zones and enforcement modes, in an order shuffled by `seed`.

    Exact rather than drawn, so a benchmark's capacity is known to the node: a 5,000-node
    region always has 400 A100 nodes, a third of them in each zone. The first nodes of a
    small fleet are not all of one kind: the seed's shuffle decides."""
    total = sum(k.share for k in mix)
    quotas = [int(count * k.share / total) for k in mix]
    by_remainder = sorted(
        range(len(mix)), key=lambda i: (-(count * mix[i].share / total - quotas[i]), i)
    )
    for i in by_remainder[: count - sum(quotas)]:
        quotas[i] += 1
    nodes: list[Inventory] = []
    for kind, quota in zip(mix, quotas, strict=True):
        zones, modes = kind.zones, kind.enforcement
        variants: dict[tuple[str, str], Inventory] = {}  # equal nodes share one Inventory
        for i in range(quota):
            mode = modes[(i // len(zones)) % len(modes)] if kind.inventory.gpus else "none"
            zone = zones[i % len(zones)]
            inv = variants.get((zone, mode))
            if inv is None:
                inv = variants[zone, mode] = replace(kind.inventory, zone=zone, enforcement=mode)
            nodes.append(inv)
    random.Random(seed).shuffle(nodes)
    return nodes


# ------------------------------------------------------------ encoding, cheaply

_DYNAMIC = ("seq", "ts", "cpu_percent", "load1", "gpus", "tasks")
_GPU_DYNAMIC = ("uuid", "memory_used", "utilization")
_EMPTY_ARRAY = msgpack.packb([])


def _cut(wire: dict, dynamic: tuple[str, ...]) -> list[bytes]:
    """The msgpack map of `wire` as the bytes between its `dynamic` values (one more
    chunk than values): each chunk ends with the next dynamic key."""
    chunks: list[bytes] = []
    cur = bytearray(msgpack.Packer().pack_map_header(len(wire)))
    order = []
    for key, value in wire.items():
        cur += msgpack.packb(key, use_bin_type=True)
        if key in dynamic:
            order.append(key)
            chunks.append(bytes(cur))
            cur = bytearray()
        else:
            cur += msgpack.packb(value, use_bin_type=True)
    chunks.append(bytes(cur))
    if tuple(order) != dynamic:
        raise RuntimeError(f"wire field order changed: {order}, expected {dynamic}")
    return chunks


_IDLE = (msgpack.packb(0.0), msgpack.packb(0.0))  # cpu_percent and load1 of an idle node


class StateWire:
    """A node's NodeState as msgpack, with the fields that never change packed once.

    `encode(seq, ts, tasks, gpus_packed, busy_packed)` equals `mesh.codec.encode` of the
    same NodeState: a map in field order whose static key/value pairs are kept as bytes
    between the six values that change (`gpus` arrives packed: see `GpuWire`; and
    `busy_packed` is cpu_percent and load1, packed)."""

    __slots__ = ("_c0", "_c1", "_c2", "_c3", "_c4", "_c5", "_c6")

    def __init__(self, template: NodeState) -> None:
        (self._c0, self._c1, self._c2, self._c3, self._c4, self._c5, self._c6) = _cut(
            to_wire(template), _DYNAMIC
        )

    def encode(
        self,
        seq: int,
        ts: float,
        tasks: list[str],
        gpus_packed: bytes = _EMPTY_ARRAY,
        busy_packed: tuple[bytes, bytes] = _IDLE,
    ) -> bytes:
        return self.encode_packed(seq, msgpack.packb(ts), tasks, gpus_packed, busy_packed)

    def encode_packed(
        self,
        seq: int,
        ts_packed: bytes,
        tasks: list[str],
        gpus_packed: bytes = _EMPTY_ARRAY,
        busy_packed: tuple[bytes, bytes] = _IDLE,
    ) -> bytes:
        """`encode` with ts already packed (one packing serves a whole tick of nodes)."""
        return b"".join(
            (
                self._c0,
                msgpack.packb(seq),
                self._c1,
                ts_packed,
                self._c2,
                busy_packed[0],
                self._c3,
                busy_packed[1],
                self._c4,
                gpus_packed,
                self._c5,
                msgpack.packb(tasks, use_bin_type=True) if tasks else _EMPTY_ARRAY,
                self._c6,
            )
        )


class GpuWire:
    """The GPU list of nodes with one inventory, as msgpack: each GpuStatus packed once
    around the fields that differ by node (uuid) or by moment (memory_used,
    utilization), so what is kept is per inventory, not per node. `encode` gives what
    `to_wire` + `packb` would."""

    __slots__ = ("_header", "_chunks", "_pack")

    def __init__(self, inv: Inventory) -> None:
        self._header = msgpack.Packer().pack_array_header(inv.gpus)
        self._pack = msgpack.Packer(buf_size=256).pack  # a reused Packer packs 7x faster
        self._chunks = [
            tuple(
                _cut(
                    to_wire(GpuStatus(i, "", inv.gpu_model, inv.gpu_memory, 0, 0, inv.enforcement)),
                    _GPU_DYNAMIC,
                )
            )
            for i in range(inv.gpus)
        ]

    def encode(self, uuid_prefix: str, measured: list[tuple[int, int]]) -> bytes:
        """`measured`: (memory_used, utilization) per GPU, in index order; GPU i's uuid
        is `uuid_prefix` + i."""
        parts = [self._header]
        pack = self._pack
        for i, ((c0, c1, c2, c3), (mem, util)) in enumerate(
            zip(self._chunks, measured, strict=True)
        ):
            parts += (c0, pack(f"{uuid_prefix}{i}"), c1, pack(mem), c2, pack(util), c3)
        return b"".join(parts)


def node_seed(seed: int, index: int) -> int:
    """The noise seed of a fleet's `index`th node: distinct per node and per fleet seed."""
    return seed * 1_000_003 + index


# ------------------------------------------------------------ one node

# A running task's GPU grant on one node: (gpu index, milli-GPUs, bytes) per GPU.
Grant = tuple[tuple[int, int, int], ...]


class _Forever:
    """What stands for the timer of a run that lasts until it is killed (`duration:
    forever`): cancelling it is all a kill does to it."""

    __slots__ = ()

    def cancel(self) -> None:
        pass


FOREVER = _Forever()


@dataclass(eq=False, slots=True)
class HollowNode:
    """One simulated node: its runs, its redelivery guard and its measured GPUs.

    GPU state is measured from what runs, as a probe would see it: each GPU's
    `memory_used` is the GPU memory granted to the tasks on it and its `utilization` is
    min(100, round(background + granted fraction x 100 x `busy`)); `busy` (a per-node
    factor, seeded in BUSY_RANGE by the fleet) says how hard its tasks drive what they
    were given. `background` (percent per GPU index) is load from outside the mesh.
    Memory is not clamped to the GPU's size: an over-commit by the scheduler shows.

    CPU busy is measured the same way: the cores its runs keep busy are the sum of each
    run's `simulate.load` at the heartbeat's time (`workloads.load.load_at`, scaled to the
    run's cpu request unless the curve gives `cores`), plus `batch_busy` x the cpu
    request of each run without a load, plus the curves' noise (`jitter` of `load_seed`
    and the second, times the sum of their amplitudes), never below 0. `load1` reports
    those cores, `cpu_percent` min(100, 100 x cores / the node's cpus). A node whose runs
    have no curve keeps its two figures packed between a run's start and end (they do
    not move), so only nodes with curves compute them at each beat.
    A fleet holds thousands: slots, and what most nodes never use stays None."""

    node_id: str
    inventory: Inventory
    seq: int = 0
    busy: float = 1.0
    # live simulated runs: (task, attempt) -> the timer that ends it
    running: dict[tuple[str, int], asyncio.TimerHandle] = field(default_factory=dict)
    seen: set[tuple[str, int]] = field(default_factory=set)
    # ended runs whose outcome the events stream has not acknowledged yet
    owed: set[tuple[str, int]] | None = field(default=None, repr=False)
    background: dict[int, int] | None = None  # GPU index -> percent
    gpu_wire: GpuWire | None = field(default=None, repr=False)  # shared by equal nodes
    down: bool = False  # crashed: no heartbeats, assignments wait in `backlog`
    verify_key: str = ""  # the id of the key its fleet verifies with (heartbeats say it)
    labels: tuple[tuple[str, str], ...] = ()  # extra labels its heartbeats carry (partition=...)
    site: str = ""  # the edge site its heartbeats name ("": none)
    backlog: list[AssignmentMessage] | None = field(default=None, repr=False)
    wake: asyncio.TimerHandle | None = field(default=None, repr=False)
    grants: dict[tuple[str, int], Grant] | None = field(default=None, repr=False)
    _gpu_milli: list[int] | None = field(default=None, repr=False)
    _gpu_mem: list[int] | None = field(default=None, repr=False)
    _wire: StateWire | None = field(default=None, repr=False)
    _gpus_packed: bytes | None = field(default=None, repr=False)  # None: to re-measure
    load_seed: int = 0  # its noise's seed (the fleet derives one per node from its seed)
    batch_busy: float = BATCH_BUSY
    # runs without a load curve: their cpu requests (millicores); and runs with one: the
    # curve and the cores it scales to
    flat_cpu: dict[tuple[str, int], int] | None = field(default=None, repr=False)
    curves: dict[tuple[str, int], tuple[LoadCurve, float]] | None = field(default=None, repr=False)
    _flat_milli: int = field(default=0, repr=False)
    _busy_packed: tuple[bytes, bytes] | None = field(default=None, repr=False)
    # runs that take time to stop once killed (`simulate.stop`): seconds; and those stopping
    stop_s: dict[tuple[str, int], float] | None = field(default=None, repr=False)
    stopping: set[tuple[str, int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = self.inventory.gpus
        if n:
            self._gpu_milli = [0] * n
            self._gpu_mem = [0] * n

    # -------------------------------------------------------- GPUs

    def gpu_uuid(self, index: int) -> str:
        return f"GPU-{self.node_id}-{index}"

    def gpu_index(self, uuid: str) -> int | None:
        prefix = f"GPU-{self.node_id}-"
        if not uuid.startswith(prefix) or not uuid[len(prefix) :].isdigit():
            return None
        index = int(uuid[len(prefix) :])
        return index if index < self.inventory.gpus else None

    def measured(self) -> list[tuple[int, int]]:
        """(memory_used, utilization) per GPU, in index order."""
        if not self.inventory.gpus:
            return []
        busy, bg = self.busy, self.background or {}
        return [
            (mem, min(100, round(bg.get(i, 0) + milli * busy / 10)))
            for i, (milli, mem) in enumerate(zip(self._gpu_milli, self._gpu_mem, strict=True))
        ]

    def set_background(self, index: int, percent: int) -> None:
        if not 0 <= index < self.inventory.gpus:
            raise IndexError(f"{self.node_id} has no GPU {index}")
        if not 0 <= percent <= 100:
            raise ValueError(f"background utilization {percent} is not in [0, 100]")
        if self.background is None:
            self.background = {}
        self.background[index] = percent
        self._gpus_packed = None

    def _gpus(self) -> tuple[GpuStatus, ...]:
        inv = self.inventory
        return tuple(
            GpuStatus(
                i,
                self.gpu_uuid(i),
                inv.gpu_model,
                inv.gpu_memory,
                mem,
                util,
                inv.enforcement,
            )
            for i, (mem, util) in enumerate(self.measured())
        )

    # -------------------------------------------------------- CPU

    def busy_at(self, ts: float) -> tuple[float, float]:
        """(cpu_percent, load1) at time `ts` (see the class docstring)."""
        cores = self._flat_milli * self.batch_busy / 1000.0
        if self.curves:
            amplitude = 0.0
            for load, scale in self.curves.values():
                cores += load_at(load, ts, scale)
                if load.noise:
                    amplitude += load.noise * (scale if load.cores is None else load.cores)
            if amplitude:
                cores += amplitude * jitter(self.load_seed, int(ts))
            cores = max(0.0, cores)
        cpus = self.inventory.cpus
        cpu = min(100.0, round(100.0 * cores / cpus, 1)) if cpus > 0 else 0.0
        return cpu, round(cores, 2)

    def _busy_wire(self, ts: float) -> tuple[bytes, bytes]:
        if not self.curves:
            if self._busy_packed is None:
                if not self._flat_milli:
                    self._busy_packed = _IDLE
                else:
                    cpu, load1 = self.busy_at(ts)
                    self._busy_packed = (msgpack.packb(cpu), msgpack.packb(load1))
            return self._busy_packed
        cpu, load1 = self.busy_at(ts)
        return msgpack.packb(cpu), msgpack.packb(load1)

    def _count_cpu(self, key: tuple[str, int], spec: TaskSpec) -> None:
        sim = spec.simulate
        load = sim.load if sim is not None else None
        if load is not None:
            if self.curves is None:
                self.curves = {}
            self.curves[key] = (load, spec.resources.cpu / 1000.0)
        elif spec.resources.cpu:
            if self.flat_cpu is None:
                self.flat_cpu = {}
            self.flat_cpu[key] = spec.resources.cpu
            self._flat_milli += spec.resources.cpu
            self._busy_packed = None

    def _uncount_cpu(self, key: tuple[str, int]) -> None:
        if self.curves and self.curves.pop(key, None) is not None:
            return
        milli = self.flat_cpu.pop(key, 0) if self.flat_cpu else 0
        if milli:
            self._flat_milli -= milli
            self._busy_packed = None

    # -------------------------------------------------------- runs

    def start_run(
        self, key: tuple[str, int], spec: TaskSpec, timer: asyncio.TimerHandle | _Forever
    ) -> None:
        self.running[key] = timer
        self._count_cpu(key, spec)
        if spec.simulate is not None and spec.simulate.stop_s > 0:
            if self.stop_s is None:
                self.stop_s = {}
            self.stop_s[key] = spec.simulate.stop_s
        if spec.resources.gpu and self.inventory.gpus:
            grant = self._grant(spec)
            if grant:
                if self.grants is None:
                    self.grants = {}
                self.grants[key] = grant
                for i, milli, mem in grant:
                    self._gpu_milli[i] += milli
                    self._gpu_mem[i] += mem
                self._gpus_packed = None

    def end_run(self, key: tuple[str, int]) -> asyncio.TimerHandle | _Forever | None:
        """Forget a run (its timer is returned, not cancelled) and release its GPUs and
        the CPU it kept busy."""
        self._uncount_cpu(key)
        if self.stop_s:
            self.stop_s.pop(key, None)
        if self.stopping:
            self.stopping.discard(key)
        grant = self.grants.pop(key, None) if self.grants else None
        if grant:
            for i, milli, mem in grant:
                self._gpu_milli[i] -= milli
                self._gpu_mem[i] -= mem
            self._gpus_packed = None
        return self.running.pop(key, None)

    def begin_stop(self, key: tuple[str, int], grace_s: float) -> float | None:
        """A kill of a run: how long it takes to stop (its `simulate.stop`, at most the
        kill's grace period, as SIGKILL ends a real process's grace); None when there is
        nothing to stop or it is stopping already (a repeated kill changes nothing); 0:
        at once."""
        if key not in self.running or (self.stopping and key in self.stopping):
            return None
        stop = min(self.stop_s.get(key, 0.0) if self.stop_s else 0.0, max(0.0, grace_s))
        if stop <= 0:
            return 0.0
        if self.stopping is None:
            self.stopping = set()
        self.stopping.add(key)
        return stop

    def drop_all(self) -> list[tuple[str, int]]:
        """Every run stops, unreported (a reboot): their keys."""
        keys = list(self.running)
        for timer in self.running.values():
            timer.cancel()
        self.running.clear()
        self.owed = None
        self.flat_cpu = self.curves = None
        self.stop_s = self.stopping = None
        self._flat_milli = 0
        self._busy_packed = None
        if self.grants:
            self.grants = None
            self._gpu_milli = [0] * self.inventory.gpus
            self._gpu_mem = [0] * self.inventory.gpus
            self._gpus_packed = None
        return keys

    def _grant(self, spec: TaskSpec) -> Grant:
        """The GPUs a task holds, its request split evenly over them. The coordinator
        names them (`gpu_uuids`); a task given none is put on the least-granted GPUs
        (ceil(gpu) of them), as a device plugin left to choose would. UUIDs that are not
        this node's are not counted (a misaddressed grant shows as no load)."""
        r = spec.resources
        if spec.gpu_uuids:
            idx = [i for i in map(self.gpu_index, spec.gpu_uuids) if i is not None]
        else:
            want = min(self.inventory.gpus, max(1, -(-r.gpu // 1000)))
            idx = sorted(range(self.inventory.gpus), key=lambda i: (self._gpu_milli[i], i))
            idx = sorted(idx[:want])
        if not idx:
            return ()
        n = len(idx)
        return tuple(
            (i, r.gpu // n + (k < r.gpu % n), r.gpu_memory // n + (k < r.gpu_memory % n))
            for k, i in enumerate(idx)
        )

    # -------------------------------------------------------- state

    def _state(self, region: str, seq: int, ts: float, tasks: tuple[str, ...]) -> NodeState:
        inv = self.inventory
        labels = {"kind": "edge" if inv.edge else "datacenter"}
        if inv.gpu_model:
            labels["gpu_model"] = inv.gpu_model
        labels.update(self.labels)
        cpu_percent, load1 = self.busy_at(ts)
        return NodeState(
            node_id=self.node_id,
            region=region,
            seq=seq,
            ts=ts,
            capacity=inv.capacity(),
            zone=inv.zone,
            simulated=True,
            labels=labels,
            cpu_percent=cpu_percent,
            load1=load1,
            gpus=self._gpus(),
            tasks=tasks,
            verify_key=self.verify_key,
            site=self.site,
            # Simulated tasks bind nothing: every hollow node of a host may offer the range.
            address="127.0.0.1",
            port_range=DEFAULT_PORT_RANGE,
        )

    def live_tasks(self) -> list[str]:
        """What the node still answers for: its runs, and those that ended with their
        outcome not yet stored. Without the latter, a run that ends while the events
        stream is away (a NATS server dying) drops off the heartbeats, which go on over
        core NATS, and the coordinator declares it LOST and runs it again."""
        live = [f"{t}#{a}" for t, a in self.running]
        if self.owed:
            live += [f"{t}#{a}" for t, a in self.owed]
        return live

    def owe(self, key: tuple[str, int]) -> None:
        if self.owed is None:
            self.owed = set()
        self.owed.add(key)

    def state(self, region: str) -> NodeState:
        """The next heartbeat as a NodeState."""
        self.seq += 1
        return self._state(region, self.seq, time.time(), tuple(self.live_tasks()))

    def encode_state(self, region: str, ts: float | None = None, ts_packed: bytes = b"") -> bytes:
        """The next heartbeat, encoded: what `encode(self.state(region))` gives, cheaply.
        The GPU list is re-packed only after a run started or ended on the node.
        `ts_packed`, when given, is `ts` packed (`ts` is still needed: the CPU busy of
        runs with a load curve depends on it)."""
        if self._wire is None:
            self._wire = StateWire(self._state(region, 0, 0.0, ()))
        gpus = _EMPTY_ARRAY
        if self.inventory.gpus:
            if self._gpus_packed is None:
                if self.gpu_wire is None:
                    self.gpu_wire = GpuWire(self.inventory)
                self._gpus_packed = self.gpu_wire.encode(f"GPU-{self.node_id}-", self.measured())
            gpus = self._gpus_packed
        self.seq += 1
        if ts is None:
            ts = time.time()
        if not ts_packed:
            ts_packed = msgpack.packb(float(ts))
        busy = self._busy_wire(ts)
        return self._wire.encode_packed(self.seq, ts_packed, self.live_tasks(), gpus, busy)


class HollowFleet:
    """Many hollow nodes in one process (see the module docstring for why and how).

    `gpu_background` (GPU uuid -> percent) makes GPUs look busy with no mesh task on
    them; `set_gpu_background` changes it while running. `crash` takes a node down.
    `labels` go into every node's heartbeats, as an agent's `--label`s do (e.g.
    `{"partition": "stateless"}` starts the fleet in that partition). Every run is
    recorded in its ledger (`ledger()`; also appended to `ledger_path` when given).
    With `site` the fleet is an edge site's nodes, connected to the site's leaf (as
    `mesh agent --site`)."""

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
        gpu_background: Mapping[str, int] | None = None,
        verify_key: str | os.PathLike[str] | VerifyKey | None = None,
        tls: ClientTls | None = None,
        batch_busy: float = BATCH_BUSY,
        labels: Mapping[str, str] | None = None,
        ledger_path: str | os.PathLike[str] | None = None,
        site: str = "",
    ) -> None:
        self.nats_url = nats_url
        self.book = RunBook(ledger_path)  # every run, as the nodes ran it (`ledger()`)
        # An edge site's nodes (edge/README.md): connected to the site's leaf, events go
        # to the site's stream, assignments come through the hub's JetStream domain.
        self.site = subjects.token(site, "site") if site else ""
        self.tls = tls  # its certificate (fleet:PREFIX) on a secure mesh
        # Like a real agent: with the coordinator's public key, act on nothing unverified.
        if isinstance(verify_key, (str, os.PathLike)):
            verify_key = load_verify_key(verify_key)
        self.verify_key = verify_key
        self.region = subjects.token(region, "region")
        self.prefix = subjects.token(prefix, "fleet prefix")
        invs = inventories or inventory_mix(count, seed)
        busy = random.Random(f"busy:{seed}")  # its own stream: the mix's draws stay as they are
        wires = {inv: GpuWire(inv) for inv in set(invs) if inv.gpus}
        self.nodes: dict[str, HollowNode] = {}
        for i, inv in enumerate(invs):
            node_id = f"{prefix}-{i:04d}"
            self.nodes[node_id] = HollowNode(
                node_id,
                inv,
                busy=round(busy.uniform(*BUSY_RANGE), 3),
                gpu_wire=wires.get(inv),
                load_seed=node_seed(seed, i),
                batch_busy=batch_busy,
            )
        verify_id = key_id(verify_key) if verify_key is not None else ""
        for node_id, node in self.nodes.items():
            subjects.token(node_id, "node id")
            node.verify_key = verify_id
            node.labels = tuple(sorted((labels or {}).items()))
            node.site = self.site
        for uuid, percent in (gpu_background or {}).items():
            self.set_gpu_background(uuid, percent)
        self.heartbeat_s = heartbeat_s
        self.feed: FleetFeed | None = None
        self.uplink = Uplink()  # at a site: what its link says of the region
        self.events: EventPublisher | None = None
        self.started_s = 0.0  # how long start() took
        self.counts = {
            "runs": 0,
            "refused": 0,
            "duplicates": 0,
            "kills": 0,
            "ended": 0,
            "crashes": 0,
            "dropped": 0,  # runs lost to crashes, never reported
            "unverified": 0,  # assignments refused by signature verification
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._ended: deque[tuple[float, HollowNode, tuple[str, int]]] = deque()
        self._stopping = False
        self.nc = None

    def _gpu_owner(self, uuid: str) -> tuple[HollowNode, int]:
        node_id = uuid.removeprefix("GPU-").rpartition("-")[0]
        node = self.nodes.get(node_id)
        index = node.gpu_index(uuid) if node is not None else None
        if index is None:
            raise KeyError(f"no GPU {uuid!r} in this fleet")
        return node, index

    def set_gpu_background(self, uuid: str, percent: int) -> None:
        """Load on a GPU from outside the mesh (another tenant, a stray process): it adds
        to the utilization the node reports for that GPU from its next heartbeat on."""
        node, index = self._gpu_owner(uuid)
        node.set_background(index, percent)

    async def start(self) -> None:
        t0 = time.monotonic()
        self.nc = await connect(
            self.nats_url, name=f"hollow:{self.prefix}:{len(self.nodes)}", tls=self.tls
        )
        try:
            # events (the leaf's, at a site) and the region's streams
            self.js, hub_js = await node_streams(self.nc, self.region, self.site, timeout=10.0)
            self.events = EventPublisher(
                self.js, self.region, on_acked=self._reported, site=self.site
            )
            self.events.start()
            self.feed = FleetFeed(
                hub_js,
                self.region,
                self.prefix,
                list(self.nodes),
                self._on_assignment,
                **({"ack_wait": SITE_ACK_WAIT_S} if self.site else {}),
            )
            if self.site:  # a long poll across the site's link, kicked when it is back
                self.feed.wait_s = self.feed.site_wait_s
                self.uplink.on_back = self.feed.kick
                await self.uplink.start(self.nc, self.region, self.site)
            await self.feed.start()
        except BaseException:
            await self.stop()
            raise
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="hollow-heartbeat"))
        self.started_s = time.monotonic() - t0
        log.info(
            "hollow fleet %s: %d nodes in region %s, started in %.2f s, connected to %s",
            self.prefix,
            len(self.nodes),
            self.region,
            self.started_s,
            describe(self.nc),
            extra=fields(event="started", process="fleet", region=self.region, **endpoint(self.nc)),
        )

    def ledger(self) -> list[Run]:
        """Every run this fleet's nodes started (agent/ledger.py: `count_duplicates`)."""
        return self.book.runs()

    async def stop(self) -> None:
        self._stopping = True  # runs cut short by a shutdown were not killed: report nothing
        for t in self._tasks:
            await cancel_and_wait(t)
        self._tasks = []
        await self.uplink.stop()
        if self.feed is not None:
            await self.feed.stop()
        for node in self.nodes.values():
            self.book.dropped(node.node_id, node.drop_all())
            if node.wake is not None:
                node.wake.cancel()
                node.wake = None
        if self.events is not None:
            await self.events.stop(flush_timeout=2.0)  # what already ended still gets told
        if self.nc is not None:
            await close_quietly(self.nc)
        self.book.close()

    # ------------------------------------------------------------ failures

    def crash(self, node_id: str, down_s: float) -> int:
        """The node goes down as if it lost power: its runs end unreported, it sends no
        heartbeat for `down_s` seconds, then it comes back empty. Assignments sent to it
        meanwhile wait for its return (its durable subject would keep them), and it still
        remembers the attempts it was given (an agent's store is on disk), so a redelivery
        never runs a dropped attempt again. Crashing a node that is down restarts its
        downtime. Returns the number of runs dropped."""
        node = self.nodes[node_id]
        loop = asyncio.get_running_loop()
        dropped = node.drop_all()
        self.book.dropped(node_id, dropped)
        now = time.monotonic()
        self._ended.extend((now, node, key) for key in dropped)
        self.counts["crashes"] += 1
        self.counts["dropped"] += len(dropped)
        node.down = True
        if node.wake is not None:
            node.wake.cancel()
        node.wake = loop.call_later(max(0.0, down_s), self._wake, node)
        log.info(
            "hollow node %s crashed: %d runs dropped, down %.1f s", node_id, len(dropped), down_s
        )
        return len(dropped)

    def _wake(self, node: HollowNode) -> None:
        node.down = False
        node.wake = None
        backlog, node.backlog = node.backlog or [], None
        for a in backlog:
            self._on_assignment(node.node_id, a)

    # ------------------------------------------------------------ heartbeats

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        nodes = list(self.nodes.values())
        period = self.heartbeat_s
        slices = max(1, min(len(nodes), round(period / HEARTBEAT_TICK_S)))
        groups = [
            [(self._state_subject(n.node_id), n) for n in nodes[i::slices]] for i in range(slices)
        ]
        step = period / slices
        due = loop.time()
        publish = self.nc.publish
        while True:
            for group in groups:
                ts = time.time()
                now = msgpack.packb(ts)
                for subject, node in group:
                    if node.down:
                        continue
                    try:
                        await publish(subject, node.encode_state(self.region, ts, now))
                    except Exception as exc:
                        log.debug("hollow heartbeat: %s", exc)
                due += step
                delay = due - loop.time()
                if delay < -period:  # fell a whole period behind: carry on, don't burst
                    due = loop.time()
                await asyncio.sleep(max(0.0, delay))
            self._forget_old()

    def _state_subject(self, node_id: str) -> str:
        """A node's heartbeat subject: at a site, site-local (the site link relays what
        the region acts on)."""
        if self.site:
            return subjects.site_state(self.region, self.site, node_id)
        return subjects.state(self.region, node_id)

    def _forget_old(self) -> None:
        horizon = time.monotonic() - SEEN_TTL_S
        ended = self._ended
        while ended and ended[0][0] < horizon:
            _, node, key = ended.popleft()
            node.seen.discard(key)

    # ------------------------------------------------------------ assignments

    def _on_assignment(self, node_id: str, m: AssignmentMessage) -> None:
        """Called by the feed for each message (one assignment or a batch); never waits."""
        node = self.nodes[node_id]
        if node.down:
            if node.backlog is None:
                node.backlog = []
            node.backlog.append(m)
            return
        for a, refused in open_message(m, self.verify_key, node_id, time.time()):
            if refused is not None:
                self._refuse(node, a, (a.task_id, a.attempt), refused)
            else:
                self._act(node, a)

    def _act(self, node: HollowNode, a: Assignment) -> None:
        key = (a.task_id, a.attempt)
        if a.kind == "kill":
            self._kill(node, a, key)
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
        self.book.started(a.task_id, a.attempt, node.node_id)
        # A simulated service replica with a health check passes it from the start.
        # Its ports as given, not checked: a simulated task binds nothing.
        health = "healthy" if a.spec.health else ""
        self._report(node, a, TaskState.RUNNING, health=health, ports=dict(a.spec.ports))
        duration = a.spec.simulate.duration_s
        if duration is None:  # until killed
            timer: asyncio.TimerHandle | _Forever = FOREVER
        else:
            timer = asyncio.get_running_loop().call_later(duration, self._finish, node, a)
        node.start_run(key, a.spec, timer)

    def _kill(self, node: HollowNode, a: Assignment, key: tuple[str, int]) -> None:
        """Stop a run: at once, or, for one whose spec takes `simulate.stop` to stop,
        after that long within the kill's grace period (a process handling SIGTERM):
        meanwhile it still runs, busy and holding what it was given, so a drain waits
        for it as for a real one. Either way it ends KILLED."""
        stop = node.begin_stop(key, a.grace_s)
        if stop is None:
            return
        if stop > 0:
            node.running[key].cancel()  # its own end: it is stopping now
            node.running[key] = asyncio.get_running_loop().call_later(
                stop, self._killed, node, a, key
            )
            return
        self._killed(node, a, key)

    def _killed(self, node: HollowNode, a: Assignment, key: tuple[str, int]) -> None:
        timer = node.end_run(key)
        if timer is None:
            return
        timer.cancel()
        self.book.ended(a.task_id, a.attempt, node.node_id, "KILLED")
        self.counts["kills"] += 1
        self._report(node, a, TaskState.KILLED, message="killed")
        self._end(node, key)

    def _refuse(
        self, node: HollowNode, a: Assignment, key: tuple[str, int], exc: AssignmentRefused
    ) -> None:
        """As the real agent does: counted, not acted on, and a run's refusal reported as
        its attempt's failure (the leader judges whether it counts); remembered only when
        the coordinator really issued it (too old, or clocks apart), so a forgery never
        blocks the genuine run of its attempt."""
        self.counts["unverified"] += 1
        log.warning("hollow node %s refused an assignment: %s", node.node_id, exc)
        if a.kind != "run" or not exc.reported or key in node.seen:
            return
        message = f"refused by node {node.node_id}: {exc}"
        self._report(node, a, TaskState.FAILED, message=message, refused=exc.reason)
        if exc.genuine:
            node.seen.add(key)
            self._end(node, key)

    def _finish(self, node: HollowNode, a: Assignment) -> None:
        key = (a.task_id, a.attempt)
        if node.end_run(key) is None:
            return
        if self._stopping:
            self.book.dropped(node.node_id, [key])
            return
        sim = a.spec.simulate
        outcome = "SUCCEEDED" if sim.exit_code == 0 else "FAILED"
        self.book.ended(a.task_id, a.attempt, node.node_id, outcome)
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
        """After the run's last event was handed to the publisher."""
        self.counts["ended"] += 1
        node.owe(key)
        self._ended.append((time.monotonic(), node, key))

    def _reported(self, ev: TaskEvent) -> None:
        if ev.state in ENDED:
            node = self.nodes.get(ev.node_id)
            if node is not None and node.owed:
                node.owed.discard((ev.task_id, ev.attempt))

    def _report(
        self,
        node: HollowNode,
        a: Assignment,
        state: TaskState,
        exit_code: int | None = None,
        message: str = "",
        refused: str = "",
        health: str = "",
        ports: dict[str, int] | None = None,
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
                refused=refused,
                verify_key=node.verify_key if refused else "",
                health=health,
                ports=ports or {},
            )
        )
