"""Discrete-event simulator for inference routing policies: ``python -m inference.sim``.

Time is integer nanoseconds. The event sources are the arrival stream and each policy's
own ``next_wakeup_ns`` (its timers and the GPU free times it knows, since every batch's
end is fixed when it is dispatched); the loop always jumps to the earliest. GPUs are
modelled by the latency profiles alone: a batch of ``b`` occupies its GPU for exactly
``l(b)``, nothing else is simulated (no network, no load time), and every policy sees the
same requests on the same GPUs.

The simulator also checks what it applies, so a policy cannot cheat or corrupt state
unnoticed: each request is decided exactly once, a batch starts no earlier than the
moment it was decided, never overlaps another batch on its GPU, and lasts exactly its
profiled latency. A violation raises ``SimulationError``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from inference.decisions import Dispatch, Gpu, ModelSpec, Policy, Request
from inference.policies import EXTRA_POLICIES, POLICIES, make_policy
from inference.profile import MS, SOURCED_PROFILES
from inference.workload import (
    NS,
    ArrivalSpec,
    generate_events,
    read_trace,
    to_requests,
    trace_rates,
)

PENDING, ON_TIME, LATE, DROPPED = 0, 1, 2, 3


class SimulationError(RuntimeError):
    """A policy broke an invariant the simulator enforces."""


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of one run, over the requests that arrived in the measured window.

    ``bad`` = late + dropped + unanswered, the papers' "bad rate" numerator
    (Symphony: dropped + timeout + noreply).
    """

    policy: str
    arrived: int
    served_on_time: int
    late: int
    dropped: int
    unanswered: int
    bad_rate: float
    goodput_rps: float
    latency_p50_ms: float
    latency_p99_ms: float
    batches: int
    mean_batch: float
    gpu_busy: float
    decide_s: float
    """Wall-clock seconds spent inside the policy (submit + step + next_wakeup)."""

    @property
    def bad(self) -> int:
        return self.late + self.dropped + self.unanswered


