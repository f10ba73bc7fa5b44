"""The partition controller's decision time over a large fleet (a helper for the
partitions bench, which calls :func:`decision_time`; `python -m bench partitions_decide`
runs it alone).

One decision is what the leader does every interval: each node's hotness read from its
full window, each partition summed up, and ``decide()`` over every node's facts. It is
timed in two parts: ``decide`` (partition_hotness + decide(), the part the issue's 10 ms
target names) and ``round`` (that plus reading every node's window). The fleet is built so
that every decision acts (stateless hot past its dwell, nothing cooling down): the
worst case, since a decision in the dead band never looks at the nodes at all.
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from bench._util import summary_ms
from coordinator.partitions.config import BATCH, STATELESS, PartitionsConfig
from coordinator.partitions.controller import ControllerState, NodeFacts, decide
from coordinator.partitions.hotness import NodeWindows, Sample, partition_hotness

ZONES = 10


def build_fleet(
    nodes: int, cfg: PartitionsConfig, heartbeat_s: float = 1.0, seed: int = 0
) -> tuple[NodeWindows, list[NodeFacts], float]:
    """``nodes`` nodes, 40 % stateless (running hot) and 60 % batch, each with a full
    window of samples; returns the windows, the facts and the time "now"."""
    rng = random.Random(seed)
    windows = NodeWindows(cfg.window_s)
    facts = []
    start = 1_700_000_000.0
    per_node = int(cfg.window_s / heartbeat_s)
    now = start + per_node * heartbeat_s
    for i in range(nodes):
        node_id = f"n{i:05d}"
        partition = STATELESS if i % 5 < 2 else BATCH
        base = 0.8 if partition == STATELESS else 0.5
        for k in range(per_node):
            busy = min(1.0, max(0.0, base + rng.gauss(0.0, 0.08)))
            windows.add(node_id, Sample(start + (k + 1) * heartbeat_s, busy, busy * 0.9, 0.4))
        tasks = 0 if i % 7 == 0 else rng.randint(1, 8)
        facts.append(
            NodeFacts(
                node_id=node_id,
                zone=f"z{i % ZONES}",
                partition=partition,
                desired=partition,
                draining=False,
                last_moved=0.0,
                home="",
                tasks=tasks,
                priority_sum=tasks * rng.randint(0, 100),
                non_preemptible=i % 13 == 0,
                services=rng.randint(0, 4) if partition == STATELESS else 0,
                p90=None,
            )
        )
    return windows, facts, now


def decision_time(nodes: int = 5000, rounds: int = 100, seed: int = 0) -> dict:
    """p50/p99 (ms) of one controller decision at ``nodes`` nodes with full windows.

    Returns ``{"nodes", "decide_ms": {...}, "decide_cpu_ms": {...}, "round_ms": {...},
    "moves_per_decision"}``; the figure to hold to the target is ``decide_ms["p99"]``
    (wall clock). ``decide_cpu_ms`` is the same part in this thread's CPU time: on a
    shared machine the gap between the two is time spent waiting for a core."""
    cfg = PartitionsConfig()
    windows, facts, now = build_fleet(nodes, cfg, seed=seed)
    # The fleet is long-lived state, as in a leader that has run for a while: collected
    # once and frozen, so the timed rounds pay only for their own garbage.
    gc.collect()
    gc.freeze()
    names = cfg.names
    state = ControllerState(hot_since=((STATELESS, now - 3600.0),))
    decide_s, decide_cpu_s, round_s = [], [], []
    moves = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        members: dict[str, list] = {name: [] for name in names}
        p90: dict[str, float | None] = {}
        for f in facts:
            h = windows.node(f.node_id, now, cfg)
            members[f.partition].append(h)
            p90[f.node_id] = h.p90 if h.state != "unknown" else None
        # The shell builds the facts with each node's p90; built here outside the timing.
        t1 = time.perf_counter()
        ready = [_with_p90(f, p90[f.node_id]) for f in facts]
        t2, c2 = time.perf_counter(), time.thread_time()
        hotness = {name: partition_hotness(cfg, name, members[name]) for name in names}
        decision = decide(cfg, ready, hotness, state, now)
        t3, c3 = time.perf_counter(), time.thread_time()
        moves += len(decision.moves)
        decide_s.append(t3 - t2)
        decide_cpu_s.append(c3 - c2)
        round_s.append((t1 - t0) + (t3 - t2))
    gc.unfreeze()
    return {
        "nodes": nodes,
        "rounds": rounds,
        "decide_ms": summary_ms(decide_s, 3),
        "decide_cpu_ms": summary_ms(decide_cpu_s, 3),
        "round_ms": summary_ms(round_s, 3),
        "moves_per_decision": moves / rounds,
    }


def _with_p90(f: NodeFacts, p90: float | None) -> NodeFacts:
    return NodeFacts(
        f.node_id,
        f.zone,
        f.partition,
        f.desired,
        f.draining,
        f.last_moved,
        f.home,
        f.tasks,
        f.priority_sum,
        f.non_preemptible,
        f.services,
        p90,
    )


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench partitions_decide")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="500 nodes, 10 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds = 500, 10
    result = decision_time(args.nodes, args.rounds)
    print(
        f"{args.nodes} nodes: decide p99 {result['decide_ms']['p99']} ms "
        f"(CPU {result['decide_cpu_ms']['p99']} ms), "
        f"round (with window reads) p99 {result['round_ms']['p99']} ms"
    )
    # The target is at 5,000 nodes; a smaller --nodes is held to it all the same.
    return {**result, "targets": {"decide_p99_le_10ms": result["decide_ms"]["p99"] <= 10.0}}
