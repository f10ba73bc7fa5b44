"""Jobs that fit no node, set aside until something could make them fit. Pure.

A backlog that fits nowhere made every round re-place all of it, for every new job
that arrived. A job that fit no node would not fit on the same nodes again, so it is
parked until one of:
- a node whose snapshot row changed since (its grants moved, or what its heartbeat
  measured: the snapshot's journal of rows) carries its labels and has room for one of
  its tasks (a job none of whose tasks fits any changed node still has only the nodes
  it had), and, for a gang that needs all its tasks at once, the ready nodes with its
  labels have room for as many tasks of each size as it waits for (else a gang of 64
  was looked at again on every release of one core);
- the ready nodes change (the snapshot is built whole: a new journal);
- a gang reaches the age at which it would hold the line (`scheduling.holds_line`).
Nothing else placement reads can change, so nothing else lets a job go: a parking that
ran out after 5 s made the 2,400 edge jobs a full region could not take be placed in
vain about 470 times a second, and those rounds were the slowest tenth of a latency run.

Jobs that admission says can never be admitted as the pools stand (above their pool's
limit, say) are parked too, until the pool tree is applied again: nothing else changes
that answer (a job's pending tasks only grow while none is placed). A backlog of 70,000
jobs held by a limit of zero was admitted again, window by window, for every batch of
new submits.

Jobs that can never fit the region as it is, whatever is free (`coordinator.fitting`:
a gang larger than the ready nodes, a task larger than any of them), are parked before
admission, until the ready nodes' capacity changes (`RegionFit.version`): they must not
count in admission's look-ahead (17 such gangs kept a pool's every other job waiting for
ever) nor hold the line.

Parking also keeps the waiting jobs it does not hold, in queue order (`looking`), from
the fold's journal of queue moves: a round looks at those without walking a queue of
thousands of parked jobs (which took a third of the leader's time at 5,000 nodes with
2,400 edge jobs parked and 20 new jobs a second).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from sortedcontainers import SortedDict

from coordinator.changes import Mark
from coordinator.placement import Snapshot
from coordinator.pools import PoolTree
from coordinator.records import JobRecord
from coordinator.scheduling import PlacementConfig
from coordinator.state import RegionState
from workloads.lifecycle import TaskState

Need = tuple[int, int, int, int, int]  # one task's resources, in Resources.KINDS order
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Needs:
    """What a parked job waits to find room for. Jobs alike share one (a backlog of
    thousands has a few dozen), so a round checks each once."""

    counts: tuple[tuple[Need, int], ...]  # waiting tasks per size, by size
    whole: bool  # all of them at once (a gang without a smaller minimum)
    labels: Labels  # every node it may use carries these


@dataclass(slots=True)
class Parking:
    mark: Mark  # where the snapshot's journal of rows stood
    queue_mark: Mark  # where the fold's journal of queue moves stood
    looking: SortedDict  # queue order -> job id: the waiting jobs not parked nor killed
    tree: PoolTree  # the pools the `never` jobs were found never admissible in
    why: dict[str, str] = field(default_factory=dict)  # job -> why it waits
    never: set[str] = field(default_factory=set)  # parked by admission, not for room
    fit_version: int = 0  # the RegionFit.version the `unfit` jobs were judged on
    unfit: set[str] = field(default_factory=set)  # can never fit the region as it is
    needs: dict[str, Needs] = field(default_factory=dict)
    alike: dict[Needs, set[str]] = field(default_factory=dict)  # the jobs with those needs
    # Gang -> when it holds the line, kept while it waits, parked or not (one heap entry)
    until: dict[str, float] = field(default_factory=dict)
    due: list[tuple[float, str]] = field(default_factory=list)  # heap of (until, gang)


def parked(state: RegionState, snap: Snapshot, now: float, fit_version: int = 0) -> Parking:
    """The parked jobs for this round, those something may now fit let go.
    `fit_version`: the region's `RegionFit.version` (what can ever fit it)."""
    p = state.memo.get("parking")
    rows = None if p is None else snap.row_changes.since(p.mark)
    queue_mark = state.queue_changes.mark()
    if p is None or rows is None:
        p = Parking(
            snap.mark, queue_mark, _waiting(state, {}), state.pools, fit_version=fit_version
        )
        state.memo["parking"] = p
    else:
        moved = state.queue_changes.since(p.queue_mark)
        p.mark, p.queue_mark = snap.mark, queue_mark
        if moved is None:
            p.looking = _waiting(state, p.why)
        else:
            _follow_queue(p, state, moved)
        if rows and p.alike:
            _let_go_where_room(p, state, snap, rows)
        if p.tree is not state.pools:
            # A new pool tree lets every never-admissible job go at once: one sort of
            # the queue, not an insertion each (72,000 held jobs took 0.9 s of a round
            # when their limit was lifted).
            p.tree = state.pools
            if p.never:
                for job_id in p.never:
                    del p.why[job_id]
                p.never.clear()
                p.looking = _waiting(state, p.why)
        if p.fit_version != fit_version:
            # The region's capacity changed: every job that could never fit it is
            # judged again (those that still cannot are parked again at once).
            p.fit_version = fit_version
            if p.unfit:
                for job_id in p.unfit:
                    del p.why[job_id]
                p.unfit.clear()
                p.looking = _waiting(state, p.why)
    _let_go_due(p, state, now)
    return p


