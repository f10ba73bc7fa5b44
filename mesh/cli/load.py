"""`mesh load`: submit a generated workload (workloads.generator) and say how it went.

Submits are the thing measured, so they are kept in flight (`--concurrency` at once,
each one MeshClient.submit with its retries) and never wait on each other; with `--rate`
each job goes at its own arrival time, and a job sent late (the mesh could not keep up)
is counted as late, not hidden.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mesh.client import MeshClient
from mesh.schema import ApiError
from workloads.generator import GeneratedJob, WorkloadConfig, describe, generate

PROGRESS_S = 5.0  # how often a long run says where it is (stderr, human output only)
LATE_S = 0.1  # a job sent this far past its arrival time counts as late


def add_parser(sub: Any) -> None:
    lo = sub.add_parser("load", help="submit a generated workload (benchmark load)")
    size = lo.add_mutually_exclusive_group()
    size.add_argument("--tasks", type=int, help="tasks in all (default 10000)")
    size.add_argument("--jobs", type=int, help="number of jobs (instead of --tasks)")
    when = lo.add_mutually_exclusive_group()
    when.add_argument("--rate", type=float, help="jobs per second, Poisson arrivals")
    when.add_argument("--burst", action="store_true", help="all jobs at once (the default)")
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--concurrency", type=int, default=64, help="submits in flight at once")
    lo.add_argument("--gang-fraction", type=float, default=0.3, help="share of tasks in gangs")
    lo.add_argument("--gpu-fraction", type=float, default=0.2, help="share of jobs with GPUs")
    lo.add_argument(
        "--constrained-fraction",
        type=float,
        default=0.2,
        help="share of jobs with a placement block",
    )
    lo.add_argument("--median", type=float, default=60.0, help="median task duration, seconds")
    lo.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of durations")
    lo.add_argument("--pool", default="/")
    lo.add_argument("--prefix", default="load", help="job name prefix")
    lo.add_argument("--dry-run", action="store_true", help="generate and summarise, submit nothing")


def workload(args: argparse.Namespace) -> list[GeneratedJob]:
    """The jobs the arguments describe. Raises ValueError for values out of range."""
    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {args.concurrency}")
    return generate(config_from(args))


def config_from(args: argparse.Namespace) -> WorkloadConfig:
    return WorkloadConfig(
        seed=args.seed,
        tasks=args.tasks,
        jobs=args.jobs,
        gang_fraction=args.gang_fraction,
        gpu_fraction=args.gpu_fraction,
        constrained_fraction=args.constrained_fraction,
        duration_median_s=args.median,
        duration_sigma=args.sigma,
        rate=args.rate,
        pool=args.pool,
        name_prefix=args.prefix,
    )


@dataclass
class LoadResult:
    jobs: int = 0  # acknowledged
    tasks: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # by error code
    samples: dict[str, str] = field(default_factory=dict)  # error code -> first message
    late: int = 0  # sent more than LATE_S after their arrival time
    max_lag_s: float = 0.0
    latencies: list[float] = field(default_factory=list)  # submit to acknowledgement
    elapsed_s: float = 0.0

    def failed(self, code: str, message: str) -> None:
        self.errors[code] += 1
        self.samples.setdefault(code, message)

    def summary(
        self, workload: dict[str, Any], concurrency: int, target_rate: float | None = None
    ) -> dict[str, Any]:
        lat = sorted(self.latencies)
        rate = self.jobs / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {
            "workload": workload,
            "concurrency": concurrency,
            "submitted_jobs": self.jobs,
            "submitted_tasks": self.tasks,
            "errors": sum(self.errors.values()),
            "errors_by_code": dict(self.errors),
            "error_samples": dict(self.samples),
            "rate": target_rate,  # --rate (None: a burst)
            "elapsed_s": round(self.elapsed_s, 3),
            "jobs_per_s": round(rate, 1),
            "tasks_per_s": round(self.tasks / self.elapsed_s if self.elapsed_s > 0 else 0.0, 1),
            "ack_ms": {
                "p50": _ms(_quantile(lat, 0.50)),
                "p99": _ms(_quantile(lat, 0.99)),
                "max": _ms(lat[-1] if lat else None),
            },
            "late_jobs": self.late,
            "max_lag_s": round(self.max_lag_s, 3),
        }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def submit_all(
    client: MeshClient,
    jobs: list[GeneratedJob],
    concurrency: int,
    *,
    progress: bool = False,
    paced: bool = True,
) -> LoadResult:
    """Submit every job at its offset with at most `concurrency` in flight. Client ids
    are fresh per run (a rerun with the same seed is new work, not a retry). Lateness
    is counted only when `paced` (a `--rate`): a burst has no arrival times to miss."""
    result = LoadResult()
    run_id = uuid.uuid4().hex[:12]
    queue: asyncio.Queue[tuple[int, GeneratedJob]] = asyncio.Queue()
    for item in enumerate(jobs):
        queue.put_nowait(item)
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def worker() -> None:
        while not queue.empty():
            i, job = queue.get_nowait()
            delay = t0 + job.offset_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif paced and -delay > LATE_S:
                result.late += 1
                result.max_lag_s = max(result.max_lag_s, -delay)
            sent = loop.time()
            try:
                await client.submit(job.spec, client_id=f"load-{run_id}-{i}")
            except ApiError as exc:
                result.failed(str(exc.code), exc.message)
            except Exception as exc:  # a timeout, a lost connection: counted, not fatal
                result.failed(type(exc).__name__, str(exc) or type(exc).__name__)
            else:
                result.jobs += 1
                result.tasks += job.tasks
                result.latencies.append(loop.time() - sent)

    async def report() -> None:
        while True:
            await asyncio.sleep(PROGRESS_S)
            done = result.jobs + sum(result.errors.values())
            print(
                f"{done}/{len(jobs)} jobs sent, {sum(result.errors.values())} errors, "
                f"{loop.time() - t0:.0f} s",
                file=sys.stderr,
            )

    reporter = asyncio.create_task(report()) if progress else None
    try:
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(jobs))))))
    finally:
        if reporter is not None:
            reporter.cancel()
    result.elapsed_s = loop.time() - t0
    return result


def workload_line(w: dict[str, Any]) -> str:
    return (
        f"workload: {w['jobs']} jobs, {w['tasks']} tasks ({w['gang_tasks']} in "
        f"{w['gang_jobs']} gangs), {w['gpu_jobs']} GPU jobs ({w['fractional_gpu_jobs']} "
        f"fractional), {w['constrained_jobs']} constrained; at once {w['cores_at_once']:.0f} "
        f"cores, {w['gpus_at_once']:.0f} GPUs; over {w['span_s']:.1f} s"
    )


def human(summary: dict[str, Any]) -> str:
    ack = summary["ack_ms"]
    lines = [
        workload_line(summary["workload"]),
        f"submitted {summary['submitted_jobs']} jobs ({summary['submitted_tasks']} tasks) "
        f"in {summary['elapsed_s']:.1f} s: {summary['jobs_per_s']} jobs/s, "
        f"{summary['tasks_per_s']} tasks/s; {summary['errors']} errors",
        f"ack latency p50 {ack['p50']} ms, p99 {ack['p99']} ms, max {ack['max']} ms",
    ]
    samples = summary.get("error_samples", {})
    for code, count in sorted(summary["errors_by_code"].items()):
        sample = samples.get(code)
        lines.append(f"error {code} x{count}" + (f", e.g.: {sample}" if sample else ""))
    if summary["late_jobs"] and summary.get("rate") is not None:
        lines.append(
            f"{summary['late_jobs']} jobs sent late (max {summary['max_lag_s']:.2f} s behind): "
            f"the mesh did not keep up with --rate {summary['rate']:g}"
        )
    return "\n".join(lines)


async def run_load(args: argparse.Namespace, client: MeshClient, jobs: list[GeneratedJob]) -> dict:
    result = await submit_all(
        client, jobs, args.concurrency, progress=not args.json, paced=args.rate is not None
    )
    return result.summary(describe(jobs), args.concurrency, args.rate)
