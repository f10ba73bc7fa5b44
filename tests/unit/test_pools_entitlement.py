"""Entitlement: worked examples, the integer division, and agreement with the reference."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.pools import (
    compute_entitlement,
    demand_by_pool,
    parse_pool_tree,
    reservation_shortfall,
    wants,
)
from coordinator.pools.entitlement import _fill
from coordinator.pools.jobs import PendingJob
from workloads.resources import Resources

PELOTON = parse_pool_tree("""
pools:
  /rp1: {cpu: {reservation: 20, limit: 100, share: 1}}
  /rp2: {cpu: {reservation: 20, limit: 100, share: 1}}
  /rp3: {cpu: {reservation: 20, limit: 100, share: 1}}
""")


def cores(**by_pool: int) -> dict[str, Resources]:
    return {"/" + p: Resources(cpu=v * 1000) for p, v in by_pool.items()}


def cpu_of(ent: dict[str, Resources]) -> dict[str, int]:
    return {p: r.cpu for p, r in ent.items()}


def test_peloton_user_guide_example():
    """docs/user-guide.md: 100 units, three pools res 20 / limit 100 / share 1."""
    cap = Resources(cpu=100_000)
    ent = compute_entitlement(PELOTON, cap, cores(rp1=10, rp2=80, rp3=80))
    assert cpu_of(ent) == {"/": 100_000, "/rp1": 10_000, "/rp2": 45_000, "/rp3": 45_000}
    ent = compute_entitlement(PELOTON, cap, cores(rp1=50, rp2=80, rp3=80))
    # 100 cores = 100000m over three: one pool gets the odd millicore, the first by path.
    assert cpu_of(ent) == {"/": 100_000, "/rp1": 33_334, "/rp2": 33_333, "/rp3": 33_333}


def test_peloton_example_in_whole_units_is_exact():
    """The same example counted in whole GPUs (milli-GPU 1000s) shows the remainder rule."""
    tree = parse_pool_tree("""
pools:
  /rp1: {gpu: {reservation: 20, limit: 100}}
  /rp2: {gpu: {reservation: 20, limit: 100}}
  /rp3: {gpu: {reservation: 20, limit: 100}}
""")
    dem = {f"/rp{i}": Resources(gpu=v * 1000) for i, v in ((1, 50), (2, 80), (3, 80))}
    ent = compute_entitlement(tree, Resources(gpu=100_000), dem)
    assert [ent[f"/rp{i}"].gpu for i in (1, 2, 3)] == [33_334, 33_333, 33_333]


def test_allocation_counts_as_demand():
    cap = Resources(cpu=100_000)
    split = compute_entitlement(PELOTON, cap, cores(rp1=5, rp2=40, rp3=80),
                                cores(rp1=5, rp2=40))
    whole = compute_entitlement(PELOTON, cap, cores(rp1=10, rp2=80, rp3=80))
    assert split == whole


def test_leftover_spread_by_share_up_to_limit():
    """Phase 3: with every want met, the rest goes to all children by share, capped."""
    tree = parse_pool_tree("""
pools:
  /a: {cpu: {reservation: 10, limit: 30, share: 1}}
  /b: {cpu: {reservation: 10, limit: 100, share: 3}}
""")
    ent = compute_entitlement(tree, Resources(cpu=100_000), cores(a=5, b=5))
    # a: 5 + min(cap 25, ...) ; b gets the rest: the leftover 90 splits 1:3 -> 22.5/67.5.
    assert ent["/a"].cpu == 5_000 + 22_500
    assert ent["/b"].cpu == 5_000 + 67_500
    ent = compute_entitlement(tree, Resources(cpu=200_000), cores())
    assert ent["/a"].cpu == 30_000  # limit
    assert ent["/b"].cpu == 100_000  # limit; 70 cores stay unassigned at the root


def test_elastic_reservation_counts_only_up_to_demand():
    tree = parse_pool_tree("""
pools:
  /idle: {cpu: {reservation: 50, limit: 100}}
  /busy: {cpu: {reservation: 10, limit: 100}}
""")
    ent = compute_entitlement(tree, Resources(cpu=100_000), cores(idle=0, busy=100))
    assert ent["/idle"].cpu == 0 and ent["/busy"].cpu == 100_000  # idle reservation lent


def test_static_reservation_held_at_zero_demand_and_never_lent():
    tree = parse_pool_tree("""
pools:
  /idle: {cpu: {reservation: 50, limit: 100, type: static}}
  /busy: {cpu: {reservation: 10, limit: 100}}
""")
    ent = compute_entitlement(tree, Resources(cpu=100_000), cores(idle=0, busy=100))
    assert ent["/idle"].cpu == 50_000 and ent["/busy"].cpu == 50_000


def test_static_reservation_below_an_elastic_parent_is_held():
    """A static leaf's reservation is part of its ancestors' want, so it is held all the way
    down even when nothing in the subtree asks for anything."""
    tree = parse_pool_tree("""
pools:
  /ml: {cpu: {reservation: 40, limit: 100}}
  /ml/train: {cpu: {reservation: 30, type: static}}
  /ml/dev: {cpu: {reservation: 10}}
  /web: {cpu: {reservation: 0}}
