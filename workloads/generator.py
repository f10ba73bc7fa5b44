"""A seeded workload for placement benchmarks: jobs as the job-spec YAML shape, with
arrival times.

Pure and deterministic: the same `WorkloadConfig` gives the same jobs, byte for byte,
so two runs of a benchmark (or a scheduler before and after a change) see one
workload. Arrivals come from their own random stream, so switching between `rate` and
a burst changes when the jobs come, never what they are. Every task is
`simulate: {duration: D}`: hollow nodes run it, real agents refuse it.

What a workload is made of (defaults in brackets):

- Shape: a share of the TASKS [0.3] in gangs (one task group of 2-64 tasks, placed all
  or nothing), the rest single-task jobs. Gang sizes are powers of two (the usual
  data-parallel widths), drawn with weight size^-1/2: mean about 11. The share is held
  by error diffusion, not by a coin per job, so it is met within one gang at any size;
  each gang's size is drawn before its turn comes, so the sizes are not biased.
- Durations: lognormal, median [60 s] and sigma [1.0] (mean = median x e^(sigma^2/2),
  ~99 s), clamped to [1 s, 6 h]. A gang's tasks share one duration.
- GPUs: a share of the JOBS [0.2] asks for them; of those, half [0.5] ask for a share of
  one GPU (0.25 GPU with 5Gi of its memory, or 0.5 with 10Gi: both fit an L4's 24 GiB
  four or two ways) and the rest for whole GPUs (1, 2, 4 or 8 per task, weights
  4:3:2:1, mean 2.6) with 8 cores and 40Gi of memory per GPU. CPU tasks ask for 0.5-8
  cores (mean 2.3) and 2Gi of memory per core.
- Constraints: a share of the JOBS [0.2] carries a `placement:` block that the region
  of `agent.hollow.MIX` can satisfy: GPU jobs name a `gpu_model` that has their size
  (8 GPUs: A100 or H100 only), fractional ones add the `gpu_isolation` that model's
  nodes can deliver (L4: watchdog; A100: up to mps; H100: up to mig), GPU gangs ask to
  `pack`; CPU gangs `spread` over zones or ask for `anti_affinity`; CPU singles name a
  zone, or (2 cores or less) `kind: edge`.
- Arrival: `rate` jobs/s as a Poisson process, or a burst (all at t=0) when rate is None.

Capacity (the 5,000-node region of `agent.hollow.MIX`: 187,200 cores, 7,600 GPUs, 1,000
4-core edge nodes). Per task, the defaults average about 0.30 GPU and 4.1 cores
(0.8 x 2.3 CPU-task cores + 0.1 x (2.6 GPUs, 20.8 cores) + 0.1 x (0.375 GPU, 2 cores)),
and a job has 1.38 tasks on average. So:

- a burst of 10,000 tasks (~7,270 jobs) asks for ~3,000 GPUs (39 %) and ~41,000 cores
  (22 %) at once: it all fits, and GPUs run out first, at ~25,000 tasks;
- at `rate` r jobs/s, Little's law holds r x 1.38 x 99 s = 136 r tasks running, i.e.
  ~41 r GPUs and ~560 r cores: r = 100 keeps about half the GPUs busy, and ~185 jobs/s
  is the most the region can hold in steady state.
The largest single ask, a gang of 64 tasks x 8 GPUs packed on H100s (512 GPUs), fits
the region's 250 H100 nodes (2,000 GPUs) with room to spare.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TASKS", "GeneratedJob", "WorkloadConfig", "describe", "generate"]

DEFAULT_TASKS = 10_000

_CPU_SIZES = ((0.5, 0.20), (1, 0.30), (2, 0.25), (4, 0.15), (8, 0.10))  # cores, weight
_WHOLE_GPUS = ((1, 4), (2, 3), (4, 2), (8, 1))  # GPUs per task, weight
_FRACTIONS = ((0.25, "5Gi"), (0.5, "10Gi"))  # share of one GPU, its memory
_GPU_MODELS = ("A100", "H100", "L4")
_ISOLATION = {"L4": ("watchdog",), "A100": ("watchdog", "mps"), "H100": ("watchdog", "mps", "mig")}
_ZONES = ("zone-a", "zone-b", "zone-c")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What to generate. Give `tasks` (stop at that many tasks, the last gang trimmed to
    fit) or `jobs` (that many jobs), not both; neither means DEFAULT_TASKS tasks. Shares
    are in [0, 1]: `gang_fraction` of tasks, the others of jobs."""

    seed: int = 0
    tasks: int | None = None
    jobs: int | None = None
    gang_fraction: float = 0.3
    gang_min: int = 2
    gang_max: int = 64
    duration_median_s: float = 60.0
    duration_sigma: float = 1.0
    duration_min_s: float = 1.0
    duration_max_s: float = 6 * 3600.0
    gpu_fraction: float = 0.2
    fractional_gpu_fraction: float = 0.5  # of the GPU jobs
    constrained_fraction: float = 0.2
    fail_fraction: float = 0.0  # jobs whose tasks exit 1 (simulated failure)
    rate: float | None = None  # jobs/s (Poisson); None: a burst at t=0
    pool: str = "/"
    name_prefix: str = "load"

    def __post_init__(self) -> None:
        if self.tasks is not None and self.jobs is not None:
            raise ValueError("give tasks or jobs, not both")
        for name in ("tasks", "jobs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name in (
            "gang_fraction",
            "gpu_fraction",
            "fractional_gpu_fraction",
            "constrained_fraction",
            "fail_fraction",
        ):
            _share(self, name)
        if not 2 <= self.gang_min <= self.gang_max <= 10_000:
            raise ValueError(
                f"gang sizes need 2 <= min <= max, got {self.gang_min}-{self.gang_max}"
            )
        if not 0 < self.duration_min_s <= self.duration_max_s or self.duration_median_s <= 0:
            raise ValueError("durations need 0 < min <= max and a median above 0")
        if self.duration_sigma < 0:
            raise ValueError(f"duration_sigma must be >= 0, got {self.duration_sigma}")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of jobs/s, got {self.rate}")

    @property
    def burst(self) -> bool:
        return self.rate is None


