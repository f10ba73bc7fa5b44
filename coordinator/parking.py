"""Jobs that fit no node, set aside until something could make them fit. Pure.

A backlog that fits nowhere made every round re-place all of it, for every new job
that arrived. A job that fit no node would not fit on the same nodes again, so it is
parked until one of:
- a node whose grants moved since (the fold's journal) has room for one of its tasks
  (a job none of whose tasks fits any changed node still has only the nodes it had);
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
    needs: dict[str, frozenset[Need]]  # job -> its waiting tasks' distinct resources


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


def _needs(job: JobRecord) -> frozenset[Need]:
    needs = set()
    for t in job.tasks.values():
        if t.state == TaskState.PENDING:
            r = t.resources
            needs.add((r.cpu, r.memory, r.disk, r.gpu, r.gpu_memory))
    return frozenset(needs)


def _let_go(p: Parking, job_id: str) -> None:
    del p.until[job_id], p.why[job_id], p.needs[job_id]


def _let_go_where_room(p: Parking, snap: Snapshot, granted: set) -> None:
    """Node-level room is checked (not per GPU, not labels): at worst a job is looked
    at in vain, never left parked while it could fit."""
    rows = [i for n in granted if (i := snap.index.get(n)) is not None]
    if not rows:
        return
    free = snap.free[rows]
    room: dict[Need, bool] = {}
    for job_id, needs in list(p.needs.items()):
        for need in needs:
            fits = room.get(need)
            if fits is None:
                fits = room[need] = bool((free >= np.array(need)).all(axis=1).any())
            if fits:
                _let_go(p, job_id)
                break


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
