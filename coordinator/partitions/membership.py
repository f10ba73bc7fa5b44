"""Which partition each node is in, as folded from the job log; and what placement asks
of it. Pure: the fold (`coordinator/state.py`) hands events to `Membership`, and
placement, the drain and the API read it. No clock, no I/O.

A node has a **current** partition (where its work comes from) and a **desired** one
(where it is going). They differ while a move is in flight: the node is **draining**
(cordoned: it takes no new work) until nothing of its old partition runs there, then
the move converges (`NodePartitionChanged`: current := desired). A node the log never
named is in its agent label `partition=NAME` if that names a configured partition,
else in `config.default_partition`. Its **home** is the partition it was in before it
was lent ("" while it is at home).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from coordinator.partitions.config import (
    PartitionsConfig,
    PartitionSpec,
    parse_partitions_config,
)
from workloads.quantity import SpecError
from workloads.resources import Resources

LABEL = "partition"  # the agent label (`mesh agent --label partition=stateless`)
HISTORY = 1024  # moves remembered (started and converged), for "moves in the last hour"


@dataclass(slots=True)
class NodeMembership:
    """One node the log has named."""

    node_id: str
    partition: str  # current
    desired: str
    home: str = ""  # where it was before it was lent; "" while at home
    last_moved: float = 0.0  # when its last move converged (0: never)
    reason: str = ""  # why its last move started
    break_glass: bool = False  # its last move was a break-glass one
    since: float = 0.0  # when its last move started

    @property
    def draining(self) -> bool:
        return self.desired != self.partition


@dataclass(frozen=True, slots=True)
class MoveRecord:
    """A move started (`converged` False) or finished, for `mesh partition list`."""

    ts: float
    node_id: str
    source: str
    target: str
    reason: str
    break_glass: bool
    converged: bool


@dataclass(slots=True)
class BreakGlass:
    """A break-glass in force: which nodes it moved, from where, by whom, until when."""

    to: str
    nodes: tuple[str, ...]
    reason: str
    by: str
    until_ts: float  # 0: no TTL, until `mesh partition restore`
    started: float
    origins: dict[str, str] = field(default_factory=dict)  # node -> where it came from


class Membership:
    """The partitions part of `RegionState`: changed only by the fold's events. Each
    change returns False when the event does not fit (the fold counts it ignored)."""

    def __init__(self) -> None:
        self.config = PartitionsConfig()
        self._names = frozenset(p.name for p in self.config.partitions)
        self._specs = {p.name: p for p in self.config.partitions}
        self.config_source = ""  # the YAML text applied last ("" : the defaults)
        self.nodes: dict[str, NodeMembership] = {}
        self.moving: set[str] = set()  # nodes with desired != current
        self.glass: BreakGlass | None = None
        self.history: deque[MoveRecord] = deque(maxlen=HISTORY)

    # ------------------------------------------------------------ the fold

    def set_config(self, source: str) -> bool:
        try:
            cfg = parse_partitions_config(source)
        except SpecError:
            return False
        self.config, self.config_source = cfg, source
        self._names = frozenset(p.name for p in cfg.partitions)
        self._specs = {p.name: p for p in cfg.partitions}
        return True

    def set_desired(
        self, node_id: str, desired: str, source: str, reason: str, glass: bool, ts: float
    ) -> bool:
        """A move starts (or, desired == current, a move in flight is called off)."""
        if desired not in self.names():
            return False
        rec = self.nodes.get(node_id)
        if rec is None:
            start = source if source in self.names() else self.config.default_partition
            rec = self.nodes[node_id] = NodeMembership(node_id, start, start)
        if rec.desired == desired:
            return False
        rec.desired, rec.reason, rec.break_glass, rec.since = desired, reason, glass, ts
        if rec.draining:
            self.moving.add(node_id)
        else:
            self.moving.discard(node_id)
        if glass and self.glass is not None:
            self.glass.origins.setdefault(node_id, rec.partition)
        self.history.append(MoveRecord(ts, node_id, rec.partition, desired, reason, glass, False))
        return True

    def converged(self, node_id: str, partition: str, ts: float) -> bool:
        """The move of `node_id` to `partition` finished: drained, flipped, uncordoned."""
        rec = self.nodes.get(node_id)
        if rec is None or rec.desired != partition or rec.partition == partition:
            return False
        old, rec.partition, rec.last_moved = rec.partition, partition, ts
        if partition == rec.home:
            rec.home = ""
        elif not rec.home:
            rec.home = old
        self.moving.discard(node_id)
        self.history.append(
            MoveRecord(ts, node_id, old, partition, rec.reason, rec.break_glass, True)
        )
        return True

    def glass_set(
        self, to: str, nodes: tuple[str, ...], reason: str, by: str, until_ts: float, ts: float
    ) -> None:
        self.glass = BreakGlass(to, nodes, reason, by, until_ts, ts)

    def glass_ended(self) -> bool:
        if self.glass is None:
            return False
        self.glass = None
        return True

    # ------------------------------------------------------------ queries

    def names(self) -> frozenset[str]:
        return self._names

    @property
    def divided(self) -> bool:
        """Whether the fleet is split at all: once a partitions config was applied or a
        node was moved. Before that the region is one undivided fleet, as it was before
        partitions existed: a node takes every job unless its agent's `partition=NAME`
        label puts it in one (a region with no stateless node would otherwise never run
        a service)."""
        return bool(self.config_source) or bool(self.nodes)

    def spec(self, name: str) -> PartitionSpec:
        return self._specs.get(name) or PartitionSpec(name)

    def partition_of(self, node_id: str, labels: Mapping[str, str] | None = None) -> str:
        rec = self.nodes.get(node_id)
        if rec is not None:
            return rec.partition
        return self.unrecorded(labels)

    def desired_of(self, node_id: str, labels: Mapping[str, str] | None = None) -> str:
        rec = self.nodes.get(node_id)
        return rec.desired if rec is not None else self.unrecorded(labels)

    def unrecorded(self, labels: Mapping[str, str] | None) -> str:
        """Where a node the log never named is: its label's partition, if configured."""
        named = (labels or {}).get(LABEL, "")
        return named if named in self.names() else self.config.default_partition

    def draining(self, node_id: str) -> bool:
        return node_id in self.moving

    def moves_since(self, ts: float) -> list[MoveRecord]:
        return [m for m in self.history if m.ts >= ts]


