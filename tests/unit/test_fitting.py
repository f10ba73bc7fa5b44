"""Jobs that can never fit the region as it is (coordinator/fitting.py): they are set aside
before admission, hold no line, say why, and come back when the ready nodes change; no
job that fits waits for ever behind them."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from coordinator.cluster import READY, SUSPECT
from coordinator.fitting import needs_of_spec, region_fit, submit_warning
from coordinator.placement import GangRequest, GpuSlot, NodeInfo, Snapshot, TaskRequest, place
from coordinator.pools.default import DEFAULT_POOL, job_pool, with_default_pool
from coordinator.pools.tree import PoolConfigError, load_pool_source, parse_pool_tree
from coordinator.reconcile import reconcile
from coordinator.scheduling import PlacementConfig, spec_shape
from coordinator.state import RegionState
from mesh.schema import JobSubmitted
from workloads.lifecycle import TaskState
from workloads.resources import Resources
from workloads.spec import parse_job_spec

from .test_reconcile import HEARD, NOW, GiB, Log, cluster, placements, view

S = TaskState


def submit(log: Log, job_id: str, count: int, cpu: str, **extra) -> None:
    group = {"role": "w", "count": count, "command": ["true"], "resources": {"cpu": cpu}}
    spec = {"name": job_id, "tasks": [group], **extra}
    log.append(JobSubmitted(job_id, f"client-{job_id}", spec, 1.0))


def region_118() -> list:
    """The report's region: 118 cores in 6 ready nodes."""
    return [view(f"n{i}", cpu=20000) for i in range(5)] + [view("n5", cpu=18000)]


def test_gangs_larger_than_the_region_do_not_keep_a_small_job_waiting():
    """17 gangs of 200 one-core tasks on 118 cores used up admission's look-ahead of 16
    in every round: the 100m job behind them in the pool never ran."""
    log = Log()
    for i in range(17):
        submit(log, f"big{i:02d}", 200, "1")
    submit(log, "small", 1, "100m")
    d = log.step(cluster(*region_118()))
    assert [p[0] for p in placements(d)] == ["small.w.0"]
    assert d.unplaced["big16"] == (
        "can never fit the region as it is: needs 200 cpu in one gang; the region has 118 cpu "
        "in 6 ready nodes (looked at again when nodes join or grow)"
    )
    assert all(d.unplaced[f"big{i:02d}"] == d.unplaced["big16"] for i in range(17))


def test_a_gang_the_nodes_cannot_hold_at_once_is_set_aside_and_never_holds_the_line():
    """3 tasks of 4 cores fit 12 of 12 cores, but a 6-core node holds one: admitted, it
    was placed in vain and, once old, held the line of the whole region."""
    log = Log()
    submit(log, "gang", 3, "4")
    nodes = cluster(view("a", cpu=6000), view("b", cpu=6000))
    late = NOW + 10_000  # long past starve_after_s: a gang that could fit would hold the line
    d = log.step(nodes, late)
    assert d.unplaced["gang"].startswith(
        "can never fit the region as it is: a gang of 3 tasks (cpu=4 memory=64Mi) must start "
        "together; the 2 nodes that can take one hold 2 at most"
    )
    submit(log, "small", 1, "1")
    d = log.step(nodes, late + 1)
    assert [p[0] for p in placements(d)] == ["small.w.0"]


def test_a_task_larger_than_every_node_says_why_per_node():
    log = Log()
    submit(log, "wide", 1, "7")
    d = log.step(cluster(view("a", cpu=4000), view("b", cpu=6000), view("c", simulated=True)))
    assert d.unplaced["wide"] == (
        "can never fit the region as it is: a task (cpu=7 memory=64Mi) fits no node, even "
        "idle: 2 nodes: insufficient cpu; 1 node: simulated node (task runs a real command) "
        "(looked at again when nodes join or grow)"
    )


def test_an_unfit_job_is_judged_again_when_a_node_joins_or_grows():
    log = Log()
    submit(log, "gang", 3, "4")
    nodes = cluster(view("a", cpu=6000), view("b", cpu=6000))
    assert "can never fit" in log.step(nodes).unplaced["gang"]
    # Time and releases alone change nothing.
    assert placements(log.step(nodes, NOW + 60)) == []
    a = nodes.nodes["a"].state
    grown = dataclasses.replace(a.capacity, cpu=8000)
    nodes.observe(dataclasses.replace(a, seq=2, ts=1.0, capacity=grown), HEARD + 1)
    d = log.step(nodes, NOW + 61)  # a grew to 8 cores: 2 + 1 slots
    assert sorted(p[1] for p in placements(d)) == ["a", "a", "b"]
    log2 = Log()
    submit(log2, "gang", 3, "4")
    nodes = cluster(view("a", cpu=6000), view("b", cpu=6000))
    assert "can never fit" in log2.step(nodes).unplaced["gang"]
    nodes.observe(view("c", cpu=4000).state, HEARD + 1)  # a node joins
    assert len(placements(log2.step(nodes, NOW + 1))) == 3


