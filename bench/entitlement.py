"""`python -m bench entitlement`: full entitlement recompute on a large pool tree.

Scenario (seeded, so every run is the same): a 4-level tree of 1,000 pools (the root, 10
pools under it, 10 under each of those, and 889 leaves under those 100), with per-kind
reservations, limits, shares and static/elastic types drawn at random within the
validation rules; 100,000 pending tasks in gangs of 1-8 tasks (cpu, memory, disk, some
GPUs) spread unevenly over the leaves, plus 50,000 running tasks as their allocations; a
cluster of 2,000 nodes, less than the demand in cpu and GPUs (so the surplus is
water-filled) and more than it in disk (so the leftover is spread).

Measured, each `--runs` times (p50/p99/max):

- ``entitlement``: `compute_entitlement(tree, capacity, demand, allocation)` from
  per-leaf pending demand and allocation (what the coordinator keeps up to date as jobs
  come and go);
- ``aggregate``: `demand_by_pool` over the 100,000 tasks' gangs (what it costs to rebuild
  per-leaf demand from the queues instead);
- ``full``: the two together, the recompute from the queues.

Baseline in the same run: ``reference``, a straightforward implementation of the same
algorithm (`coordinator/pools/_reference.py`: recursive, per-pool dicts, each pool's want
recomputed from its subtree, exact fractions), on the same inputs; the run checks both give
identical entitlements. ``ratio`` = reference p50 / entitlement p50.

Target (issue): full recompute <= 20 ms p99 on this machine. Reported, never asserted.
`--profile` prints a cProfile of the entitlement call.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import io
import pstats
import random
import time

from bench._util import fmt_ms, loadavg, machine, summary_ms
from coordinator.pools import (
    PendingJob,
    PoolSpec,
    PoolTree,
    PoolType,
    ResourceSpec,
    compute_entitlement,
    demand_by_pool,
)
from coordinator.pools._reference import reference_entitlement
from workloads.resources import Resources

Gi = 2**30
KINDS = ("cpu", "memory", "disk", "gpu")
NODE = Resources(cpu=64_000, memory=256 * Gi, disk=2000 * Gi, gpu=8_000)  # per node


def build_tree(rng: random.Random, fanout: tuple[int, ...] = (10, 10, 9), pools: int = 1000):
    """Root + 10 + 100 + 889 pools. Reservations split a random part of the parent's,
    limits sit between the reservation and the parent's limit (or none)."""
    scale = {
        "cpu": 2_000 * NODE.cpu,
        "memory": 2_000 * NODE.memory,
        "disk": 2_000 * NODE.disk,
        "gpu": 2_000 * NODE.gpu,
    }
    specs: list[PoolSpec] = []
    levels = [["/"]]
    res = {("/", k): int(scale[k] * 0.8) for k in KINDS}
    lim: dict[tuple[str, str], int | None] = {("/", k): None for k in KINDS}
    count = 1
    for depth, fan in enumerate(fanout):
        nxt = []
        for parent in levels[-1]:
            n = fan if count + fan <= pools or depth < len(fanout) - 1 else pools - count
            n = min(n, pools - count)
            if n <= 0:
                break
            weights = [rng.random() for _ in range(n)]
            for i in range(n):
                path = f"{parent.rstrip('/')}/p{i}"
                kinds = {}
                for k in KINDS:
                    # Children together reserve 30-90% of their parent's reservation.
                    r = int(res[(parent, k)] * rng.uniform(0.3, 0.9) * weights[i] / sum(weights))
                    up = lim[(parent, k)]
                    limit = (
                        None
                        if rng.random() < 0.3
                        else int(
                            r + ((up if up is not None else scale[k]) - r) * rng.uniform(0.2, 1.0)
                        )
                    )
                    res[(path, k)] = r
                    lim[(path, k)] = limit if limit is not None else up
                    kinds[k] = ResourceSpec(
                        reservation=r,
                        limit=limit,
                        share=rng.choice([1, 1, 2, 3, 0.5]),
                        type=PoolType.STATIC if rng.random() < 0.15 else PoolType.ELASTIC,
                    )
                specs.append(PoolSpec(path, **kinds))
                nxt.append(path)
                count += 1
        levels.append(nxt)
    return PoolTree(tuple(specs))


def task_size(rng: random.Random) -> Resources:
    return Resources(
        cpu=rng.choice([250, 500, 1000, 2000, 4000]),
        memory=rng.choice([1, 2, 4, 8, 16]) * Gi // 2,
        disk=rng.choice([1, 10, 50]) * Gi,
        gpu=rng.choice([0] * 12 + [500, 1000, 2000]),
    )


