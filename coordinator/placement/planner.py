"""Commit a plan against the live view: optimistic concurrency for placement.

A plan is computed on a snapshot; by the time it is committed the region may have moved
(a node shrank or vanished, another plan landed first). The planner replays the plan on
the live allocations of the nodes it touches and keeps a job's placements only if every
one of them still fits, node and GPU alike, so no commit over-commits anything and no
gang is committed in part. Rejected jobs stay pending and are placed again next round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from coordinator.placement.core import GangRequest, Placement, PlacementResult
from coordinator.placement.plugins import Shape
from coordinator.placement.snapshot import WHOLE, NodeInfo, Snapshot, Working


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
        rows = {w.snap.index[p.node_id] for p in placements if p.node_id in w.snap.index}
        saved = {i: (w.free[i].copy(), w.g_alloc[i].copy(), w.g_free_mem[i].copy()) for i in rows}
        conflict = next((p for p in placements if not _take(w, p, shapes[p.task_id])), None)
        if conflict is None:
            accepted.extend(placements)
            continue
        for i, (free, g_alloc, g_free_mem) in saved.items():
            w.free[i], w.g_alloc[i], w.g_free_mem[i] = free, g_alloc, g_free_mem
        unplaced[job_id] = (
            f"node {conflict.node_id} changed since the placement snapshot; placing again"
        )
    return PlacementResult(tuple(accepted), unplaced, plan.line_held_by)


def _take(w: Working, p: Placement, shape: Shape) -> bool:
    i = w.snap.index.get(p.node_id)
    if i is None:
        return False
    need = np.asarray(shape.resources)
    if (w.free[i] < need).any():
        return False
    uuids = w.snap.g_uuid[i]
    each = shape.gpu if shape.fractional else WHOLE
    slots = []
    for uuid in p.gpu_uuids:
        if uuid not in uuids:
            return False
        j = uuids.index(uuid)
        fits = w.g_free_mem[i, j] >= shape.gpu_memory_each and (
            w.g_alloc[i, j] + each <= WHOLE if shape.fractional else w.g_alloc[i, j] == 0
        )
        if not fits:
            return False
        slots.append(j)
    w.free[i] -= need
    for j in slots:
        w.g_alloc[i, j] += each
        w.g_free_mem[i, j] -= shape.gpu_memory_each
    return True
