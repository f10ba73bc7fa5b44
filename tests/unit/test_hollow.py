"""Hollow nodes without a broker: the region's inventory mix, GPU state measured from
grants, and heartbeats encoded cheaply yet byte for byte as the codec would."""

from __future__ import annotations

from collections import Counter

import pytest

from agent.hollow import (
    BATCH_BUSY,
    BUSY_RANGE,
    FOREVER,
    GiB,
    HollowFleet,
    HollowNode,
    Inventory,
    inventory_mix,
)
from mesh.codec import decode, encode
from mesh.schema import NodeState, Resources, TaskSpec
from workloads.load import LoadCurve, load_at
from workloads.spec import SimulatedRun

REGION = "default"
A100 = Inventory(96, 1024 * GiB, "A100", 8, 80 * GiB, enforcement="mps")
L4 = Inventory(48, 192 * GiB, "L4", 4, 24 * GiB, zone="zone-b", enforcement="watchdog")


def kind(inv: Inventory) -> str:
    return inv.gpu_model or ("edge" if inv.edge else "cpu")


def gpu_task(gpu: int, gpu_memory: int = 0, uuids: tuple[str, ...] = ()) -> TaskSpec:
    return TaskSpec(resources=Resources(cpu=1000, gpu=gpu, gpu_memory=gpu_memory), gpu_uuids=uuids)


def test_the_5000_node_mix_has_exact_shares_zones_and_enforcement():
    mix = inventory_mix(5000, seed=0)
    assert Counter(kind(i) for i in mix) == {
        "cpu": 2750,
        "A100": 400,
        "H100": 250,
        "L4": 600,
        "edge": 1000,
    }
    assert sum(i.cpus for i in mix) == 187_200 and sum(i.gpus for i in mix) == 7600
    by_kind: dict[str, list[Inventory]] = {}
    for inv in mix:
        by_kind.setdefault(kind(inv), []).append(inv)
    for name in ("cpu", "A100", "H100", "L4"):
        zones = Counter(i.zone for i in by_kind[name])
        assert set(zones) == {"zone-a", "zone-b", "zone-c"}
        assert max(zones.values()) - min(zones.values()) <= 1
    assert Counter(i.zone for i in by_kind["edge"]) == {"edge-1": 500, "edge-2": 500}
    assert all(i.edge and i.cpus == 4 for i in by_kind["edge"])
    enforcement = {name: Counter(i.enforcement for i in by_kind[name]) for name in by_kind}
    assert set(enforcement["H100"]) == {"mig", "mps"}
    assert set(enforcement["A100"]) == {"mps", "watchdog"}
    assert set(enforcement["L4"]) == {"watchdog"}
    assert set(enforcement["cpu"]) == set(enforcement["edge"]) == {"none"}
    for name in ("H100", "A100"):
        a, b = enforcement[name].values()
        assert abs(a - b) <= 6
    assert {(i.gpus, i.gpu_memory) for i in by_kind["H100"] + by_kind["A100"]} == {(8, 80 * GiB)}
    assert {(i.gpus, i.gpu_memory) for i in by_kind["L4"]} == {(4, 24 * GiB)}


def test_the_mix_is_seeded():
    assert inventory_mix(500, seed=3) == inventory_mix(500, seed=3)
    assert inventory_mix(500, seed=3) != inventory_mix(500, seed=4)
    assert Counter(inventory_mix(500, seed=3)) == Counter(inventory_mix(500, seed=4))
    assert len(inventory_mix(1)) == 1 and inventory_mix(0) == []


def test_labels_and_zone_per_node():
    for i, inv in enumerate(inventory_mix(60, seed=1)):
        st = HollowNode(f"n-{i}", inv).state(REGION)
        assert st.zone == inv.zone and "zone" not in st.labels
        assert st.labels["kind"] == ("edge" if inv.edge else "datacenter")
        assert st.labels.get("gpu_model", "") == inv.gpu_model
        assert len(st.gpus) == inv.gpus
        assert all(g.enforcement == inv.enforcement for g in st.gpus)
        assert st.capacity.gpu == 1000 * inv.gpus


