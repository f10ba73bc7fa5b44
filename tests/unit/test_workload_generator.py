"""The benchmark workload generator (workloads.generator): seeded, in the shares asked,
and every job a spec the parser accepts and the simulated region can hold."""

from __future__ import annotations

import math
import statistics

import pytest

from workloads.generator import DEFAULT_TASKS, WorkloadConfig, describe, generate
from workloads.spec import parse_job_spec

GPU_MODELS = {"A100": 80, "H100": 80, "L4": 24}  # GiB per GPU in agent.hollow.MIX
ISOLATION_BY_MODEL = {  # the strongest each model's nodes deliver in the mix
    "L4": "watchdog",
    "A100": "mps",
    "H100": "mig",
}
ORDER = ("none", "watchdog", "mps", "mig")


@pytest.fixture(scope="module")
def default_jobs():
    return generate(WorkloadConfig(seed=7))


def test_same_seed_same_jobs_other_seed_other_jobs():
    a = generate(WorkloadConfig(seed=1, tasks=2000, rate=50.0))
    b = generate(WorkloadConfig(seed=1, tasks=2000, rate=50.0))
    c = generate(WorkloadConfig(seed=2, tasks=2000, rate=50.0))
    assert a == b
    assert [j.spec for j in a] != [j.spec for j in c]


def test_arrivals_change_when_not_what():
    burst = generate(WorkloadConfig(seed=4, tasks=1000))
    poisson = generate(WorkloadConfig(seed=4, tasks=1000, rate=20.0))
    assert [j.spec for j in burst] == [j.spec for j in poisson]
    assert all(j.offset_s == 0.0 for j in burst)


def test_task_total_is_exact_and_defaults_to_ten_thousand(default_jobs):
    assert sum(j.tasks for j in default_jobs) == DEFAULT_TASKS
    for n in (1, 2, 3, 65, 777):
        assert sum(j.tasks for j in generate(WorkloadConfig(tasks=n))) == n


def test_jobs_count():
    jobs = generate(WorkloadConfig(seed=3, jobs=500))
    assert len(jobs) == 500
    assert [j.spec["name"] for j in jobs] == [f"load-{i:06d}" for i in range(500)]


def test_every_spec_parses(default_jobs):
    for job in default_jobs:
        spec = parse_job_spec(job.spec)
        assert spec.task_count == job.tasks
        (group,) = spec.tasks
        assert group.simulate is not None and group.simulate.exit_code == 0
        assert not group.command  # simulated: only hollow nodes take it


def test_placement_blocks_parse():
    """The constrained share uses the job-level `placement:` block."""
    jobs = generate(WorkloadConfig(seed=5, tasks=3000, constrained_fraction=1.0))
    assert all("placement" in j.spec for j in jobs)
    for job in jobs:
        spec = parse_job_spec(job.spec)
        placement = job.spec["placement"]
        assert spec.placement.strategy == placement.get("strategy", "binpack")
        assert dict(spec.placement.labels) == placement.get("labels", {})
        assert spec.placement.anti_affinity == placement.get("anti_affinity", False)
        assert spec.placement.gpu_isolation == placement.get("gpu_isolation", "none")


def test_gang_share_of_tasks_within_tolerance(default_jobs):
    gang_tasks = sum(j.tasks for j in default_jobs if j.gang)
    assert abs(gang_tasks / DEFAULT_TASKS - 0.3) < 0.01
    for fraction in (0.0, 0.1, 0.6, 1.0):
        jobs = generate(WorkloadConfig(seed=2, tasks=5000, gang_fraction=fraction))
        share = sum(j.tasks for j in jobs if j.gang) / 5000
        assert abs(share - fraction) < 0.02, (fraction, share)


def test_gangs_are_one_group_of_two_to_sixty_four(default_jobs):
    gangs = [j for j in default_jobs if j.gang]
    assert gangs
    sizes = {j.tasks for j in gangs}
    assert min(sizes) >= 2 and max(sizes) <= 64
    assert {2, 64} <= sizes  # both ends drawn
    for j in gangs:
        (group,) = j.spec["tasks"]
        assert group["count"] == j.tasks
    assert all(j.tasks == 1 for j in default_jobs if not j.gang)
    assert 6 < statistics.mean(j.tasks for j in gangs) < 16  # sizes^-1/2 weights: ~11


