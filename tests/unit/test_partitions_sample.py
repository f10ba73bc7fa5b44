"""`sample_from_state`: one heartbeat as the hotness windows' Sample, every figure a
0..1 fraction; and `busy_score`, the largest known signal."""

from __future__ import annotations

import pytest

from coordinator.partitions.sample import Sample, busy_score, sample_from_state
from mesh.schema import GpuStatus, NodeState, Resources

GiB = 1024**3


def node(**kw) -> NodeState:
    return NodeState(
        node_id="n1",
        region="r",
        seq=1,
        ts=kw.pop("ts", 5.0),
        capacity=kw.pop("capacity", Resources(cpu=8000, memory=32 * GiB)),
        **kw,
    )


def gpu(i: int, util: int) -> GpuStatus:
    return GpuStatus(i, f"GPU-{i}", "L4", 24 * GiB, 0, util)


def test_each_figure_is_a_fraction_of_the_nodes_capacity():
    s = sample_from_state(
        node(cpu_percent=40.0, load1=12.0, memory_used=8 * GiB, cpu_pressure=26.0,
             mem_pressure=3.5, gpus=(gpu(0, 20), gpu(1, 60))),
        now=100.0,
    )  # fmt: skip
    assert s == Sample(
        ts=100.0,
        cpu_busy=pytest.approx(0.4),
        load_per_core=pytest.approx(1.5),  # a run queue past the cores is kept as it is
        mem_used=pytest.approx(0.25),
        cpu_pressure=pytest.approx(0.26),
        mem_pressure=pytest.approx(0.035),
        gpu_util=pytest.approx(0.4),  # the mean of the GPUs
    )


def test_stamped_with_the_receivers_clock_not_the_agents():
    assert sample_from_state(node(ts=1.0), now=42.0).ts == 42.0


def test_no_psi_and_no_gpus_are_unknown_not_idle():
    s = sample_from_state(node(cpu_percent=10.0), now=1.0)
    assert s.cpu_pressure is None and s.mem_pressure is None and s.gpu_util is None


def test_a_node_declaring_no_cores_or_memory_reads_zero():
    s = sample_from_state(node(capacity=Resources(), load1=3.0, memory_used=GiB), now=1.0)
    assert (s.load_per_core, s.mem_used) == (0.0, 0.0)


def test_memory_over_capacity_is_clipped():
    s = sample_from_state(node(memory_used=64 * GiB), now=1.0)
    assert s.mem_used == 1.0


def test_busy_score_is_the_largest_signal_clipped():
    base = Sample(ts=0.0, cpu_busy=0.3, load_per_core=0.2, mem_used=0.1)
    assert busy_score(base) == pytest.approx(0.3)
    assert busy_score(Sample(0.0, 0.3, 2.5, 0.1)) == 1.0  # load per core clipped at 1
    assert busy_score(Sample(0.0, 0.3, 0.2, 0.8)) == pytest.approx(0.8)
    assert busy_score(Sample(0.0, 0.3, 0.2, 0.1, cpu_pressure=0.55)) == pytest.approx(0.55)
    assert busy_score(Sample(0.0, 0.3, 0.2, 0.1, mem_pressure=0.65)) == pytest.approx(0.65)
    assert busy_score(Sample(0.0, 0.3, 0.2, 0.1, gpu_util=0.9)) == pytest.approx(0.9)
    assert busy_score(Sample(0.0, 0.0, 0.0, 0.0)) == 0.0


def test_busy_score_of_a_hollow_nodes_heartbeat():
    s = sample_from_state(node(cpu_percent=75.0, load1=6.0), now=1.0)
    assert busy_score(s) == pytest.approx(0.75)