def test_utilization_and_memory_come_from_the_grants():
    node = HollowNode("n-1", A100, busy=0.8)
    u = node.gpu_uuid
    node.start_run(("half", 1), gpu_task(500, 10 * GiB, (u(3),)), None)
    node.start_run(("two", 1), gpu_task(2000, 0, (u(0), u(1))), None)
    node.start_run(("quarter", 1), gpu_task(250, 5 * GiB, (u(3),)), None)
    gpus = {g.index: g for g in node.state(REGION).gpus}
    assert (gpus[3].utilization, gpus[3].memory_used) == (60, 15 * GiB)  # 0.75 x 100 x 0.8
    assert (gpus[0].utilization, gpus[1].utilization) == (80, 80)
    assert all(gpus[i].utilization == gpus[i].memory_used == 0 for i in (2, 4, 5, 6, 7))
    node.end_run(("half", 1))
    gpus = {g.index: g for g in node.state(REGION).gpus}
    assert (gpus[3].utilization, gpus[3].memory_used) == (20, 5 * GiB)
    node.end_run(("two", 1))
    node.end_run(("quarter", 1))
    assert all(g.utilization == g.memory_used == 0 for g in node.state(REGION).gpus)
    assert not node.grants


def test_utilization_is_capped_and_memory_split_evenly():
    node = HollowNode("n-1", L4, busy=1.0)
    u = node.gpu_uuid
    for k in range(3):  # over-committed on purpose: the measurement shows it
        node.start_run((f"t{k}", 1), gpu_task(500, 9 * GiB + 1, (u(0),)), None)
    node.start_run(("pair", 1), gpu_task(2000, 3, (u(1), u(2))), None)
    gpus = node.state(REGION).gpus
    assert gpus[0].utilization == 100 and gpus[0].memory_used == 3 * (9 * GiB + 1)
    assert (gpus[1].memory_used, gpus[2].memory_used) == (2, 1)  # the odd byte goes first


def test_a_grant_without_uuids_goes_to_the_least_granted_gpus():
    node = HollowNode("n-1", L4, busy=1.0)
    node.start_run(("a", 1), gpu_task(1000, 0, (node.gpu_uuid(0),)), None)
    node.start_run(("b", 1), gpu_task(2000), None)  # 2 GPUs, none named
    node.start_run(("c", 1), gpu_task(250), None)  # a quarter: one GPU
    assert [g.utilization for g in node.state(REGION).gpus] == [100, 100, 100, 25]


def test_a_foreign_uuid_is_not_counted():
    node = HollowNode("n-1", L4)
    node.start_run(("x", 1), gpu_task(1000, 0, ("GPU-n-2-0", "GPU-n-1-9")), None)
    assert not node.grants and all(g.utilization == 0 for g in node.state(REGION).gpus)


def test_cpu_only_nodes_ignore_gpu_requests():
    node = HollowNode("n-1", Inventory(32, 128 * GiB))
    node.start_run(("x", 1), gpu_task(1000), None)
    assert node.state(REGION).gpus == () and not node.grants


def test_background_utilization_with_no_mesh_task():
    fleet = HollowFleet(
        "nats://127.0.0.1:1",
        count=3,
        inventories=[A100, L4, Inventory(32, 128 * GiB)],
        gpu_background={"GPU-hollow-0001-2": 70},
    )
    l4 = fleet.nodes["hollow-0001"]
    assert [g.utilization for g in l4.state(REGION).gpus] == [0, 0, 70, 0]
    assert all(g.memory_used == 0 for g in l4.state(REGION).gpus)
    fleet.set_gpu_background("GPU-hollow-0000-7", 30)
    a100 = fleet.nodes["hollow-0000"]
    a100.busy = 1.0
    a100.start_run(("t", 1), gpu_task(500, 0, ("GPU-hollow-0000-7",)), None)
    assert a100.state(REGION).gpus[7].utilization == 80  # 30 + 50
    a100.set_background(7, 90)
    assert a100.state(REGION).gpus[7].utilization == 100
    with pytest.raises(KeyError):
        fleet.set_gpu_background("GPU-hollow-0002-0", 10)  # a CPU node
    with pytest.raises(KeyError):
        fleet.set_gpu_background("GPU-nowhere-0", 10)
    with pytest.raises(ValueError):
        fleet.set_gpu_background("GPU-hollow-0001-0", 101)