def _share(config: WorkloadConfig, name: str) -> None:
    value = getattr(config, name)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass(frozen=True, slots=True)
class GeneratedJob:
    """One job to submit `offset_s` seconds after the start. `spec` is plain data in the
    job-spec YAML shape (`workloads.spec.parse_job_spec` reads it); the other fields say
    what it was drawn as, for summaries."""

    offset_s: float
    spec: dict[str, Any]
    tasks: int
    gang: bool
    gpu: str  # "", "fractional" or "whole"
    constrained: bool


def generate(config: WorkloadConfig) -> list[GeneratedJob]:
    """The workload `config` describes, in arrival order."""
    rng = random.Random(f"jobs:{config.seed}")
    arrivals = random.Random(f"arrivals:{config.seed}")
    target = config.tasks if config.jobs is None and config.tasks is not None else DEFAULT_TASKS
    sizes = _gang_sizes(config.gang_min, config.gang_max)
    out: list[GeneratedJob] = []
    total = in_gangs = 0
    next_gang = _draw_gang(rng, sizes)
    offset = 0.0
    while (len(out) < config.jobs) if config.jobs is not None else (total < target):
        size = next_gang
        if config.jobs is None:
            size = min(size, target - total)
        gang = size >= config.gang_min and _closer(
            config.gang_fraction, in_gangs + size, total + size, in_gangs, total + 1
        )
        count = size if gang else 1
        if gang:
            next_gang = _draw_gang(rng, sizes)
        if config.rate is not None:
            offset += arrivals.expovariate(config.rate)
        out.append(_job(config, rng, len(out), count, gang, offset))
        total += count
        in_gangs += count if gang else 0
    return out


def _closer(target: float, g1: int, t1: int, g0: int, t0: int) -> bool:
    """Whether the gang share g1/t1 is nearer the target than g0/t0 (ties: no)."""
    return abs(g1 / t1 - target) < abs(g0 / t0 - target)


def _gang_sizes(low: int, high: int) -> tuple[tuple[int, float], ...]:
    sizes = {low, high} | {2**k for k in range(1, 14) if low <= 2**k <= high}
    return tuple((s, s**-0.5) for s in sorted(sizes))


def _draw_gang(rng: random.Random, sizes: tuple[tuple[int, float], ...]) -> int:
    return _pick(rng, sizes)


def _pick(rng: random.Random, weighted: tuple[tuple[Any, float], ...]) -> Any:
    return rng.choices([v for v, _ in weighted], [w for _, w in weighted])[0]


