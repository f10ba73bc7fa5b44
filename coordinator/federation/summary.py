"""Region summaries (docs/federation.md, "Summaries and the global view"): what a
region's leader tells the others, and how a reader judges one. Pure: state and clock
in, summary or verdict out.

A summary says what is free now in total *and* as the largest free node shapes: a
gang of N tasks of shape S needs N places of S at once, which a free total can hold
while no node does (8 nodes of 1 free core are 8 cores, and no home for a 2-core
task). So `fits` packs a job's tasks into the shapes; the shapes are bounded
(`MAX_SHAPES`), which makes the verdict for a job larger than those shapes together
conservative: it may say "no" to a job the region could take, never "yes" to one the
shapes cannot hold. A summary judges, it does not reserve: the region that is sent a
job still admits or refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.cluster import DOWN, SUSPECT, ClusterView
from coordinator.scheduling import node_info
from coordinator.state import RegionState
from mesh.fedschema import MAX_POOLS, MAX_SHAPES, RegionSummary
from workloads.resources import Resources
from workloads.spec import JobSpec

__all__ = [
    "FRESH",
    "STALE",
    "UNREACHABLE",
    "Demand",
    "RegionSummary",
    "changed",
    "demand_of",
    "fits",
    "fresh",
    "region_rows",
    "status",
    "summarize",
]

FRESH, STALE, UNREACHABLE = "fresh", "stale", "unreachable"


def _free(capacity: Resources, allocated: Resources) -> Resources:
    """What is left of `capacity`, no kind below zero (an oversubscribed node has none)."""
    return Resources(
        max(0, capacity.cpu - allocated.cpu),
        max(0, capacity.memory - allocated.memory),
        max(0, capacity.disk - allocated.disk),
        max(0, capacity.gpu - allocated.gpu),
        max(0, capacity.gpu_memory - allocated.gpu_memory),
    )


def _size(r: Resources) -> tuple[int, ...]:
    """Largest first: GPUs are the scarcest, then cores, then memory."""
    return (r.gpu, r.cpu, r.memory, r.gpu_memory, r.disk)


def summarize(state: RegionState, cluster: ClusterView, now: float) -> RegionSummary:
    """The region's summary as its leader sees it at wall-clock time `now`: placement's
    view of each ready node (its partition's allocatable, what the log granted; a
    draining node offers nothing new), the waiting jobs per pool, and its health."""
    capacity: list[Resources] = []
    free: list[Resources] = []
    for view in cluster.ready():
        info = node_info(view, state)
        capacity.append(info.capacity)
        if not info.draining:
            free.append(_free(info.capacity, info.allocated))
    statuses: dict[str, int] = {}
    for view in cluster.nodes.values():
        statuses[view.status] = statuses.get(view.status, 0) + 1
    pools: dict[str, int] = {}
    for job_id in state.waiting:
        job = state.jobs[job_id]
        if not job.kill_requested:
            pools[job.spec.pool] = pools.get(job.spec.pool, 0) + 1
    deepest = sorted(pools.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_POOLS]
    if not free:
        health = "no_nodes"
    elif statuses.get(SUSPECT, 0) or statuses.get(DOWN, 0):
        health = "degraded"
    else:
        health = "ok"
    shapes = sorted((f for f in free if not f.is_zero()), key=_size, reverse=True)
    return RegionSummary(
        region=cluster.region,
        ts=now,
        leader=state.leader_id,
        term=state.term,
        capacity=Resources.total(capacity),
        free=Resources.total(free),
        largest_free=tuple(shapes[:MAX_SHAPES]),
        nodes=statuses,
        queued=sum(pools.values()),
        queue=dict(sorted(deepest)),
        health=health,
    )


def changed(old: RegionSummary | None, new: RegionSummary) -> bool:
    """Whether `new` says anything `old` did not (its time aside): worth publishing now
    rather than at the next interval."""
    if old is None:
        return True
    return any(
        getattr(old, name) != getattr(new, name)
        for name in RegionSummary.__dataclass_fields__
        if name != "ts"
    )


def fresh(summary: RegionSummary, now: float, max_age_s: float) -> bool:
    """Whether a summary may be believed at `now`: no older than `max_age_s`. One from
    the future by as much is believed too (clocks of two regions differ a little);
    further than that, the publisher's clock is wrong and nothing it says is dated."""
    return abs(now - summary.ts) <= max_age_s


def status(summary: RegionSummary, now: float, max_age_s: float, unreachable_s: float) -> str:
    """`fresh` (believed), `stale` (ignored: no newer one for over `max_age_s`), or
    `unreachable` (silent for over `unreachable_s`: the region is taken to be gone)."""
    if fresh(summary, now, max_age_s):
        return FRESH
    return UNREACHABLE if now - summary.ts > unreachable_s else STALE


@dataclass(frozen=True, slots=True)
class Demand:
    """What a job asks of a region: one entry per task, and whether all of them must
    start together (a gang)."""

    tasks: tuple[Resources, ...]
    gang: bool = False


def demand_of(spec: JobSpec) -> Demand:
    """A job spec's demand: every task of every group (gangs as the spec says)."""
    tasks = tuple(g.resources for g in spec.tasks for _ in range(g.count))
    return Demand(tasks, bool(spec.placement.gang))


def fits(summary: RegionSummary, demand: Demand) -> bool:
    """Whether the job could start in the summarised region now. A gang: all its tasks
    packed into the largest free node shapes at once (first fit, largest task first),
    within the free total. Not a gang: each task fits some free shape alone and the
    tasks together fit the free total (they need not all start at once, but a task no
    node can hold never starts). A job of no tasks fits nowhere: there is nothing to
    send."""
    if not demand.tasks:
        return False
    if not Resources.total(demand.tasks).fits_in(summary.free):
        return False
    if not demand.gang:
        return all(any(t.fits_in(s) for s in summary.largest_free) for t in demand.tasks)
    return _packs(demand.tasks, summary.largest_free)


def _packs(tasks: Iterable[Resources], shapes: Sequence[Resources]) -> bool:
    room = list(shapes)
    for task in sorted(tasks, key=_size, reverse=True):
        for i, left in enumerate(room):
            if task.fits_in(left):
                room[i] = left - task
                break
        else:
            return False
    return True


def region_rows(
    summaries: Mapping[str, RegionSummary],
    now: float,
    max_age_s: float,
    unreachable_s: float,
) -> list[dict]:
    """The regions known, by name, as `region.list` shows them: each summary's fields,
    its age and its status."""
    rows = []
    for name in sorted(summaries):
        s = summaries[name]
        rows.append(
            {
                "region": name,
                "status": status(s, now, max_age_s, unreachable_s),
                "age_s": round(max(0.0, now - s.ts), 3),
                "ts": s.ts,
                "leader": s.leader,
                "term": s.term,
                "health": s.health,
                "capacity": s.capacity.to_dict(),
                "free": s.free.to_dict(),
                "largest_free": [r.to_dict() for r in s.largest_free],
                "nodes": dict(s.nodes),
                "queued": s.queued,
                "queue": dict(s.queue),
            }
        )
    return rows
