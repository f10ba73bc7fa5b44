"""Entitlement: how much of each kind every pool may hold now. A pure function.

Peloton's three-phase calculation (``pkg/resmgr/entitlement/non_revocable.go``), top-down,
each parent dividing its own entitlement among its children, kind by kind:

0. *Want.* A leaf wants what it holds plus what it has pending (``allocation + demand``);
   a parent wants the sum of its children's wants. A static pool wants at least its
   reservation. Every want is capped at the pool's (effective) limit.
1. *Reservations.* Each child is granted its reservation -- in full if static, else only
   up to its want (an elastic pool's idle reservation is lent). If the parent cannot cover
   these claims (capacity below the reservations), they are scaled down alike.
2. *Surplus by share.* What is left is water-filled among children whose want is not yet
   met, weighted by share, none past its want (hence never past its limit).
3. *Leftover.* If every want is met and something is still left, it is water-filled among
   all children by share up to their limits, so a pool that gets new work before the next
   recompute can start at once. What no child can take stays unassigned.

Every grant is an integer (millicores, bytes, milli-GPUs). Dividing ``n`` units by weights
is defined as handing them out one at a time, each to the child whose next unit is due
first (the smallest ``(granted + 1) / weight``; ties to the earlier path), skipping children
at their cap -- Jefferson's (D'Hondt's) apportionment, computed in closed form by
:func:`_fill`. Unlike rounding each exact share to nearest (Hamilton's method), it never
takes a unit from a child when there is more to divide, or when that child wants more, so
entitlement is monotone in capacity and in a pool's own demand.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from operator import add, le, sub

from coordinator.pools.jobs import PendingJob, RunningJob
from coordinator.pools.tree import NO_LIMIT, POOL_KINDS, ROOT, PoolTree, format_amount
from workloads.resources import Resources

__all__ = [
    "compute_entitlement",
    "demand_by_pool",
    "sum_by_pool",
    "reservation_shortfall",
    "wants",
]


def compute_entitlement(
    tree: PoolTree,
    capacity: Resources,
    demand: Mapping[str, Resources],
    allocation: Mapping[str, Resources] | None = None,
) -> dict[str, Resources]:
    """Every pool's entitlement, root (= ``capacity``) included, by path.

    ``demand[leaf]`` is what the leaf has pending (jobs not yet admitted) and
    ``allocation[leaf]`` what it holds (admitted or running); both are summed up the tree
    here, so they are given for leaves only; a pool missing from either has none.
    ``gpu_memory`` is not pooled and is 0 in every entitlement.
    """
    want_leaf = _leaf_wants(tree, demand, allocation)
    columns = [_entitle_kind(tree, k, _amount(capacity, k, "capacity"), want_leaf[j])
               for j, k in enumerate(POOL_KINDS)]
    return {p: Resources(c, m, d, g) for p, c, m, d, g in zip(tree.order, *columns, strict=True)}


def wants(
    tree: PoolTree,
    demand: Mapping[str, Resources],
    allocation: Mapping[str, Resources] | None = None,
) -> dict[str, Resources]:
    """Every pool's want as phase 0 above defines it (static floors and limits applied)."""
    want_leaf = _leaf_wants(tree, demand, allocation)
    columns = [_want_kind(tree, k, want_leaf[j]) for j, k in enumerate(POOL_KINDS)]
    return {p: Resources(c, m, d, g) for p, c, m, d, g in zip(tree.order, *columns, strict=True)}


def demand_by_pool(jobs: Iterable[PendingJob | RunningJob]) -> dict[str, Resources]:
    """Sum of ``job.resources`` per ``job.pool``: a leaf's pending demand from its queue."""
    return sum_by_pool((job.pool, job.resources) for job in jobs)


