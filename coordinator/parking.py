"""Jobs that fit no node, set aside until something could make them fit. Pure.

A backlog that fits nowhere made every round re-place all of it, for every new job
that arrived. A job that fit no node would not fit on the same nodes again, so it is
parked until one of:
- a node whose grants moved since (the fold's journal) has room for one of its tasks
  (a job none of whose tasks fits any changed node still has only the nodes it had),
  and, for a gang that needs all its tasks at once, the ready nodes have room for as
  many tasks of each size as it has waiting (else a gang of 64 was looked at again on
  every release of one core);
- the ready nodes change;
- PARK_S passes: heartbeats move what is measured (GPU memory and load), which the
  grants do not show.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from coordinator.changes import Mark
from coordinator.placement import Snapshot
from coordinator.scheduling import PlacementConfig
from coordinator.state import JobRecord, RegionState
from workloads.lifecycle import TaskState

PARK_S = 1.0  # the longest a job that fit no node waits before it is looked at again

Need = tuple[int, int, int, int, int]  # one task's resources, in Resources.KINDS order


@dataclass(slots=True)
class Parking:
    ids: list[str]  # the ready nodes (the snapshot's) the jobs were parked on
    mark: Mark  # where the fold's journal of grants stood
    until: dict[str, float]  # job -> when to look again; in parking order
    why: dict[str, str]  # job -> why it waits
    # job -> how many waiting tasks need each size, and whether it needs them all at once
    needs: dict[str, tuple[dict[Need, int], bool]]


def parked(state: RegionState, snap: Snapshot, now: float) -> Parking:
    """The parked jobs for this round, those something may now fit let go."""
    p = state.memo.get("parking")
    granted = None if p is None else state.node_changes.since(p.mark)
    mark = state.node_changes.mark()
    if p is None or granted is None or (p.ids is not snap.ids and p.ids != snap.ids):
        p = Parking(snap.ids, mark, {}, {}, {})
        state.memo["parking"] = p
    else:
        p.ids, p.mark = snap.ids, mark
        if granted and p.why:
            _let_go_where_room(p, snap, granted)
    _let_go_expired(p, now)
    return p


def park(
    p: Parking,
    misfits: Iterable[str],
    state: RegionState,
    now: float,
    config: PlacementConfig,
    why: dict[str, str],
) -> None:
    """A gang that holds the line, or will within PARK_S, is not parked: it must be
    looked at to hold it (see `scheduling.holds_line`)."""
    soon = config.starve_after_s - PARK_S
    for job_id in misfits:
        job = state.jobs[job_id]
        if job.spec.placement.gang and len(job.tasks) > 1 and now - job.pending_since >= soon:
            continue
        p.until[job_id] = now + PARK_S
        p.why[job_id] = why[job_id]
        p.needs[job_id] = _needs(job)


def _needs(job: JobRecord) -> tuple[dict[Need, int], bool]:
    counts: dict[Need, int] = {}
    for t in job.tasks.values():
        if t.state == TaskState.PENDING:
            r = t.resources
            need = (r.cpu, r.memory, r.disk, r.gpu, r.gpu_memory)
            counts[need] = counts.get(need, 0) + 1
    # All at once: a gang without a smaller minimum (that one is checked task by task).
    whole = job.spec.placement.gang and job.spec.min_tasks is None
    return counts, whole


def _let_go(p: Parking, job_id: str) -> None:
    del p.until[job_id], p.why[job_id], p.needs[job_id]


def _let_go_where_room(p: Parking, snap: Snapshot, granted: set) -> None:
    """Room is counted per node and kind (not per GPU, not by labels): at worst a job
    is looked at in vain, never left parked while it could fit."""
    rows = [i for n in granted if (i := snap.index.get(n)) is not None]
    if not rows:
        return
    changed = snap.free[rows]
    room: dict[Need, bool] = {}  # fits some changed node
    slots: dict[Need, int] = {}  # tasks of this size the ready nodes have room for
    for job_id, (counts, whole) in list(p.needs.items()):
        if not any(_cached(room, need, lambda n: bool(_fits(changed, n).any())) for need in counts):
            continue
        if whole and any(
            _cached(slots, need, lambda n: _slots(snap.free, n)) < count
            for need, count in counts.items()
        ):
            continue
        _let_go(p, job_id)


def _cached(memo: dict, need: Need, compute):
    v = memo.get(need)
    if v is None:
        v = memo[need] = compute(need)
    return v


def _fits(free: np.ndarray, need: Need) -> np.ndarray:
    return (free >= np.array(need)).all(axis=1)


def _slots(free: np.ndarray, need: Need) -> int:
    d = np.array(need)
    kinds = d > 0
    if not kinds.any():
        return 1 << 62
    per_node = (np.maximum(free[:, kinds], 0) // d[kinds]).min(axis=1)
    return int(per_node.sum())


def _let_go_expired(p: Parking, now: float) -> None:
    """Parking order is expiry order (the clock moves on), so stop at the first job not
    due; one due more than PARK_S from now means the clock went back: due."""
    due = []
    for job_id, until in p.until.items():
        if now < until <= now + PARK_S:
            break
        due.append(job_id)
    for job_id in due:
        _let_go(p, job_id)
