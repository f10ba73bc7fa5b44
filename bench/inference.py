"""`python -m bench inference`: deadline-aware inference routing, ours vs the baselines.

Measures, on the simulator (inference.sim) with the same arrivals, GPUs and profiles
for every policy:

1. the highest request rate each policy sustains with <= 1% bad (late + dropped +
   unanswered), found by bisection, on 8 GPUs, Poisson and gamma CV=4, pooled over 5
   seeds;
2. the GPUs each policy needs for a fixed load at <= 1% bad;
3. the router core's own scheduling decisions per second on one core;
4. a PNG of bad rate vs request rate for all policies (``--plot``).

Targets (the issue): ours >= 2x eager+EDF and >= 1.2x Clockwork at CV=4, and >= 100,000
decisions/s per core. The returned dict carries the figures, the ratios and whether
each target was met; bench/__main__.py prints it as the last line.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor

from inference.decisions import Dispatch, Gpu, ModelSpec
from inference.policies import POLICIES
from inference.profile import MS, SOURCED_PROFILES
from inference.router_core import RouterCore
from inference.sim import Scenario, run_policy
from inference.workload import NS, ArrivalSpec, generate_events, to_requests

BAD_LIMIT = 0.01


def _bad(
    args: tuple[str, Scenario, float, float, tuple[int, ...], int | None],
) -> tuple[float, int]:
    """Pooled bad rate of ``policy`` at ``rate`` over ``seeds`` (run in a worker)."""
    policy, sc, rate, cv, seeds, n_gpus = args
    bad = arrived = 0
    for s in seeds:
        r = run_policy(policy, sc, rate, cv, s, n_gpus=n_gpus)
        bad += r.bad
        arrived += r.arrived
    return (bad / arrived if arrived else 0.0), arrived


def _max_rate(
    args: tuple[str, Scenario, float, tuple[int, ...], int, float, float],
) -> tuple[str, float, float, list[tuple[float, float]]]:
    """Bisect (geometrically) for the highest rate with pooled bad rate <= 1%."""
    policy, sc, cv, seeds, steps, lo, hi = args
    points = []
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        bad, _ = _bad((policy, sc, mid, cv, seeds, None))
        points.append((mid, bad))
        if bad <= BAD_LIMIT:
            lo = mid
        else:
            hi = mid
    return policy, cv, lo, points


def _gpus_needed(
    args: tuple[str, Scenario, float, float, tuple[int, ...], int],
) -> tuple[str, float, int | None]:
    """Fewest GPUs (bisection over 1..max) with pooled bad rate <= 1% at ``rate``."""
    policy, sc, rate, cv, seeds, max_gpus = args
    if _bad((policy, sc, rate, cv, seeds, max_gpus))[0] > BAD_LIMIT:
        return policy, cv, None
    lo, hi = 0, max_gpus  # lo fails (or is 0), hi passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _bad((policy, sc, rate, cv, seeds, mid))[0] <= BAD_LIMIT:
            hi = mid
        else:
            lo = mid
    return policy, cv, hi


def _grid(
    args: tuple[str, Scenario, float, float, tuple[int, ...]],
) -> tuple[str, float, float, float]:
    policy, sc, rate, cv, seeds = args
    return policy, cv, rate, _bad((policy, sc, rate, cv, seeds, None))[0]


def decisions_per_second(
    n_models: int,
    n_gpus: int,
    rate: float,
    duration_s: float,
    profile: str = "symphony",
    seed: int = 0,
) -> dict[str, float]:
    """Drive the router core alone over a generated workload and time it (one core).

    A decision is one request resolved: placed in a dispatched batch or dropped. The
    loop is what an I/O shell would run (submit each arrival, step, ask for the next
    wake-up), with no simulator bookkeeping, so the time is the core's own.
    """
    p = SOURCED_PROFILES[profile]
    models = [ModelSpec.single(f"m{i}", 100 * MS, p) for i in range(n_models)]
    gpus = [Gpu(f"g{j}") for j in range(n_gpus)]
    spec = ArrivalSpec(rate, int(duration_s * NS), tuple(m.name for m in models), 1.0, 1.0)
    reqs = to_requests(generate_events(spec, seed), {m.name: m.slo_ns for m in models})
    core = RouterCore(models, gpus)
    submit, step, wakeup = core.submit, core.step, core.next_wakeup_ns
    n = len(reqs)
    i = steps = decided = batches = 0
    t0 = time.process_time()
    while True:
        w = wakeup()
        ta = reqs[i].arrival_ns if i < n else None
        if ta is None and w is None:
            break
        t = ta if w is None or (ta is not None and ta <= w) else w
        while i < n and reqs[i].arrival_ns == t:
            submit(reqs[i], t)
            i += 1
        for d in step(t):
            if type(d) is Dispatch:
                decided += len(d.request_ids)
                batches += 1
            else:
                decided += 1
        steps += 1
    cpu = time.process_time() - t0
    return {
        "requests": n,
        "decisions": decided,
        "batches": batches,
        "steps": steps,
        "cpu_s": round(cpu, 3),
        "decisions_per_s": round(decided / cpu),
        "us_per_decision": round(1e6 * cpu / decided, 2),
    }


def _plot(
    path: str,
    grid: list[tuple[str, float, float, float]],
    knees: dict[tuple[str, float], float],
    sc: Scenario,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cvs = sorted({cv for _, cv, _, _ in grid})
    fig, axes = plt.subplots(1, len(cvs), figsize=(6.5 * len(cvs), 4.6), squeeze=False)
    for ax, cv in zip(axes[0], cvs, strict=True):
        for policy in dict.fromkeys(p for p, _, _, _ in grid):
            pts = sorted((r, b) for p, c, r, b in grid if p == policy and c == cv)
            if not pts:
                continue
            (line,) = ax.plot(
                [r for r, _ in pts],
                [100 * b for _, b in pts],
                marker="o",
                ms=3,
                lw=2.2 if policy == "ours" else 1.3,
                label=policy,
            )
            knee = knees.get((policy, cv))
            if knee:
                ax.axvline(knee, color=line.get_color(), ls=":", lw=0.8)
        ax.axhline(100 * BAD_LIMIT, color="black", lw=0.8, ls="--")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(0, 100)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("bad = late + dropped (%)")
        kind = "Poisson" if cv == 1.0 else f"gamma CV={cv:g}"
        ax.set_title(
            f"{kind}: {sc.n_gpus} GPUs, {sc.n_models} models (Zipf {sc.zipf_s:g}), "
            f"{sc.profile} profile, SLO {sc.slo_ms:g} ms",
            fontsize=9,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m bench inference", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer seeds, steps and points; half the fixed load"
    )
    ap.add_argument("--models", type=int, default=32)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--profile", choices=sorted(SOURCED_PROFILES), default="symphony")
    ap.add_argument("--slo-ms", type=float, default=100.0)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=None, help="simulated seconds per run")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument(
        "--fixed-load",
        type=float,
        default=None,
        help="req/s for the GPUs-needed measurement (default 8000; 4000 with --quick)",
    )
    ap.add_argument(
        "--plot",
        metavar="PATH",
        help="write the bad-rate plot here (needs matplotlib, the `bench` extra); "
        "docs/inference-bad-rate.png is the committed one. Default: no plot",
    )
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-gpus-needed", action="store_true", help="skip measurement 2")
    ap.add_argument("--no-grid", action="store_true", help="skip the plot's rate grid")
    args = ap.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        ap.error("--plot needs matplotlib: pip install -e '.[bench]' (or `make bench`)")

    quick = args.quick
    if args.fixed_load is None:  # a quick run's bisections simulate half the requests
        args.fixed_load = 4000.0 if quick else 8000.0
    seeds = tuple(range(args.seeds if args.seeds else (1 if quick else 5)))
    steps = 4 if quick else 9
    duration = args.duration if args.duration else (2.0 if quick else 4.0)
    sc = Scenario(
        n_models=args.models,
        n_gpus=args.gpus,
        profile=args.profile,
        slo_ms=args.slo_ms,
        zipf_s=args.zipf,
        duration_s=duration,
        warmup_s=1.0,
    )
    policies = [p for p in args.policies.split(",") if p]
    cvs = (1.0, 4.0)
    p = SOURCED_PROFILES[args.profile]
    ceiling = args.gpus * p.throughput(p.max_batch)  # every GPU on full batches
    lo, hi = ceiling / 64, ceiling * 1.25
    started = time.time()
    print(
        f"# inference bench: {args.gpus} GPUs, {args.models} models (Zipf {args.zipf}), "
        f"profile {args.profile} {p}, SLO {args.slo_ms} ms, {duration} s x {len(seeds)} "
        f"seeds, bisection {steps} steps in [{lo:.0f}, {hi:.0f}] req/s; "
        f"ideal ceiling {ceiling:.0f} req/s",
        flush=True,
    )

    knees: dict[tuple[str, float], float] = {}
    grid: list[tuple[str, float, float, float]] = []
    with ProcessPoolExecutor(max(1, args.workers)) as ex:
        jobs = [(pol, sc, cv, seeds, steps, lo, hi) for cv in cvs for pol in policies]
        for pol, cv, knee, _points in ex.map(_max_rate, jobs):
            knees[pol, cv] = knee
            print(f"max rate at <=1% bad  {pol:>10}  cv={cv:g}: {knee:8.0f} req/s", flush=True)

        # The plot uses a fixed grid, so every policy is compared at the same rates.
        # --quick computes it only for a plot.
        n_grid = 0 if args.no_grid or (quick and not args.plot) else (6 if quick else 14)
        rates = [ceiling * (0.15 + 0.9 * k / (n_grid - 1)) for k in range(n_grid)]
        gjobs = [(pol, sc, r, cv, seeds[:3]) for cv in cvs for pol in policies for r in rates]
        grid.extend(ex.map(_grid, gjobs))
        for cv in cvs if grid else ():
            print(f"bad rate (%) by request rate, cv={cv:g}, {min(3, len(seeds))} seeds:")
            print(f"{'req/s':>10}" + "".join(f"{p:>11}" for p in policies))
            for r in rates:
                row = {p: b for p, c, rr, b in grid if c == cv and rr == r}
                print(f"{r:10.0f}" + "".join(f"{100 * row[p]:11.2f}" for p in policies))

        needed: dict[tuple[str, float], int | None] = {}
        max_g = 6 * args.gpus
        njobs = [(pol, sc, args.fixed_load, cv, seeds, max_g) for cv in cvs for pol in policies]
        for pol, cv, g in ex.map(_gpus_needed, [] if args.no_gpus_needed else njobs):
            needed[pol, cv] = g
            print(
                f"GPUs for {args.fixed_load:.0f} req/s at <=1% bad  {pol:>10}  cv={cv:g}: "
                f"{g if g is not None else f'> {max_g}'}",
                flush=True,
            )

    core = decisions_per_second(
        args.models,
        args.gpus,
        knees.get(("ours", 1.0), 4000.0),
        1.0 if quick else 10.0,
        args.profile,
    )
    big = decisions_per_second(256, 64, 40_000.0, 0.5 if quick else 2.0, args.profile)
    print(
        f"router core, one core: {core['decisions_per_s']} decisions/s "
        f"({core['us_per_decision']} us each) at {args.models} models / {args.gpus} GPUs; "
        f"{big['decisions_per_s']} decisions/s at 256 models / 64 GPUs / 40k req/s",
        flush=True,
    )

    if args.plot and grid:
        _plot(args.plot, grid, knees, sc)
        print(f"plot: {args.plot}", flush=True)

    def ratio(base: str, cv: float) -> float | None:
        b = knees.get((base, cv))
        return round(knees["ours", cv] / b, 3) if b and ("ours", cv) in knees else None

    result = {
        "scenario": {
            "gpus": args.gpus,
            "models": args.models,
            "zipf": args.zipf,
            "profile": args.profile,
            "slo_ms": args.slo_ms,
            "duration_s": duration,
            "seeds": len(seeds),
            "bisection_steps": steps,
            "quick": quick,
        },
        "max_rate_at_1pct_bad": {f"{pol}/cv{cv:g}": round(v) for (pol, cv), v in knees.items()},
        "gpus_needed": {f"{pol}/cv{cv:g}": g for (pol, cv), g in needed.items()},
        "fixed_load_rps": args.fixed_load,
        "ratio_vs_eager_edf_cv4": ratio("eager_edf", 4.0),
        "ratio_vs_clockwork_cv4": ratio("clockwork", 4.0),
        "ratio_vs_eager_edf_poisson": ratio("eager_edf", 1.0),
        "ratio_vs_clockwork_poisson": ratio("clockwork", 1.0),
        "decisions_per_s": core["decisions_per_s"],
        "decisions_per_s_256_models_64_gpus": big["decisions_per_s"],
        "core_run": core,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus {platform.platform()}",
        "python": platform.python_version(),
        "wall_s": round(time.time() - started, 1),
        "plot": args.plot,
    }
    r_e, r_c = result["ratio_vs_eager_edf_cv4"], result["ratio_vs_clockwork_cv4"]
    result["targets"] = {
        "2x_eager_edf_cv4": r_e is not None and r_e >= 2.0,
        "1.2x_clockwork_cv4": r_c is not None and r_c >= 1.2,
        "100k_decisions_per_s": core["decisions_per_s"] >= 100_000,
    }
    return result


__all__ = ["decisions_per_second", "main"]
