"""Victim choice: hysteresis, elastic shrink first, whole gangs, the smallest set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.pools import RunningJob, any_over_entitlement, choose_victims, parse_pool_tree
from workloads.resources import Resources

TREE = parse_pool_tree("""
pools:
  /ml: {gpu: {reservation: 8}}
  /ml/vision: {gpu: {reservation: 4}}
  /ml/nlp: {gpu: {reservation: 4}}
  /batch: {}
  /web: {}
""")
CAP = Resources(gpu=16_000)


def gpus(n: float) -> Resources:
    return Resources(gpu=int(n * 1000))


def rj(job_id, n, pool="/batch", **kw) -> RunningJob:
    return RunningJob(job_id, pool, gpus(n), **kw)


def choose(running, ent, demand, counts=None, cycles=1, cap=CAP):
    return choose_victims(TREE, cap, {p: gpus(v) for p, v in ent.items()}, running,
                          {p: gpus(v) for p, v in demand.items()}, counts or {}, cycles=cycles)


def killed(choice) -> list[str]:
    return [v.job_id for v in choice.victims if v.action == "kill"]


def test_hysteresis_counts_then_preempts():
    running = [rj("b", 12), rj("v", 4, pool="/ml/vision")]
    ent = {"/batch": 8, "/ml/vision": 8}
    demand = {"/ml/vision": 4}
    counts: dict[str, int] = {}
    for cycle in range(1, 4):
        c = choose(running, ent, demand, counts, cycles=3)
        counts = c.over_counts
        assert counts == {"/batch": cycle}
        assert (c.victims != []) == (cycle == 3)
    # Back within its entitlement: the count is dropped.
    c = choose(running, {"/batch": 12, "/ml/vision": 4}, {}, counts, cycles=3)
    assert c.over_counts == {} and c.victims == []


def test_free_capacity_is_used_before_anything_is_preempted():
    c = choose([rj("b", 10)], {"/batch": 8, "/ml/vision": 8}, {"/ml/vision": 6})
    assert c.victims == []  # 6 GPUs are free
    c = choose([rj("b", 12)], {"/batch": 8, "/ml/vision": 8}, {"/ml/vision": 6})
    assert [v.frees.gpu for v in c.victims] == [12_000]  # 4 free, 2 owed: one whole gang


def test_elastic_jobs_shrink_before_anything_is_killed():
    running = [rj("rigid", 4, running_for=1), rj("elastic", 8, tasks=8, min_tasks=2,
                                                  running_for=100)]
    c = choose(running, {"/batch": 8, "/ml/vision": 4}, {"/ml/vision": 4}, cap=gpus(12))
    assert [(v.job_id, v.action, v.tasks, v.frees) for v in c.victims] == [
        ("elastic", "shrink", 4, gpus(4))]


def test_shrink_to_minimum_then_kill_whole_gangs():
    running = [rj("rigid", 6, tasks=3, running_for=1),
               rj("elastic", 6, tasks=6, min_tasks=4, running_for=100)]
    # /batch holds 12 with entitlement 4; /ml/vision is owed 8, nothing is free.
    c = choose(running, {"/batch": 4, "/ml/vision": 12}, {"/ml/vision": 8})
    assert [(v.job_id, v.action, v.tasks, v.frees.gpu) for v in c.victims] == [
        ("elastic", "shrink", 2, 2000), ("rigid", "kill", 3, 6000)]


def test_a_shrunk_job_that_is_then_killed_is_one_victim():
    running = [rj("elastic", 8, tasks=4, min_tasks=2)]
    c = choose(running, {"/batch": 0, "/ml/vision": 8}, {"/ml/vision": 8}, cap=gpus(8))
    assert [(v.job_id, v.action, v.tasks, v.frees.gpu) for v in c.victims] == [
        ("elastic", "kill", 4, 8000)]


def test_smallest_set_within_the_shortest_covering_prefix():
    # Same priority; shortest running first gives a, b, c. a+b do not cover 4, so c is
    # reached -- and c alone covers it: one victim, not three.
    running = [rj("a", 1, running_for=1), rj("b", 1, running_for=2), rj("c", 4, running_for=3)]
    c = choose(running, {"/batch": 0, "/ml/vision": 16}, {"/ml/vision": 4}, cap=gpus(6))
    assert killed(c) == ["c"]


def test_one_victim_when_one_suffices():
    """volcano#5994: one GPU needed, ten one-GPU victims available: stop one."""
    running = [rj(f"j{i}", 1, running_for=i) for i in range(10)]
    c = choose(running, {"/batch": 0, "/ml/vision": 10}, {"/ml/vision": 1}, cap=gpus(10))
    assert killed(c) == ["j0"]