""")
    ent = compute_entitlement(tree, Resources(cpu=100_000), cores(web=1000))
    assert ent["/ml/train"].cpu == 30_000
    assert ent["/ml/dev"].cpu == 0
    assert ent["/ml"].cpu == 30_000
    assert ent["/web"].cpu == 70_000
    assert wants(tree, cores(web=1000))["/ml"].cpu == 30_000


def test_pool_type_per_kind():
    tree = parse_pool_tree("""
pools:
  /a:
    type: static
    cpu: {reservation: 10}
    gpu: {reservation: 2, type: elastic}
  /b: {}
""")
    dem = {"/b": Resources(cpu=100_000, gpu=100_000)}
    ent = compute_entitlement(tree, Resources(cpu=100_000, gpu=8_000), dem)
    assert ent["/a"].cpu == 10_000 and ent["/a"].gpu == 0
    assert ent["/b"].cpu == 90_000 and ent["/b"].gpu == 8_000


def test_capacity_below_reservations_scales_claims_alike():
    tree = parse_pool_tree("""
pools:
  /a: {gpu: {reservation: 6, type: static}}
  /b: {gpu: {reservation: 3}}
""")
    dem = {"/b": Resources(gpu=3_000)}
    assert reservation_shortfall(tree, Resources(gpu=6_000)) == [
        "/: gpu reservations of its children sum to 9, above the capacity 6"]
    ent = compute_entitlement(tree, Resources(gpu=6_000), dem)
    assert (ent["/a"].gpu, ent["/b"].gpu) == (4_000, 2_000)
    assert reservation_shortfall(tree, Resources(gpu=9_000)) == []


def test_limits_cap_wants_in_a_deep_tree():
    tree = parse_pool_tree("""
pools:
  /ml: {gpu: {limit: 8}}
  /ml/vision: {gpu: {limit: 6}}
  /ml/nlp: {}
  /web: {}
""")
    dem = {"/ml/vision": Resources(gpu=20_000), "/ml/nlp": Resources(gpu=1_000),
           "/web": Resources(gpu=1_000)}
    ent = compute_entitlement(tree, Resources(gpu=16_000), dem)
    assert ent["/ml/vision"].gpu == 6_000
    assert ent["/ml/nlp"].gpu == 2_000  # its want 1 met, plus the leftover up to /ml's limit
    assert ent["/ml"].gpu == 8_000
    assert ent["/web"].gpu == 8_000


def test_gpu_memory_is_not_pooled():
    ent = compute_entitlement(PELOTON, Resources(cpu=1000, gpu_memory=10**9), {})
    assert all(r.gpu_memory == 0 for r in ent.values())


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown pool"):
        compute_entitlement(PELOTON, Resources(), {"/nope": Resources()})
    with pytest.raises(ValueError, match="not a leaf"):
        compute_entitlement(PELOTON, Resources(), {"/": Resources()})
    with pytest.raises(ValueError, match="negative"):
        compute_entitlement(PELOTON, Resources(cpu=-1), {})
    with pytest.raises(ValueError, match="negative"):
        compute_entitlement(PELOTON, Resources(), {}, {"/rp1": Resources(cpu=-1)})


def test_demand_by_pool():
    jobs = [PendingJob("a", "/rp1", Resources(cpu=1, gpu=2)),
            PendingJob("b", "/rp1", Resources(cpu=10, memory=5)),
            PendingJob("c", "/rp2", Resources(disk=7))]
    assert demand_by_pool(jobs) == {"/rp1": Resources(cpu=11, memory=5, gpu=2),
                                    "/rp2": Resources(disk=7)}


# --------------------------------------------------------------------------- _fill


def unit_by_unit(total: int, weights: list[int], caps: list[int]) -> list[int]:
    """The definition, literally: one unit at a time to the uncapped item due first."""
    got = [0] * len(caps)
    for _ in range(total):
        open_ = [i for i in range(len(caps)) if got[i] < caps[i]]
        if not open_:
            break
        i = min(open_, key=lambda i: (Fraction(got[i] + 1, weights[i]), i))
        got[i] += 1
    return got


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 7), st.integers(0, 40)), min_size=1, max_size=6),
       st.integers(0, 150))
def test_fill_is_unit_by_unit_handout(items, total):
    weights = [w for w, _ in items]
    caps = [c for _, c in items]
    assert _fill(total, weights, caps) == unit_by_unit(total, weights, caps)


def test_fill_large_numbers_exact():
    # Shares 1:2:3 of 3 * 2**58 + 1 units: floors 2**57, 2**58, 3 * 2**57; the odd unit is
    # due first at the third item ((3 * 2**57 + 1) / 3000 is the smallest next level).
    got = _fill(3 * 2**58 + 1, [1000, 2000, 3000], [2**60, 2**60, 2**59])
    assert got == [2**57, 2**58, 3 * 2**57 + 1]
    # A cap that binds: the other two split the rest, 5 * 2**57, 1:2 (5 * 2**57 = 1 mod 3);
    # floors leave one unit, due first at the second item.
    got = _fill(3 * 2**58, [1000, 2000, 3000], [2**60, 2**60, 2**57])
    assert got == [(5 * 2**57 - 1) // 3, (10 * 2**57 - 2) // 3 + 1, 2**57]