def _percentile(sorted_vals: Sequence[int], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return sorted_vals[k] / MS


def simulate(policy: Policy, requests: Sequence[Request], models: Sequence[ModelSpec],
             gpus: Sequence[Gpu], *, measure_from_ns: int = 0,
             measure_until_ns: int | None = None) -> SimResult:
    """Run ``policy`` over ``requests`` (ids 0..n-1, sorted by arrival) until it is idle."""
    n = len(requests)
    for i, r in enumerate(requests):
        if r.id != i:
            raise ValueError("requests must have ids 0..n-1 in arrival order")
    latency_of = {(m.name, g.id): m.profile_for(g.gpu_type) for m in models for g in gpus}
    gpu_end = {g.id: g.free_at_ns for g in gpus}
    status = bytearray(n)
    finish = [0] * n
    batches = 0
    batched = 0
    busy = 0
    i = 0
    now = -(1 << 62)
    same_time_steps = 0
    submit, step, wakeup = policy.submit, policy.step, policy.next_wakeup_ns
    clock = time.perf_counter
    spent = 0.0
    while True:
        t0 = clock()
        w = wakeup()
        spent += clock() - t0
        ta = requests[i].arrival_ns if i < n else None
        if ta is None and w is None:
            break
        t = ta if w is None or (ta is not None and ta <= w) else w
        if t < now:
            raise SimulationError(f"{policy.name}: asked to wake at {w} < now {now}")
        same_time_steps = same_time_steps + 1 if t == now else 0
        if same_time_steps > 100_000:
            raise SimulationError(f"{policy.name}: no progress at t={t}")
        now = t
        t0 = clock()
        while i < n and requests[i].arrival_ns == t:
            submit(requests[i], t)
            i += 1
        decisions = step(t)
        spent += clock() - t0
        for d in decisions:
            if type(d) is Dispatch:
                ids = d.request_ids
                if not ids:
                    raise SimulationError(f"{policy.name}: empty batch")
                if d.start_ns < t or d.start_ns < gpu_end[d.gpu_id]:
                    raise SimulationError(f"{policy.name}: batch on {d.gpu_id} starts at "
                                          f"{d.start_ns}, before now {t} or GPU free "
                                          f"{gpu_end[d.gpu_id]}")
                if d.end_ns - d.start_ns != latency_of[d.model, d.gpu_id].latency(len(ids)):
                    raise SimulationError(f"{policy.name}: batch duration is not its latency")
                gpu_end[d.gpu_id] = d.end_ns
                end = d.end_ns
                for rid in ids:
                    if rid >= i or status[rid] != PENDING or requests[rid].model != d.model:
                        raise SimulationError(f"{policy.name}: bad dispatch of request {rid}")
                    status[rid] = ON_TIME if end <= requests[rid].deadline_ns else LATE
                    finish[rid] = end
                batches += 1
                batched += len(ids)
                busy += end - d.start_ns
            else:
                rid = d.request_id
                if rid >= i or status[rid] != PENDING:
                    raise SimulationError(f"{policy.name}: bad drop of request {rid}")
                status[rid] = DROPPED

    lo = measure_from_ns
    hi = measure_until_ns if measure_until_ns is not None else (
        requests[-1].arrival_ns + 1 if n else 0)
    counts = [0, 0, 0, 0]
    lats = []
    for r in requests:
        if lo <= r.arrival_ns < hi:
            s = status[r.id]
            counts[s] += 1
            if s in (ON_TIME, LATE):
                lats.append(finish[r.id] - r.arrival_ns)
    lats.sort()
    arrived = sum(counts)
    bad = counts[LATE] + counts[DROPPED] + counts[PENDING]
    span_s = max(1, hi - lo) / NS
    total_span = max(1, max(gpu_end.values()) - (requests[0].arrival_ns if n else 0))
    return SimResult(
        policy=policy.name,
        arrived=arrived,
        served_on_time=counts[ON_TIME],
        late=counts[LATE],
        dropped=counts[DROPPED],
        unanswered=counts[PENDING],
        bad_rate=bad / arrived if arrived else 0.0,
        goodput_rps=counts[ON_TIME] / span_s,
        latency_p50_ms=_percentile(lats, 0.50),
        latency_p99_ms=_percentile(lats, 0.99),
        batches=batches,
        mean_batch=batched / batches if batches else 0.0,
        gpu_busy=busy / (total_span * len(gpus)) if gpus else 0.0,
        decide_s=spent,
    )


@dataclass(frozen=True, slots=True)
class Scenario:
    """The shared inputs of a comparison: models, GPUs and load."""

    n_models: int = 32
    n_gpus: int = 8
    profile: str = "symphony"
    slo_ms: float = 100.0
    zipf_s: float = 1.0
    duration_s: float = 5.0
    warmup_s: float = 1.0

    def models(self) -> list[ModelSpec]:
        p = SOURCED_PROFILES[self.profile]
        return [ModelSpec.single(f"m{i}", int(self.slo_ms * MS), p) for i in range(self.n_models)]

    def gpus(self, n: int | None = None) -> list[Gpu]:
        return [Gpu(f"gpu{j}") for j in range(self.n_gpus if n is None else n)]


def run_policy(name: str, scenario: Scenario, rate: float, cv: float, seed: int,
               n_gpus: int | None = None) -> SimResult:
    """One run of policy ``name`` on the scenario at ``rate`` req/s (generated arrivals)."""
    models = scenario.models()
    gpus = scenario.gpus(n_gpus)
    spec = ArrivalSpec(rate, int(scenario.duration_s * NS), tuple(m.name for m in models),
                       scenario.zipf_s, cv)
    reqs = to_requests(generate_events(spec, seed), {m.name: m.slo_ns for m in models})
    policy = make_policy(name, models, gpus, seed=seed, rates=spec.rates())
    return simulate(policy, reqs, models, gpus, measure_from_ns=int(scenario.warmup_s * NS),
                    measure_until_ns=spec.duration_ns)


def _summary(res: SimResult) -> str:
    return (f"{res.policy:>13}: arrived {res.arrived}  on-time {res.served_on_time}  "
            f"late {res.late}  dropped {res.dropped}  unanswered {res.unanswered}  "
            f"bad {100 * res.bad_rate:.3f}%  goodput {res.goodput_rps:.0f}/s  "
            f"p50 {res.latency_p50_ms:.1f} ms  p99 {res.latency_p99_ms:.1f} ms  "
            f"mean batch {res.mean_batch:.1f}  GPU busy {100 * res.gpu_busy:.0f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inference.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="ours",
                    help=f"one of {', '.join(POLICIES + EXTRA_POLICIES)}, or 'all'")
    ap.add_argument("--rate", type=float, default=2000.0, help="total requests/s")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--models", type=int, default=32)
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of model popularity")
    ap.add_argument("--arrival", choices=("poisson", "gamma", "trace"), default="poisson")
    ap.add_argument("--cv", type=float, default=4.0, help="gamma inter-arrival CV")
    ap.add_argument("--trace", help="CSV of t_ns,model rows (with --arrival trace)")
    ap.add_argument("--profile", choices=sorted(SOURCED_PROFILES), default="symphony")
    ap.add_argument("--slo-ms", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds not measured")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    sc = Scenario(args.models, args.gpus, args.profile, args.slo_ms, args.zipf,
                  args.duration, args.warmup)
    models = sc.models()
    gpus = sc.gpus()
    slo = {m.name: m.slo_ns for m in models}
    if args.arrival == "trace":
        if not args.trace:
            ap.error("--arrival trace needs --trace FILE")
        events = read_trace(args.trace)
        names = sorted({m for _, m in events})
        models = [ModelSpec.single(m, int(args.slo_ms * MS), SOURCED_PROFILES[args.profile])
                  for m in names]
        slo = {m.name: m.slo_ns for m in models}
        rates = trace_rates(events)
        until = events[-1][0] + 1 if events else 0
    else:
        cv = 1.0 if args.arrival == "poisson" else args.cv
        spec = ArrivalSpec(args.rate, int(args.duration * NS), tuple(m.name for m in models),
                           args.zipf, cv)
        events = generate_events(spec, args.seed)
        rates = spec.rates()
        until = spec.duration_ns
    reqs = to_requests(events, slo)
    names = list(POLICIES) if args.policy == "all" else [args.policy]
    print(f"# {len(reqs)} requests, {len(models)} models, {len(gpus)} GPUs, profile "
          f"{args.profile}, SLO {args.slo_ms} ms, arrivals {args.arrival}", flush=True)
    results = []
    for name in names:
        policy = make_policy(name, models, gpus, seed=args.seed, rates=rates)
        res = simulate(policy, reqs, models, gpus, measure_from_ns=int(args.warmup * NS),
                       measure_until_ns=until)
        print(_summary(res), flush=True)
        results.append(res)
    out = {"sim": "inference", "arrival": args.arrival, "rate": args.rate, "gpus": args.gpus,
           "results": [asdict(r) for r in results]}
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
