"""Nexus's squishy bin packing, checked on the paper's own worked example (SOSP'19 §4.1).

The example quotes: model A (SLO 200 ms) tops out at batch 16 and 160 req/s per GPU;
with A = 64, B = C = 32 req/s, one GPU on a 125 ms cycle runs A in batches of 8 (75 ms),
and B's batch of 4 (50 ms) fits beside it (B's worst case 125 + 50 = 175 <= 250 ms)
while C's batch of 4 (60 ms) does not. The profiles below are straight lines through
exactly the points the example quotes (A: l(8) = 75 ms, l(16) = 100 ms; B: l(4) = 50 ms;
C: l(4) = 60 ms).
"""

from __future__ import annotations

from inference.decisions import Gpu, ModelSpec, Request
from inference.policies.nexus import Nexus, plan_for_pool
from inference.policies.nexus_plan import (
    Session,
    _node,
    residual_batch,
    saturated_batch,
    squishy_bin_pack,
)
from inference.profile import MS, LatencyProfile

A = LatencyProfile(a_ns=50 * MS, b_ns=3_125_000, max_batch=32)
B = LatencyProfile(a_ns=30 * MS, b_ns=5 * MS, max_batch=32)
C = LatencyProfile(a_ns=40 * MS, b_ns=5 * MS, max_batch=32)
SA = Session("A", A, 200 * MS, 64.0)
SB = Session("B", B, 250 * MS, 32.0)
SC = Session("C", C, 250 * MS, 32.0)


def test_profiles_go_through_the_quoted_points() -> None:
    assert A.latency(8) == 75 * MS
    assert A.latency(16) == 100 * MS
    assert B.latency(4) == 50 * MS
    assert C.latency(4) == 60 * MS


def test_model_a_saturates_at_batch_16_and_160_rps_per_gpu() -> None:
    assert saturated_batch(A, 200 * MS) == 16
    assert A.throughput(16) == 160.0
    assert 2 * A.latency(17) > 200 * MS  # one more and the SLO breaks


def test_a_alone_at_64_rps_runs_batches_of_8_on_a_125ms_cycle() -> None:
    assert residual_batch(A, 200 * MS, 64.0) == (8, 125 * MS)


def test_b_fits_beside_a_on_one_gpu_and_c_does_not() -> None:
    ab = _node([SA, SB], 125 * MS)
    assert ab is not None
    assert ab.duty_cycle_ns == 125 * MS
    assert [(x.model, x.batch) for x in ab.allocations] == [("A", 8), ("B", 4)]
    assert ab.exec_ns == 75 * MS + 50 * MS == 125 * MS
    assert ab.duty_cycle_ns + B.latency(4) == 175 * MS <= 250 * MS
    assert _node([SA, SC], 125 * MS) is None          # 75 + 60 = 135 > 125 ms
    assert _node([SA, SB, SC], 125 * MS) is None      # 75 + 50 + 60 = 185 > 125 ms


def test_squishy_bin_packing_of_the_example_needs_two_gpus() -> None:
    plan = squishy_bin_pack([SA, SB, SC])
    assert len(plan) == 2
    shared = next(p for p in plan if any(x.model == "A" for x in p.allocations))
    assert shared.duty_cycle_ns == 125 * MS
    assert sorted((x.model, x.batch) for x in shared.allocations) == [("A", 8), ("B", 4)]
    assert shared.occupancy == 1.0
    other = next(p for p in plan if p is not shared)
    assert [x.model for x in other.allocations] == ["C"]


def test_a_model_above_one_gpu_gets_saturated_gpus_plus_a_residual() -> None:
    plan = squishy_bin_pack([Session("A", A, 200 * MS, 400.0)])  # 2 x 160 + 80 left over
    full = [p for p in plan if p.allocations[0].batch == 16]
    assert len(full) == 2 and all(p.occupancy == 1.0 for p in full)
    assert len(plan) == 3
    assert abs(sum(x.rate for p in plan for x in p.allocations) - 400.0) < 1e-6


def test_pool_plan_uses_every_gpu_and_folds_overflow() -> None:
    sessions = [SA, SB, SC]
    assert len(plan_for_pool(sessions, 4)) == 4
    assert len(plan_for_pool(sessions, 1)) == 1


def test_nexus_runtime_caps_batches_at_the_plan_and_drops_early() -> None:
    models = [ModelSpec.single("A", 200 * MS, A), ModelSpec.single("B", 250 * MS, B)]
    nexus = Nexus(models, [Gpu("g0")], rates={"A": 64.0, "B": 32.0})
    for i in range(20):  # a burst of 20 A requests at t=0
        nexus.submit(Request(i, "A", 0, 200 * MS), 0)
    first = nexus.step(0)
    assert len(first) == 1 and len(first[0].request_ids) == 8  # the planned batch
    assert first[0].end_ns == 75 * MS
