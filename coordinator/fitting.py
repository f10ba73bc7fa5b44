"""Whether a job can ever fit the region as it is: its size against the ready nodes'
capacity as if every node were idle, not against what is free now. Pure.

Admission and placement judge a job by what is free now, so a job that can never fit
looked merely early, and held the line for ever: a gang of 200 one-core tasks in a
region of 118 cores is over its pool's entitlement (which never exceeds the region's
capacity) in every round, so admission takes it for the blocked job at the head of its
pool, and 16 of them used up the look-ahead behind it in every round: nothing else in
the pool was ever admitted. (Placement's parking, for jobs that fit no node, never saw
them: only admitted jobs are placed.) A gang that passes admission but that the nodes
cannot hold all at once (3 tasks of 4 cores on two 6-core nodes) was placed in vain,
parked, and after `starve_after_s` held the line of the whole region for `hold_s` of
every `hold_s + release_s`.

So each round, before admission, the jobs looked at are judged here, and those that
can never fit are parked with the reason (`parking.park_unfit`): they count in no
look-ahead and hold no line, and are judged again when the region's capacity changes.

"The region as it is" is its **ready** nodes (the round's snapshot), each as if idle:
its capacity, labels, zone, simulation flag, GPUs (count, memory, isolation). A
suspect or down node takes no new work, so a job that needs it cannot start until it
is back; when the ready nodes or any of those figures change (a node joins, comes back,
grows, is relabelled), `RegionFit.version` moves, every verdict is dropped and parked
jobs are looked at again. What is allocated or measured in use never enters: placements
and releases move no verdict.

The checks are necessary conditions of fitting, never sufficient: a job failing one
can never be placed on these nodes, one passing them may still not fit (per-GPU
packing of several sizes, for one), and then waits as any job that does not fit now.
For the tasks that must start together (a gang's waiting tasks, an elastic job's first
`min_tasks`, else the first waiting task):
- every task fits some idle node, past every placement filter;
- per task shape, the idle nodes hold that many copies at once (node resources, whole
  GPUs per node, GPU shares per GPU; one per node under anti-affinity);
- together they fit the summed capacity of the nodes any of them may use (and, under
  anti-affinity, there are as many such nodes as tasks);
and the job's waiting tasks summed (admission takes a job whole) fit the region's
capacity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from coordinator.changes import Mark
from coordinator.cluster import ClusterView
from coordinator.placement import Shape, Snapshot, describe
from coordinator.placement.plugins import FILTERS, copies_fitting, gpu_fits, rejections
from coordinator.placement.snapshot import WHOLE, Working
from coordinator.records import HOLDING, JobRecord
from coordinator.scheduling import snapshot, spec_shape
from coordinator.state import RegionState
from workloads.lifecycle import TaskState
from workloads.quantity import format_bytes, format_cpu, format_gpu
from workloads.resources import Resources
from workloads.spec import JobSpec

POOLED = 4  # cpu, memory, disk, gpu: the kinds admission budgets (Resources.KINDS order)


def _about_bytes(n: int) -> str:
    """Bytes to a tenth of the largest binary unit (a region's memory summed is rarely
    a round number: 167290420Ki reads as 159.5Gi)."""
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + unit
    return format_bytes(n)


_FORMAT = (format_cpu, _about_bytes, _about_bytes, format_gpu, _about_bytes)


@dataclass(frozen=True, slots=True)
class Needs:
    """What a job needs of the region to start. Jobs alike share one verdict."""

    at_once: tuple[tuple[Shape, int], ...]  # the tasks that must start together, per shape
    gang: bool  # those are all its waiting tasks, all or nothing
    anti_affinity: bool
    total: tuple[int, ...]  # its waiting tasks summed, pooled kinds: admitted together
    waiting: int  # its waiting tasks


def needs_of_job(job: JobRecord) -> Needs:
    """A job in the queue: its waiting tasks, and whether any already run (an elastic
    job with running tasks places the rest one by one, as `scheduling.gang_request`)."""
    runs: list[list] = []  # [shape, count] per run of waiting tasks of one role
    role = None
    held = 0
    for t in job.tasks.values():
        if t.state == TaskState.PENDING:
            if t.role != role or not runs:
                role = t.role
                runs.append([spec_shape(job.spec, t.group), 0])
            runs[-1][1] += 1
        elif t.state in HOLDING:
            held += 1
    r = job.pending_resources
    return _needs(job.spec, runs, held, (r.cpu, r.memory, r.disk, r.gpu))


def needs_of_spec(spec: JobSpec) -> Needs:
    """A job about to be submitted: every task waits."""
    runs = [[spec_shape(spec, g), g.count] for g in spec.tasks if g.count]
    r = spec.total_resources
    return _needs(spec, runs, 0, (r.cpu, r.memory, r.disk, r.gpu))


def _needs(spec: JobSpec, runs: list[list], held: int, total: tuple[int, ...]) -> Needs:
    waiting = sum(n for _, n in runs)
    p = spec.placement
    whole = p.gang and spec.min_tasks is None
    if whole:
        size = waiting
    elif p.gang and not held:
        size = spec.min_tasks or 1
    else:
        size = 1  # placed one by one: it starts if its first waiting task fits
    size = max(1, min(size, waiting))
    at_once: dict[Shape, int] = {}
    for shape, n in runs:
        take = min(n, size)
        if take:
            at_once[shape] = at_once.get(shape, 0) + take
            size -= take
    if spec.is_elastic:
        # Admitted for what it may place now, a gang of min or a grow (elastic.offer),
        # never for every waiting task: only that must fit the region.
        total = tuple(sum(sh.resources[j] * k for sh, k in at_once.items()) for j in range(4))
    return Needs(tuple(at_once.items()), whole, p.anti_affinity, total, waiting)


def _basis(node) -> tuple:
    """What of a node decides what can ever fit it (not what is allocated or measured)."""
    gpus = tuple((g.memory_total, g.enforcement) for g in node.gpus)
    return (
        node.node_id,
        node.capacity,
        node.simulated,
        node.zone,
        dict(node.labels),
        gpus,
        node.partition,
        node.draining,
        node.port_range,
    )


@dataclass(slots=True)
class RegionFit:
    """The ready nodes as if idle, kept in step with the snapshots (their journal of
    rows), and the verdicts given on them. `version` moves whenever what can fit moves."""

    snap: Snapshot
    mark: Mark
    basis: list[tuple]
    version: int = 0
    verdicts: dict[Needs, str | None] = field(default_factory=dict)
    by_job: dict[str, tuple[Resources, int, Needs]] = field(default_factory=dict)
    _idle: Working | None = None

    def sync(self, snap: Snapshot) -> None:
        if snap is self.snap:
            return
        rows = snap.row_changes.since(self.mark)
        if rows is None:  # built whole: the ready nodes changed, or a node was reshaped
            basis = [_basis(x) for x in snap.nodes]
            moved = basis != self.basis
            self.basis = basis
        else:
            moved = False
            for i in rows:
                b = _basis(snap.nodes[i])
                if b != self.basis[i]:
                    self.basis[i] = b
                    moved = True
        self.snap, self.mark = snap, snap.mark
        if moved:
            self.version += 1
            self.verdicts.clear()
            self._idle = None

    def never(self, jobs: Iterable[JobRecord], waiting: int) -> dict[str, str]:
        """Of these queued jobs, those that can never fit the region as it is, and why.
        `waiting`: how many jobs wait in all (bounds what is remembered per job)."""
        out = {}
        by_job = self.by_job
        if len(by_job) > 2 * waiting + 1024:
            by_job.clear()  # jobs that left the queue
        for job in jobs:
            # Whether tasks run matters only to an elastic job (see needs_of_job).
            holding = 0 if job.spec.min_tasks is None else _holding(job)
            kept = by_job.get(job.job_id)
            if kept is None or kept[0] is not job.pending_resources or kept[1] != holding:
                kept = by_job[job.job_id] = (job.pending_resources, holding, needs_of_job(job))
            why = self.verdict(kept[2])
            if why is not None:
                out[job.job_id] = why
        return out

    def verdict(self, needs: Needs) -> str | None:
        """Why a job with these needs can never fit the ready nodes, or None."""
        if needs in self.verdicts:
            return self.verdicts[needs]
        why = None if not len(self.snap) else self._judge(needs)
        self.verdicts[needs] = why
        return why

    def _idle_nodes(self) -> Working:
        """The snapshot's nodes as if idle: all capacity free, every GPU unshared with
        all its memory."""
        if self._idle is None:
            s = self.snap
            w = Working(s)
            w.free = s.cap.copy()
            w.g_alloc = np.zeros_like(s.g_alloc)
            w.g_free_mem = np.zeros_like(s.g_free_mem)
            for i in np.flatnonzero(s.gpu_count):
                for j, g in enumerate(s.nodes[i].gpus):
                    w.g_free_mem[i, j] = g.memory_total
            self._idle = w
        return self._idle

    def _judge(self, needs: Needs) -> str | None:
        s = self.snap
        n = len(s)
        nodes = f"{n} ready node{'s' if n != 1 else ''}"
        total = np.array(needs.total, dtype=np.int64)
        # (One task is better explained per node, below.)
        over = np.flatnonzero(total > s.cap_total[:POOLED]) if needs.waiting > 1 else ()
        if len(over):
            what = "in one gang" if needs.gang else "for its waiting tasks, admitted together"
            return _never(
                f"needs {_amounts(total, over)} {what}; the region has "
                f"{_amounts(s.cap_total, over)} in {nodes}"
            )
        w = self._idle_nodes()
        usable = np.zeros(n, dtype=bool)
        count = 0
        asked = np.zeros(len(Resources.KINDS), dtype=np.int64)
        for shape, k in needs.at_once:
            ok = _fits_idle(w, shape)
            if not ok.any():
                why = _counted(rejections(w, shape, idle=True))
                return _never(f"a task ({describe(shape)}) fits no node, even idle: {why}")
            room = int(_copies(w, shape, needs.anti_affinity)[ok].sum())
            if room < k:
                return _never(
                    f"a gang of {k} tasks ({describe(shape)}) must start together; the "
                    f"{_count_nodes(int(ok.sum()))} that can take one hold {room} at most"
                )
            usable |= ok
            count += k
            asked += np.array(shape.resources, dtype=np.int64) * k
        if len(needs.at_once) > 1:
            have = s.cap[usable].sum(axis=0)
            short = np.flatnonzero(asked > have)
            if len(short):
                return _never(
                    f"needs {_amounts(asked, short)} in one gang; the "
                    f"{_count_nodes(int(usable.sum()))} its tasks may use have "
                    f"{_amounts(have, short)}"
                )
            if needs.anti_affinity and count > int(usable.sum()):
                return _never(
                    f"a gang of {count} tasks, one per node (anti_affinity); only "
                    f"{_count_nodes(int(usable.sum()))} can take one"
                )
        return None


def submit_warning(state: RegionState, cluster: ClusterView, spec: JobSpec) -> str | None:
    """What a submit's reply says of a job that can never fit the region as it is now:
    it is still accepted (nodes may join or grow). Nothing while no node is ready (a
    region starting up)."""
    if not cluster.ready():
        return None
    why = region_fit(state, snapshot(cluster, state)).verdict(needs_of_spec(spec))
    return None if why is None else f"accepted, but it {why}"


def region_fit(state: RegionState, snap: Snapshot) -> RegionFit:
    """The region's fit for this round's snapshot (kept in the state's memo)."""
    f = state.memo.get("fit")
    if f is None:
        f = state.memo["fit"] = RegionFit(snap, snap.mark, [_basis(x) for x in snap.nodes])
    else:
        f.sync(snap)
    return f


def _holding(job: JobRecord) -> int:
    return sum(job.counts.get(s, 0) for s in HOLDING)


def _fits_idle(w: Working, shape: Shape) -> np.ndarray:
    ok = np.ones(len(w.snap), dtype=bool)
    for f in FILTERS:
        if f.applies(shape) and not f.measured:
            ok &= f.ok(w, slice(None), shape)
    return ok


def _copies(w: Working, shape: Shape, anti_affinity: bool) -> np.ndarray:
    """Per idle node, how many tasks of `shape` it holds at once."""
    copies = copies_fitting(w, shape)
    if shape.gpu:
        fits = gpu_fits(w, slice(None), shape)
        if shape.fractional:
            per_gpu = np.full(fits.shape, WHOLE // shape.gpu, dtype=np.int64)
            if shape.gpu_memory_each:
                per_gpu = np.minimum(per_gpu, w.g_free_mem // shape.gpu_memory_each)
            gpu_copies = np.where(fits, per_gpu, 0).sum(axis=1)
        else:
            gpu_copies = fits.sum(axis=1) // shape.whole_gpus
        copies = np.minimum(copies, gpu_copies)
    if anti_affinity:
        copies = np.minimum(copies, 1)
    return copies


def _never(detail: str) -> str:
    return f"can never fit the region as it is: {detail} (looked at again when nodes join or grow)"


def _amounts(values: np.ndarray, kinds: np.ndarray) -> str:
    return ", ".join(f"{_FORMAT[k](int(values[k]))} {Resources.KINDS[k]}" for k in kinds)


def _count_nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _counted(counts: dict[str, int]) -> str:
    return "; ".join(
        f"{n:,} node{'s' if n != 1 else ''}: {why}"
        for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )
