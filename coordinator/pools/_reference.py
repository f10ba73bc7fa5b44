"""A straightforward reference implementation of :func:`compute_entitlement`.

Written for clarity, not speed: it walks the tree recursively pool by pool, recomputes each
pool's want from its whole subtree, keeps every amount in a per-pool dict, and finds the
water level with exact fractions. It must give exactly the same integers as the optimised
:mod:`coordinator.pools.entitlement`; the tests check that, and ``python -m bench
entitlement`` times both.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from coordinator.pools.tree import POOL_KINDS, ROOT, PoolTree, PoolType, _share_weight
from workloads.resources import Resources


def reference_entitlement(
    tree: PoolTree,
    capacity: Resources,
    demand: Mapping[str, Resources],
    allocation: Mapping[str, Resources] | None = None,
) -> dict[str, Resources]:
    allocation = allocation or {}
    out: dict[str, dict[str, int]] = {ROOT: {k: getattr(capacity, k) for k in POOL_KINDS}}

    def want(path: str, kind: str) -> int:
        kids = tree.children(path)
        if kids:
            w = sum(want(c, kind) for c in kids)
        else:
            w = getattr(demand.get(path, Resources()), kind) + \
                getattr(allocation.get(path, Resources()), kind)
        spec = tree[path].resource(kind)
        if spec.type is PoolType.STATIC:
            w = max(w, spec.reservation)
        limit = tree.effective_limit(path, kind)
        return w if limit is None else min(w, limit)

    def divide(path: str) -> None:
        kids = tree.children(path)
        if not kids:
            return
        for c in kids:
            out[c] = {}
        for kind in POOL_KINDS:
            total = out[path][kind]
            specs = {c: tree[c].resource(kind) for c in kids}
            wants = {c: want(c, kind) for c in kids}
            shares = {c: _share_weight(specs[c].share) for c in kids}
            grant = {}
            for c in kids:
                r = specs[c].reservation
                grant[c] = r if specs[c].type is PoolType.STATIC else min(wants[c], r)
            if sum(grant.values()) > total:
                scaled = _apportion(total, {c: g for c, g in grant.items()}, dict(grant))
                for c in kids:
                    out[c][kind] = scaled[c]
                continue
            left = total - sum(grant.values())
            unmet = {c: wants[c] - grant[c] for c in kids}
            extra = _apportion(left, shares, unmet)
            for c in kids:
                grant[c] += extra[c]
            left -= sum(extra.values())
            if left > 0:
                room = {}
                for c in kids:
                    limit = tree.effective_limit(c, kind)
                    room[c] = left if limit is None else limit - grant[c]
                extra = _apportion(left, shares, room)
                for c in kids:
                    grant[c] += extra[c]
            for c in kids:
                out[c][kind] = grant[c]
        for c in kids:
            divide(c)

    divide(ROOT)
    return {p: Resources(**out[p]) for p in tree.order}


def _apportion(total: int, weights: dict[str, int], caps: dict[str, int]) -> dict[str, int]:
    """Units handed out one at a time to the uncapped pool whose next unit is due first,
    (granted + 1) / weight, ties to the earlier pool: done by finding the exact water
    level with fractions, flooring, then handing out the remaining units one by one."""
    names = [n for n in weights if weights[n] > 0]  # dict order = sibling order
    if sum(caps[n] for n in names) <= total:
        return {n: caps.get(n, 0) if n in names else 0 for n in weights}
    # The water level: raise it past each pool's saturation point in turn.
    level = Fraction(0)
    open_ = sorted(names, key=lambda n: Fraction(caps[n], weights[n]))
    left = Fraction(total)
    while open_:
        w = sum(weights[n] for n in open_)
        first = open_[0]
        need = (Fraction(caps[first], weights[first]) - level) * w
        if need <= left:
            left -= need
            level = Fraction(caps[first], weights[first])
            open_.pop(0)
        else:
            level += left / w
            break
    got = {n: min(caps[n], int(weights[n] * level)) for n in names}
    rest = total - sum(got.values())
    while rest > 0:
        best = None
        for n in names:
            if got[n] < caps[n]:
                due = Fraction(got[n] + 1, weights[n])
                if best is None or due < best[0]:
                    best = (due, n)
        got[best[1]] += 1
        rest -= 1
    return {n: got.get(n, 0) for n in weights}