def test_unfit_is_judged_on_ready_nodes_and_a_node_back_lets_the_job_go():
    """A suspect node takes no work: a gang that needs it waits, parked, and is placed
    once the node is ready again."""
    log = Log()
    submit(log, "gang", 3, "4")
    views = [view("a", cpu=4000), view("b", cpu=4000), view("c", SUSPECT, cpu=4000)]
    nodes = cluster(*views)
    d = log.step(nodes)
    assert "needs 12 cpu in one gang; the region has 8 cpu in 2 ready nodes" in d.unplaced["gang"]
    nodes.observe(dataclasses.replace(views[2].state, seq=2), HEARD + 1)  # c heartbeats again
    nodes.sweep(HEARD + 1)
    assert nodes.nodes["c"].status == READY
    assert len(placements(log.step(nodes, NOW + 1))) == 3


def test_anti_affinity_and_labels_count_in_what_can_ever_fit():
    log = Log()
    submit(log, "spread", 3, "1", placement={"anti_affinity": True})
    submit(log, "picky", 1, "1", placement={"labels": {"rack": "r1"}})
    d = log.step(cluster(view("a"), view("b")))
    assert "2 nodes that can take one hold 2 at most" in d.unplaced["spread"]
    assert "fits no node, even idle: 2 nodes: label rack≠r1" in d.unplaced["picky"]


def gpu_node(node_id: str, gpus: int, memory: int = 40 * GiB) -> NodeInfo:
    slots = tuple(GpuSlot(f"{node_id}-g{j}", memory_total=memory) for j in range(gpus))
    cap = Resources(cpu=64000, memory=256 * GiB, gpu=1000 * gpus, gpu_memory=memory * gpus)
    return NodeInfo(node_id, cap, gpus=slots)


def verdict(nodes: list[NodeInfo], spec: dict) -> str | None:
    state = RegionState()
    return region_fit(state, Snapshot(nodes)).verdict(needs_of_spec(parse_job_spec(spec)))


def gpu_job(count: int, gpu, gpu_memory: str = "0") -> dict:
    res = {"cpu": "1", "gpu": gpu, "gpu_memory": gpu_memory}
    return {
        "name": "g",
        "tasks": [{"role": "w", "count": count, "command": ["x"], "resources": res}],
    }


def test_gpus_are_counted_per_node_and_per_gpu():
    nodes = [gpu_node("a", 3), gpu_node("b", 3)]  # 6 GPUs, but whole pairs: 1 + 1
    assert verdict(nodes, gpu_job(2, 2)) is None
    assert "hold 2 at most" in verdict(nodes, gpu_job(3, 2))
    # Shares: a GPU holds 2 tasks of 0.4 GPU, and 2 of 0.1 GPU and 20 GiB of its 40.
    assert verdict(nodes, gpu_job(12, 0.4)) is None
    assert "hold 12 at most" in verdict(nodes, gpu_job(13, 0.4))
    assert verdict(nodes, gpu_job(12, 0.1, "20Gi")) is None
    assert "hold 12 at most" in verdict(nodes, gpu_job(13, 0.1, "20Gi"))
    assert "fits no node" in verdict(nodes, gpu_job(1, 0.5, "50Gi"))


def test_in_use_gpu_memory_and_grants_do_not_make_a_job_unfit():
    """Only the idle region counts: memory an outside process holds may be freed."""
    busy = NodeInfo(
        "a",
        Resources(cpu=8000, memory=16 * GiB, gpu=1000, gpu_memory=40 * GiB),
        allocated=Resources(cpu=8000),
        gpus=(GpuSlot("g0", memory_total=40 * GiB, allocated=1000, memory_used=40 * GiB),),
    )
    assert verdict([busy], gpu_job(1, 1, "30Gi")) is None
    assert "fits no node" in verdict([busy], gpu_job(1, 1, "41Gi"))


def test_submit_warns_of_a_job_that_cannot_fit_today_s_region():
    log = Log()
    nodes = cluster(*region_118())
    big = {
        "name": "big",
        "tasks": [{"role": "w", "count": 200, "command": ["x"], "resources": {"cpu": 1}}],
    }
    small = {"name": "small", "tasks": [{"role": "w", "command": ["x"]}]}
    why = submit_warning(log.state, nodes, parse_job_spec(big))
    assert why.startswith("accepted, but it can never fit the region as it is: needs 200 cpu")
    assert submit_warning(log.state, nodes, parse_job_spec(small)) is None
    assert submit_warning(log.state, cluster(), parse_job_spec(big)) is None  # no node yet


