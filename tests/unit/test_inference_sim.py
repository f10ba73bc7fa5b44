"""The simulator, the workload generators and every policy end to end (small runs)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from inference.decisions import Dispatch, Gpu, ModelSpec, Request
from inference.policies import EXTRA_POLICIES, POLICIES, make_policy
from inference.profile import MS, RESNET50_V100, SOURCED_PROFILES, SYMPHONY_HARNESS
from inference.sim import Scenario, SimulationError, main, run_policy, simulate
from inference.workload import (
    NS,
    ArrivalSpec,
    burstiness,
    generate_events,
    interval_count_events,
    read_trace,
    to_requests,
    trace_rates,
    write_trace,
    zipf_weights,
)

SMALL = Scenario(n_models=4, n_gpus=4, duration_s=2.0, warmup_s=0.5)


@pytest.mark.parametrize("policy", POLICIES + EXTRA_POLICIES)
@pytest.mark.parametrize("cv", [1.0, 4.0])
def test_light_load_is_served_on_time_by_every_policy(policy: str, cv: float) -> None:
    res = run_policy(policy, SMALL, rate=300.0, cv=cv, seed=1)
    assert res.arrived > 300
    assert res.bad_rate <= 0.005, res
    assert res.late == 0 or policy in ("rayserve", "triton", "eager_edf")


def test_impossible_deadline_all_dropped_none_late() -> None:
    # 1 ms SLO, but a batch of one takes 5.2 ms: nothing can be served in time.
    models = [ModelSpec.single("m", 1 * MS, SYMPHONY_HARNESS)]
    gpus = [Gpu("g0"), Gpu("g1")]
    reqs = [Request(i, "m", i * MS, i * MS + 1 * MS) for i in range(200)]
    res = simulate(make_policy("ours", models, gpus), reqs, models, gpus)
    assert res.dropped == res.arrived == 200
    assert res.late == 0 and res.served_on_time == 0 and res.unanswered == 0


def test_overload_is_answered_by_drops_never_late_for_ours() -> None:
    res = run_policy("ours", SMALL, rate=20_000.0, cv=4.0, seed=2)
    assert res.late == 0 and res.unanswered == 0
    assert res.dropped > 0 and res.served_on_time > 0
    assert res.served_on_time + res.dropped == res.arrived


def test_same_seed_same_result_and_json_cli(capsys: pytest.CaptureFixture[str]) -> None:
    a = run_policy("rayserve", SMALL, rate=800.0, cv=4.0, seed=3)
    b = run_policy("rayserve", SMALL, rate=800.0, cv=4.0, seed=3)
    assert (a.served_on_time, a.late, a.dropped) == (b.served_on_time, b.late, b.dropped)
    assert main(["--policy", "all", "--rate", "400", "--gpus", "2", "--models", "3",
                 "--duration", "1", "--warmup", "0.2", "--arrival", "gamma", "--cv", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(last)
    assert [r["policy"] for r in out["results"]] == list(POLICIES)


def test_trace_replay_cli(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, [(i * 2 * MS, "a" if i % 3 else "b") for i in range(500)])
    assert main(["--arrival", "trace", "--trace", str(path), "--policy", "nexus",
                 "--gpus", "2", "--warmup", "0"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["results"][0]["arrived"] == 500


class _Cheater:
    """Serves everything at once on one GPU, overlapping its own batches."""

    name = "cheater"

    def __init__(self) -> None:
        self.q: list[Request] = []

    def submit(self, request: Request, now_ns: int) -> None:
        self.q.append(request)

    def step(self, now_ns: int) -> list:
        out = [Dispatch("g0", r.model, (r.id,), now_ns, now_ns + RESNET50_V100.latency(1))
               for r in self.q]
        self.q.clear()
        return out

    def next_wakeup_ns(self) -> int | None:
        return None


def test_simulator_rejects_overlapping_batches() -> None:
    models = [ModelSpec.single("m", 100 * MS, RESNET50_V100)]
    reqs = [Request(0, "m", 0, 100 * MS), Request(1, "m", 0, 100 * MS)]
    with pytest.raises(SimulationError):
        simulate(_Cheater(), reqs, models, [Gpu("g0")])


# ------------------------------------------------------------------ workloads


def test_zipf_weights() -> None:
    w = zipf_weights(4, 1.0)
    assert math.isclose(sum(w), 1.0)
    assert math.isclose(w[0] / w[3], 4.0)


@pytest.mark.parametrize("cv", [0.5, 1.0, 4.0, 8.0])
def test_generated_rate_and_burstiness(cv: float) -> None:
    spec = ArrivalSpec(2000.0, 20 * NS, ("only",), cv=cv)
    ev = generate_events(spec, seed=7)
    # gamma gaps at CV 8 are heavy-tailed: a wide band, but the mean rate must hold
    assert abs(len(ev) / 20 - 2000) / 2000 < (0.05 if cv <= 1 else 0.35)
    assert abs(burstiness(ev) - cv) / cv < 0.25
    assert ev == generate_events(spec, seed=7)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(ev))


def test_models_split_by_popularity() -> None:
    spec = ArrivalSpec(4000.0, 5 * NS, ("a", "b", "c", "d"), zipf_s=1.0)
    ev = generate_events(spec, seed=1)
    counts = {m: sum(1 for _, x in ev if x == m) for m in spec.models}
    assert counts["a"] > counts["b"] > counts["d"]
    reqs = to_requests(ev, {m: 50 * MS for m in spec.models})
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert all(r.deadline_ns - r.arrival_ns == 50 * MS for r in reqs)


def test_interval_counts_and_trace_round_trip(tmp_path) -> None:
    ev = interval_count_events({"x": [3, 0, 5], "y": [1, 1, 1]}, interval_ns=NS, seed=0)
    assert len(ev) == 11
    assert sum(1 for t, m in ev if m == "x" and 2 * NS <= t < 3 * NS) == 5
    path = tmp_path / "trace.csv"
    write_trace(path, ev)
    assert read_trace(path) == ev
    rates = trace_rates(ev)
    assert set(rates) == {"x", "y"}


def test_sourced_profiles() -> None:
    assert SOURCED_PROFILES["resnet50-v100"].latency(1) == 3_660_000
    assert SOURCED_PROFILES["symphony"].latency(1) == 6_286_000
    assert SOURCED_PROFILES["vgg16-titanx"].latency(1) == 5_310_000
    assert SYMPHONY_HARNESS.max_batch_within(50 * MS) == 32
    assert RESNET50_V100.max_batch_within(3 * MS) == 0
