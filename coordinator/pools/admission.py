"""Admission: which pending jobs may leave their pool's queue now. A pure function.

As Peloton's ``pkg/resmgr/respool/admission.go``, per leaf pool and per kind the job needs:

- the pool's allocation plus the whole gang must stay within its entitlement;
- a non-preemptible gang must also keep the pool's non-preemptible allocation within its
  reservation: it may never stand on borrowed capacity, since that can be taken back.

Jobs are taken in priority order (higher first; equal priorities in the order given). A job
that does not fit does not stop the queue: up to ``lookahead`` jobs behind the first
blocked one are still tried, and any that fit are admitted (backfill). Only jobs that ask
for a kind the blocked job is short of count against the look-ahead: a CPU-only job
cannot delay a job waiting for GPUs, so it is never held back for it (with one mixed
queue, a region out of GPUs would otherwise admit 16 jobs a cycle). A non-preemptible
job blocked only by its reservation is set aside like Peloton's side queue and opens no
window; a job that can never fit (above its pool's limit; non-preemptible and above the
reservation) is reported as such, blocks nothing, and should be failed by the caller.

Backfill can starve a big job behind a stream of small ones. Against that, the caller may
pass how many cycles each job has waited (``waited``, returned updated each call) and
``hold_after``: a job blocked that long, which would fit once its pool's current allocation
drained (it is within the entitlement), stops backfill behind it until it is admitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.pools.jobs import PendingJob
from coordinator.pools.tree import POOL_KINDS, PoolTree, format_amount
from workloads.resources import NOTHING, Resources

__all__ = ["Admission", "admit"]


@dataclass(frozen=True, slots=True)
class Admission:
    """``admitted``: job ids, in the order they were admitted. ``blocked``: a reason for
    every other job, for the person who submitted it. ``never``: the blocked jobs that can
    never be admitted as their pool is configured. ``allocation`` / ``non_preemptible``:
    every leaf's allocations after the admitted jobs. ``waited``: cycles each blocked job
    has now waited (admitted jobs drop out); pass it to the next call."""

    admitted: list[str]
    blocked: dict[str, str]
    never: frozenset[str]
    allocation: dict[str, Resources]
    non_preemptible: dict[str, Resources]
    waited: dict[str, int]


def admit(
    tree: PoolTree,
    pending: Sequence[PendingJob],
    entitlement: Mapping[str, Resources],
    allocation: Mapping[str, Resources],
    non_preemptible: Mapping[str, Resources] | None = None,
    *,
    lookahead: int = 16,
    waited: Mapping[str, int] | None = None,
    hold_after: int | None = None,
) -> Admission:
    """Decide admission for ``pending`` (any order across pools; within a pool, the order
    given breaks priority ties). ``allocation[leaf]`` is what the leaf holds now and
    ``non_preemptible[leaf]`` the part of that held by non-preemptible jobs; ``entitlement``
    is :func:`compute_entitlement`'s result."""
    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    waited = waited or {}
    non_preemptible = non_preemptible or {}
    queues: dict[str, list[tuple[int, int, PendingJob]]] = {}
    blocked: dict[str, str] = {}
    never: set[str] = set()
    for n, job in enumerate(pending):
        if job.pool not in tree:
            blocked[job.job_id] = f"pool {job.pool}: no such pool"
            never.add(job.job_id)
        elif not tree.is_leaf(job.pool):
            blocked[job.job_id] = (f"pool {job.pool}: has child pools; jobs are submitted to "
                                   "leaf pools")
            never.add(job.job_id)
        else:
            queues.setdefault(job.pool, []).append((-job.priority, n, job))
    admitted: list[str] = []
    alloc_out: dict[str, Resources] = dict(allocation)
    np_out: dict[str, Resources] = dict(non_preemptible)
    for pool, queue in queues.items():
        queue.sort()  # by (-priority, position): positions differ, jobs are never compared
        _admit_pool(tree, pool, [j for _, _, j in queue], entitlement.get(pool, NOTHING),
                    alloc_out, np_out, lookahead, waited, hold_after, admitted, blocked, never)
    new_waited = {j: waited.get(j, 0) + 1 for j in blocked}
    return Admission(admitted, blocked, frozenset(never), alloc_out, np_out, new_waited)


def _vec(r: Resources) -> list[int]:
    return [r.cpu, r.memory, r.disk, r.gpu]