def test_a_job_that_names_no_pool_goes_to_default_once_pools_are_defined():
    source = load_pool_source("pools:\n  /ml: {}\n  /ml/vision: {}\n  /web: {}\n")
    tree, applied = with_default_pool(parse_pool_tree(source), source)
    assert tree.order == ("/", "/default", "/ml", "/web", "/ml/vision")
    assert tree.is_leaf(DEFAULT_POOL) and parse_pool_tree(applied) == tree
    assert job_pool(tree, "/") == DEFAULT_POOL and job_pool(tree, "/web") == "/web"
    assert job_pool(parse_pool_tree("pools: {}\n"), "/") == "/"  # / alone is a leaf
    own = load_pool_source("pools:\n  /default: {cpu: {limit: 4}}\n")
    assert with_default_pool(parse_pool_tree(own), own)[1] is own  # kept as defined
    nested = load_pool_source("pools:\n  /default: {}\n  /default/x: {}\n")
    with pytest.raises(PoolConfigError, match="/default: must be a leaf"):
        with_default_pool(parse_pool_tree(nested), nested)


# --------------------------------------------------------------------------- property

CORES = st.integers(1, 16)


def fits_idle(caps: list[int], count: int, cpu: int) -> bool:
    """Whether placement puts a gang of `count` tasks of `cpu` millicores on the idle
    nodes: the independent judge of "fits the region's capacity"."""
    spec = parse_job_spec(
        {
            "name": "j",
            "tasks": [
                {"role": "w", "count": count, "command": ["x"], "resources": {"cpu": f"{cpu}m"}}
            ],
        }
    )
    shape = spec_shape(spec, spec.tasks[0])
    nodes = [NodeInfo(f"n{i}", Resources(cpu=c, memory=16 * GiB)) for i, c in enumerate(caps)]
    gang = GangRequest("j", tuple(TaskRequest(f"t{k}", shape) for k in range(count)))
    return len(place(Snapshot(nodes), [gang]).placed) == count


@st.composite
def regions(draw):
    caps = [1000 * draw(CORES) for _ in range(draw(st.integers(1, 5)))]
    total = sum(caps)
    jobs = []  # (job id, count, cpu millicores, priority, fits)
    for i in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["over_total", "over_node", "fragmented"]))
        if kind == "over_total":
            count = draw(st.integers(2, 40))
            cpu = -(-(total + 1) // count)  # the gang is above the region's capacity
        elif kind == "over_node":
            count, cpu = 1, max(caps) + draw(st.integers(1, 4000))
        else:  # each fits a node, the gang does not fit them all at once
            cpu = draw(st.integers(500, max(caps)))
            count = sum(c // cpu for c in caps) + draw(st.integers(1, 3))
        jobs.append((f"never{i:02d}", count, cpu, draw(st.integers(0, 5))))
    for i in range(draw(st.integers(1, 8))):
        count = draw(st.integers(1, 4))
        cpu = draw(st.integers(100, max(caps)))
        jobs.append((f"fits{i}", count, cpu, draw(st.integers(0, 5))))
    order = draw(st.permutations(range(len(jobs))))
    return caps, [jobs[k] for k in order]


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failing example is slow to run
)
@given(regions())
def test_no_job_that_fits_the_region_waits_for_ever_behind_jobs_that_cannot(region):
    """Random regions, one pool, jobs that can never fit (above the region's capacity,
    above every node, or more than the nodes hold at once) mixed in any order and
    priority with jobs that fit: rounds in which every running task ends at the next
    round place every job that fits within a bound set by their number alone."""
    caps, jobs = region
    log = Log()
    nodes = cluster(*(view(f"n{i}", cpu=c, memory=64 * GiB) for i, c in enumerate(caps)))
    fitting = set()
    for job_id, count, cpu, priority in jobs:
        submit(log, job_id, count, f"{cpu}m", priority=priority)
        if fits_idle(caps, count, cpu):
            assert not job_id.startswith("never")
            fitting.add(job_id)
    config = PlacementConfig(starve_after_s=5.0, hold_s=20.0, release_s=5.0)
    bound = 4 * len(fitting) + 4
    running: list[str] = []
    now = NOW
    for _ in range(bound):
        for tid in running:
            log.update(tid, S.SUCCEEDED)
        running = []
        now += 1.0
        d = reconcile(log.state, nodes, now, config)
        if d.events:
            log.append(*d.events)
        for tid, _, _ in placements(d):
            log.update(tid, S.RUNNING)
            running.append(tid)
        if all(log.state.jobs[j].pending == 0 for j in fitting):
            break
    left = sorted(j for j in fitting if log.state.jobs[j].pending)
    assert not left, (left, {j: d.unplaced.get(j) for j in left})
    for job_id, *_ in jobs:
        if job_id not in fitting:
            assert log.state.jobs[job_id].pending, job_id  # never placed, not even in part
