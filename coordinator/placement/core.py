"""The placement core: which node (and GPUs) each ready task goes to. Pure: a snapshot
and an ordered list of gangs in, a decision out; same snapshot, gangs and seed -> same
decision.

Filter -> score -> select, one gang at a time in the order given (the caller orders by
pool admission and priority). A gang's first `gang` tasks are placed all or nothing:
tried against the working copy, undone if one does not fit, so a gang that does not fit
reserves nothing. Whatever does not fit is explained: per reason, how many nodes the
filters turned away.

Speed comes from task shapes: tasks that ask for the same thing under the same
constraints share one feasibility-and-score array over all nodes, computed once and then
refreshed only for the nodes a placement changed since (a change log), so a task costs an
argmax over the nodes, not a pass of Python over them. Job-level terms (spread, pack,
anti-affinity) are added on top per job. Ties go to a seeded random order, not to the
first node, so equal nodes share the load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from coordinator.placement.plugins import (
    PROFILES,
    Pipeline,
    Profile,
    Shape,
    book,
    choose_gpus,
    copies_fitting,
    pipeline,
    rejections,
)
from coordinator.placement.snapshot import Snapshot, Working
from workloads.quantity import format_bytes, format_cpu, format_gpu

JOB_TERM_WEIGHT = 4.0  # spread/pack outweigh every profile score (each about 0..1)
TIE_BREAK = 1e-6
FULL_REFRESH = 0.25  # past this share of nodes changed, rescore all of them
# Up to this many changed nodes are rescored one by one with the plugins' scalar twins
# (a node costs about what numpy's per-call overhead costs for one ufunc).
SCALAR_REFRESH = 8


@dataclass(frozen=True, slots=True)
class TaskRequest:
    task_id: str
    shape: Shape


@dataclass(frozen=True, slots=True)
class GangRequest:
    """A job's pending tasks. The first `gang` of them start together or not at all; the
    rest are placed one by one, as room allows."""

    job_id: str
    tasks: tuple[TaskRequest, ...]
    gang: int = -1  # -1: all of them
    strategy: str = "binpack"  # binpack | spread | pack
    spread_by: str = "zone"  # zone | node
    anti_affinity: bool = False
    held: tuple[str, ...] = ()  # nodes already running this job's tasks (one entry per task)
    holds_line: bool = False  # starving: if it does not fit, nothing after it is placed

    @property
    def gang_size(self) -> int:
        return len(self.tasks) if self.gang < 0 else min(self.gang, len(self.tasks))


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    task_id: str
    node_id: str
    gpu_uuids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlacementResult:
    placed: tuple[Placement, ...]
    unplaced: Mapping[str, str]  # job_id -> why (some of) its tasks did not fit
    line_held_by: str = ""  # a starving gang that did not fit and blocked the rest


@dataclass(slots=True)
class _ShapeArrays:
    dynamic: Pipeline
    static_ok: np.ndarray  # what the snapshot alone allows
    static_score: np.ndarray  # static scores plus the tie-break; -inf where not static_ok
    total: np.ndarray  # static + dynamic score where feasible, -inf elsewhere
    seen: int  # how much of the change log it reflects
    hot: int = -1  # the node it last chose by a full argmax (see Placer._pick)


@dataclass(slots=True)
class _JobTerms:
    """What the job already holds, for spread, pack and anti-affinity."""

    per_node: dict[int, int] = field(default_factory=dict)
    zone_count: np.ndarray | None = None
    placed: int = 0


@dataclass(slots=True)
class _Undo:
    node: int
    free: np.ndarray
    g_alloc: np.ndarray
    g_free_mem: np.ndarray


class Placer:
    """One round of placement over one snapshot."""

    def __init__(self, snap: Snapshot, profile: Profile | None = None, seed: int = 0) -> None:
        self.snap = snap
        self.w = Working(snap)
        self.profile = profile or PROFILES["default"]
        self.jitter = np.random.default_rng(seed).random(len(snap)) * TIE_BREAK
        self.all = slice(None)  # every node: views, where an index array copies (2-3x)
        self.changes: list[int] = []
        self._run_node = -1  # the node the latest changes were all on, since _run_start
        self._run_start = 0
        self.shapes: dict[Shape, _ShapeArrays] = {}
        w = self.profile.weights
        # Scores that never fall on the node that takes a task (binpack, whole-GPU fit)
        # with weights >= 0, and constant ones: then the node a task just went to stays
        # the best for the next task of its shape while it still fits (see _pick).
        self._monotone = w.get("binpack", 0) >= 0 and w.get("gpu_fit", 0) >= 0
        # Per shape, the change-log position at which it was found to fit nowhere, and
        # its explanation then. Placements only take capacity, so both hold until an
        # undo gives back what was taken after that position (see _undo).
        self._dead: dict[Shape, int] = {}
        # Per shape, the change-log position at which it was found to fit somewhere:
        # that holds only until the next change (a backlog's window asks it of every
        # job before anything is placed, 4,000 times for some forty shapes).
        self._alive: dict[Shape, int] = {}
        self._rejections: dict[Shape, tuple[int, dict[str, int], str]] = {}

    # ------------------------------------------------------------ shape arrays

    def _refresh(self, arr: _ShapeArrays, idx, shape: Shape) -> None:
        ok, values = arr.dynamic.run(self.w, idx, shape)
        arr.total[idx] = np.where(ok, values + arr.static_score[idx], -np.inf)

    def _refresh_one(self, arr: _ShapeArrays, i: int, shape: Shape) -> None:
        if not arr.dynamic.scalar:
            self._refresh(arr, slice(i, i + 1), shape)
            return
        value = arr.dynamic.run_one(self.w.row(i), shape)
        arr.total[i] = -np.inf if value is None else value + arr.static_score[i]

    def _arrays(self, shape: Shape) -> np.ndarray:
        arr = self.shapes.get(shape)
        if arr is None:
            ok, values = pipeline(shape, self.profile, dynamic=False).run(self.w, self.all, shape)
            arr = _ShapeArrays(
                pipeline(shape, self.profile, dynamic=True),
                ok,
                np.where(ok, values + self.jitter, -np.inf),
                np.empty(len(self.snap)),
                len(self.changes),
            )
            self._refresh(arr, self.all, shape)
            self.shapes[shape] = arr
        elif arr.seen < len(self.changes):
            # Only nodes the shape's static filters allow: elsewhere -inf stands whatever
            # changed.
            stale = self.changes[arr.seen :]
            nodes = set(stale) if len(stale) > 1 else stale
            if len(nodes) <= SCALAR_REFRESH:
                static_ok = arr.static_ok
                for i in nodes:
                    if static_ok[i]:
                        self._refresh_one(arr, i, shape)
            elif len(stale) > FULL_REFRESH * len(self.snap):
                self._refresh(arr, self.all, shape)
            else:
                idx = np.array(sorted(nodes), dtype=np.int64)
                idx = idx[arr.static_ok[idx]]
                if len(idx):
                    self._refresh(arr, idx, shape)
            arr.seen = len(self.changes)
        return arr.total

    def fits_nowhere(self, shape: Shape) -> bool:
        """No node can take a task of `shape` as the round stands now."""
        if not len(self.snap) or shape in self._dead:
            return True
        at = len(self.changes)
        if self._alive.get(shape) == at:
            return False
        if np.isfinite(self._arrays(shape).max()):
            self._alive[shape] = at
            return False
        return True

    # ------------------------------------------------------------ one task

    def _job_terms(self, gang: GangRequest) -> _JobTerms | None:
        if gang.strategy == "binpack" and not gang.anti_affinity:
            return None
        terms = _JobTerms(zone_count=np.zeros(len(self.snap.zones)))
        for node_id in gang.held:
            i = self.snap.index.get(node_id)
            if i is not None:
                self._count(terms, i, +1)
        return terms

    def _count(self, terms: _JobTerms, i: int, delta: int) -> None:
        terms.per_node[i] = terms.per_node.get(i, 0) + delta
        if not terms.per_node[i]:
            del terms.per_node[i]
        terms.zone_count[self.snap.zone[i]] += delta
        terms.placed += delta

    def _candidates(self, shape: Shape, gang: GangRequest, terms: _JobTerms | None):
        total = self._arrays(shape)
        if terms is None:
            return total
        total = total.copy()
        held = np.fromiter(terms.per_node, dtype=np.int64, count=len(terms.per_node))
        if gang.strategy == "spread":
            share = 1.0 / (terms.placed + 1)
            if gang.spread_by == "zone":
                total -= JOB_TERM_WEIGHT * share * terms.zone_count[self.snap.zone]
            elif len(held):
                counts = np.fromiter(terms.per_node.values(), dtype=np.float64)
                total[held] -= JOB_TERM_WEIGHT * share * counts
        elif gang.strategy == "pack":
            # Fewest nodes: stay on nodes the job holds, and otherwise open the node that
            # takes most of what is left of it (then its zone's nodes).
            remaining = max(len(gang.tasks) - terms.placed + len(gang.held), 1)
            room = np.minimum(copies_fitting(self.w, shape), remaining) / remaining
            total += JOB_TERM_WEIGHT * room
            if terms.placed:
                total += (JOB_TERM_WEIGHT / 4) * (terms.zone_count[self.snap.zone] > 0)
                total[held] += 2 * JOB_TERM_WEIGHT
        if gang.anti_affinity and len(held):
            total[held] = -np.inf
        return total

    def _pick(self, shape: Shape, gang: GangRequest, terms: _JobTerms | None) -> int | None:
        """The best node for one task of `shape`, or None if none can take it.

        The fast path: when every node that changed since this shape's array was last
        refreshed is the one node it last chose, and the profile's scores never fall on
        a node that takes a task, that node is still the argmax (its score rose or
        stayed, the others did not move, ties went to it before): if it still fits, it
        is the answer, with no refresh and no argmax. Placing a gang or a run of equal
        jobs then costs one argmax per node filled, not one per task."""
        if shape in self._dead:
            return None
        arr = self.shapes.get(shape)
        if (
            terms is None
            and arr is not None
            and arr.hot >= 0
            and self._monotone
            and not shape.fractional
            and (
                arr.seen == len(self.changes)
                or (self._run_node == arr.hot and self._run_start <= arr.seen)
            )
            and self._fits(arr.hot, arr, shape)
        ):
            return arr.hot
        total = self._candidates(shape, gang, terms)
        i = int(np.argmax(total))
        if not np.isfinite(total[i]):
            base = self.shapes[shape].total
            if base is total or not np.isfinite(base.max()):
                self._dead[shape] = len(self.changes)
            return None
        if terms is None:
            self.shapes[shape].hot = i
        return i

    def _fits(self, i: int, arr: _ShapeArrays, shape: Shape) -> bool:
        """Whether node `i` passes the shape's dynamic filters (its static ones it passed
        when it was chosen)."""
        if arr.dynamic.scalar:
            return arr.dynamic.fits_one(self.w.row(i), shape)
        return bool(arr.dynamic.run(self.w, slice(i, i + 1), shape)[0][0])

    def _changed(self, i: int) -> None:
        if i != self._run_node:
            self._run_node, self._run_start = i, len(self.changes)
        self.changes.append(i)

    def _apply(self, i: int, shape: Shape, slots: tuple[int, ...], keep: bool) -> _Undo | None:
        w = self.w
        undo = None
        if keep:
            undo = _Undo(i, w.free[i].copy(), w.g_alloc[i].copy(), w.g_free_mem[i].copy())
        book(w, i, shape, slots)
        self._changed(i)
        return undo

    def _undo(self, undos: list[_Undo], start: int) -> None:
        """Give back a gang's partial placement: the nodes return to what they were at
        change-log position `start`, so what was known to fit nowhere before `start`
        still fits nowhere, and only later findings are forgotten."""
        for u in reversed(undos):
            self.w.free[u.node] = u.free
            self.w.g_alloc[u.node] = u.g_alloc
            self.w.g_free_mem[u.node] = u.g_free_mem
            self._changed(u.node)
        self._dead = {s: at for s, at in self._dead.items() if at <= start}
        self._rejections = {s: r for s, r in self._rejections.items() if r[0] <= start}
        for arr in self.shapes.values():
            arr.hot = -1  # a node given back is not known to be anyone's best any more

    # ------------------------------------------------------------ gangs

    def place(self, gangs: Iterable[GangRequest], budget: int | None = None) -> PlacementResult:
        """Place `gangs` in order; stop early once `budget` tasks are placed (the rest
        wait for the next round, which sees these placements), so one round of a huge
        backlog cannot hold the leader's event loop for seconds. `considered` lists the
        gangs that were looked at."""
        placed: list[Placement] = []
        unplaced: dict[str, str] = {}
        holder = ""
        self.considered: list[GangRequest] = []
        for gang in gangs:
            if budget is not None and len(placed) >= budget:
                break
            self.considered.append(gang)
            if holder:
                unplaced[gang.job_id] = (
                    f"waiting: job {holder} has waited long and holds the line until it fits"
                )
                continue
            why, gang_failed = self._place_gang(gang, placed)
            if why:
                unplaced[gang.job_id] = why
                if gang.holds_line and gang_failed:
                    holder = gang.job_id
        return PlacementResult(tuple(placed), unplaced, holder)

    def _place_gang(self, gang: GangRequest, out: list[Placement]) -> tuple[str, bool]:
        """Why (some of) the gang did not fit, and whether its all-or-nothing part failed."""
        if not len(self.snap):
            return "no ready nodes", True
        terms = self._job_terms(gang)
        start = len(self.changes)
        undos: list[_Undo] = []
        picks: list[Placement] = []
        need = gang.gang_size
        for k, task in enumerate(gang.tasks):
            i = self._pick(task.shape, gang, terms)
            if i is None:
                why = self._explain(gang, task, k, terms)
                if k < need:
                    if undos:
                        self._undo(undos, start)
                    return why, True
                out.extend(picks)
                return why, False
            slots = choose_gpus(self.w, i, task.shape) if task.shape.gpu else ()
            undo = self._apply(i, task.shape, slots, keep=need > 1)
            if undo is not None:
                undos.append(undo)
            if terms is not None:
                self._count(terms, i, +1)
            uuids = tuple(self.snap.g_uuid[i][j] for j in slots)
            picks.append(Placement(gang.job_id, task.task_id, self.snap.ids[i], uuids))
        out.extend(picks)
        return "", False

    def _explain(
        self, gang: GangRequest, task: TaskRequest, k: int, terms: _JobTerms | None
    ) -> str:
        if not len(self.snap):
            return "no ready nodes"
        # Counted once per shape: placements alone never make a rejecting node accept,
        # so within a round the first count stands until an undo forgets it.
        cached = self._rejections.get(task.shape)
        if cached is None:
            counts = rejections(self.w, task.shape)
            cached = (len(self.changes), counts, _reasons(counts))
            self._rejections[task.shape] = cached
        parts = cached[2]
        if gang.anti_affinity and terms is not None:
            taken = sum(1 for i in terms.per_node if np.isfinite(self._arrays(task.shape)[i]))
            if taken:
                parts = _reasons(
                    {**cached[1], "already run a task of this job (anti_affinity)": taken}
                )
        head = f"task {task.task_id} ({describe(task.shape)})"
        if gang.gang_size > 1 and k < gang.gang_size:
            head = f"gang of {gang.gang_size}: {k} placed, then {head}"
        return f"{head} fits no node: {parts}" if parts else f"{head} fits no node"


def _reasons(counts: Mapping[str, int]) -> str:
    return "; ".join(
        f"{n:,} node{'s' if n != 1 else ''}: {why}"
        for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


@lru_cache(maxsize=4096)
def describe(shape: Shape) -> str:
    cpu, memory, disk, gpu, gpu_memory = shape.resources
    parts = [f"cpu={format_cpu(cpu)}", f"memory={format_bytes(memory)}"]
    if disk:
        parts.append(f"disk={format_bytes(disk)}")
    if gpu:
        parts.append(f"gpu={format_gpu(gpu)}")
    if gpu_memory:
        parts.append(f"gpu_memory={format_bytes(gpu_memory)}")
    for key, value in shape.labels:
        parts.append(f"{key}={value}")
    if shape.isolation != "none":
        parts.append(f"isolation>={shape.isolation}")
    return " ".join(parts)


def place(
    snap: Snapshot,
    gangs: Iterable[GangRequest],
    profile: Profile | None = None,
    seed: int = 0,
    budget: int | None = None,
) -> PlacementResult:
    return Placer(snap, profile, seed).place(gangs, budget)


__all__ = [
    "GangRequest",
    "Placement",
    "PlacementResult",
    "Placer",
    "TaskRequest",
    "describe",
    "place",
]
