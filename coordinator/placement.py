"""The placement core: which node each ready task goes to. Pure: snapshot in, decision out.

Filter -> score -> select, one gang at a time in the order given (the caller orders
by priority). A gang is placed all or nothing: its tasks are tried against a scratch
copy of the free capacity and committed only if every one fits, so a gang that does
not fit reserves nothing. A gang that does not fit is explained: per reason, how many
nodes rejected its first unplaceable task.

Score is best fit: the node whose normalised leftover after the task is smallest, so
large holes stay open for large tasks. Ties go to the earlier node in the snapshot,
which the caller orders deterministically.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workloads.resources import Resources


@dataclass(frozen=True, slots=True)
class NodeCandidate:
    node_id: str
    capacity: Resources
    free: Resources
    simulated: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskRequest:
    task_id: str
    resources: Resources
    simulated: bool = False


@dataclass(frozen=True, slots=True)
class GangRequest:
    """Tasks that must start together or not at all (a job's pending tasks)."""

    job_id: str
    tasks: tuple[TaskRequest, ...]


@dataclass(frozen=True, slots=True)
class PlacementResult:
    placed: tuple[tuple[str, str], ...]  # (task_id, node_id)
    unplaced: Mapping[str, str]  # job_id -> why it did not fit


def filter_reason(node: NodeCandidate, free: Resources, task: TaskRequest) -> str | None:
    """Why `task` cannot go on `node` now, or None if it can."""
    if task.simulated and not node.simulated:
        return "real node (task is simulated)"
    if node.simulated and not task.simulated:
        return "simulated node (task runs a real command)"
    short = task.resources.shortfall(free)
    if short:
        return "insufficient " + ", ".join(short)
    return None


def best_fit_score(capacity: Resources, leftover: Resources) -> float:
    """Sum over resource kinds of the fraction left free; lower is a tighter fit."""
    score = 0.0
    for kind in Resources.KINDS:
        cap = getattr(capacity, kind)
        if cap > 0:
            score += getattr(leftover, kind) / cap
    return score


def explain(task: TaskRequest, rejects: Counter[str], total: int) -> str:
    if total == 0:
        return f"task {task.task_id} ({task.resources}): no ready nodes"
    parts = "; ".join(
        f"{n} node{'s' if n != 1 else ''}: {reason}" for reason, n in rejects.most_common()
    )
    return f"task {task.task_id} ({task.resources}) fits no node: {parts}"


def place(nodes: Sequence[NodeCandidate], gangs: Sequence[GangRequest]) -> PlacementResult:
    free = {n.node_id: n.free for n in nodes}
    placed: list[tuple[str, str]] = []
    unplaced: dict[str, str] = {}
    for gang in gangs:
        scratch: dict[str, Resources] = {}
        picks: list[tuple[str, str]] = []
        for task in gang.tasks:
            best: NodeCandidate | None = None
            best_score = 0.0
            rejects: Counter[str] = Counter()
            for node in nodes:
                avail = scratch.get(node.node_id, free[node.node_id])
                reason = filter_reason(node, avail, task)
                if reason is not None:
                    rejects[reason] += 1
                    continue
                score = best_fit_score(node.capacity, avail - task.resources)
                if best is None or score < best_score:
                    best, best_score = node, score
            if best is None:
                unplaced[gang.job_id] = explain(task, rejects, len(nodes))
                break
            scratch[best.node_id] = scratch.get(best.node_id, free[best.node_id]) - task.resources
            picks.append((task.task_id, best.node_id))
        else:
            free.update(scratch)
            placed.extend(picks)
    return PlacementResult(tuple(placed), unplaced)
