"""Jobs that fit no node, set aside until something could make them fit. Pure.

A backlog that fits nowhere made every round re-place all of it, for every new job
that arrived. A job that fit no node would not fit on the same nodes again, so it is
parked until one of:
- a node whose grants moved since (the fold's journal) carries its labels and has room
  for one of its tasks (a job none of whose tasks fits any changed node still has only
  the nodes it had), and, for a gang that needs all its tasks at once, the ready nodes
  with its labels have room for as many tasks of each size as it waits for (else a gang
  of 64 was looked at again on every release of one core);
- the ready nodes change;
- its parking runs out, PARK_S to 1.5 x PARK_S (spread by job, so jobs parked in one
  round are not all looked at again in one round): heartbeats move what is measured
  (GPU memory and load), which the grants do not show. Kubernetes, for comparison,
  flushes its unschedulable pods after 5 minutes when no event moved them.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from coordinator.changes import Mark
from coordinator.placement import Snapshot
from coordinator.scheduling import PlacementConfig
from coordinator.state import JobRecord, RegionState
from workloads.lifecycle import TaskState

PARK_S = 5.0  # the shortest a job that fit no node is parked; the longest is 1.5 x this
MAX_PARK_S = 1.5 * PARK_S

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
    ids: list[str]  # the ready nodes (the snapshot's) the jobs were parked on
    mark: Mark  # where the fold's journal of grants stood
    why: dict[str, str] = field(default_factory=dict)  # job -> why it waits
    needs: dict[str, Needs] = field(default_factory=dict)
    alike: dict[Needs, set[str]] = field(default_factory=dict)  # the jobs with those needs
    until: dict[str, float] = field(default_factory=dict)  # job -> when to look again
    due: list[tuple[float, str]] = field(default_factory=list)  # heap of (until, job)


def parked(state: RegionState, snap: Snapshot, now: float) -> Parking:
    """The parked jobs for this round, those something may now fit let go."""
    p = state.memo.get("parking")
    granted = None if p is None else state.node_changes.since(p.mark)
    mark = state.node_changes.mark()
    if p is None or granted is None or (p.ids is not snap.ids and p.ids != snap.ids):
        p = Parking(snap.ids, mark)
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
    """A gang that holds the line, or may before its parking runs out, is not parked:
    it must be looked at to hold it (see `scheduling.holds_line`)."""
    soon = config.starve_after_s - MAX_PARK_S
    for job_id in misfits:
        job = state.jobs[job_id]
        if job.spec.placement.gang and len(job.tasks) > 1 and now - job.pending_since >= soon:
            continue
        spread = (zlib.crc32(job_id.encode()) % 1024) / 2048  # 0 to 0.5, fixed per job
        until = now + PARK_S * (1 + spread)
        needs = _needs(job)
        p.why[job_id] = why[job_id]
        p.needs[job_id] = needs
        p.alike.setdefault(needs, set()).add(job_id)
        p.until[job_id] = until
        heapq.heappush(p.due, (until, job_id))


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


def _let_go(p: Parking, job_id: str) -> None:
    needs = p.needs.pop(job_id)
    del p.why[job_id], p.until[job_id]  # its heap entry goes when due
    alike = p.alike[needs]
    alike.discard(job_id)
    if not alike:
        del p.alike[needs]


def _let_go_where_room(p: Parking, snap: Snapshot, granted: set) -> None:
    """Room is counted per node and kind (not per GPU): at worst a job is looked at in
    vain, never left parked while it could fit."""
    rows = np.array([i for n in granted if (i := snap.index.get(n)) is not None], dtype=np.int64)
    if not len(rows):
        return
    masks: dict[Labels, np.ndarray] = {}
    for needs in [n for n in p.alike if _may_fit(n, snap, rows, masks)]:
        for job_id in list(p.alike[needs]):
            _let_go(p, job_id)


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


def _let_go_expired(p: Parking, now: float) -> None:
    """A heap entry whose job was let go (or parked again since) is dropped when due.
    One due later than MAX_PARK_S from now means the clock went back: due."""
    due = p.due
    while due and (due[0][0] <= now or due[0][0] > now + MAX_PARK_S):
        until, job_id = heapq.heappop(due)
        if p.until.get(job_id) == until:
            _let_go(p, job_id)