def _admit_pool(tree, pool, queue, ent_r, alloc_out, np_out, lookahead, waited, hold_after,
                admitted, blocked, never) -> None:
    ent = _vec(ent_r)
    alloc = _vec(alloc_out.get(pool, NOTHING))
    np_alloc = _vec(np_out.get(pool, NOTHING))
    reservation = [tree.reservation[k][tree.index[pool]] for k in POOL_KINDS]
    limit = [tree.limit[k][tree.index[pool]] for k in POOL_KINDS]

    # Per (need, preemptible): the answer depends on nothing else in this pool, and a
    # long queue held back by a limit asks it of every job, every cycle, in few shapes
    # (formatting the amounts was 60% of a leader holding a 70,000-job backlog).
    never_memo: dict[tuple[tuple[int, ...], bool], str | None] = {}

    def never_reason(need: list[int], preemptible: bool) -> str | None:
        key = (tuple(need), preemptible)
        if key not in never_memo:
            never_memo[key] = _never_reason(need, preemptible)
        return never_memo[key]

    def _never_reason(need: list[int], preemptible: bool) -> str | None:
        bad = [f"{_k(j)} job {_f(j, need[j])} > limit {_f(j, limit[j])}"
               for j in range(4) if limit[j] is not None and need[j] > limit[j]]
        if not bad and not preemptible:
            bad = [f"{_k(j)} job {_f(j, need[j])} > reservation {_f(j, reservation[j])} (a "
                   "non-preemptible job must fit in the reservation)"
                   for j in range(4) if need[j] > reservation[j]]
        return f"pool {pool}: can never be admitted: " + "; ".join(bad) if bad else None

    first_blocked: str | None = None
    short_kinds: list[int] = []  # the kinds first_blocked is short of
    budget = lookahead
    taken: list[Resources] = []
    np_taken: list[Resources] = []
    for pos, job in enumerate(queue):
        need = _vec(job.resources)
        if first_blocked is not None and any(need[j] for j in short_kinds):
            if budget == 0:
                _rest([job], f"pool {pool}: waiting behind blocked job {first_blocked}: "
                      f"the look-ahead of {lookahead} jobs past it is used up this cycle",
                      never_reason, blocked, never)
                continue
            budget -= 1
        reason = never_reason(need, job.preemptible)
        if reason:
            blocked[job.job_id] = reason
            never.add(job.job_id)
            continue
        over = [j for j in range(4) if need[j] and alloc[j] + need[j] > ent[j]]
        short = [f"{_k(j)} allocation {_f(j, alloc[j])} + job {_f(j, need[j])} > entitlement "
                 f"{_f(j, ent[j])}" for j in over]
        np_short = [] if job.preemptible else [
            f"{_k(j)} non-preemptible allocation {_f(j, np_alloc[j])} + job {_f(j, need[j])} > "
            f"reservation {_f(j, reservation[j])} (a non-preemptible job never runs on "
            "borrowed capacity)"
            for j in range(4) if need[j] and np_alloc[j] + need[j] > reservation[j]]
        if short or np_short:
            blocked[job.job_id] = f"pool {pool}: " + "; ".join(short + np_short)
            if first_blocked is None and job.preemptible:
                first_blocked = job.job_id  # a non-preemptible job is set aside instead
                short_kinds = over
            cycles = waited.get(job.job_id, 0) + 1
            # Holding the queue helps only a job short of entitlement that fits once the
            # pool's allocation drains: not one short of non-preemptible room.
            if (hold_after is not None and cycles > hold_after and short and not np_short
                    and all(need[j] <= ent[j] for j in range(4))):
                _rest(queue[pos + 1:], f"pool {pool}: held for job {job.job_id}, blocked "
                      f"{cycles} cycles, until it fits", never_reason, blocked, never)
                break
            continue
        for j in range(4):
            alloc[j] += need[j]
        taken.append(job.resources)
        if not job.preemptible:
            for j in range(4):
                np_alloc[j] += need[j]
            np_taken.append(job.resources)
        admitted.append(job.job_id)
    if taken:
        alloc_out[pool] = Resources.total(taken, alloc_out.get(pool, NOTHING))
    if np_taken:
        np_out[pool] = Resources.total(np_taken, np_out.get(pool, NOTHING))


def _rest(jobs, reason, never_reason, blocked, never) -> None:
    """Jobs not tried this cycle: why they wait, unless they can never be admitted."""
    for job in jobs:
        why = never_reason(_vec(job.resources), job.preemptible)
        if why:
            never.add(job.job_id)
        blocked[job.job_id] = why or reason


def _k(j: int) -> str:
    return POOL_KINDS[j]


def _f(j: int, amount: int) -> str:
    return format_amount(POOL_KINDS[j], amount)
