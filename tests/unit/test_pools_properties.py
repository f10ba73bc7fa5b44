"""Hypothesis properties of entitlement over random trees, capacities and demands."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.pools import (
    PoolSpec,
    PoolTree,
    PoolType,
    ResourceSpec,
    compute_entitlement,
    wants,
)
from coordinator.pools._reference import reference_entitlement
from workloads.resources import Resources

KINDS = ("cpu", "gpu")  # the two kinds drawn at random; memory and disk stay zero


SHARES = [1, 1, 2, 3, 0.5, 1.5, 0.001]


class _Bytes:
    """Numbers read off a byte string hypothesis draws in one go: far cheaper than one
    draw per number (which costs ~100x more here), and it still shrinks towards 0."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def upto(self, hi: int) -> int:
        """0..hi inclusive (hi < 256)."""
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1] % (hi + 1)

    def pick(self, items):
        return items[self.upto(len(items) - 1)]


@st.composite
def trees(draw, max_pools: int = 10, big: bool = False):
    """A random valid tree (depth <= 4; reservations within the parent's, limits within the
    ancestors'), with a capacity, pending demands and allocations for its leaves."""
    b = _Bytes(draw(st.binary(min_size=240, max_size=240)))
    n = 1 + b.upto(max_pools - 1)
    unit = 10**9 if big else 1
    paths, depth = ["/"], {"/": 0}
    for i in range(n):
        parent = b.pick([p for p in paths if depth[p] < 4])
        path = parent.rstrip("/") + f"/p{i}"
        paths.append(path)
        depth[path] = depth[parent] + 1
    room: dict[tuple[str, str], int | None] = {("/", k): None for k in KINDS}
    cap_of: dict[tuple[str, str], int | None] = {("/", k): None for k in KINDS}
    specs = []
    for p in paths[1:]:
        parent = p.rsplit("/", 1)[0] or "/"
        kinds = {}
        for k in KINDS:
            left = room[(parent, k)]
            r = b.upto(30 if left is None else left)
            if left is not None:
                room[(parent, k)] = left - r
            room[(p, k)] = r
            inherited = cap_of[(parent, k)]
            top = max(r, 60 if inherited is None else inherited)
            limit = None if b.upto(1) else r + b.upto(top - r)
            cap_of[(p, k)] = limit if limit is not None else inherited
            kinds[k] = ResourceSpec(reservation=r * unit,
                                    limit=None if limit is None else limit * unit,
                                    share=b.pick(SHARES),
                                    type=b.pick([PoolType.ELASTIC, PoolType.STATIC]))
        specs.append(PoolSpec(p, **kinds))
    tree = PoolTree(tuple(specs))
    cap = Resources(cpu=b.upto(120) * unit, gpu=b.upto(120) * unit)
    leaves = tree.leaves()

    def some() -> dict[str, Resources]:
        return {p: Resources(cpu=b.upto(70) * unit, gpu=b.upto(70) * unit)
                for p in leaves if b.upto(1)}

    return tree, cap, some(), some()


def res(tree, p, k):
    return tree[p].resource(k).reservation


def is_static(tree, p, k):
    return tree[p].resource(k).type is PoolType.STATIC


@settings(max_examples=400, deadline=None)
@given(trees())
def test_matches_reference(case):
    tree, cap, demand, alloc = case
    assert compute_entitlement(tree, cap, demand, alloc) == \
        reference_entitlement(tree, cap, demand, alloc)


@settings(max_examples=150, deadline=None)
@given(trees(big=True))
def test_matches_reference_with_big_amounts(case):
    tree, cap, demand, alloc = case
    assert compute_entitlement(tree, cap, demand, alloc) == \
        reference_entitlement(tree, cap, demand, alloc)


