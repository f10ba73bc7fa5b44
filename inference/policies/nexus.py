"""Baseline: Nexus (SOSP'19): squishy bin packing, then per-GPU round robin with early drop.

Nexus decides placement from rates (``nexus_plan.squishy_bin_pack``), then each GPU
backend loops over the models placed on it, running for each a batch of up to its
planned size (github uwsaml/nexus backend gpu_executor.cpp ``GpuExecutorMultiBatching``:
work-conserving, no idling to fill the duty cycle). A batch is formed with Nexus's
*early drop* (model_exec.cpp ``GetBatchTaskSlidingWindow``): with the expected batch
``min(queued, planned)``, requests whose deadline falls before ``now + l(expected)`` are
dropped and the rest taken in deadline order. Frontends split each model's traffic over
the GPUs that host it in proportion to the rate each was planned for (smooth weighted
round robin, standing in for Nexus's deficit round robin).

Nexus re-plans every 30 s from measured rates; the simulator runs shorter than that, so
we give it the workload's true mean rate per model (an oracle, in its favour) and plan
once. Two adaptations for a fixed pool: if the plan leaves GPUs idle, we re-plan for a
higher load (the largest uniform headroom that still fits) so that every GPU is used; if
it needs more GPUs than exist, the extra GPUs' models are folded onto the least occupied
ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inference.decisions import Decision, Dispatch, Drop, DropReason, Gpu, ModelSpec, Request
from inference.policies._queue import DeadlineQueue
from inference.policies.nexus_plan import GpuPlan, Session, squishy_bin_pack


def plan_for_pool(sessions: Sequence[Session], n_gpus: int) -> list[GpuPlan]:
    """A squishy-bin-packing plan with exactly ``n_gpus`` GPU plans (see module doc)."""
    plan = squishy_bin_pack(sessions)
    if 0 < len(plan) < n_gpus:
        lo, hi = 1.0, 2.0
        while len(squishy_bin_pack(_scaled(sessions, hi))) <= n_gpus and hi < 1e6:
            lo, hi = hi, hi * 2
        for _ in range(30):
            mid = (lo + hi) / 2
            if len(squishy_bin_pack(_scaled(sessions, mid))) <= n_gpus:
                lo = mid
            else:
                hi = mid
        plan = squishy_bin_pack(_scaled(sessions, lo))
    plan = sorted(plan, key=lambda p: -p.occupancy)
    while len(plan) > n_gpus:
        extra = plan.pop()
        target = min(range(len(plan)), key=lambda i: plan[i].occupancy)
        host = plan[target]
        plan[target] = GpuPlan(host.duty_cycle_ns, host.allocations + extra.allocations,
                               host.exec_ns + extra.exec_ns)
    return plan


def _scaled(sessions: Sequence[Session], f: float) -> list[Session]:
    return [Session(s.model, s.profile, s.slo_ns, s.rate * f) for s in sessions]


class Nexus:
    name = "nexus"

    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[Gpu], *,
                 rates: Mapping[str, float]) -> None:
        if len({g.gpu_type for g in gpus}) != 1:
            raise ValueError("the Nexus baseline models one GPU type")
        gtype = gpus[0].gpu_type
        self._prof = {m.name: m.profile_for(gtype) for m in models}
        sessions = [Session(m.name, self._prof[m.name], m.slo_ns, float(rates.get(m.name, 0.0)))
                    for m in models]
        plan = plan_for_pool(sessions, len(gpus))
        self._gpu_ids = [g.id for g in gpus]
        self._free = [g.free_at_ns for g in gpus]
        # Per GPU: the models it cycles through, with their planned batch and queue.
        self._slots: list[list[tuple[str, int, DeadlineQueue]]] = [[] for _ in gpus]
        self._rr = [0] * len(gpus)
        self._pending = [0] * len(gpus)
        routes: dict[str, list[tuple[int, float, DeadlineQueue]]] = {}
        for g, gp in enumerate(plan):
            for alloc in gp.allocations:
                q = DeadlineQueue()
                self._slots[g].append((alloc.model, alloc.batch, q))
                routes.setdefault(alloc.model, []).append((g, alloc.rate, q))
        for m in models:  # a model with no planned rate still gets served somewhere
            if m.name not in routes:
                g = min(range(len(gpus)), key=lambda i: len(self._slots[i]))
                q = DeadlineQueue()
                self._slots[g].append((m.name, 1, q))
                routes[m.name] = [(g, 1.0, q)]
        self._routes = routes
        self._current = {name: [0.0] * len(r) for name, r in routes.items()}
        self.plan = plan

    def submit(self, request: Request, now_ns: int) -> None:
        routes = self._routes[request.model]
        if len(routes) == 1:
            k = 0
        else:  # smooth weighted round robin: deterministic, proportional to planned rate
            cur = self._current[request.model]
            total = 0.0
            k = 0
            for j, (_, w, _) in enumerate(routes):
                cur[j] += w
                total += w
                if cur[j] > cur[k]:
                    k = j
            cur[k] -= total
        g, _, q = routes[k]
        q.push(request.deadline_ns, request.id)
        self._pending[g] += 1

    def step(self, now_ns: int) -> list[Decision]:
        out: list[Decision] = []
        for g in range(len(self._free)):
            if self._pending[g] and self._free[g] <= now_ns:
                self._run_next(g, now_ns, out)
        return out

    def _run_next(self, g: int, now: int, out: list[Decision]) -> None:
        slots = self._slots[g]
        k = len(slots)
        for j in range(k):
            idx = (self._rr[g] + j) % k
            model, batch, q = slots[idx]
            n = len(q)
            if not n:
                continue
            p = self._prof[model]
            expect = min(n, batch, p.max_batch)
            finish = now + p.latency(expect)
            taken: list[int] = []
            while len(q) and len(taken) < expect:
                if q.head_deadline() < finish:
                    out.append(Drop(q.pop_head(), DropReason.DEADLINE_CANNOT_BE_MET))
                else:
                    taken.append(q.pop_head())
            self._pending[g] -= n - len(q)
            if taken:
                end = now + p.latency(len(taken))
                out.append(Dispatch(self._gpu_ids[g], model, tuple(taken), now, end))
                self._free[g] = end
                self._rr[g] = idx + 1
                return

    def next_wakeup_ns(self) -> int | None:
        best = None
        for g, f in enumerate(self._free):
            if self._pending[g] and (best is None or f < best):
                best = f
        return best
