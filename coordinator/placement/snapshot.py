"""An immutable picture of the region's nodes, as arrays the placement plugins scan.

Built once per placement round from what agents measure (heartbeats) and what the job
log says is allocated. Node-level quantities are an (N, 5) int64 array in
`Resources.KINDS` order; GPUs are an (N, G) table padded to the largest GPU count, so a
plugin can look at any subset of nodes with one gather. Plugins never mutate it: the
core works on copies of the `free` arrays (`Working`).

Snapshots made from one another by `with_rows` share a journal of the rows they
replaced (`row_changes`, with each snapshot's `mark` in it): whoever derived something
from an earlier snapshot of the line can bring it up to date by those rows alone
(parking does). A snapshot built whole starts a new journal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from coordinator.changes import Changes
from coordinator.ports import range_size
from workloads.resources import Resources

KINDS = Resources.KINDS
CPU, MEMORY, DISK, GPU, GPU_MEMORY = range(5)
WHOLE = 1000  # milli-GPUs in one GPU
# Weakest to strongest (workloads.spec.GPU_ISOLATION): a level delivers every weaker one.
ISOLATION_LEVEL = {"none": 0, "watchdog": 1, "mps": 2, "mig": 3}


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU: what the log has granted on it and what its agent measured."""

    uuid: str
    model: str = ""
    memory_total: int = 0
    allocated: int = 0  # milli-GPUs granted to tasks
    memory_allocated: int = 0  # bytes granted to tasks
    utilization: int = 0  # measured, percent
    memory_used: int = 0  # measured, bytes (mesh tasks and anything else)
    enforcement: str = "none"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    capacity: Resources
    allocated: Resources = Resources()
    simulated: bool = False
    zone: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[GpuSlot, ...] = ()
    load: float = 0.0  # measured CPU busy fraction, 0..1
    partition: str = ""  # its current partition ("": an undivided region, takes any job)
    draining: bool = False  # cordoned by a partition move: takes no new work
    busy_limit: float = 0.0  # load at or above which it takes no new work; 0: none
    # Named ports (coordinator/ports.py): its range ((0, 0): none), and how many of it
    # its holding tasks leave free.
    port_range: tuple[int, int] = (0, 0)
    ports_free: int = 0


def _row(r: Resources) -> tuple[int, int, int, int, int]:
    return (r.cpu, r.memory, r.disk, r.gpu, r.gpu_memory)


_ROW_ARRAYS = (
    "cap",
    "free",
    "inv_cap",
    "inv_kinds",
    "simulated",
    "load",
    "busy_limit",
    "draining",
    "zone",
    "gpu_count",
    "g_valid",
    "g_alloc",
    "g_free_mem",
    "g_util",
    "g_level",
    "port_size",
    "ports_free",
)


