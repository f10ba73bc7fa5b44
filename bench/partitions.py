"""`python -m bench partitions`: a day of services and batch sharing 1,000 nodes, three
ways: a static split sized for the service's peak, one sized for its mean, and the
dynamic partition controller.

This is an **in-process simulation with a simulated clock**, not hollow agents over NATS:
1,000 nodes x a day of 10 s samples is 8.6 million heartbeats, which a hollow fleet can
only produce in a real day, and 2 shared cores could not carry them; the transport and
the moves' log events are the integration tests' (tests/integration). What runs is the
real product code that decides: `Controlling` (the leader's hotness windows and its call
of `decide` each interval), `controller.decide` and `break_glass`, `NodeWindows` and
`partition_hotness`, fed each node's simulated CPU load as `sample_from_state` builds a
Sample; and `workloads.load.load_at` for the service's diurnal curve. The load spread,
the always-full batch backlog and the drain delay are a model (bench/_partitions_sim.py
says which, and why each is as simple as it is).

Same day, same seeds, same noise for every policy. The dynamic controller starts from
the mean-sized split (where the load is at t = 0; `--start trough` for the trough-sized
one) and is compared with the peak-sized split: Uber's comparison, a shared fleet that
moves hosts against dedicated capacity provisioned for the peak. The controller gives
back borrowed nodes and then stateless's own, so the starting split is no floor.

Both sides get the same margin under the line where service suffers (`Day.busy_line`,
0.7, where hot-node-seconds are counted): the peak split is sized for a node busy of
0.7 - node noise (bench/_partitions_sim.nodes_for), and the controller acts at that same
0.65 (its `busy_line`; `--config` sets another).
Reported: batch work done (core-seconds) and the dynamic/peak ratio, utilization,
hot-node-seconds (serving nodes above the busy line), service core-seconds on hot
nodes, moves per hour, flaps, time to relief after the spike, a break-glass drill's
time to full capacity (at the day's end, on the dynamic fleet), and the controller's
decision time at 5,000 nodes (bench/partitions_decide.py).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from bench._partitions_sim import (
    Day,
    Result,
    count_flaps,
    demand,
    max_per_window,
    mean_demand,
    nodes_for,
    relief,
    simulate,
)
from bench._util import loadavg, machine, ratio
from bench.partitions_decide import decision_time
from coordinator.partitions.config import (
    BATCH,
    STATELESS,
    PartitionsConfig,
    parse_partitions_config,
)
from coordinator.partitions.controller import break_glass

HOUR_S = 3600.0


def summarize(day: Day, r: Result, cfg: PartitionsConfig) -> dict:
    """One policy's figures (the JSON's per-policy part)."""
    fleet_core_s = day.nodes * day.cores * day.day_s
    hot_at, relief_at = relief(r.times, r.hot_fraction, day.spike_at_s, cfg.hot_fraction)
    if hot_at is None:
        relief_s: float | None = 0.0
    else:
        relief_s = None if relief_at is None else relief_at - hot_at
    starts = [m[1] for m in r.moves]
    return {
        "stateless_nodes_min": min(r.stateless_nodes),
        "stateless_nodes_max": max(r.stateless_nodes),
        "batch_core_s": round(r.batch_core_s),
        "lost_core_s": round(r.lost_core_s),
        "service_core_s": round(r.service_core_s),
        "utilization": round((r.batch_core_s + r.service_core_s) / fleet_core_s, 4),
        "hot_node_s": round(r.hot_node_s),
        "hot_service_core_s": round(r.hot_service_core_s),
        "hot_service_share": round(r.hot_service_core_s / r.service_core_s, 4),
        "moves": len(r.moves),
        "moves_per_hour": round(len(r.moves) / (day.day_s / HOUR_S), 2),
        "moves_max_in_an_hour": max_per_window(starts, HOUR_S),
        "flaps": count_flaps(r.moves, cfg.cooldown_s),
        "spike_hot_at_s": hot_at,
        "spike_relief_s": relief_s,
        "spike_relief_intervals": None if relief_s is None else round(relief_s / cfg.interval_s, 1),
        "decisions": r.decide_calls,
        "frozen_decisions": r.frozen,
    }


def drill(day: Day, fleet, cfg: PartitionsConfig) -> dict:
    """Break-glass at the end of the dynamic day: the real `break_glass` over the fleet,
    then the drains, until every movable batch node is stateless."""
    t0 = day.day_s
    facts = fleet.facts()
    c0 = time.perf_counter()
    moves = break_glass(cfg, facts, STATELESS, None, t0, "bench drill")
    call_ms = (time.perf_counter() - c0) * 1000
    lost = fleet.apply(moves, t0)
    sink = Result("drill")
    t = t0
    while (fleet.part != fleet.desired).any():
        t += 1.0
        fleet.converge(t, sink)
    batch_left = [f for f in fleet.facts() if f.partition == BATCH]
    movable_left = sum(1 for f in batch_left if not f.non_preemptible)
    return {
        "nodes_moved": len(moves),
        "batch_nodes_left": len(batch_left),
        "movable_batch_left": movable_left,
        "time_to_full_capacity_s": t - t0,
        "lost_core_s": round(lost),
        "break_glass_call_ms": round(call_ms, 2),
    }


def plot(path: Path, day: Day, results: dict[str, Result]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    hours = [t / HOUR_S for t in results["dynamic"].times]
    need = [demand(day, t) / (day.cores * day.busy_line) for t in results["dynamic"].times]
    top.plot(hours, need, color="0.6", lw=0.7, label="service demand / (cores x busy line)")
    colors = {
        "static_peak": "tab:blue",
        "static_mean": "tab:orange",
        "dynamic": "tab:green",
    }
    for name, r in results.items():
        top.plot(hours, r.stateless_nodes, color=colors[name], lw=1.4, label=f"{name}: stateless")
        smooth = _smooth(r.hot_fraction, 30)
        bottom.plot(hours, smooth, color=colors[name], lw=1.0, label=name)
    top.set_ylabel("nodes")
    top.set_title(f"{day.nodes} nodes over a simulated day: stateless partition size")
    top.legend(loc="upper left", fontsize=8)
    bottom.axhline(0.6, color="k", ls=":", lw=0.8, label="hot_fraction 0.6")
    bottom.set_ylabel("stateless nodes above busy line\n(share, 5-min mean)")
    bottom.set_xlabel("hour of the simulated day")
    bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(xs: list[float], n: int) -> list[float]:
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        if i >= n:
            total -= xs[i - n]
        out.append(total / min(i + 1, n))
    return out


def run(args: argparse.Namespace) -> dict:
    day = Day(nodes=args.nodes, day_s=args.day_s, spike_at_s=0.55 * args.day_s, seed=args.seed)
    cfg = (
        parse_partitions_config(Path(args.config).read_text())
        if args.config
        else PartitionsConfig(busy_line=round(day.busy_line - day.node_noise, 4))
    )
    peak, mean = nodes_for(day, day.peak_cores), nodes_for(day, mean_demand(day))
    trough = nodes_for(day, day.peak_cores / day.peak_to_trough)
    start = {"mean": mean, "trough": trough}[args.start]
    print(
        f"{day.nodes} nodes x {day.cores} cores, a {day.day_s / HOUR_S:g} h day in "
        f"{day.step_s:g} s steps; service peak {day.peak_cores:.0f} cores (3:1 to trough), "
        f"+{day.spike:.0%} spike at {day.spike_at_s / HOUR_S:.1f} h; "
        f"static splits: peak {peak}, mean {mean} stateless nodes"
    )
    t0 = time.perf_counter()
    results, figures, fleets = {}, {}, {}
    policies = [
        ("static_peak", peak, None),
        ("static_mean", mean, None),
        ("dynamic", start, cfg),
    ]
    for name, stateless, policy_cfg in policies:
        c0 = time.perf_counter()
        r, fleet, _ = simulate(day, name, stateless, policy_cfg)
        results[name], fleets[name] = r, fleet
        figures[name] = s = summarize(day, r, cfg)
        print(
            f"  {name:12s} batch {s['batch_core_s'] / 1e6:8.2f} M core-s "
            f"(lost {s['lost_core_s'] / 1e6:.2f} M), util {s['utilization']:.1%}, "
            f"hot {s['hot_node_s'] / HOUR_S:7.1f} node-h, service on hot "
            f"{s['hot_service_share']:.1%}, moves/h {s['moves_per_hour']}, flaps {s['flaps']}, "
            f"spike relief {s['spike_relief_s']} s  [{time.perf_counter() - c0:.1f} s]"
        )
    sim_s = time.perf_counter() - t0
    dyn, pk = figures["dynamic"], figures["static_peak"]
    gain = ratio(dyn["batch_core_s"], pk["batch_core_s"])
    print(f"dynamic / static peak batch work: {gain}")
    glass = drill(day, fleets["dynamic"], cfg)
    print(
        f"break-glass drill: {glass['nodes_moved']} nodes to stateless in one call "
        f"({glass['break_glass_call_ms']} ms), full capacity after "
        f"{glass['time_to_full_capacity_s']:g} s; {glass['movable_batch_left']} movable left"
    )
    dec = decision_time(args.decide_nodes, args.decide_rounds)
    print(
        f"decision at {dec['nodes']} nodes: decide p99 {dec['decide_ms']['p99']} ms "
        f"(CPU {dec['decide_cpu_ms']['p99']} ms), round p99 {dec['round_ms']['p99']} ms"
    )
    if args.plot:
        plot(Path(args.plot), day, results)
        print(f"plot written to {args.plot}")
    relief_s = dyn["spike_relief_s"]
    return {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "loadavg_1m": loadavg(),
        "simulation": "in process, simulated clock, the real Controlling/decide/break_glass",
        "nodes": day.nodes,
        "cores_per_node": day.cores,
        "day_s": day.day_s,
        "step_s": day.step_s,
        "drain_s": day.drain_s,
        "spike_at_s": day.spike_at_s,
        "split_peak": peak,
        "split_mean": mean,
        "split_trough": trough,
        "dynamic_starts_from": args.start,
        "controller": {
            "interval_s": cfg.interval_s,
            "borrow_after_s": cfg.borrow_after_s,
            "return_after_s": cfg.return_after_s,
            "cooldown_s": cfg.cooldown_s,
            "nodes_per_move": cfg.nodes_per_move,
            "moves_per_hour": cfg.moves_per_hour,
            "max_draining": cfg.max_draining,
            "busy_line": cfg.busy_line,
        },
        "policies": figures,
        "dynamic_over_peak_batch": gain,
        "break_glass": glass,
        "decision": dec,
        "simulate_wall_s": round(sim_s, 1),
        "targets": {
            "batch_ge_1.2x_peak": dyn["batch_core_s"] >= 1.2 * pk["batch_core_s"],
            "hot_node_s_le_peak": dyn["hot_node_s"] <= pk["hot_node_s"],
            "flaps_0": dyn["flaps"] == 0,
            "spike_relief_le_2_intervals": relief_s is not None and relief_s <= 2 * cfg.interval_s,
            "decide_p99_le_10ms": dec["decide_ms"]["p99"] <= 10.0,
        },
    }


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench partitions")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--day-s", type=float, default=86400.0, help="the simulated day's length")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", help="a partitions config (YAML) for the controller")
    ap.add_argument("--decide-nodes", type=int, default=5000)
    ap.add_argument("--decide-rounds", type=int, default=100)
    ap.add_argument(
        "--start",
        choices=("mean", "trough"),
        default="mean",
        help="the dynamic policy's starting split (where the day begins; not a floor)",
    )
    ap.add_argument("--plot", help="write a PNG of partition sizes and hotness here")
    ap.add_argument("--quick", action="store_true", help="100 nodes, a 2 h day, 500-node decisions")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.day_s, args.decide_nodes, args.decide_rounds = 100, 7200.0, 500, 10
    if args.nodes < 10:
        ap.error("--nodes must be at least 10")
    if not math.isfinite(args.day_s) or args.day_s < 600:
        ap.error("--day-s must be at least 600")
    return run(args)
