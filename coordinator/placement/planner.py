"""Commit a plan against the live view: optimistic concurrency for placement.

A plan is computed on a snapshot; by the time it is committed the region may have moved
(a node shrank or vanished, another plan landed first). The planner replays the plan on
the live allocations of the nodes it touches and keeps a job's placements only if every
one of them still fits, node and GPU alike, so no commit over-commits anything and no
gang is committed in part. Rejected jobs stay pending and are placed again next round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coordinator.placement.core import GangRequest, Placement, PlacementResult
from coordinator.placement.plugins import Shape, book, gpu_fits, request
from coordinator.placement.snapshot import NodeInfo, Snapshot, Working


def commit(
    plan: PlacementResult, gangs: Sequence[GangRequest], live: Mapping[str, NodeInfo]
) -> PlacementResult:
    """The part of `plan` that fits `live` (node id -> its current NodeInfo)."""
    shapes: dict[str, Shape] = {t.task_id: t.shape for g in gangs for t in g.tasks}
    touched = sorted({p.node_id for p in plan.placed})
    snap = Snapshot([live[n] for n in touched if n in live])
    w = Working(snap)
    by_job: dict[str, list[Placement]] = {}
    for p in plan.placed:
        by_job.setdefault(p.job_id, []).append(p)
    accepted: list[Placement] = []
    unplaced = dict(plan.unplaced)
    for job_id, placements in by_job.items():
        taken: list[tuple[int, Shape, tuple[int, ...]]] = []
        conflict = None
        for p in placements:
            took = _take(w, p, shapes[p.task_id])
            if took is None:
                conflict = p
                break
            taken.append(took)
        if conflict is None:
            accepted.extend(placements)
            continue
        for i, shape, slots in reversed(taken):
            book(w, i, shape, slots, -1)  # the job's earlier placements, given back
        unplaced[job_id] = (
            f"node {conflict.node_id} changed since the placement snapshot; placing again"
        )
    return PlacementResult(tuple(accepted), unplaced, plan.line_held_by)


def _take(w: Working, p: Placement, shape: Shape) -> tuple[int, Shape, tuple[int, ...]] | None:
    """Book `p` on the live rows if it still fits, by the placement filters' own GPU
    test: (row, shape, GPU slots), or None."""
    i = w.snap.index.get(p.node_id)
    if i is None or (w.free[i] < request(shape)).any():
        return None
    if shape.ports and w.ports_free[i] < shape.ports:
        return None
    uuids = w.snap.g_uuid[i]
    if any(u not in uuids for u in p.gpu_uuids):
        return None
    slots = tuple(uuids.index(u) for u in p.gpu_uuids)
    if slots and not gpu_fits(w, slice(i, i + 1), shape)[0][list(slots)].all():
        return None
    book(w, i, shape, slots)
    return i, shape, slots