def sum_by_pool(items: Iterable[tuple[str, Resources]]) -> dict[str, Resources]:
    """Sum of the resources per pool, as ints until the end (it may see 100,000 jobs)."""
    acc: dict[str, list[int]] = {}
    for pool, r in items:
        v = acc.get(pool)
        if v is None:
            acc[pool] = [r.cpu, r.memory, r.disk, r.gpu]
        else:
            v[0] += r.cpu
            v[1] += r.memory
            v[2] += r.disk
            v[3] += r.gpu
    return {p: Resources(*v) for p, v in acc.items()}


def reservation_shortfall(tree: PoolTree, capacity: Resources) -> list[str]:
    """What the capacity cannot guarantee: for each kind where the root's children reserve
    more than ``capacity``, a line saying so (their phase-1 grants are then scaled down)."""
    out = []
    for k in POOL_KINDS:
        res = tree.reservation[k]
        total = sum(res[i] for i in tree.child_index[0])
        cap = getattr(capacity, k)
        if total > cap:
            out.append(f"{ROOT}: {k} reservations of its children sum to "
                       f"{format_amount(k, total)}, above the capacity {format_amount(k, cap)}")
    return out


# --------------------------------------------------------------------------- internals


def _amount(r: Resources, kind: str, what: str) -> int:
    v = getattr(r, kind)
    if v < 0:
        raise ValueError(f"{what}: {kind} must not be negative, got {v}")
    return v


def _leaf_wants(tree, demand, allocation) -> list[list[int]]:
    """Per kind, a list in ``tree.order`` of allocation + demand (leaves only)."""
    n = len(tree.order)
    cols = [[0] * n for _ in POOL_KINDS]
    c0, c1, c2, c3 = cols
    index, kids = tree.index, tree.child_index
    for what, given in (("demand", demand), ("allocation", allocation or {})):
        for path, r in given.items():
            i = index.get(path)
            if i is None:
                raise ValueError(f"{what}: unknown pool {path!r}")
            if kids[i]:
                raise ValueError(f"{what}: {path} is not a leaf; jobs are submitted to leaves")
            cpu, mem, disk, gpu = r.cpu, r.memory, r.disk, r.gpu
            if cpu < 0 or mem < 0 or disk < 0 or gpu < 0:
                raise ValueError(f"{what}: {path}: amounts must not be negative, got {r}")
            c0[i] += cpu
            c1[i] += mem
            c2[i] += disk
            c3[i] += gpu
    return cols


def _want_kind(tree: PoolTree, kind: str, want: list[int]) -> list[int]:
    """Phase 0: ``want`` holds the leaves' allocation + demand (0 for parents); returns
    every pool's want -- its own, or its children's summed, raised to its static floor and
    capped at its limit."""
    floor, ceiling = tree.floor[kind], tree.ceiling[kind]
    want = [f if w < f else c if w > c else w for w, f, c in zip(want, floor, ceiling, strict=True)]
    for p, lo, hi, *_ in reversed(tree.families[kind]):  # children before parents
        w = sum(want[lo:hi])
        f, c = floor[p], ceiling[p]
        want[p] = f if w < f else c if w > c else w
    return want


def _entitle_kind(tree: PoolTree, kind: str, capacity: int, want_leaf: list[int]) -> list[int]:
    want = _want_kind(tree, kind, want_leaf)
    ent = [0] * len(want)
    ent[0] = capacity
    for p, lo, hi, res, lim, weights, weight_sum, steps, unlimited in tree.families[kind]:
        e = ent[p]
        if not e:
            continue  # nothing to divide (entitlements start at 0)
        if hi - lo == 1:  # an only child: no division, just its cap
            cap = lim[0]
            ent[lo] = e if cap is None or cap >= e else cap
            continue
        # Phase 1: reservations -- in full if static (a static want is at least its
        # reservation), else up to the want.
        wants = want[lo:hi]
        claims = [w if w < r else r for w, r in zip(wants, res, strict=True)]
        claimed = sum(claims)
        if claimed >= e:  # the claims take it all (scaled alike if more than all)
            ent[lo:hi] = _fill(e, claims, claims) if claimed > e else claims
            continue
        e -= claimed
        unmet = sum(wants) - claimed
        if unmet >= e:
            # Phase 2: the surplus by share, none past its want.
            ent[lo:hi] = map(add, claims, _fill(e, weights, list(map(sub, wants, claims)), steps))
            continue
        # Every want met; phase 3: the leftover by share, up to each limit.
        e -= unmet
        if unlimited:
            extra = _spread(e, weights, weight_sum, steps)
        else:
            room = [e if c is None else c - w for c, w in zip(lim, wants, strict=True)]
            extra = _fill(e, weights, room, steps)
        ent[lo:hi] = map(add, wants, extra)
    return ent