def _waiting(state: RegionState, parked: Mapping[str, str]) -> SortedDict:
    return SortedDict((j.order, j.job_id) for j in state.pending_jobs() if j.job_id not in parked)


def _follow_queue(p: Parking, state: RegionState, moved: set) -> None:
    """Jobs that joined the queue look for room; jobs that left it (placed, killed) are
    no longer looked at, nor kept parked."""
    for job_id in moved:
        job = state.jobs[job_id]
        waits = job_id in state.waiting and not job.kill_requested
        if job_id in p.why:
            if not waits:
                _let_go(p, job_id, state)
        elif waits:
            p.looking[job.order] = job_id
        else:
            p.looking.pop(job.order, None)


def park(
    p: Parking,
    misfits: Iterable[str],
    state: RegionState,
    now: float,
    config: PlacementConfig,
    why: dict[str, str],
) -> None:
    """A gang that holds the line is not parked: it must be looked at to hold it (see
    `scheduling.holds_line`). One younger is parked until it is that old."""
    for job_id in misfits:
        job = state.jobs[job_id]
        if job.spec.placement.gang and len(job.tasks) > 1:
            until = job.pending_since + config.starve_after_s
            if now >= until:
                continue
            if job_id not in p.until:
                p.until[job_id] = until
                heapq.heappush(p.due, (until, job_id))
        needs = _needs(job)
        p.looking.pop(job.order, None)
        p.why[job_id] = why[job_id]
        p.needs[job_id] = needs
        p.alike.setdefault(needs, set()).add(job_id)


def park_never(p: Parking, never: Iterable[str], state: RegionState, why: dict[str, str]) -> None:
    """Jobs admission found can never be admitted as the pools stand."""
    for job_id in never:
        p.looking.pop(state.jobs[job_id].order, None)
        p.why[job_id] = why[job_id]
        p.never.add(job_id)


def park_unfit(p: Parking, unfit: Mapping[str, str], state: RegionState) -> None:
    """Jobs that can never fit the region as it is (`coordinator.fitting`)."""
    for job_id, why in unfit.items():
        p.looking.pop(state.jobs[job_id].order, None)
        p.why[job_id] = why
        p.unfit.add(job_id)


def _needs(job: JobRecord) -> Needs:
    counts: dict[Need, int] = {}
    for t in job.tasks.values():
        if t.state == TaskState.PENDING:
            r = t.resources
            need = (r.cpu, r.memory, r.disk, r.gpu, r.gpu_memory)
            counts[need] = counts.get(need, 0) + 1
    placement = job.spec.placement
    whole = placement.gang and job.spec.min_tasks is None
    return Needs(tuple(sorted(counts.items())), whole, placement.labels)


def _let_go(p: Parking, job_id: str, state: RegionState) -> None:
    del p.why[job_id]
    if job_id in p.never:
        p.never.discard(job_id)
    elif job_id in p.unfit:
        p.unfit.discard(job_id)
    else:
        needs = p.needs.pop(job_id)
        alike = p.alike[needs]
        alike.discard(job_id)
        if not alike:
            del p.alike[needs]
    job = state.jobs[job_id]
    if job_id in state.waiting and not job.kill_requested:
        p.looking[job.order] = job_id


def _let_go_where_room(p: Parking, state: RegionState, snap: Snapshot, changed: set) -> None:
    """Room is counted per node and kind (not per GPU, and not what GPUs measured): at
    worst a job is looked at in vain, never left parked while it could fit."""
    rows = np.fromiter(changed, dtype=np.int64, count=len(changed))
    masks: dict[Labels, np.ndarray] = {}
    for needs in [n for n in p.alike if _may_fit(n, snap, rows, masks)]:
        for job_id in list(p.alike[needs]):
            _let_go(p, job_id, state)


def _may_fit(needs: Needs, snap: Snapshot, rows: np.ndarray, masks: dict) -> bool:
    mask = masks.get(needs.labels)
    if mask is None:
        mask = masks[needs.labels] = _with_labels(snap, needs.labels)
    changed = snap.free[rows[mask[rows]]]
    if not any(bool((changed >= np.array(need)).all(axis=1).any()) for need, _ in needs.counts):
        return False
    if needs.whole:
        free = snap.free[mask]
        return all(_slots(free, need) >= count for need, count in needs.counts)
    return True


def _with_labels(snap: Snapshot, labels: Labels) -> np.ndarray:
    mask = np.ones(len(snap), dtype=bool)
    for key, value in labels:
        mask &= snap.label_mask(key, value)
    return mask


def _slots(free: np.ndarray, need: Need) -> int:
    d = np.array(need)
    kinds = d > 0
    if not kinds.any():
        return 1 << 62
    per_node = (np.maximum(free[:, kinds], 0) // d[kinds]).min(axis=1)
    return int(per_node.sum())


def gang_due(state: RegionState, now: float) -> bool:
    """Whether a parked gang has come to hold the line (so a round is not idle)."""
    p = state.memo.get("parking")
    return p is not None and bool(p.due) and p.due[0][0] <= now


def _let_go_due(p: Parking, state: RegionState, now: float) -> None:
    due = p.due
    while due and due[0][0] <= now:
        _, job_id = heapq.heappop(due)
        del p.until[job_id]
        if job_id in p.why:
            _let_go(p, job_id, state)
