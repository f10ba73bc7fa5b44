"""place(): the pure placement core. Properties over random clusters, plus worked cases."""

from __future__ import annotations

import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.placement import (
    GangRequest,
    NodeCandidate,
    PlacementResult,
    TaskRequest,
    best_fit_score,
    filter_reason,
    place,
)
from workloads.resources import Resources

PROPS = settings(
    max_examples=300,
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
GiB = 2**30


def node(
    node_id: str,
    cpu: int = 0,
    memory: int = 0,
    *,
    free: Resources | None = None,
    simulated: bool = False,
    **kinds: int,
) -> NodeCandidate:
    cap = Resources(cpu=cpu, memory=memory, **kinds)
    return NodeCandidate(node_id, cap, cap if free is None else free, simulated)


def task(
    task_id: str, cpu: int = 0, memory: int = 0, *, simulated: bool = False, **kinds: int
) -> TaskRequest:
    return TaskRequest(task_id, Resources(cpu=cpu, memory=memory, **kinds), simulated)


def gang(job_id: str, *tasks: TaskRequest) -> GangRequest:
    return GangRequest(job_id, tuple(tasks))


# --------------------------------------------------------------------------- strategies


class Tape:
    """Reads a cluster off a list of small integers drawn by hypothesis: one draw instead of
    hundreds, and it still shrinks (fewer nodes, smaller amounts)."""

    def __init__(self, numbers: list[int]) -> None:
        self.numbers = numbers
        self.i = 0

    def int(self, hi: int) -> int:
        n = self.numbers[self.i] if self.i < len(self.numbers) else 0
        self.i += 1
        return n % (hi + 1)


def build_cluster(numbers: list[int]):
    tape = Tape(numbers)
    nodes = []
    for i in range(tape.int(5)):
        cap = [tape.int(12) for _ in Resources.KINDS]
        used = []
        for c in cap:
            u = tape.int(c) if tape.int(2) == 0 else 0
            if tape.int(15) == 0:
                u = c + 1 + tape.int(2)  # overdrawn (allocated above capacity): free < 0
            used.append(u)
        nodes.append(
            NodeCandidate(
                f"n{i}",
                Resources(*cap),
                Resources(*(c - u for c, u in zip(cap, used, strict=True))),
                tape.int(3) == 0,
            )
        )
    gangs = []
    for j in range(tape.int(6)):
        tasks = tuple(
            TaskRequest(
                f"j{j}.t{k}",
                Resources(*(tape.int(8) if tape.int(2) == 0 else 0 for _ in Resources.KINDS)),
                tape.int(3) == 0,
            )
            for k in range(1 + tape.int(3))
        )
        gangs.append(GangRequest(f"j{j}", tasks))
    return nodes, gangs


def uniform_cluster(seed: int):
    rnd = random.Random(seed)
    return build_cluster([rnd.randrange(256) for _ in range(250)])


# Short, shrinkable tapes (hypothesis favours small numbers), and uniform ones from a seed,
# which make busier clusters where gangs compete for the same nodes.
clusters = st.one_of(
    st.lists(st.integers(0, 255), max_size=250).map(build_cluster),
    st.integers(0, 2**32 - 1).map(uniform_cluster),
)


def by_task(gangs) -> dict[str, tuple[str, TaskRequest]]:
    return {t.task_id: (g.job_id, t) for g in gangs for t in g.tasks}


# --------------------------------------------------------------------------- properties


def check_never_over_commits(nodes, gangs, result):
    """The sum of what was placed on a node fits in what was free there, kind by kind."""
    tasks = by_task(gangs)
    used = {n.node_id: Resources() for n in nodes}
    for tid, node_id in result.placed:
        used[node_id] = used[node_id] + tasks[tid][1].resources
    for n in nodes:
        if any(nid == n.node_id for _, nid in result.placed):
            for kind in Resources.KINDS:
                assert getattr(used[n.node_id], kind) <= getattr(n.free, kind), (n, kind)


def check_gangs_all_or_nothing(nodes, gangs, result):
    placed = dict(result.placed)
    assert len(placed) == len(result.placed), "a task placed twice"
    for g in gangs:
        got = [t.task_id in placed for t in g.tasks]
        assert all(got) or not any(got), g.job_id
        assert (g.job_id in result.unplaced) == (not all(got))
    assert set(result.unplaced) <= {g.job_id for g in gangs}


def check_simulated_matches(nodes, gangs, result):
    sim = {n.node_id: n.simulated for n in nodes}
    tasks = by_task(gangs)
    for tid, node_id in result.placed:
        assert node_id in sim
        assert tasks[tid][1].simulated == sim[node_id], (tid, node_id)


def check_each_task_fits_its_node(nodes, gangs, result):
    by_id = {n.node_id: n for n in nodes}
    tasks = by_task(gangs)
    for tid, nid in result.placed:
        assert tasks[tid][1].resources.fits_in(by_id[nid].free)


def check_unplaced_explained(nodes, gangs, result):
    for why in result.unplaced.values():
        assert why.startswith("task ")
        if not nodes:
            assert why.endswith("no ready nodes")
        else:
            counts = [int(n) for n in re.findall(r"(\d+) nodes?: ", why)]
            # every node rejected the task, each for exactly one reason
            assert sum(counts) == len(nodes), why


def check_lone_tasks_placed_when_they_fit(nodes, gangs, result):
    """Completeness for single-task gangs: left unplaced only if no node of the right kind had
    room after the gangs before it were placed."""
    placed = dict(result.placed)
    free = {n.node_id: n.free for n in nodes}
    for g in gangs:
        if len(g.tasks) == 1 and g.job_id in result.unplaced:
            t = g.tasks[0]
            for n in nodes:
                assert not (t.simulated == n.simulated and t.resources.fits_in(free[n.node_id])), (
                    g.job_id,
                    n.node_id,
                )
        for t in g.tasks:
            if t.task_id in placed:
                nid = placed[t.task_id]
                free[nid] = free[nid] - t.resources


@PROPS
@given(clusters)
def test_never_over_commits_any_resource_on_any_node(cluster):
    nodes, gangs = cluster
    result = place(nodes, gangs)
    check_never_over_commits(nodes, gangs, result)
    check_each_task_fits_its_node(nodes, gangs, result)


@PROPS
@given(clusters)
def test_gang_is_all_or_nothing_and_explained(cluster):
    nodes, gangs = cluster
    result = place(nodes, gangs)
    check_gangs_all_or_nothing(nodes, gangs, result)
    check_unplaced_explained(nodes, gangs, result)
    check_lone_tasks_placed_when_they_fit(nodes, gangs, result)


@PROPS
@given(clusters)
def test_simulated_tasks_only_on_simulated_nodes_and_real_on_real(cluster):
    nodes, gangs = cluster
    check_simulated_matches(nodes, gangs, place(nodes, gangs))


@PROPS
@given(clusters)
def test_deterministic(cluster):
    nodes, gangs = cluster
    first = place(nodes, gangs)
    assert isinstance(first, PlacementResult)
    assert place(list(nodes), list(gangs)) == first
    assert place(nodes, gangs) == first  # the inputs were not consumed or changed


def test_the_strategy_makes_interesting_clusters():
    # guard against a generator that only ever makes trivial cases
    rnd = random.Random(0)
    outcomes = {"placed": 0, "unplaced": 0, "sim": 0, "multi": 0}
    for _ in range(200):
        nodes, gangs = build_cluster([rnd.randrange(256) for _ in range(250)])
        r = place(nodes, gangs)
        outcomes["placed"] += bool(r.placed)
        outcomes["unplaced"] += bool(r.unplaced)
        outcomes["sim"] += any(
            t.simulated and t.task_id in dict(r.placed) for g in gangs for t in g.tasks
        )
        outcomes["multi"] += any(len(g.tasks) > 1 and g.job_id not in r.unplaced for g in gangs)
    assert all(v >= 10 for v in outcomes.values()), outcomes


# --------------------------------------------------------------------------- worked cases


def test_best_fit_picks_the_tightest_node():
    nodes = [node("big", cpu=8000), node("tight", cpu=2000), node("mid", cpu=4000)]
    result = place(nodes, [gang("j", task("j.0", cpu=2000))])
    assert result.placed == (("j.0", "tight"),)
    assert result.unplaced == {}


def test_best_fit_uses_what_is_free_not_the_capacity():
    nodes = [
        node("a", cpu=8000, memory=8 * GiB, free=Resources(cpu=1000, memory=1 * GiB)),
        node("b", cpu=2000, memory=2 * GiB),
    ]
    result = place(nodes, [gang("j", task("j.0", cpu=1000, memory=1 * GiB))])
    assert result.placed == (("j.0", "a"),)  # leaves 0 on a, half of b on b


def test_best_fit_weighs_every_kind_by_its_capacity():
    # after the task: a leaves 0/4 cpu + 3/4 memory = 0.75, b leaves 2/4 + 0/4 = 0.5
    a = node("a", cpu=4000, memory=4 * GiB, free=Resources(cpu=1000, memory=4 * GiB))
    b = node("b", cpu=4000, memory=4 * GiB, free=Resources(cpu=3000, memory=1 * GiB))
    assert best_fit_score(a.capacity, a.free - Resources(cpu=1000, memory=GiB)) == 0.75
    result = place([a, b], [gang("j", task("j.0", cpu=1000, memory=GiB))])
    assert result.placed == (("j.0", "b"),)


def test_ties_go_to_the_earlier_node():
    nodes = [node("z", cpu=4000), node("a", cpu=4000)]
    assert place(nodes, [gang("j", task("j.0", cpu=1000))]).placed == (("j.0", "z"),)


def test_tasks_of_one_gang_see_each_others_reservations():
    # two 3-core tasks, one 4-core node: the second must not see the first one's room
    result = place([node("n", cpu=4000)], [gang("j", task("j.0", cpu=3000), task("j.1", cpu=3000))])
    assert result.placed == ()
    assert "j" in result.unplaced and "j.1" in result.unplaced["j"]


def test_a_gang_spreads_over_nodes_when_it_must():
    result = place(
        [node("a", cpu=4000), node("b", cpu=4000)],
        [gang("j", task("j.0", cpu=3000), task("j.1", cpu=3000))],
    )
    assert sorted(result.placed) == [("j.0", "a"), ("j.1", "b")]


def test_a_gang_that_does_not_fit_reserves_nothing():
    nodes = [node("a", cpu=4000)]
    gangs = [
        gang("big", task("big.0", cpu=3000), task("big.1", cpu=3000)),  # does not fit
        gang("small", task("small.0", cpu=4000)),  # fits only if big
    ]  # reserved nothing
    result = place(nodes, gangs)
    assert result.placed == (("small.0", "a"),)
    assert set(result.unplaced) == {"big"}


def test_gangs_are_served_in_the_order_given():
    nodes = [node("a", cpu=4000)]
    first = place(nodes, [gang("x", task("x.0", cpu=3000)), gang("y", task("y.0", cpu=3000))])
    second = place(nodes, [gang("y", task("y.0", cpu=3000)), gang("x", task("x.0", cpu=3000))])
    assert first.placed == (("x.0", "a"),) and set(first.unplaced) == {"y"}
    assert second.placed == (("y.0", "a"),) and set(second.unplaced) == {"x"}


def test_placed_work_reduces_free_for_later_gangs():
    nodes = [node("a", cpu=4000), node("b", cpu=2000)]
    gangs = [gang(f"j{i}", task(f"j{i}.0", cpu=2000)) for i in range(4)]
    result = place(nodes, gangs)
    assert sorted(nid for _, nid in result.placed) == ["a", "a", "b"]
    assert set(result.unplaced) == {"j3"}


def test_unplaced_reason_counts_nodes_per_reason():
    nodes = [
        node("m1", cpu=8000, memory=1 * GiB),
        node("m2", cpu=8000, memory=2 * GiB),
        node("sim", cpu=8000, memory=64 * GiB, simulated=True),
        node("c", cpu=500, memory=64 * GiB),
    ]
    result = place(nodes, [gang("j", task("j.w.0", cpu=1000, memory=4 * GiB))])
    why = result.unplaced["j"]
    assert why.startswith("task j.w.0 (cpu=1 memory=4Gi) fits no node: ")
    assert "2 nodes: insufficient memory" in why
    assert "1 node: simulated node (task runs a real command)" in why
    assert "1 node: insufficient cpu" in why
    # the most common reason first
    assert why.index("2 nodes") < why.index("1 node:")


def test_unplaced_reason_lists_every_short_kind():
    result = place(
        [node("a", cpu=100, memory=10)], [gang("j", task("j.0", cpu=1000, memory=GiB, gpu=1000))]
    )
    assert result.unplaced["j"].endswith("1 node: insufficient cpu, memory, gpu")


def test_unplaced_reason_for_a_real_task_and_simulated_task():
    sim_task = task("s.0", cpu=1, simulated=True)
    result = place([node("r1", cpu=1000), node("r2", cpu=1000)], [gang("s", sim_task)])
    assert "2 nodes: real node (task is simulated)" in result.unplaced["s"]


def test_no_nodes_at_all():
    result = place([], [gang("j", task("j.0", cpu=1))])
    assert result.placed == ()
    assert result.unplaced["j"].endswith("no ready nodes")


def test_reason_names_the_first_task_that_did_not_fit():
    result = place(
        [node("a", cpu=2000)],
        [gang("j", task("j.0", cpu=1000), task("j.1", cpu=5000), task("j.2", cpu=9000))],
    )
    assert result.unplaced["j"].startswith("task j.1 ")


def test_zero_resource_tasks_fit_on_a_full_node():
    full = node("a", cpu=1000, free=Resources())
    assert place([full], [gang("j", task("j.0"))]).placed == (("j.0", "a"),)


def test_an_overdrawn_node_takes_nothing_that_needs_the_overdrawn_kind():
    over = node("a", cpu=4000, memory=4 * GiB, free=Resources(cpu=-1000, memory=4 * GiB))
    result = place([over], [gang("j", task("j.0", memory=GiB))])
    assert result.placed == ()  # it asks for no cpu, but 0 > -1000 is still a shortfall
    assert "insufficient cpu" in result.unplaced["j"]


def test_filter_reason():
    n = node("a", cpu=1000, memory=GiB)
    assert filter_reason(n, n.free, task("t", cpu=1000, memory=GiB)) is None
    assert filter_reason(n, n.free, task("t", cpu=1001)) == "insufficient cpu"
    assert filter_reason(n, n.free, task("t", simulated=True)) == "real node (task is simulated)"
    s = node("s", cpu=1000, simulated=True)
    assert filter_reason(s, s.free, task("t")) == "simulated node (task runs a real command)"
    assert filter_reason(s, s.free, task("t", simulated=True)) is None


def test_best_fit_score_ignores_kinds_the_node_lacks():
    cap = Resources(cpu=1000)
    assert best_fit_score(cap, Resources(cpu=500)) == 0.5
    assert best_fit_score(Resources(), Resources()) == 0.0


def test_gpu_and_gpu_memory_are_bounded_too():
    nodes = [node("g", cpu=8000, gpu=1000, gpu_memory=16 * GiB)]
    gangs = [
        gang("a", task("a.0", cpu=100, gpu=500, gpu_memory=8 * GiB)),
        gang("b", task("b.0", cpu=100, gpu=500, gpu_memory=10 * GiB)),
        gang("c", task("c.0", cpu=100, gpu=500, gpu_memory=8 * GiB)),
    ]
    result = place(nodes, gangs)
    assert dict(result.placed) == {"a.0": "g", "c.0": "g"}
    assert "insufficient gpu_memory" in result.unplaced["b"]
