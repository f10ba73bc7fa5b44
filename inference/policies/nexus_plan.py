"""Nexus's squishy bin packing (SOSP'19 §4.1, §6.1): which models share which GPU.

Nexus plans placement from each model's request rate, every 30 s. A model with more load
than one GPU sustains gets whole GPUs running its *saturated* batch, the largest ``b``
with ``2 * l(b) <= SLO`` (a request may wait one full batch and then run in the next).
What is left over (the residual) is packed with other models onto shared GPUs that
cycle through their models with a duty cycle ``d``: a model at rate ``r`` runs batches
of ``ceil(r * d)`` and its worst-case latency is ``d + l(b)``. Packing is best-fit by
occupancy (``sum l(b_i) / d``), largest first: the "squishy" part is that merging two
GPUs shortens the duty cycle to the smaller one, which shrinks every batch on it.

Pure functions over frozen dataclasses, unit-tested on the paper's worked example
(tests/unit/test_inference_nexus.py). Rates are requests per second; times are ns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from inference.profile import LatencyProfile


@dataclass(frozen=True, slots=True)
class Session:
    """A model to place: its profile, SLO and the rate it must serve."""

    model: str
    profile: LatencyProfile
    slo_ns: int
    rate: float


@dataclass(frozen=True, slots=True)
class Allocation:
    """A model on a GPU: the batch it runs there and the rate that GPU takes of it."""

    model: str
    batch: int
    rate: float


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """One GPU's plan: the models it cycles through, every ``duty_cycle_ns``."""

    duty_cycle_ns: int
    allocations: tuple[Allocation, ...]
    exec_ns: int
    """Time one cycle spends executing: ``sum l(b_i)``."""

    @property
    def occupancy(self) -> float:
        return self.exec_ns / self.duty_cycle_ns


def saturated_batch(profile: LatencyProfile, slo_ns: int) -> int:
    """Largest batch with ``2 * l(b) <= SLO``: the batch of a GPU given over to one model.

    Nexus halves the SLO because a request can arrive just after a batch starts and
    wait for it to finish before its own batch runs. 0 if even a batch of one is too
    slow.
    """
    return profile.max_batch_within(slo_ns // 2)


def residual_batch(profile: LatencyProfile, slo_ns: int, rate: float) -> tuple[int, int]:
    """``(batch, duty_cycle_ns)`` for a model alone on a shared GPU at ``rate`` req/s.

    The largest ``b`` with ``b / r + l(b) <= SLO``: collecting ``b`` requests takes a
    cycle ``d = b / r`` and the oldest then waits ``l(b)`` more. A model too slow even
    for that runs batches of one on the longest cycle its SLO allows.
    """
    best = 0
    for b in range(1, profile.max_batch + 1):
        if b * 1e9 / rate + profile.latency(b) <= slo_ns:
            best = b
        else:
            break
    if best == 0:
        return 1, max(1, slo_ns - profile.latency(1))
    return best, round(best * 1e9 / rate)


def _node(sessions: Sequence[Session], duty_ns: int) -> GpuPlan | None:
    """The sessions sharing one GPU on a ``duty_ns`` cycle, or None if they don't fit."""
    allocs = []
    exec_ns = 0
    for s in sessions:
        b = max(1, math.ceil(s.rate * duty_ns / 1e9 - 1e-9))
        if b > s.profile.max_batch:
            return None
        lat = s.profile.latency(b)
        if duty_ns + lat > s.slo_ns:
            return None
        exec_ns += lat
        allocs.append(Allocation(s.model, b, s.rate))
    if exec_ns > duty_ns:
        return None
    return GpuPlan(duty_ns, tuple(allocs), exec_ns)


def squishy_bin_pack(sessions: Iterable[Session]) -> list[GpuPlan]:
    """Nexus's plan: saturated GPUs first, then residual loads packed best-fit.

    Returns one ``GpuPlan`` per GPU the load needs. Deterministic: ties go to the
    earlier session / GPU.
    """
    plans: list[GpuPlan] = []
    residual: list[tuple[Session, GpuPlan]] = []
    for s in sessions:
        if s.rate <= 0:
            continue
        b_sat = saturated_batch(s.profile, s.slo_ns)
        if b_sat == 0:
            raise ValueError(f"model {s.model!r}: even a batch of one misses SLO/2")
        lat = s.profile.latency(b_sat)
        per_gpu = b_sat * 1e9 / lat
        full = int(s.rate // per_gpu)
        plans.extend(GpuPlan(lat, (Allocation(s.model, b_sat, per_gpu),), lat)
                     for _ in range(full))
        left = s.rate - full * per_gpu
        if left > 1e-9:
            rs = Session(s.model, s.profile, s.slo_ns, left)
            b, d = residual_batch(s.profile, s.slo_ns, left)
            residual.append((rs, GpuPlan(d, (Allocation(s.model, b, left),),
                                         s.profile.latency(b))))
    # Largest occupancy first; each goes to the shared GPU it fills fullest, else a new one.
    residual.sort(key=lambda item: -item[1].occupancy)
    nodes: list[tuple[list[Session], GpuPlan]] = []
    for rs, alone in residual:
        best: tuple[float, int, GpuPlan] | None = None
        for i, (members, plan) in enumerate(nodes):
            merged = _node([*members, rs], min(plan.duty_cycle_ns, alone.duty_cycle_ns))
            if merged is not None and (best is None or merged.occupancy > best[0]):
                best = (merged.occupancy, i, merged)
        if best is None:
            nodes.append(([rs], alone))
        else:
            _, i, merged = best
            nodes[i] = ([*nodes[i][0], rs], merged)
    return plans + [plan for _, plan in nodes]