def test_busy_factors_are_seeded_in_range():
    a = HollowFleet("nats://127.0.0.1:1", count=200, seed=5)
    b = HollowFleet("nats://127.0.0.1:1", count=200, seed=5)
    c = HollowFleet("nats://127.0.0.1:1", count=200, seed=6)
    busy = [n.busy for n in a.nodes.values()]
    assert busy == [n.busy for n in b.nodes.values()]
    assert busy != [n.busy for n in c.nodes.values()]
    assert all(BUSY_RANGE[0] <= x <= BUSY_RANGE[1] for x in busy)
    assert max(busy) - min(busy) > 0.3


def test_encoded_heartbeat_with_measured_gpus_is_what_the_codec_gives():
    nodes = [
        HollowNode(f"hollow-{i:04d}", inv, busy=0.5 + i / 40)
        for i, inv in enumerate([*inventory_mix(12, seed=2), A100, L4])
    ]
    for node in nodes:
        n = node.inventory.gpus
        for step in range(6):
            if step == 1 and n:
                node.set_background(n - 1, 35)
            if step >= 2:
                uuids = tuple(node.gpu_uuid(i % max(1, n)) for i in range(step % 3 + 1))
                spec = gpu_task(250 * step, step * GiB + 7, uuids if n else ())
                node.start_run((f"job.w.{step}", step), spec, None)
            if step == 5:
                node.end_run(("job.w.3", 3))
            st = node.state(REGION)
            node.seq -= 1  # encode the same beat again, the cheap way
            raw = node.encode_state(REGION, st.ts)
            assert raw == encode(st), (node.node_id, step)
            assert decode(NodeState, raw) == st
        if n:
            assert any(g.utilization for g in st.gpus)
            assert any(g.memory_used for g in st.gpus)


# ------------------------------------------------------------ CPU busy from the runs

CPU32 = Inventory(32, 128 * GiB)


def sim_task(cpu: int, load: LoadCurve | None = None, duration: float | None = 60.0) -> TaskSpec:
    return TaskSpec(resources=Resources(cpu=cpu), simulate=SimulatedRun(duration, 0, load))


def test_an_idle_node_reports_no_busy():
    st = HollowNode("h-0", CPU32).state(REGION)
    assert (st.cpu_percent, st.load1) == (0.0, 0.0)
    assert (st.cpu_pressure, st.mem_pressure) == (None, None)  # a hollow node has no PSI


def test_runs_without_a_load_count_their_request_at_the_batch_fraction():
    node = HollowNode("h-0", CPU32)
    node.start_run(("t1", 0), sim_task(8000), None)
    node.start_run(("t2", 0), sim_task(4000), None)
    st = node.state(REGION)
    assert BATCH_BUSY == 1.0
    assert (st.cpu_percent, st.load1) == (37.5, 12.0)  # 12 of 32 cores
    node.end_run(("t1", 0))
    assert node.state(REGION).load1 == 4.0
    half = HollowNode("h-1", CPU32, batch_busy=0.5)
    half.start_run(("t1", 0), sim_task(8000), None)
    assert half.state(REGION).load1 == 4.0


def test_a_curve_is_followed_at_the_heartbeats_time():
    node = HollowNode("h-0", CPU32)
    load = LoadCurve("diurnal", 0.8, 0.2, 600.0, step_to=0.8)
    node.start_run(("svc", 0), sim_task(16000, load), None)  # scales to its 16-core request
    for ts in (1000.0, 1150.0, 1300.0, 1450.0):
        cpu, load1 = node.busy_at(ts)
        assert load1 == pytest.approx(load_at(load, ts, 16.0), abs=0.01)
        assert cpu == pytest.approx(100 * load_at(load, ts, 16.0) / 32, abs=0.1)
    peak, trough = node.busy_at(150.0), node.busy_at(450.0)
    assert peak == (40.0, 12.8) and trough == (10.0, 3.2)


def test_cpu_percent_is_capped_but_load_is_not():
    node = HollowNode("h-0", CPU32)
    node.start_run(("a", 0), sim_task(24000), None)
    node.start_run(("b", 0), sim_task(16000, LoadCurve("flat", 1.0, cores=20.0)), None)
    st = node.state(REGION)
    assert st.cpu_percent == 100.0 and st.load1 == 44.0  # oversubscribed: 44 of 32 cores