@settings(max_examples=700, deadline=None)
@given(trees())
def test_invariants(case):
    tree, cap, demand, alloc = case
    ent = compute_entitlement(tree, cap, demand, alloc)
    want = wants(tree, demand, alloc)
    for k in KINDS:
        e = {p: getattr(r, k) for p, r in ent.items()}
        w = {p: getattr(r, k) for p, r in want.items()}
        assert e["/"] == getattr(cap, k)
        limit = {p: tree.effective_limit(p, k) for p in tree.order}
        for p in tree.order:
            assert e[p] >= 0
            # Never above its limit.
            assert limit[p] is None or e[p] <= limit[p], (k, p)
            kids = tree.children(p)
            if not kids:
                continue
            given_out = sum(e[c] for c in kids)
            # Children's entitlements sum to at most the parent's...
            assert given_out <= e[p], (k, p)
            # ...and something stays at the parent only if every child is at its limit.
            if given_out < e[p]:
                assert all(e[c] == limit[c] for c in kids), (k, p)
            # No leftover (phase 3) handed out while a sibling's want is unmet.
            if any(e[c] < w[c] for c in kids):
                assert all(e[c] <= w[c] for c in kids), (k, p)
            # A parent that covers its children's reservations guarantees each its
            # reservation: in full if static, else up to its demand.
            if e[p] >= sum(res(tree, c, k) for c in kids):
                for c in kids:
                    floor = res(tree, c, k) if is_static(tree, c, k) else min(res(tree, c, k), w[c])
                    assert e[c] >= floor, (k, c)
        # Work-conserving: above a leaf with unmet demand, every ancestor's own want is
        # unmet too (so, with the checks above, its parent gave out all it had and nothing
        # beyond any sibling's want) -- up to the first ancestor that sits at its limit.
        for leaf in tree.leaves():
            if e[leaf] < w[leaf]:
                for a in tree.ancestors(leaf)[:-1]:
                    if e[a] == limit[a]:
                        break
                    assert e[a] < w[a], (k, leaf, a)
        # With capacity for the top-level reservations, every reservation holds down the tree.
        if getattr(cap, k) >= sum(res(tree, c, k) for c in tree.children("/")):
            for p in tree.order[1:]:
                r = res(tree, p, k)
                assert e[p] >= (r if is_static(tree, p, k) else min(r, w[p])), (k, p)


@settings(max_examples=300, deadline=None)
@given(trees())
def test_static_reservation_held_at_zero_demand(case):
    tree, cap, _, _ = case
    ent = compute_entitlement(tree, cap, {})
    for k in KINDS:
        if getattr(cap, k) >= sum(res(tree, c, k) for c in tree.children("/")):
            for p in tree.order[1:]:
                if is_static(tree, p, k):
                    assert getattr(ent[p], k) >= res(tree, p, k), (k, p)


@settings(max_examples=500, deadline=None)
@given(trees(), st.data())
def test_raising_demand_never_lowers_own_entitlement(case, data):
    tree, cap, demand, alloc = case
    leaf = data.draw(st.sampled_from(tree.leaves()))
    k = data.draw(st.sampled_from(KINDS))
    more = data.draw(st.integers(1, 80))
    before = compute_entitlement(tree, cap, demand, alloc)
    old = demand.get(leaf, Resources())
    raised = {**demand, leaf: Resources(**{**old.to_dict(), k: getattr(old, k) + more})}
    after = compute_entitlement(tree, cap, raised, alloc)
    assert getattr(after[leaf], k) >= getattr(before[leaf], k)


@settings(max_examples=500, deadline=None)
@given(trees(), st.data())
def test_more_capacity_never_lowers_anyone(case, data):
    tree, cap, demand, alloc = case
    k = data.draw(st.sampled_from(KINDS))
    more = data.draw(st.integers(1, 80))
    before = compute_entitlement(tree, cap, demand, alloc)
    bigger = Resources(**{**cap.to_dict(), k: getattr(cap, k) + more})
    after = compute_entitlement(tree, bigger, demand, alloc)
    for p in tree.order:
        assert getattr(after[p], k) >= getattr(before[p], k), p
