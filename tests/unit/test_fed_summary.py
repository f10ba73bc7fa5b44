"""coordinator/federation/summary.py: a region's summary from its leader's state, when
a summary is believed, and whether a job (a gang or not) fits the region it describes;
mesh/fedschema.py: the summary on the wire."""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.cluster import ClusterView
from coordinator.federation.summary import (
    FRESH,
    STALE,
    UNREACHABLE,
    Demand,
    changed,
    demand_of,
    fits,
    fresh,
    region_rows,
    status,
    summarize,
)
from coordinator.records import task_id_for
from coordinator.state import RegionState
from mesh.codec import WireError, encode, pack
from mesh.fedschema import MAX_SHAPES, RegionSummary, decode_summary
from mesh.schema import JobSubmitted, LogEntry, NodeState, TaskPlaced
from workloads.resources import Resources
from workloads.spec import parse_job_spec

GiB = 1 << 30


def node(node_id: str, cpu: int, memory: int = 8 * GiB, gpu: int = 0) -> NodeState:
    return NodeState(
        node_id=node_id,
        region="eu",
        seq=1,
        ts=0.0,
        capacity=Resources(cpu=cpu, memory=memory, gpu=gpu, gpu_memory=gpu * 16 * GiB // 1000),
    )


def job(name: str, cpu: float, count: int = 1, pool: str | None = None) -> dict:
    spec = {
        "name": name,
        "tasks": [
            {
                "role": "w",
                "count": count,
                "resources": {"cpu": cpu, "memory": "1Gi"},
                "simulate": {"duration": 1.0},
            }
        ],
    }
    if pool is not None:
        spec["pool"] = pool
    return spec


def region() -> tuple[RegionState, ClusterView]:
    cluster = ClusterView("eu", suspect_after=3.0, down_after=10.0)
    cluster.observe(node("a", 4000), 0.0)
    cluster.observe(node("b", 8000, gpu=2000), 0.0)
    state = RegionState()
    state.apply(1, LogEntry(3, "c1", (JobSubmitted("j1", "k1", job("one", 3), 0.0),)))
    placed = TaskPlaced("j1", task_id_for("j1", "w", 0), 1, "a", 0.0)
    state.apply(2, LogEntry(3, "c1", (placed,)))
    state.apply(3, LogEntry(3, "c1", (JobSubmitted("j2", "k2", job("two", 64), 0.0),)))
    state.leader_id, state.term = "c1", 3
    return state, cluster


def test_a_summary_counts_capacity_free_shapes_and_queues():
    state, cluster = region()
    s = summarize(state, cluster, 1000.0)
    assert (s.region, s.ts, s.leader, s.term) == ("eu", 1000.0, "c1", 3)
    assert s.capacity.cpu == 12000 and s.capacity.gpu == 2000
    assert s.free.cpu == 12000 - 3000  # the placed task's 3 cores are granted on a
    assert [r.cpu for r in s.largest_free] == [8000, 1000]  # GPUs first, then cores
    assert s.largest_free[0].gpu == 2000
    assert s.queued == 1 and s.queue == {"/": 1}  # j2 waits (it fits nowhere)
    assert s.nodes == {"ready": 2} and s.health == "ok"


def test_a_region_with_silent_nodes_is_degraded_and_without_ready_ones_has_no_nodes():
    state, cluster = region()
    cluster.observe(dataclasses.replace(node("b", 8000), seq=2), 5.0)
    cluster.sweep(5.0)  # a was last heard at 0: suspect
    s = summarize(state, cluster, 1.0)
    assert s.health == "degraded" and s.nodes == {"ready": 1, "suspect": 1}
    assert s.capacity.cpu == 8000  # a suspect node offers nothing new
    cluster.sweep(20.0)
    assert summarize(state, cluster, 2.0).health == "no_nodes"


def test_the_shapes_are_bounded_to_the_largest():
    cluster = ClusterView("eu", suspect_after=3.0, down_after=10.0)
    for i in range(MAX_SHAPES + 8):
        cluster.observe(node(f"n{i:02d}", 1000 * (i + 1)), 0.0)
    s = summarize(RegionState(), cluster, 0.0)
    assert len(s.largest_free) == MAX_SHAPES
    assert s.largest_free[0].cpu == 1000 * (MAX_SHAPES + 8)
    assert min(r.cpu for r in s.largest_free) == 1000 * 9  # the 8 smallest left out
    assert s.free.cpu == sum(1000 * (i + 1) for i in range(MAX_SHAPES + 8))


def summary(free_shapes: list[int], ts: float = 100.0) -> RegionSummary:
    shapes = tuple(Resources(cpu=c, memory=8 * GiB) for c in sorted(free_shapes, reverse=True))
    return RegionSummary(
        region="us", ts=ts, free=Resources.total(shapes), largest_free=shapes, capacity=Resources()
    )


def tasks(n: int, cpu: int) -> tuple[Resources, ...]:
    return tuple(Resources(cpu=cpu, memory=GiB) for _ in range(n))


def test_a_gang_that_fits_the_free_total_but_no_node_shapes_does_not_fit():
    s = summary([1000] * 8)  # 8 cores free, one per node
    gang = Demand(tasks(2, 2000), gang=True)  # 4 cores, 2 per task
    assert Resources.total(gang.tasks).fits_in(s.free)
    assert not fits(s, gang)
    assert not fits(s, Demand(tasks(2, 2000)))  # nor alone: no node takes a 2-core task


def test_a_gang_packs_into_the_shapes_all_at_once():
    s = summary([4000, 2000])
    assert fits(s, Demand(tasks(3, 2000), gang=True))  # two on the 4-core, one on the 2
    assert not fits(s, Demand(tasks(4, 2000), gang=True))
    assert fits(s, Demand(tasks(2, 3000)))  # not a gang: each fits the 4-core, total 6 = 6
    assert not fits(s, Demand(tasks(2, 3000), gang=True))  # together they need two 3-cores
    assert not fits(s, Demand((), gang=True))


def test_the_demand_of_a_spec():
    d = demand_of(parse_job_spec(job("g", 2, count=3)))
    assert d.gang and d.tasks == tasks(3, 2000)  # all at once, as jobs are by default
    loose = {**job("b", 1, count=2), "placement": {"gang": False}}
    assert demand_of(parse_job_spec(loose)) == Demand(tasks(2, 1000), gang=False)


def test_a_stale_summary_is_ignored():
    s = summary([4000], ts=100.0)
    assert fresh(s, 105.0, 6.0) and status(s, 105.0, 6.0, 30.0) == FRESH
    assert not fresh(s, 106.5, 6.0) and status(s, 106.5, 6.0, 30.0) == STALE
    assert status(s, 131.0, 6.0, 30.0) == UNREACHABLE
    assert fresh(s, 95.0, 6.0)  # a clock a little behind the publisher's
    assert not fresh(s, 50.0, 6.0)  # a publisher's clock far ahead dates nothing
    rows = region_rows({"us": s}, 110.0, 6.0, 30.0)
    assert rows[0]["region"] == "us" and rows[0]["status"] == STALE
    assert rows[0]["age_s"] == 10.0 and rows[0]["free"]["cpu"] == 4000


def test_only_a_change_beyond_the_clock_is_news():
    s = summary([4000], ts=1.0)
    assert changed(None, s)
    assert not changed(s, dataclasses.replace(s, ts=2.0))
    assert changed(s, dataclasses.replace(s, queued=3))


def test_a_summary_crosses_the_wire_and_bad_ones_are_refused():
    state, cluster = region()
    s = summarize(state, cluster, 7.5)
    assert decode_summary(encode(s)) == s
    with pytest.raises(WireError):
        decode_summary(b"\xc1")  # not msgpack
    with pytest.raises(WireError):
        decode_summary(pack({"region": "eu", "ts": 1.0, "health": "splendid"}))
    with pytest.raises(WireError):
        decode_summary(pack({"region": "eu", "ts": 1.0, "free": {"cpu": -1}}))
    too_many = [Resources(cpu=1).to_dict()] * (MAX_SHAPES + 1)
    with pytest.raises(WireError):
        decode_summary(pack({"region": "eu", "ts": 1.0, "largest_free": too_many}))