def test_noise_is_seeded_per_node_and_bounded_by_the_amplitudes():
    def busy(seed: int) -> list[float]:
        node = HollowNode("h", CPU32, load_seed=seed)
        node.start_run(("s", 0), sim_task(8000, LoadCurve("flat", 0.5, noise=0.1)), None)
        node.start_run(("b", 0), sim_task(2000), None)
        return [node.busy_at(float(t))[1] for t in range(300)]

    a = busy(1)
    assert a == busy(1)  # the same seed, the same noise
    assert a != busy(2)
    assert all(6.0 - 0.8 <= x <= 6.0 + 0.8 for x in a)  # 4 + 2 cores, +-0.1 x 8 cores
    assert max(a) > 6.6 and min(a) < 5.4
    assert sum(a) / len(a) == pytest.approx(6.0, abs=0.1)
    # one draw per second: the noise does not move within a second
    node = HollowNode("h", CPU32, load_seed=1)
    node.start_run(("s", 0), sim_task(8000, LoadCurve("flat", 0.5, noise=0.1)), None)
    assert node.busy_at(100.2) == node.busy_at(100.9)


def test_fleet_nodes_get_distinct_seeded_noise():
    a = HollowFleet("nats://127.0.0.1:1", count=50, seed=5)
    b = HollowFleet("nats://127.0.0.1:1", count=50, seed=5)
    seeds = [n.load_seed for n in a.nodes.values()]
    assert seeds == [n.load_seed for n in b.nodes.values()]
    assert len(set(seeds)) == 50
    assert (
        seeds[0]
        != HollowFleet("nats://127.0.0.1:1", count=1, seed=6).nodes["hollow-0000"].load_seed
    )
    assert (
        HollowFleet("nats://127.0.0.1:1", count=1, batch_busy=0.3).nodes["hollow-0000"].batch_busy
        == 0.3
    )


def test_busy_is_released_by_ends_and_crashes():
    node = HollowNode("h-0", CPU32)
    node.start_run(("a", 0), sim_task(8000), None)
    node.start_run(("b", 0), sim_task(8000, LoadCurve("flat", 0.5)), None)
    node.end_run(("b", 0))
    assert node.state(REGION).load1 == 8.0
    node.end_run(("a", 0))
    assert node.state(REGION).load1 == 0.0
    node.start_run(("c", 0), sim_task(8000), FOREVER)
    node.start_run(("d", 0), sim_task(8000, LoadCurve("flat", 0.5)), FOREVER)
    assert node.state(REGION).load1 == 12.0
    assert node.drop_all() == [("c", 0), ("d", 0)]
    assert node.state(REGION).load1 == 0.0
    assert node.encode_state(REGION, 5.0) == encode(node._state(REGION, node.seq, 5.0, ()))


def test_encoded_heartbeat_with_busy_is_what_the_codec_gives():
    node = HollowNode("h-0", A100, load_seed=9)
    diurnal = LoadCurve("diurnal", 0.9, 0.1, 60.0, cores=12.0, noise=0.05, step_to=0.9)
    steps = [
        ("batch", sim_task(8000)),
        ("svc", sim_task(4000, diurnal)),
        ("gpu", gpu_task(500, GiB)),
        ("forever", sim_task(2000, duration=None)),
    ]
    for i, (name, spec) in enumerate(steps):
        node.start_run((name, i), spec, None)
        for ts in (1000.0 + i, 1007.5 + i, 1031.0 + i):
            st = node._state(REGION, node.seq + 1, ts, tuple(node.live_tasks()))
            raw = node.encode_state(REGION, ts)
            assert raw == encode(st), (name, ts)
            assert decode(NodeState, raw) == st
    assert st.load1 > 8.0 and st.cpu_percent > 0.0
    node.end_run(("svc", 1))
    st = node._state(REGION, node.seq + 1, 2000.0, tuple(node.live_tasks()))
    assert node.encode_state(REGION, 2000.0) == encode(st)
    assert st.load1 == 11.0  # batch 8 + gpu task 1 + forever 2
