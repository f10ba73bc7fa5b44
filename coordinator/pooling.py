"""The region's state seen through its pools: what each pool holds and wants, which
waiting jobs may start, which running ones to reclaim. Pure: the fold's state and the
ready capacity in, decisions out; the pools core (`coordinator/pools/`) does the math.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.pools import (
    POOL_KINDS,
    PendingJob,
    RunningJob,
    admit,
    any_over_entitlement,
    choose_victims,
    compute_entitlement,
    format_amount,
    sum_by_pool,
)
from coordinator.records import HOLDING, JobRecord
from coordinator.state import RegionState
from mesh.schema import TaskPreemptRequested
from workloads.lifecycle import TaskState
from workloads.resources import Resources

ADMISSION_LOOKAHEAD = 16


@dataclass(frozen=True, slots=True)
class PoolView:
    """Every input and output of one entitlement round, per leaf pool."""

    capacity: Resources
    allocation: dict[str, Resources]  # everything held, reclaimed or not
    non_preemptible: dict[str, Resources]
    demand: dict[str, Resources]
    entitlement: dict[str, Resources]


@dataclass(slots=True)
class _Held:
    """What one running job holds, summed over its tasks, and its earliest start."""

    resources: Resources
    tasks: int
    started: float


def pool_view(state: RegionState, capacity: Resources, now: float) -> PoolView:
    leaves = set(state.pools.leaves())
    # Kept by the fold per pool: the queue may hold 100,000 jobs, and summing it was
    # most of a round's cost. (sum_by_pool drops gpu_memory: pools do not budget it.)
    pending = _without_resting(state) if state.elastic else state.pool_pending
    demand = sum_by_pool((p, r) for p, r in pending.items() if p in leaves)
    allocation = dict(state.pool_alloc)  # kept by the fold, not re-summed per round
    non_preemptible = dict(state.pool_fixed)
    alloc_leaves = {p: r for p, r in allocation.items() if p in leaves}
    entitlement = compute_entitlement(state.pools, capacity, demand, alloc_leaves)
    return PoolView(capacity, allocation, non_preemptible, demand, entitlement)


def _without_resting(state: RegionState) -> dict[str, Resources]:
    """The pools' waiting demand less elastic jobs' tasks at or above their target (a
    shrink's, which wait to be scaled up again): no demand, so no entitlement or
    preemption is claimed for them."""
    pending = dict(state.pool_pending)
    for job_id in state.elastic:
        job = state.jobs[job_id]
        if job.kill_requested or job.away or not job.pending:
            continue
        target = job.target or job.spec.workers_max or len(job.tasks)
        resting = [
            t.resources
            for t in job.tasks.values()
            if t.state == TaskState.PENDING and t.index >= target
        ]
        pool = job.spec.pool
        if resting and pool in pending:
            pending[pool] = pending[pool] - Resources.total(resting)
    return pending


def running_jobs(state: RegionState, now: float) -> list[RunningJob]:
    """The holding jobs of leaf pools, minus those being reclaimed: what preemption chooses
    from. Visits every running task, so only a preemption cycle asks for it."""
    leaves = set(state.pools.leaves())
    held: dict[str, _Held] = {}
    per_job: dict[str, list[int]] = {}
    reclaimed: set[str] = {state.tasks[t].job_id for t in state.preempting}
    for node_tasks in state.node_tasks.values():
        for tid in node_tasks:
            t = state.tasks[tid]
            job = state.jobs[t.job_id]
            if job.job_id in reclaimed or job.spec.pool not in leaves:
                continue
            r = t.resources
            _add(per_job, job.job_id, (r.cpu, r.memory, r.disk, r.gpu, r.gpu_memory))
            h = held.get(job.job_id)
            if h is None:
                h = held[job.job_id] = _Held(Resources(), 0, now)
            h.tasks += 1
            if t.started_at is not None:
                h.started = min(h.started, t.started_at)
    running = []
    for jid, h in sorted(held.items()):
        spec = state.jobs[jid].spec
        running.append(
            RunningJob(
                jid,
                spec.pool,
                Resources(*per_job[jid]),
                h.tasks,
                min_tasks=None if _floor(spec) is None else min(_floor(spec), h.tasks),
                priority=spec.priority,
                preemptible=spec.preemptible,
                running_for=max(0.0, now - h.started),
            )
        )
    return running


def _floor(spec) -> int | None:
    """The tasks a running job may not be shrunk below: an elastic job's workers_min."""
    if spec.is_elastic:
        return spec.workers_min
    return spec.min_tasks


def _add(acc: dict[str, list[int]], key: str, row: tuple[int, ...]) -> None:
    v = acc.get(key)
    if v is None:
        acc[key] = list(row)
    else:
        for i, x in enumerate(row):
            v[i] += x


def _as_pending(j: JobRecord, asks: Resources | None = None) -> PendingJob:
    if asks is not None:  # an elastic job: only what it may place now (elastic.offer)
        return PendingJob(j.job_id, j.spec.pool, asks, j.spec.priority, j.spec.preemptible)
    p = j.as_pending
    if p is None or p.resources is not j.pending_resources:
        spec = j.spec
        p = j.as_pending = PendingJob(
            j.job_id, spec.pool, j.pending_resources, spec.priority, spec.preemptible
        )
    return p


def admitted_jobs(
    state: RegionState,
    view: PoolView,
    jobs: list[JobRecord],
    skip: frozenset[str] = frozenset(),
    asks: Mapping[str, Resources] | None = None,
) -> tuple[set[str], dict[str, str], frozenset[str]]:
    """Which of the waiting `jobs` (all of them, or a window of a long queue) may be
    placed now, why the others wait, and which of those can never be admitted as the
    pools stand. Jobs in `skip` (admitted but found not to fit any node) take no share
    of their pool's budget. `asks`: per elastic job, what the tasks it may place now
    ask for (its other waiting tasks are not admitted, so a grow stays within the
    pool's entitlement as a first placement does)."""
    leaves = set(state.pools.leaves())
    asks = asks or {}
    pending = [_as_pending(j, asks.get(j.job_id)) for j in jobs if j.job_id not in skip]
    decision = admit(
        state.pools,
        pending,
        view.entitlement,
        {p: r for p, r in view.allocation.items() if p in leaves},
        {p: r for p, r in view.non_preemptible.items() if p in leaves},
        lookahead=ADMISSION_LOOKAHEAD,
    )
    return set(decision.admitted), dict(decision.blocked), decision.never


def preemptions(
    state: RegionState, view: PoolView, over_counts: dict[str, int], cycles: int, now: float
) -> tuple[list[TaskPreemptRequested], dict[str, int]]:
    """Reclaim capacity for pools below their entitlement from pools above theirs, whole
    gangs at a time, after `cycles` consecutive rounds over entitlement."""
    if not any_over_entitlement(view.allocation, view.entitlement):
        return [], {}  # what choose_victims would say, without visiting every task
    choice = choose_victims(
        state.pools,
        view.capacity,
        view.entitlement,
        running_jobs(state, now),
        view.demand,
        over_counts,
        cycles=cycles,
    )
    events = []
    for victim in choice.victims:
        holding = [t for t in state.jobs[victim.job_id].tasks.values() if t.state in HOLDING]
        # Highest index first: an elastic job gives back its last tasks, and task 0
        # (its rendezvous) goes last, only with the whole gang.
        holding = sorted(holding, key=lambda t: (t.index, t.role), reverse=True)
        if victim.action == "shrink":
            holding = holding[: victim.tasks]
        for t in holding:
            events.append(
                TaskPreemptRequested(
                    t.job_id, t.task_id, t.attempt, f"preempted: {victim.reason}", now
                )
            )
    return events, dict(choice.over_counts)


def pool_rows(state: RegionState, view: PoolView) -> list[dict]:
    """What `mesh pool list` shows: per pool and kind, settings and the round's figures."""
    tree = state.pools
    sums: dict[str, dict[str, Resources]] = {"demand": {}, "allocation": {}}
    for name, per_leaf in (("demand", view.demand), ("allocation", view.allocation)):
        for leaf, amount in per_leaf.items():
            if leaf not in tree:
                continue
            for p in (leaf, *tree.ancestors(leaf)):
                sums[name][p] = sums[name].get(p, Resources()) + amount
    rows = []
    for path in tree.order:
        spec = tree[path]
        kinds = {}
        for kind in POOL_KINDS:
            r = spec.resource(kind)
            i = tree.index[path]
            limit = tree.limit[kind][i]
            kinds[kind] = {
                "reservation": format_amount(kind, r.reservation),
                "limit": "-" if limit is None else format_amount(kind, limit),
                "share": r.share,
                "type": str(r.type),
                "demand": format_amount(kind, getattr(sums["demand"].get(path, Resources()), kind)),
                "allocation": format_amount(
                    kind, getattr(sums["allocation"].get(path, Resources()), kind)
                ),
                "entitlement": format_amount(
                    kind, getattr(view.entitlement.get(path, Resources()), kind)
                ),
            }
        rows.append({"path": path, "leaf": tree.is_leaf(path), "kinds": kinds})
    return rows