def test_lower_priority_first_even_if_it_takes_more_gangs():
    running = [rj("hi", 2, priority=9), rj("lo1", 1, priority=0), rj("lo2", 1, priority=0)]
    c = choose(running, {"/batch": 0, "/ml/vision": 4}, {"/ml/vision": 2}, cap=gpus(4))
    assert killed(c) == ["lo1", "lo2"]


def test_furthest_over_pool_first():
    running = [rj("b", 4, pool="/batch", priority=0), rj("w", 4, pool="/web", priority=0),
               rj("w2", 4, pool="/web", priority=9)]
    ent = {"/batch": 3, "/web": 1, "/ml/vision": 4}  # /web is 7 over, /batch 1
    c = choose(running, ent, {"/ml/vision": 4}, cap=gpus(12))
    assert killed(c) == ["w"]


def test_donors_give_only_while_above_their_entitlement():
    running = [rj(f"b{i}", 1) for i in range(6)]
    c = choose(running, {"/batch": 4, "/ml/vision": 10}, {"/ml/vision": 10}, cap=gpus(6))
    assert len(killed(c)) == 2  # /batch is 2 over: it keeps its entitlement of 4


def test_non_preemptible_never_victims():
    running = [rj("np", 8, preemptible=False), rj("p", 1)]
    c = choose(running, {"/batch": 0, "/ml/vision": 9}, {"/ml/vision": 9}, cap=gpus(9))
    assert killed(c) == ["p"]


def test_reason_names_the_claiming_pool_and_the_overage():
    c = choose([rj("b", 4, tasks=2)], {"/batch": 0, "/ml/vision": 4}, {"/ml/vision": 4},
               counts={"/batch": 4}, cycles=5, cap=gpus(4))
    (v,) = c.victims
    assert v.claimant == "/ml/vision"
    assert v.reason == (
        "stop b (all 2 tasks, priority 0) in /batch, over its entitlement for 5 cycles (gpu "
        "allocation 4 > entitlement 0); for /ml/vision, which is below its entitlement with "
        "work pending and is owed gpu 4 held by pools over theirs")


def test_several_claimants_never_share_a_victim():
    running = [rj("b1", 4), rj("b2", 4)]
    ent = {"/batch": 0, "/ml/vision": 4, "/ml/nlp": 4}
    c = choose(running, ent, {"/ml/vision": 4, "/ml/nlp": 4}, cap=gpus(8))
    assert sorted((v.job_id, v.claimant) for v in c.victims) == [
        ("b1", "/ml/nlp"), ("b2", "/ml/vision")]


def test_a_claimant_is_not_its_own_donor():
    # /web is over in cpu but owed gpu: it must not preempt itself.
    running = [RunningJob("w", "/web", Resources(cpu=8000))]
    c = choose_victims(TREE, Resources(cpu=8000, gpu=8000),
                       {"/web": Resources(cpu=4000, gpu=8000)}, running,
                       {"/web": Resources(gpu=2000)}, {}, cycles=1)
    assert c.victims == [] and c.over_counts == {"/web": 1}


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["/batch", "/web", "/ml/nlp"]), st.integers(1, 4),
                          st.integers(1, 4), st.booleans(), st.integers(0, 3),
                          st.booleans(), st.integers(0, 100)), max_size=12),
       st.integers(0, 8), st.integers(0, 8), st.integers(0, 12), st.integers(0, 6))
