"""The region's state seen as placement inputs: a snapshot of the ready nodes (what
agents measured, what the log allocated) and each admitted job as a gang request, then
the plan committed against the live allocations. Pure: state in, placements out; the
placement core (`coordinator/placement/`) decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

from coordinator import elastic
from coordinator.cluster import ClusterView, NodeView
from coordinator.partitions.membership import allocatable, placing
from coordinator.placement import (
    PROFILES,
    GangRequest,
    GpuSlot,
    NodeInfo,
    PlacementResult,
    Placer,
    Shape,
    Snapshot,
    TaskRequest,
    commit,
)
from coordinator.ports import free_count, range_size
from coordinator.records import HOLDING, JobRecord
from coordinator.state import RegionState
from mesh.schema import NodeState
from workloads import frameworks
from workloads.lifecycle import TaskState
from workloads.spec import JobSpec, TaskGroup

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """How the leader places. A gang that has waited `starve_after_s` holds the line
    (nothing queued after it is placed) for `hold_s`, then lets others pass for
    `release_s`, and so on: it cannot starve behind a stream of small jobs, and a gang
    that could never fit does not block the region forever."""

    profile: str = "default"
    max_tasks_per_round: int = 4000  # placed per reconcile round (bounds the loop's stall)
    window_jobs: int = 2000  # jobs looked at per round: the queue's head, and as many more
    windows_per_round: int = 8  # windows looked at in a round while nothing is placed
    starve_after_s: float = 30.0
    hold_s: float = 60.0
    release_s: float = 15.0
    # Elastic training jobs (coordinator/elastic.py): a resize waits this long after the
    # job's last membership change; a job whose progress stops this long after one is
    # requeued. Set from CoordinatorConfig.
    resize_every_s: float = 10.0
    progress_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.windows_per_round < 1 or self.window_jobs < 1:
            raise ValueError("window_jobs and windows_per_round must be >= 1")
        if not self.starve_after_s >= 0:
            raise ValueError(f"starve_after_s must be >= 0, got {self.starve_after_s}")
        if self.profile not in PROFILES:
            raise ValueError(
                f"unknown placement profile {self.profile!r}; known: {sorted(PROFILES)}"
            )


def window(jobs: list[T], cursor: int, size: int) -> tuple[list[T], int]:
    """The jobs one round looks at: the head of the queue, and `size` more from `cursor`
    on (wrapping), so a long queue costs a bounded round and every job is looked at
    within len(jobs)/size rounds, whatever sits at the head. Returns the next cursor."""
    if len(jobs) <= 2 * size:
        return jobs, 0
    rest = len(jobs) - size
    start = size + cursor % rest
    picked = jobs[:size] + jobs[start : start + size]
    if len(picked) < 2 * size:
        picked += jobs[size : size + 2 * size - len(picked)]
    return picked, (cursor + size) % rest


def holds_line(waited: float, config: PlacementConfig) -> bool:
    late = waited - config.starve_after_s
    return late >= 0 and late % (config.hold_s + config.release_s) < config.hold_s


def node_info(view: NodeView, state: RegionState) -> NodeInfo:
    """A node as placement sees it: measured by its agent, allocated by the log, and in
    its partition (docs/partitions.md): cordoned while it moves, offering its partition's
    allocatable (oversubscribed cpu) under a busy limit."""
    st = view.state
    member = placing(state.partitions, st.node_id, st.labels)
    gpus = tuple(
        GpuSlot(
            g.uuid,
            g.model,
            g.memory_total,
            *state.gpu_alloc.get((st.node_id, g.uuid), (0, 0)),
            g.utilization,
            g.memory_used,
            g.enforcement,
        )
        for g in st.gpus
    )
    return NodeInfo(
        st.node_id,
        allocatable(st.capacity, state.partitions.spec(member.partition)),
        state.allocated(st.node_id),
        st.simulated,
        st.zone,
        st.labels,
        gpus,
        st.cpu_percent / 100.0,
        member.partition,
        member.draining,
        member.busy_limit,
        st.port_range,
        _ports_free(st, state),
    )


def _ports_free(st: NodeState, state: RegionState) -> int:
    """The node's free ports as placement filters by them: less those its own holding
    tasks have (the exact pick, per address, is `coordinator.ports` at commit)."""
    held = state.node_ports.get(st.node_id)
    if not held:
        return range_size(st.port_range)
    return free_count(st.port_range, (p for ports in held.values() for p in ports))


def snapshot(
    cluster: ClusterView, state: RegionState, exclude: frozenset[str] = frozenset()
) -> Snapshot:
    """The snapshot of the cluster's ready nodes. The last one is kept in the state's
    memo, with where it stopped reading the journals of heartbeats (the cluster's) and
    of grants (the fold's): only the rows of nodes named in them since are rebuilt, and
    of a node that only heartbeat, only if what it measured moved (most heartbeats
    repeat the last but for the clock, and the decoder then keeps the same objects). A
    full build at 5,000 nodes takes about 170 ms; walking every node to find what
    changed took a third of the leader's time. The result is the same as a full build
    (tested); when a node comes or goes, or a journal cannot say, it is one.
    `exclude`: ready nodes left out (draining: nothing new goes there)."""
    ready = cluster.ready()
    if exclude:
        ready = [v for v in ready if v.node_id not in exclude]
    marks = (cluster.changes.mark(), state.node_changes.mark())
    cached = state.memo.get("snapshot")
    rows = None if cached is None else _changed_rows(cluster, state, ready, cached)
    if rows is None:
        snap = Snapshot([node_info(v, state) for v in ready])
        measured = {v.state.node_id: _measured(v.state) for v in ready}
    else:
        snap, measured = cached[2].with_rows(rows), cached[3]
    state.memo["snapshot"] = (ready, marks, snap, measured)
    return snap


def _changed_rows(
    cluster: ClusterView, state: RegionState, ready: list[NodeView], cached: tuple
) -> dict[int, NodeInfo] | None:
    """The rows of the kept snapshot to build again (updating what it kept of their
    heartbeats), or None when only a full build will do."""
    old_ready, (old_heard, old_granted), kept, measured = cached
    heard = cluster.changes.since(old_heard)
    granted = state.node_changes.since(old_granted)
    if heard is None or granted is None:
        return None
    if old_ready is not ready and kept.ids != [v.state.node_id for v in ready]:
        return None
    rows = {}
    for n in heard | granted:
        i = kept.index.get(n)
        if i is None:
            continue
        now = _measured(cluster.nodes[n].state)
        if n in granted or not _same(now, measured[n]):
            measured[n] = now
            rows[i] = node_info(cluster.nodes[n], state)
    return rows


def _measured(st: NodeState) -> tuple:
    """What a node's row takes from its heartbeat, as the objects that hold it (its
    port range last: a small tuple, compared by value)."""
    return (st.capacity, st.simulated, st.zone, st.labels, st.gpus, st.cpu_percent, st.port_range)


def _same(a: tuple, b: tuple) -> bool:
    return all(x is y for x, y in zip(a[:-1], b[:-1], strict=True)) and a[-1] == b[-1]


def shape_of(job: JobRecord, group: TaskGroup) -> Shape:
    return spec_shape(job.spec, group)


def spec_shape(spec: JobSpec, group: TaskGroup) -> Shape:
    """The shape of one task of `group`: what it asks for and where it may go."""
    r = group.resources
    p = spec.placement
    return _shape(
        (r.cpu, r.memory, r.disk, r.gpu, r.gpu_memory),
        group.simulate is not None,
        p.labels,
        p.gpu_isolation,
        spec.placement_partition,
        ports_asked(spec, group),
    )


def ports_asked(spec: JobSpec, group: TaskGroup) -> int:
    """How many named ports a task of `group` asks placement for: the most its first
    two indexes are given (a framework gives task 0, its rendezvous, more)."""
    return max(len(frameworks.ports_for(spec, group, i)) for i in range(min(group.count, 2) or 1))


@lru_cache(maxsize=4096)
def _shape(*fields) -> Shape:
    """One object per shape: the placement core's maps then find it by identity, without
    comparing its fields."""
    return Shape(*fields)


def gang_request(
    job: JobRecord, waited: float, config: PlacementConfig, now: float | None = None
) -> GangRequest:
    """The job's waiting tasks as one request. An elastic job's are only those
    `elastic.offer` allows now (a gang of min at first, then grows, rate-limited);
    `now` is needed for it (None: the job's last change is taken as long past)."""
    shapes: dict[str, Shape] = {}
    tasks = []
    held = []
    offered = None
    if job.spec.is_elastic:
        clock = float("inf") if now is None else now
        offered = elastic.offer(elastic.facts(job, clock, config.resize_every_s))
    for t in job.tasks.values():
        if offered is not None and t.state == TaskState.PENDING:
            if t.index not in offered.indexes:
                continue
        if t.state == TaskState.PENDING:
            shape = shapes.get(t.role)
            if shape is None:
                shape = shapes[t.role] = shape_of(job, t.group)
            tasks.append(TaskRequest(t.task_id, shape))
        elif t.state in HOLDING:
            held.append(t.node_id)
    p = job.spec.placement
    if offered is not None:
        gang = offered.gang if p.gang else 0
    elif not p.gang:
        gang = 0
    elif job.spec.min_tasks is not None:
        gang = job.spec.min_tasks if not held else 0
    else:
        gang = len(tasks)
    return GangRequest(
        job.job_id,
        tuple(tasks),
        gang,
        p.strategy,
        p.spread_by,
        p.anti_affinity,
        tuple(held),
        holds_line=min(gang, len(tasks)) > 1 and holds_line(waited, config),
    )


def new_placer(state: RegionState, snap: Snapshot, config: PlacementConfig) -> Placer:
    return Placer(snap, PROFILES[config.profile], seed=state.last_seq)


def hopeless(
    placer: Placer,
    jobs: Sequence[JobRecord],
    now: float,
    config: PlacementConfig,
    requests: dict[str, GangRequest],
) -> frozenset[str]:
    """The jobs whose first waiting task fits no node of `placer`'s snapshot, before it
    places anything: they place nothing this round, whatever else is placed (placements
    only take room). A gang holding the line is never among them: it must fail in
    place to hold it. The jobs' requests are left in `requests` for `place_jobs`."""
    out = []
    for job in jobs:
        gang = requests[job.job_id] = gang_request(job, now - job.pending_since, config, now)
        if gang.tasks and not gang.holds_line and placer.fits_nowhere(gang.tasks[0].shape):
            out.append(job.job_id)
    return frozenset(out)


def place_jobs(
    state: RegionState,
    cluster: ClusterView,
    jobs: Sequence[JobRecord],
    now: float,
    config: PlacementConfig,
    snap: Snapshot | None = None,
    placer: Placer | None = None,
    requests: Mapping[str, GangRequest] | None = None,
) -> PlacementResult:
    """Place `jobs` (in order) on the cluster's ready nodes, committed against the live
    state. `snap`: their snapshot, when the caller has one that is still current;
    `placer`: a `new_placer` over it that has placed nothing yet; `requests`: gang
    requests already made for some of the jobs this round."""
    snap = snapshot(cluster, state) if snap is None else snap
    made = requests or {}
    gangs = (
        made.get(job.job_id) or gang_request(job, now - job.pending_since, config, now)
        for job in jobs
    )
    placer = new_placer(state, snap, config) if placer is None else placer
    plan = placer.place(gangs, config.max_tasks_per_round)
    touched = {p.node_id for p in plan.placed}
    live = {n: node_info(cluster.nodes[n], state) for n in touched}
    return commit(plan, placer.considered, live)