class Snapshot:
    """The nodes, in a fixed order (the caller sorts them: decisions depend on order only
    through ties, which `seed` breaks)."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self.nodes = tuple(nodes)
        n = len(self.nodes)
        self.ids = [x.node_id for x in self.nodes]
        self.index = {node_id: i for i, node_id in enumerate(self.ids)}
        self.cap = np.array([_row(x.capacity) for x in self.nodes], dtype=np.int64).reshape(n, 5)
        alloc = np.array([_row(x.allocated) for x in self.nodes], dtype=np.int64).reshape(n, 5)
        self.free = self.cap - alloc
        self.cap_total = self.cap.sum(axis=0)  # the nodes' capacity summed, per kind
        # Per node, 1/capacity of each kind it has (0 where it has none) and 1/#kinds:
        # what the binpack score multiplies by, computed once.
        self.inv_cap = np.divide(1.0, self.cap, out=np.zeros((n, 5)), where=self.cap > 0)
        self.inv_kinds = 1.0 / np.maximum((self.cap > 0).sum(axis=1), 1)
        self.simulated = np.array([x.simulated for x in self.nodes], dtype=bool)
        self.load = np.array([min(max(x.load, 0.0), 1.0) for x in self.nodes], dtype=np.float64)
        self.busy_limit = np.array([x.busy_limit for x in self.nodes], dtype=np.float64)
        self.draining = np.array([x.draining for x in self.nodes], dtype=bool)
        self.port_size = np.array([range_size(x.port_range) for x in self.nodes], dtype=np.int64)
        self.ports_free = np.array([x.ports_free for x in self.nodes], dtype=np.int64)
        zones = sorted({x.zone for x in self.nodes})
        self.zones = zones
        zone_of = {z: i for i, z in enumerate(zones)}
        self.zone = np.array([zone_of[x.zone] for x in self.nodes], dtype=np.int64)
        self.gpu_count = np.array([len(x.gpus) for x in self.nodes], dtype=np.int64)
        g = int(self.gpu_count.max()) if n else 0
        self.gpu_width = g
        # Padding slots are invalid: no room, no isolation, never chosen.
        self.g_valid = np.zeros((n, g), dtype=bool)
        self.g_alloc = np.zeros((n, g), dtype=np.int64)
        self.g_free_mem = np.zeros((n, g), dtype=np.int64)
        self.g_util = np.zeros((n, g), dtype=np.float64)
        self.g_level = np.full((n, g), -1, dtype=np.int64)
        self.g_uuid: list[tuple[str, ...]] = []
        for i, x in enumerate(self.nodes):
            self.g_uuid.append(tuple(s.uuid for s in x.gpus))
            for j, s in enumerate(x.gpus):
                self.g_valid[i, j] = True
                self.g_alloc[i, j] = s.allocated
                # Memory is free only if neither the grants nor the measurement use it:
                # a process outside Mesh can hold GPU memory nobody granted.
                used = max(s.memory_allocated, s.memory_used)
                self.g_free_mem[i, j] = s.memory_total - used
                self.g_util[i, j] = min(max(s.utilization, 0), 100) / 100.0
                self.g_level[i, j] = ISOLATION_LEVEL.get(s.enforcement, 0)
        self._label_masks: dict[tuple[str, str], np.ndarray] = {}
        self._partition_masks: dict[str, np.ndarray] = {}
        self._fixed_rows: list[tuple | None] = [None] * n  # see fixed_row
        self.row_changes = Changes()
        self.mark = self.row_changes.mark()

    def with_rows(self, rows: Mapping[int, NodeInfo]) -> Snapshot:
        """This snapshot with the nodes at `rows` replaced: what a new round needs when only
        some nodes changed (a heartbeat, a placement), without rebuilding every row. The
        same as a full build of the new nodes; a node whose zone or GPU count changed
        makes it one."""
        if not rows:
            return self
        nodes = list(self.nodes)
        reshaped = False
        for i, x in rows.items():
            old = nodes[i]
            reshaped |= (x.node_id, x.zone, len(x.gpus)) != (old.node_id, old.zone, len(old.gpus))
            nodes[i] = x
        if reshaped:
            return Snapshot(nodes)
        # The changed rows built as a snapshot of their own (one definition of a row),
        # then copied in: their zones and GPU counts are the ones this snapshot has.
        idx = np.fromiter(rows, dtype=np.int64, count=len(rows))
        part = Snapshot([rows[i] for i in idx])
        zone_of = {z: k for k, z in enumerate(self.zones)}
        new = object.__new__(Snapshot)
        new.nodes = tuple(nodes)
        new.ids, new.index = self.ids, self.index
        new.zones, new.gpu_width = self.zones, self.gpu_width
        new.g_uuid = list(self.g_uuid)
        # Label masks stay, with the changed rows looked at again (a round's new snapshot
        # re-scanned 5,000 nodes' labels for every label a waiting job asked for).
        new._label_masks = {}
        for (key, value), mask in self._label_masks.items():
            mask = mask.copy()
            mask[idx] = [_has_label(rows[i], key, value) for i in idx]
            new._label_masks[(key, value)] = mask
        new._partition_masks = {}
        for name, mask in self._partition_masks.items():
            mask = mask.copy()
            mask[idx] = [_takes(rows[i], name) for i in idx]
            new._partition_masks[name] = mask
        new._fixed_rows = list(self._fixed_rows)
        for i in idx:
            new._fixed_rows[i] = None
        new.cap_total = self.cap_total - self.cap[idx].sum(axis=0) + part.cap_total
        for name in _ROW_ARRAYS:
            setattr(new, name, getattr(self, name).copy())
        for name in (
            "cap",
            "free",
            "inv_cap",
            "inv_kinds",
            "simulated",
            "load",
            "busy_limit",
            "draining",
            "gpu_count",
            "port_size",
            "ports_free",
        ):
            getattr(new, name)[idx] = getattr(part, name)
        new.zone[idx] = [zone_of[part.zones[z]] for z in part.zone]
        w = part.gpu_width  # columns past a row's own GPU count are padding already
        for name in ("g_valid", "g_alloc", "g_free_mem", "g_util", "g_level"):
            getattr(new, name)[idx, :w] = getattr(part, name)
        for k, i in enumerate(idx):
            new.g_uuid[i] = part.g_uuid[k]
        # The line goes on only from its newest snapshot: one made from an older one
        # differs from the newest in rows the journal does not name after its mark.
        journal = self.row_changes if self.mark == self.row_changes.mark() else Changes()
        for i in rows:
            journal.add(i)
        new.row_changes, new.mark = journal, journal.mark()
        return new

    def __len__(self) -> int:
        return len(self.nodes)

    def fixed_row(self, i: int) -> tuple:
        """What `NodeRow` takes of row `i` from the snapshot, as Python values: made when
        first asked for and kept by the snapshots made from this one until the row
        changes (all 5,000 rows a round cost 3-4 ms, a round that places one job less)."""
        row = self._fixed_rows[i]
        if row is None:
            row = self._fixed_rows[i] = (
                self.inv_cap[i].tolist(),
                self.inv_kinds[i].item(),
                self.gpu_count[i].item(),
                self.g_valid[i].tolist(),
                self.g_level[i].tolist(),
                self.g_util[i].tolist(),
            )
        return row

    def label_mask(self, key: str, value: str) -> np.ndarray:
        """Nodes carrying label key=value; the key `zone` matches the node's zone."""
        mask = self._label_masks.get((key, value))
        if mask is None:
            mask = np.array([_has_label(x, key, value) for x in self.nodes], dtype=bool)
            self._label_masks[(key, value)] = mask
        return mask

    def partition_mask(self, name: str) -> np.ndarray:
        """Nodes that take new work of partition `name`: in it, and not draining."""
        mask = self._partition_masks.get(name)
        if mask is None:
            mask = np.array([_takes(x, name) for x in self.nodes], dtype=bool)
            self._partition_masks[name] = mask
        return mask