def test_job_shares_within_tolerance(default_jobs):
    n = len(default_jobs)
    tol = 4 * math.sqrt(0.25 / n)  # four standard deviations of a share
    gpu = [j for j in default_jobs if j.gpu]
    assert abs(len(gpu) / n - 0.2) < tol
    assert abs(sum(j.gpu == "fractional" for j in gpu) / len(gpu) - 0.5) < 4 * math.sqrt(
        0.25 / len(gpu)
    )
    assert abs(sum(j.constrained for j in default_jobs) / n - 0.2) < tol
    assert sum("placement" in j.spec for j in default_jobs) == sum(
        j.constrained for j in default_jobs
    )


def test_gpu_requests_are_fractional_with_memory_or_whole(default_jobs):
    for job in default_jobs:
        res = job.spec["tasks"][0]["resources"]
        if job.gpu == "fractional":
            assert (res["gpu"], res["gpu_memory"]) in ((0.25, "5Gi"), (0.5, "10Gi"))
        elif job.gpu == "whole":
            assert res["gpu"] in (1, 2, 4, 8) and "gpu_memory" not in res
        else:
            assert "gpu" not in res


def test_durations_are_lognormal_around_the_median(default_jobs):
    durations = [j.spec["tasks"][0]["simulate"]["duration"] for j in default_jobs]
    assert 54 < statistics.median(durations) < 66
    logs = [math.log(d) for d in durations]
    assert 0.9 < statistics.stdev(logs) < 1.1
    assert min(durations) >= 1.0 and max(durations) <= 6 * 3600


def test_poisson_arrivals_at_the_rate():
    jobs = generate(WorkloadConfig(seed=9, jobs=4000, rate=200.0))
    offsets = [j.offset_s for j in jobs]
    assert offsets == sorted(offsets) and offsets[0] > 0
    assert abs(len(jobs) / offsets[-1] - 200.0) < 200.0 * 0.06
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert abs(statistics.stdev(gaps) / statistics.mean(gaps) - 1.0) < 0.1  # exponential


def test_constraints_are_satisfiable_by_the_mix():
    jobs = generate(WorkloadConfig(seed=11, tasks=4000, constrained_fraction=1.0))
    for job in jobs:
        p = job.spec["placement"]
        res = job.spec["tasks"][0]["resources"]
        if job.gpu:
            model = p["labels"]["gpu_model"]
            assert model in GPU_MODELS
            if res["gpu"] == 8:
                assert model != "L4"  # L4 nodes have 4 GPUs
            wanted = p.get("gpu_isolation", "none")
            assert ORDER.index(wanted) <= ORDER.index(ISOLATION_BY_MODEL[model])
            if job.gang:
                assert p["strategy"] == "pack"
        elif job.gang:
            assert p in ({"strategy": "spread", "spread_by": "zone"}, {"anti_affinity": True})
        elif p["labels"].get("kind") == "edge":
            assert res["cpu"] <= 2  # an edge node has 4 cores and 8 GiB
        else:
            assert p["labels"]["zone"] in ("zone-a", "zone-b", "zone-c")


def test_a_burst_of_the_default_size_fits_the_5000_node_region(default_jobs):
    summary = describe(default_jobs)
    assert summary["tasks"] == DEFAULT_TASKS
    assert summary["gpus_at_once"] < 7600 * 0.5
    assert summary["cores_at_once"] < 187_200 * 0.3


def test_failures_are_simulated_exit_codes():
    jobs = generate(WorkloadConfig(seed=1, jobs=1000, fail_fraction=0.1))
    failing = [j for j in jobs if j.spec["tasks"][0]["simulate"].get("exit_code")]
    assert 60 < len(failing) < 140
    assert parse_job_spec(failing[0].spec).tasks[0].simulate.exit_code == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tasks": 10, "jobs": 10},
        {"tasks": 0},
        {"gang_fraction": 1.5},
        {"gpu_fraction": -0.1},
        {"gang_min": 1},
        {"gang_min": 8, "gang_max": 4},
        {"rate": 0.0},
        {"duration_median_s": 0.0},
        {"duration_min_s": 10.0, "duration_max_s": 5.0},
        {"duration_sigma": -1.0},
    ],
)
def test_bad_configs_are_refused(kwargs):
    with pytest.raises(ValueError):
        WorkloadConfig(**kwargs)