def _job(
    config: WorkloadConfig, rng: random.Random, index: int, count: int, gang: bool, offset: float
) -> GeneratedJob:
    # Every draw is made whatever the shares, so changing one share moves no other draw.
    duration = config.duration_median_s * math.exp(config.duration_sigma * rng.gauss(0.0, 1.0))
    duration = round(min(config.duration_max_s, max(config.duration_min_s, duration)), 3)
    u_gpu, u_frac, u_constrained, u_fail = (rng.random() for _ in range(4))
    cores = _pick(rng, _CPU_SIZES)
    gpus = _pick(rng, _WHOLE_GPUS)
    fraction, fraction_memory = rng.choice(_FRACTIONS)
    model_draw, isolation_draw, zone_draw, choice_draw = (rng.random() for _ in range(4))

    gpu = ""
    if u_gpu < config.gpu_fraction:
        gpu = "fractional" if u_frac < config.fractional_gpu_fraction else "whole"
    if gpu == "whole":
        resources: dict[str, Any] = {"cpu": 8 * gpus, "memory": f"{40 * gpus}Gi", "gpu": gpus}
    elif gpu == "fractional":
        resources = {"cpu": 2, "memory": "8Gi", "gpu": fraction, "gpu_memory": fraction_memory}
    else:
        resources = {"cpu": cores, "memory": f"{max(1, int(2 * cores))}Gi"}

    simulate: dict[str, Any] = {"duration": duration}
    if u_fail < config.fail_fraction:
        simulate["exit_code"] = 1
    kind = "gang" if gang else "single"
    spec: dict[str, Any] = {
        "name": f"{config.name_prefix}-{index:06d}",
        "pool": config.pool,
        "labels": {"load.kind": kind, "load.gpu": gpu or "none"},
        "tasks": [{"role": "w", "count": count, "resources": resources, "simulate": simulate}],
    }
    constrained = u_constrained < config.constrained_fraction
    if constrained:
        draws = (model_draw, isolation_draw, zone_draw, choice_draw)
        spec["placement"] = _placement(gpu, gang, resources, draws)
    return GeneratedJob(offset, spec, count, gang, gpu, constrained)


def _at(options: tuple[Any, ...], u: float) -> Any:
    return options[min(len(options) - 1, int(u * len(options)))]


def _placement(
    gpu: str, gang: bool, resources: dict[str, Any], draws: tuple[float, ...]
) -> dict[str, Any]:
    """A placement block the region of agent.hollow.MIX can satisfy (module docstring)."""
    model_u, isolation_u, zone_u, choice_u = draws
    if gpu:
        models = ("A100", "H100") if resources["gpu"] == 8 else _GPU_MODELS
        model = _at(models, model_u)
        out: dict[str, Any] = {"labels": {"gpu_model": model}}
        if gpu == "fractional":
            out["gpu_isolation"] = _at(_ISOLATION[model], isolation_u)
        if gang:
            out["strategy"] = "pack"
        return out
    if gang:
        if choice_u < 0.5:
            return {"strategy": "spread", "spread_by": "zone"}
        return {"anti_affinity": True}
    if resources["cpu"] <= 2 and choice_u < 0.5:
        return {"labels": {"kind": "edge"}}
    return {"labels": {"zone": _at(_ZONES, zone_u)}}


def describe(jobs: list[GeneratedJob]) -> dict[str, Any]:
    """What a workload holds, and what it asks for if all of it ran at once (the burst
    case: compare with the region's capacity)."""
    tasks = sum(j.tasks for j in jobs)
    cpu = gpu = 0.0
    for j in jobs:
        r = j.spec["tasks"][0]["resources"]
        cpu += float(r["cpu"]) * j.tasks
        gpu += float(r.get("gpu", 0)) * j.tasks
    return {
        "jobs": len(jobs),
        "tasks": tasks,
        "gang_jobs": sum(j.gang for j in jobs),
        "gang_tasks": sum(j.tasks for j in jobs if j.gang),
        "gpu_jobs": sum(bool(j.gpu) for j in jobs),
        "fractional_gpu_jobs": sum(j.gpu == "fractional" for j in jobs),
        "constrained_jobs": sum(j.constrained for j in jobs),
        "span_s": round(jobs[-1].offset_s, 3) if jobs else 0.0,
        "cores_at_once": round(cpu, 1),
        "gpus_at_once": round(gpu, 2),
    }