# ---------------------------------------------------------------- jobs and placement

UNDIVIDED = ""  # a node's partition in a region not split into partitions: takes every job


def allocatable(capacity: Resources, spec: PartitionSpec) -> Resources:
    """What a node offers placement in its partition: cpu x `oversubscribe` (cpu only,
    as Koordinator's batch reclaim: memory is not compressible, and over-committing it
    ends in OOM kills); the other kinds as measured."""
    if spec.oversubscribe == 1.0 or not capacity.cpu:
        return capacity
    cpu = int(capacity.cpu * spec.oversubscribe)
    return Resources(cpu, capacity.memory, capacity.disk, capacity.gpu, capacity.gpu_memory)


@dataclass(frozen=True, slots=True)
class Placing:
    """What placement takes of a node's membership."""

    partition: str  # its current partition
    draining: bool  # cordoned: no new work at all until its move converges
    oversubscribe: float
    busy_limit: float  # measured CPU busy at or above which it takes no new work; 0: none


def placing(m: Membership, node_id: str, labels: Mapping[str, str]) -> Placing:
    """A node as placement sees it. The busy limit applies only where the partition is
    oversubscribed: there the allocatable lies above what the node has, and only what
    it measures keeps it from being driven past its busy line."""
    if not m.divided and (labels or {}).get(LABEL, "") not in m.names():
        return Placing(UNDIVIDED, False, 1.0, 0.0)  # no split, no label: takes any job
    part = m.partition_of(node_id, labels)
    spec = m.spec(part)
    limit = m.config.busy_line if spec.oversubscribe > 1.0 else 0.0
    return Placing(part, node_id in m.moving, spec.oversubscribe, limit)
