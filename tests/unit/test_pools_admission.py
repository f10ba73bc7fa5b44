"""Admission: gangs within entitlement, non-preemptible within reservation, no head-of-line
blocking beyond the look-ahead, priorities, reasons."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.pools import PendingJob, admit, parse_pool_tree
from workloads.resources import Resources

TREE = parse_pool_tree("""
pools:
  /ml: {gpu: {reservation: 8, limit: 16}}
  /ml/vision: {gpu: {reservation: 4, limit: 8}}
  /ml/nlp: {gpu: {reservation: 4}}
  /web: {}
""")
V = "/ml/vision"


def gpus(n: float) -> Resources:
    return Resources(gpu=int(n * 1000))


def job(job_id: str, n: float, pool: str = V, **kw) -> PendingJob:
    return PendingJob(job_id, pool, gpus(n), **kw)


def run(pending, alloc=0, ent=8, np=0, **kw):
    return admit(TREE, pending, {V: gpus(ent), "/ml/nlp": gpus(ent)}, {V: gpus(alloc)},
                 {V: gpus(np)}, **kw)


def test_blocked_reason_names_pool_kind_and_amounts():
    a = run([job("j", 4)], alloc=6)
    assert a.admitted == []
    assert a.blocked == {"j": "pool /ml/vision: gpu allocation 6 + job 4 > entitlement 8"}


def test_gang_admitted_whole_or_not_at_all():
    a = run([job("a", 3), job("b", 3), job("c", 3)], alloc=1)
    assert a.admitted == ["a", "b"]
    assert a.blocked == {"c": "pool /ml/vision: gpu allocation 7 + job 3 > entitlement 8"}
    assert a.allocation[V] == gpus(7)


def test_priority_orders_within_a_pool_ties_keep_queue_order():
    a = run([job("low", 4), job("mid1", 2, priority=5), job("high", 4, priority=9),
             job("mid2", 2, priority=5)])
    assert a.admitted == ["high", "mid1", "mid2"]
    assert set(a.blocked) == {"low"}


def test_pools_are_independent():
    a = run([job("v", 8), job("n", 8, pool="/ml/nlp")])
    assert a.admitted == ["v", "n"]


def test_non_preemptible_only_within_reservation():
    # Entitlement 8 has room, but the reservation is 4 and 2 of it is held.
    a = run([job("np", 3, preemptible=False), job("p", 3)], np=2, alloc=2)
    assert a.admitted == ["p"]
    assert a.blocked["np"] == (
        "pool /ml/vision: gpu non-preemptible allocation 2 + job 3 > reservation 4 "
        "(a non-preemptible job never runs on borrowed capacity)")
    a = run([job("np", 2, preemptible=False)], np=2, alloc=2)
    assert a.admitted == ["np"]
    assert a.non_preemptible[V] == gpus(4) and a.allocation[V] == gpus(4)


def test_jobs_that_can_never_fit_are_flagged_and_block_nothing():
    a = run([job("huge", 9), job("np", 5, preemptible=False), job("ok", 1)], lookahead=0)
    assert a.admitted == ["ok"]
    assert a.never == {"huge", "np"}
    assert a.blocked["huge"] == "pool /ml/vision: can never be admitted: gpu job 9 > limit 8"
    assert a.blocked["np"] == ("pool /ml/vision: can never be admitted: gpu job 5 > reservation "
                               "4 (a non-preemptible job must fit in the reservation)")


def test_blocked_job_does_not_block_smaller_ones_within_lookahead():
    pending = [job("big", 6), job("s1", 1), job("s2", 1), job("s3", 1)]
    a = run(pending, alloc=4, lookahead=2)
    assert a.admitted == ["s1", "s2"]
    assert a.blocked["s3"] == ("pool /ml/vision: waiting behind blocked job big: the look-ahead "
                               "of 2 jobs past it is used up this cycle")
    assert run(pending, alloc=4, lookahead=16).admitted == ["s1", "s2", "s3"]
    assert run(pending, alloc=4, lookahead=0).admitted == []


def test_non_preemptible_side_lined_without_opening_the_window():
    a = run([job("np", 3, preemptible=False), job("s", 1)], np=2, lookahead=0)
    assert a.admitted == ["s"]


def test_past_the_window_never_fit_jobs_still_flagged():
    a = run([job("big", 6), job("x", 1), job("huge", 10)], alloc=4, lookahead=1)
    assert a.admitted == ["x"]
    assert "huge" in a.never and "can never be admitted" in a.blocked["huge"]


def test_waited_counts_and_hold_for_a_starving_job():
    pending = [job("big", 6), job("s1", 1), job("s2", 1)]
    a = run(pending, alloc=4, hold_after=3)
    assert a.admitted == ["s1", "s2"] and a.waited == {"big": 1}
    a = run(pending, alloc=4, hold_after=3, waited={"big": 2, "gone": 7})
    assert a.admitted == ["s1", "s2"] and a.waited == {"big": 3}
    a = run(pending, alloc=4, hold_after=3, waited={"big": 3})
    assert a.admitted == []
    assert a.blocked["s1"] == "pool /ml/vision: held for job big, blocked 4 cycles, until it fits"
    assert a.waited == {"big": 4, "s1": 1, "s2": 1}
    # No hold for a job that would not fit even in an empty pool: holding cannot help it.
    a = run([job("big", 6), job("s1", 1)], alloc=0, ent=5, hold_after=0, waited={"big": 9})
    assert a.admitted == ["s1"]


def test_kinds_a_job_does_not_ask_for_do_not_block_it():
    ent = {V: Resources(cpu=1000, gpu=8000)}
    alloc = {V: Resources(cpu=5000)}  # over its cpu entitlement (it shrank)
    a = admit(TREE, [job("g", 2), PendingJob("c", V, Resources(cpu=1))], ent, alloc)
    assert a.admitted == ["g"]
    assert a.blocked == {"c": "pool /ml/vision: cpu allocation 5 + job 1m > entitlement 1"}


def test_several_kinds_short_in_one_reason():
    ent = {V: Resources(cpu=1000, memory=2**30)}
    a = admit(TREE, [PendingJob("j", V, Resources(cpu=2000, memory=2**31))], ent, {})
    assert a.blocked["j"] == ("pool /ml/vision: cpu allocation 0 + job 2 > entitlement 1; "
                              "memory allocation 0 + job 2Gi > entitlement 1Gi")


def test_unknown_and_inner_pools():
    a = admit(TREE, [job("x", 1, pool="/nope"), job("y", 1, pool="/ml")], {}, {})
    assert a.blocked == {"x": "pool /nope: no such pool",
                         "y": "pool /ml: has child pools; jobs are submitted to leaf pools"}
    assert a.never == {"x", "y"}


def test_inputs_untouched():
    alloc = {V: gpus(1)}
    ent = {V: gpus(8)}
    run_ = admit(TREE, [job("a", 1)], ent, alloc)
    assert alloc == {V: gpus(1)} and run_.allocation == {V: gpus(2)}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([V, "/ml/nlp", "/web"]), st.integers(0, 5000),
                          st.integers(0, 3), st.booleans()), max_size=25),
       st.integers(0, 9000), st.integers(0, 9000), st.integers(0, 4))
def test_never_over_entitlement_or_reservation(specs, ent_gpu, alloc_gpu, lookahead):
    pending = [PendingJob(f"j{i}", p, Resources(gpu=g), priority=pr, preemptible=pre)
               for i, (p, g, pr, pre) in enumerate(specs)]
    leaves = (V, "/ml/nlp", "/web")
    ent = {p: Resources(gpu=ent_gpu) for p in leaves}
    alloc = {p: Resources(gpu=alloc_gpu) for p in leaves}
    a = admit(TREE, pending, ent, alloc, {}, lookahead=lookahead)
    assert sorted(a.admitted + list(a.blocked)) == sorted(j.job_id for j in pending)
    assert len(set(a.admitted)) == len(a.admitted)
    for p in leaves:
        admitted = sum(j.resources.gpu for j in pending if j.pool == p and j.job_id in a.admitted)
        assert a.allocation[p].gpu == alloc_gpu + admitted
        if admitted:
            assert alloc_gpu + admitted <= ent_gpu
        np_admitted = sum(j.resources.gpu for j in pending
                          if j.pool == p and j.job_id in a.admitted and not j.preemptible)
        assert np_admitted <= TREE[p].gpu.reservation


def test_jobs_that_do_not_compete_for_the_blocked_kind_use_no_look_ahead():
    # "big" waits for GPUs; CPU-only jobs behind it cannot delay it, so all are admitted
    # past a look-ahead of 1, while GPU jobs behind it still use (and exhaust) it.
    ent = {V: Resources(cpu=100_000, gpu=8000), "/ml/nlp": gpus(8)}
    cpu = [PendingJob(f"c{i}", V, Resources(cpu=1000)) for i in range(5)]
    pending = [job("big", 6), *cpu[:2], job("g1", 1), *cpu[2:], job("g2", 1)]
    a = admit(TREE, pending, ent, {V: gpus(4)}, {}, lookahead=1)
    assert a.admitted == ["c0", "c1", "g1", "c2", "c3", "c4"]
    assert "look-ahead of 1 jobs past it is used up" in a.blocked["g2"]
    assert set(a.blocked) == {"big", "g2"}


amounts = st.tuples(*[st.integers(-(2**40), 2**40)] * 5)


@given(st.lists(amounts, max_size=20), st.one_of(st.none(), amounts))
def test_resources_total_is_the_sum(rows, start):
    items = [Resources(*r) for r in rows]
    first = None if start is None else Resources(*start)
    assert Resources.total(items, first) == sum(items, first or Resources())


def test_allocation_out_adds_every_kind_of_the_admitted_jobs():
    big = Resources(cpu=1000, memory=2, disk=3, gpu=1000, gpu_memory=7)
    small = Resources(gpu=1000, gpu_memory=1)  # non-preemptible: within the reservation
    held = Resources(cpu=5, memory=5, disk=5, gpu=1000, gpu_memory=5)
    a = admit(
        TREE,
        [PendingJob("a", V, big), PendingJob("b", V, small, preemptible=False)],
        {V: Resources(cpu=10**6, memory=10**6, disk=10**6, gpu=8000, gpu_memory=10**6)},
        {V: held},
        {V: Resources(gpu=1000, gpu_memory=5)},
    )
    assert a.admitted == ["a", "b"]
    assert a.allocation[V] == held + big + small
    assert a.non_preemptible[V] == Resources(gpu=2000, gpu_memory=6)
