"""Preemption choice: which gangs to shrink or stop so that a pool gets what it is owed.

A pure function, run once per preemption cycle. Definitions, per leaf pool and kind:

- *over*: allocation above entitlement. A pool becomes a *donor* only once it has been
  over for ``cycles`` consecutive calls (hysteresis, Peloton's 5 cycles): the caller
  passes each pool's count in and gets the updated counts back.
- *claimant*: a pool below its entitlement with pending demand. It is *owed*
  ``min(entitlement - allocation, demand)``, less what is free in the cluster now
  (``capacity`` minus all allocations; claimants, most owed first, take the free part in
  turn). What remains is its *need*; only donors' capacity above their entitlement can
  meet it.

For each claimant with a need, in turn:

1. Donors are ranked furthest above entitlement first (largest overage, as a fraction of
   capacity, in a kind the claimant needs; then path). Within a donor, candidates go lowest
   priority first, then shortest running. Non-preemptible jobs are never candidates, and a
   donor gives only while it is still above its entitlement in a needed kind.
2. Elastic jobs shrink first, in that order, by as few tasks as cover the need, never
   below their ``min_tasks``, before anything is killed.
3. If need remains, whole gangs are stopped: take the shortest prefix of the ranked
   candidates that frees enough (or all there is, if nothing does), then within that prefix
   the fewest gangs that still free enough (largest contribution first, then any gang
   whose removal still leaves enough is spared, most valuable first). So the victims never
   reach further up the ranking than needed, and among those, as few gangs as possible die.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from coordinator.pools.jobs import RunningJob
from coordinator.pools.tree import POOL_KINDS, PoolTree, format_amount
from workloads.resources import NOTHING, Resources

__all__ = ["Victim", "VictimChoice", "any_over_entitlement", "choose_victims"]


@dataclass(frozen=True, slots=True)
class Victim:
    """``action`` is ``"shrink"`` (stop ``tasks`` of an elastic job's tasks, keeping it
    running) or ``"kill"`` (stop the whole gang; ``tasks`` is all of them). ``frees`` is what
    that releases; ``claimant`` the pool it is taken for, which ``reason`` names."""

    job_id: str
    pool: str
    action: str
    tasks: int
    frees: Resources
    claimant: str
    reason: str


class VictimChoice(NamedTuple):
    victims: list[Victim]
    over_counts: dict[str, int]


def any_over_entitlement(
    allocation: Mapping[str, Resources], entitlement: Mapping[str, Resources]
) -> bool:
    """Whether a leaf holds more than its entitlement in what victims are chosen by.
    When none does (`allocation` may be a superset of what `choose_victims` sums: it may
    include jobs being reclaimed), `choose_victims` finds no donor and carries no count:
    no victims, empty counts, without building the running-job list it needs."""
    for pool, held in allocation.items():
        ent = _vec(entitlement.get(pool, NOTHING))
        if any(a > e for a, e in zip(_vec(held), ent, strict=True)):
            return True
    return False


def choose_victims(
    tree: PoolTree,
    capacity: Resources,
    entitlement: Mapping[str, Resources],
    running: Sequence[RunningJob],
    demand: Mapping[str, Resources],
    over_counts: Mapping[str, int],
    *,
    cycles: int,
) -> VictimChoice:
    """Victims for this cycle and every leaf's updated consecutive-over count.

    ``running``: every admitted job (its pool's allocation is their sum). ``demand[leaf]``:
    what the leaf has pending. ``over_counts``: the counts this returned last cycle.
    ``cycles``: how many consecutive cycles over entitlement make a pool a donor (>= 1).
    """
    if cycles < 1:
        raise ValueError(f"cycles must be >= 1, got {cycles}")
    cap = _vec(capacity)
    alloc: dict[str, list[int]] = {}
    for job in running:
        if job.pool not in tree or not tree.is_leaf(job.pool):
            raise ValueError(f"job {job.job_id}: pool {job.pool} is not a leaf pool")
        a = alloc.setdefault(job.pool, [0, 0, 0, 0])
        for j, v in enumerate(_vec(job.resources)):
            a[j] += v
    ent = {p: _vec(entitlement.get(p, NOTHING)) for p in tree.leaves()}
    counts: dict[str, int] = {}
    for p, a in alloc.items():
        if any(a[j] > ent[p][j] for j in range(4)):
            counts[p] = over_counts.get(p, 0) + 1
    donors = {p for p, n in counts.items() if n >= cycles}

    free = [max(0, cap[j] - sum(a[j] for a in alloc.values())) for j in range(4)]
    claims = []
    for p, d in demand.items():
        if p not in ent:
            raise ValueError(f"demand: {p} is not a leaf pool")
        a = alloc.get(p, [0, 0, 0, 0])
        owed = [max(0, min(ent[p][j] - a[j], v)) for j, v in enumerate(_vec(d))]
        if any(owed):
            weight = max(owed[j] / cap[j] for j in range(4) if cap[j]) if any(cap) else 0.0
            claims.append((-weight, p, owed))
    claims.sort()

    # What donors still hold above their entitlement, as victims are chosen; each donor's
    # candidates in the order they go (lowest priority, then shortest running, first).
    overage = {p: [alloc[p][j] - ent[p][j] for j in range(4)] for p in donors}
    queue: dict[str, list[RunningJob]] = {p: [] for p in donors}
    for job in running:
        if job.pool in donors and job.preemptible:
            queue[job.pool].append(job)
    for jobs in queue.values():
        jobs.sort(key=lambda j: (j.priority, j.running_for, j.job_id))
    elastic = {p: [j for j in jobs if j.shrinkable] for p, jobs in queue.items()}
    tasks_left = {j.job_id: j.tasks for jobs in queue.values() for j in jobs}
    shrunk: dict[str, Victim] = {}
    killed: dict[str, Victim] = {}
    for _, claimant, owed in claims:
        take_free = [min(o, f) for o, f in zip(owed, free, strict=True)]
        free = [f - t for f, t in zip(free, take_free, strict=True)]
        need = [o - t for o, t in zip(owed, take_free, strict=True)]
        if not any(need):
            continue
        why_claim = _owed_text(claimant, need)
        ranked = _rank_donors(overage, need, cap, exclude=claimant)
        # Shrink elastic jobs first.
        for pool in ranked:
            over = overage[pool]
            for job in elastic[pool]:
                if not any(need[j] > 0 and over[j] > 0 for j in range(4)):
                    break
                spare = job.shrinkable - (job.tasks - tasks_left[job.job_id])
                if spare <= 0:
                    continue
                per = _vec(job.per_task)
                useful = [j for j in range(4) if need[j] > 0 and per[j] > 0 and over[j] > 0]
                if not useful:
                    continue
                by_need = max(-(-need[j] // per[j]) for j in useful)
                by_over = max(-(-over[j] // per[j]) for j in useful)
                n = min(spare, by_need, by_over)
                _take(need, over, [v * n for v in per])
                tasks_left[job.job_id] -= n
                gone = job.tasks - tasks_left[job.job_id]
                shrunk[job.job_id] = Victim(
                    job.job_id, pool, "shrink", gone, _res([v * gone for v in per]), claimant,
                    f"shrink {job.job_id} by {_tasks(gone)} of {job.tasks} "
                    f"(min {job.min_tasks}) {_over_text(pool, alloc, ent, counts)}; "
                    f"{why_claim}")
        if not any(need):
            continue
        # Then stop whole gangs: the shortest covering prefix, then the fewest within it.
        prefix, sim_need = [], list(need)
        for pool in ranked:
            over = list(overage[pool])
            for job in queue[pool]:
                if not any(sim_need[j] > 0 and over[j] > 0 for j in range(4)):
                    break
                if job.job_id in killed:
                    continue
                held = _held(job, tasks_left)
                if any(sim_need[j] > 0 and held[j] > 0 and over[j] > 0 for j in range(4)):
                    prefix.append((job, held))
                    _take(sim_need, over, held)
            if not any(sim_need):
                break
        target = [min(need[j], sum(h[j] for _, h in prefix)) for j in range(4)]
        for job, held in _fewest(prefix, target):
            _take(need, overage[job.pool], held)
            tasks_left[job.job_id] = 0
            shrunk.pop(job.job_id, None)
            killed[job.job_id] = Victim(
                job.job_id, job.pool, "kill", job.tasks, job.resources, claimant,
                f"stop {job.job_id} (all {_tasks(job.tasks)}, priority {job.priority}) "
                f"{_over_text(job.pool, alloc, ent, counts)}; {why_claim}")
    victims = sorted([*shrunk.values(), *killed.values()],
                     key=lambda v: (v.action != "shrink", v.pool, v.job_id))
    return VictimChoice(victims, counts)


def _vec(r: Resources) -> list[int]:
    return [r.cpu, r.memory, r.disk, r.gpu]


def _res(v: list[int]) -> Resources:
    return Resources(v[0], v[1], v[2], v[3])


def _take(need: list[int], over: list[int], frees: list[int]) -> None:
    for j in range(4):
        need[j] = max(0, need[j] - frees[j])
        over[j] -= frees[j]


def _held(job: RunningJob, tasks_left: Mapping[str, int]) -> list[int]:
    """What the job holds now: all of it, less any tasks already shrunk away."""
    left = tasks_left[job.job_id]
    if left == job.tasks:
        return _vec(job.resources)
    return [v * left for v in _vec(job.per_task)]


def _rank_donors(overage, need, cap, exclude) -> list[str]:
    """Donors still over in a kind the claimant needs, furthest over (as a fraction of
    capacity) first, then by path."""
    scored = []
    for p, over in overage.items():
        if p == exclude:
            continue
        fractions = [over[j] / cap[j] for j in range(4) if need[j] > 0 and over[j] > 0 and cap[j]]
        if fractions:
            scored.append((-max(fractions), p))
    return [p for _, p in sorted(scored)]


def _fewest(prefix: list[tuple[RunningJob, list[int]]], target: list[int]):
    """A small subset of ``prefix`` (ranked, most expendable first) freeing ``target``:
    greedily the gang covering most of what is still needed, then drop any gang, least
    expendable first, whose removal still leaves enough."""
    kinds = [j for j in range(4) if target[j] > 0]
    if not kinds:
        return []
    left = list(target)
    chosen: list[int] = []
    rest = list(range(len(prefix)))
    while any(left[j] > 0 for j in kinds):
        def gain(i: int) -> float:
            held = prefix[i][1]
            return sum(min(held[j], left[j]) / target[j] for j in kinds if left[j] > 0)
        best = max(rest, key=lambda i: (gain(i), -i))
        rest.remove(best)
        chosen.append(best)
        for j in kinds:
            left[j] = max(0, left[j] - prefix[best][1][j])
    for i in sorted(chosen, reverse=True):  # least expendable first
        others = [c for c in chosen if c != i]
        if all(sum(prefix[c][1][j] for c in others) >= target[j] for j in kinds):
            chosen = others
    return [prefix[i] for i in sorted(chosen)]


def _tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"


def _over_text(pool, alloc, ent, counts) -> str:
    parts = [f"{k} allocation {format_amount(k, alloc[pool][j])} > entitlement "
             f"{format_amount(k, ent[pool][j])}"
             for j, k in enumerate(POOL_KINDS) if alloc[pool][j] > ent[pool][j]]
    return f"in {pool}, over its entitlement for {counts[pool]} cycles ({', '.join(parts)})"


def _owed_text(claimant: str, need: list[int]) -> str:
    parts = [f"{k} {format_amount(k, need[j])}" for j, k in enumerate(POOL_KINDS) if need[j]]
    return (f"for {claimant}, which is below its entitlement with work pending and is owed "
            f"{', '.join(parts)} held by pools over theirs")