def _takes(node: NodeInfo, partition: str) -> bool:
    """In the job's partition (or in an undivided region: "" takes every job), and not
    cordoned by a move."""
    return (node.partition == partition or not node.partition) and not node.draining


def _has_label(node: NodeInfo, key: str, value: str) -> bool:
    return node.zone == value if key == "zone" else node.labels.get(key) == value


@dataclass(slots=True)
class NodeRow:
    """One node of a round as Python numbers. Refreshing the scores of the one node a
    placement changed is the placement core's most frequent step, and numpy costs about
    a microsecond a call even on one row: a GPU shape's refresh made some thirty calls
    (50-100 us); the plugins' scalar twins read this instead."""

    free: list[int]
    inv_cap: list[float]
    inv_kinds: float
    gpu_count: int
    g_valid: list[bool]
    g_level: list[int]
    g_util: list[float]
    g_alloc: list[int]
    g_free_mem: list[int]
    ports_free: int = 0


class Working:
    """The mutable part of a round: what is still free, as tasks are placed."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.free = snap.free.copy()
        self.g_alloc = snap.g_alloc.copy()
        self.g_free_mem = snap.g_free_mem.copy()
        self.ports_free = snap.ports_free.copy()

    def row(self, i: int) -> NodeRow:
        """Node `i` as it stands now (what is free read afresh on each call)."""
        inv_cap, inv_kinds, gpus, valid, level, util = self.snap.fixed_row(i)
        return NodeRow(
            self.free[i].tolist(),
            inv_cap,
            inv_kinds,
            gpus,
            valid,
            level,
            util,
            self.g_alloc[i].tolist(),
            self.g_free_mem[i].tolist(),
            self.ports_free[i].item(),
        )