def _fill(total: int, weights, caps: list[int], steps=None) -> list[int]:
    """Divide ``total`` units by ``weights`` (positive ints), item ``i`` taking at most
    ``caps[i]``, exactly as handing out one unit at a time to the uncapped item with the
    smallest ``(granted + 1) / weight`` (ties to the lower index) would. ``steps`` is
    ``lcm(weights) // weight`` per item, or None to compute it.

    Closed form: the real water level ``L`` (where ``sum(min(cap, w * L)) == total``) is
    found by capping the items whose cap lies at or below it; every other item gets
    ``floor(w * L)``; the fewer-than-n units left go out in due order.
    """
    if sum(caps) <= total:
        return list(caps)
    n = len(caps)
    ws = list(weights)
    open_caps = list(caps)  # NO_LIMIT once an item is settled, so it is never capped again
    fixed = [0] * n  # the settled items' grants
    if 0 in caps:  # nothing for these: settled at 0
        for i in range(n):
            if not caps[i]:
                ws[i] = 0
                open_caps[i] = NO_LIMIT
    left = total
    while True:
        s = sum(ws)
        floors = [w * left // s for w in ws]
        # An integer cap is at or below w * left / s iff it is at or below its floor.
        if not any(map(le, open_caps, floors)):
            break
        for i in range(n):
            if open_caps[i] <= floors[i]:
                fixed[i] = caps[i]
                left -= caps[i]
                ws[i] = 0
                open_caps[i] = NO_LIMIT
    rest = left - sum(floors)  # fewer than the open items
    out = list(map(add, floors, fixed))
    if rest:
        if steps is None:
            common = math.lcm(*[w for w in ws if w])
            steps = [common // w if w else 0 for w in ws]
        _hand_out(rest, out, [i for i in range(n) if ws[i]], steps, caps)
    return out


def _spread(total: int, weights, weight_sum: int, steps) -> list[int]:
    """:func:`_fill` without caps."""
    out = [w * total // weight_sum for w in weights]
    rest = total - sum(out)
    if rest:
        _hand_out(rest, out, range(len(out)), steps, None)
    return out


def _hand_out(rest: int, out: list[int], items, steps, caps) -> None:
    """The last ``rest`` units, one at a time, to the item whose next unit is due first:
    the smallest ``(out[i] + 1) / weight``, i.e. ``(out[i] + 1) * steps[i]``; ties to
    the lower index; never past ``caps[i]`` (each item here is below its cap)."""
    due = sorted([((out[i] + 1) * steps[i], i) for i in items])
    last = due[rest - 1]
    # Usually each of the first `rest` items in due order takes one unit and is done: no
    # item's second unit falls due before the last of those first units.
    if all(((out[i] + 2) * steps[i], i) > last for _, i in due[:rest]):
        for _, i in due[:rest]:
            out[i] += 1
        return
    heap = due  # a sorted list is a heap
    while rest:
        _, i = heapq.heappop(heap)
        out[i] += 1
        rest -= 1
        if caps is None or out[i] < caps[i]:
            heapq.heappush(heap, ((out[i] + 1) * steps[i], i))