def gangs(rng: random.Random, leaves: list[str], tasks: int, prefix: str) -> list[PendingJob]:
    """Gangs of 1-8 alike tasks, ``tasks`` in all, on a skewed choice of leaves."""
    weights = [1.0 / (i + 1) ** 0.8 for i in range(len(leaves))]
    rng.shuffle(weights)
    out, n = [], 0
    while n < tasks:
        size = min(rng.randint(1, 8), tasks - n)
        pool = rng.choices(leaves, weights)[0]
        out.append(PendingJob(f"{prefix}{len(out)}", pool, task_size(rng).scaled(size)))
        n += size
    return out


def scenario(seed: int, pending_tasks: int, running_tasks: int, nodes: int):
    rng = random.Random(seed)
    tree = build_tree(rng)
    leaves = list(tree.leaves())
    pending = gangs(rng, leaves, pending_tasks, "p")
    running = gangs(rng, leaves, running_tasks, "r")
    capacity = NODE.scaled(nodes)
    return tree, capacity, pending, demand_by_pool(running)


def timed(fn, runs: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU (this thread's) seconds of each of ``runs`` calls. On a shared
    machine the wall time includes waiting for a core; the CPU time does not."""
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return wall, cpu


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench entitlement")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--baseline-runs", type=int, default=10)
    ap.add_argument("--pending-tasks", type=int, default=100_000)
    ap.add_argument("--running-tasks", type=int, default=50_000)
    ap.add_argument("--nodes", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: 5,000 pending tasks, 20 runs"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.baseline_runs = 20, 2
        args.pending_tasks, args.running_tasks, args.nodes = 5_000, 2_500, 200

    tree, capacity, pending, allocation = scenario(
        args.seed, args.pending_tasks, args.running_tasks, args.nodes
    )
    demand = demand_by_pool(pending)
    leaves = tree.leaves()
    total_demand = sum(demand.values(), Resources())
    total_alloc = sum(allocation.values(), Resources())
    print(
        f"tree: {len(tree)} pools, {len(leaves)} leaves, depth 4; "
        f"{args.pending_tasks} pending tasks in {len(pending)} gangs; "
        f"{args.running_tasks} running tasks"
    )
    print(f"capacity   {capacity}\nallocation {total_alloc}\ndemand     {total_demand}")

    def full():
        return compute_entitlement(tree, capacity, demand_by_pool(pending), allocation)

    fast = compute_entitlement(tree, capacity, demand, allocation)
    ref = reference_entitlement(tree, capacity, demand, allocation)
    identical = fast == ref
    print(f"optimised and reference entitlements identical: {identical}")

    gc.collect()
    load_before = loadavg()
    runs = {
        "entitlement": timed(
            lambda: compute_entitlement(tree, capacity, demand, allocation), args.runs
        ),
        "aggregate": timed(lambda: demand_by_pool(pending), args.runs),
        "full": timed(full, args.runs),
        "reference": timed(
            lambda: reference_entitlement(tree, capacity, demand, allocation), args.baseline_runs
        ),
    }
    wall = {name: summary_ms(w, 3) for name, (w, _) in runs.items()}
    cpu = {name: summary_ms(c, 3) for name, (_, c) in runs.items()}
    for name in runs:
        print(f"{name:12} wall {fmt_ms(wall[name])}")
        print(f"{'':12} cpu  {fmt_ms(cpu[name])}")
    ratio = wall["reference"]["p50"] / wall["entitlement"]["p50"]
    print(
        f"reference / optimised (wall p50): {ratio:.1f}x; entitlement p99 "
        f"{wall['entitlement']['p99']:.2f} ms wall, {cpu['entitlement']['p99']:.2f} ms cpu; "
        f"full (with re-aggregation) p99 {wall['full']['p99']:.2f} ms wall, "
        f"{cpu['full']['p99']:.2f} ms cpu (target <= 20 ms); "
        f"load average {load_before} -> {loadavg()} on {machine()}"
    )

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            compute_entitlement(tree, capacity, demand, allocation)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
        print(text.getvalue())

    return {
        "pools": len(tree),
        "leaves": len(leaves),
        "pending_tasks": args.pending_tasks,
        "pending_gangs": len(pending),
        "running_tasks": args.running_tasks,
        "entitlement_ms": wall["entitlement"],
        "entitlement_cpu_ms": cpu["entitlement"],
        "aggregate_ms": wall["aggregate"],
        "aggregate_cpu_ms": cpu["aggregate"],
        "full_ms": wall["full"],
        "full_cpu_ms": cpu["full"],
        "baseline": "reference implementation (coordinator/pools/_reference.py), same inputs",
        "baseline_ms": wall["reference"],
        "baseline_cpu_ms": cpu["reference"],
        "ratio": round(ratio, 1),
        "identical": identical,
        "target_p99_ms": 20,
        "targets": {
            "recompute_p99_le_20ms": wall["entitlement"]["p99"] <= 20.0,
            "with_resumming_p99_le_20ms": wall["full"]["p99"] <= 20.0,
        },
        "quick": args.quick,
        "machine": machine(),
        "loadavg": [load_before, loadavg()],
        "date": datetime.date.today().isoformat(),
    }