def test_victim_properties(jobs, e_batch, e_web, want, spare):
    running = [RunningJob(f"j{i}", pool, gpus(per * tasks), tasks=tasks,
                          min_tasks=1 if elastic else None, priority=prio, preemptible=pre,
                          running_for=age)
               for i, (pool, per, tasks, elastic, prio, pre, age) in enumerate(jobs)]
    ent = {"/batch": gpus(e_batch), "/web": gpus(e_web), "/ml/nlp": gpus(0),
           "/ml/vision": gpus(16)}
    held = sum(j.resources.gpu for j in running)
    cap = Resources(gpu=held + spare * 1000)
    c = choose_victims(TREE, cap, ent, running, {"/ml/vision": gpus(want)}, {}, cycles=1)
    by_id = {j.job_id: j for j in running}
    alloc = {p: sum(j.resources.gpu for j in running if j.pool == p) for p in ent}
    need = max(0, want * 1000 - spare * 1000)
    assert len({v.job_id for v in c.victims}) == len(c.victims)
    for v in c.victims:
        j = by_id[v.job_id]
        assert j.preemptible and v.claimant == "/ml/vision" and v.pool == j.pool
        assert alloc[j.pool] > ent[j.pool].gpu  # only from pools over their entitlement
        if v.action == "kill":  # a whole gang
            assert v.tasks == j.tasks and v.frees == j.resources
        else:  # an elastic job, never below its minimum
            assert v.action == "shrink" and 1 <= v.tasks <= j.tasks - j.min_tasks
            assert v.frees.gpu == v.tasks * (j.resources.gpu // j.tasks)
    freed = [v.frees.gpu for v in c.victims]
    if need == 0:
        assert freed == []
    kills = [v.frees.gpu for v in c.victims if v.action == "kill"]
    if kills:  # no kill is redundant: without the smallest, the need would be unmet
        assert sum(freed) - min(kills) < need
    for p in ("/batch", "/web"):  # a donor gives only while it is above its entitlement
        mine = [v.frees.gpu for v in c.victims if v.pool == p]
        if mine:
            assert sum(mine) - max(mine) < alloc[p] - ent[p].gpu


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["/batch", "/web", "/ml/nlp", "/ml/vision"]),
                          st.integers(1, 4), st.booleans()), max_size=10),
       st.dictionaries(st.sampled_from(["/batch", "/web", "/ml/nlp", "/ml/vision"]),
                       st.integers(0, 16), min_size=4, max_size=4),
       st.integers(0, 12), st.integers(0, 2))
def test_no_pool_over_its_entitlement_means_no_victims_and_no_counts(jobs, ent, want, extra):
    """The leader skips building the running-job list when `any_over_entitlement` is
    False: that must be exactly when choose_victims has nothing to say. `extra` GPUs
    of the allocation are held by jobs being reclaimed (counted in the allocation the
    leader passes, not in the running list)."""
    running = [RunningJob(f"j{i}", pool, gpus(n), preemptible=pre)
               for i, (pool, n, pre) in enumerate(jobs)]
    entitlement = {p: gpus(v) for p, v in ent.items()}
    allocation: dict[str, Resources] = {}
    for j in running:
        allocation[j.pool] = allocation.get(j.pool, Resources()) + j.resources
    if extra:
        allocation["/batch"] = allocation.get("/batch", Resources()) + gpus(extra)
    c = choose_victims(TREE, CAP, entitlement, running, {"/ml/vision": gpus(want)},
                       {"/web": 2}, cycles=1)
    if not any_over_entitlement(allocation, entitlement):
        assert c.victims == [] and c.over_counts == {}
    else:  # and it is never False when a pool really is over (the allocation is a superset)
        assert any(j.resources.gpu for j in running) or extra
