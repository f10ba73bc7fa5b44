"""Arrival generators: Poisson, gamma (bursty, any CV) and trace replay; Zipf popularity.

Each model gets its own arrival process at its share of the total rate (as in
AlpaServe's simulator and Symphony's harness, shared/research/inference.md §3-§5), and
the streams are merged. Gamma inter-arrival gaps have shape ``k = 1 / CV^2`` and scale
``CV^2 / rate``, so the mean rate is the same at every CV and only burstiness changes;
CV = 1 is Poisson.

All randomness comes from a ``random.Random`` built from the seed passed in (no numpy, so
the simulator and tests need only the standard library), and the per-model streams are
seeded independently, so a different total rate with the same seed scales the same
gaps: bisection over the rate compares like with like.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from inference.decisions import Request

NS = 1_000_000_000


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    """Popularity of ``n`` models, the i-th (from 1) proportional to ``1 / i^s``; sums to 1."""
    if n < 1:
        raise ValueError("need at least one model")
    raw = [1.0 / (i ** s) for i in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def _renewal_times(rate: float, duration_ns: int, rng: random.Random, cv: float) -> list[int]:
    """Arrival times in ``[0, duration)`` of a renewal process with gamma gaps."""
    if rate <= 0:
        return []
    horizon = duration_ns / NS
    if cv == 1.0:
        def gap() -> float:
            return rng.expovariate(rate)
    else:
        k = 1.0 / (cv * cv)
        theta = cv * cv / rate

        def gap() -> float:
            return rng.gammavariate(k, theta)
    # Start in the stationary regime: a random fraction of a first gap.
    t = gap() * rng.random()
    out = []
    while t < horizon:
        out.append(int(t * NS))
        t += gap()
    return out


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """What to generate: total rate, how it is split and how bursty it is."""

    total_rate: float
    duration_ns: int
    models: tuple[str, ...]
    zipf_s: float = 1.0
    cv: float = 1.0
    """Coefficient of variation of inter-arrival gaps: 1 = Poisson, 4 = very bursty."""

    def rates(self) -> dict[str, float]:
        return {m: self.total_rate * w
                for m, w in zip(self.models, zipf_weights(len(self.models), self.zipf_s),
                                strict=True)}


def generate_events(spec: ArrivalSpec, seed: int) -> list[tuple[int, str]]:
    """``(t_ns, model)`` events, sorted by time (ties by model order)."""
    if spec.cv <= 0:
        raise ValueError("cv must be > 0")
    events: list[tuple[int, int]] = []
    for idx, (model, rate) in enumerate(spec.rates().items()):
        rng = random.Random(f"{seed}/{idx}/{model}")
        events.extend((t, idx) for t in _renewal_times(rate, spec.duration_ns, rng, spec.cv))
    events.sort()
    return [(t, spec.models[i]) for t, i in events]


def interval_count_events(counts: Mapping[str, Sequence[int]], interval_ns: int,
                          seed: int) -> list[tuple[int, str]]:
    """Replay per-interval request counts, Poisson within each interval.

    This is how Clockwork replays the Azure Functions 2019 trace (per-minute counts,
    ``azure_fast`` squeezes each minute into a second): given ``c`` arrivals in an
    interval, a Poisson process places them uniformly at random in it.
    """
    events: list[tuple[int, int]] = []
    names = list(counts)
    for idx, model in enumerate(names):
        rng = random.Random(f"{seed}/{idx}/{model}")
        for k, c in enumerate(counts[model]):
            base = k * interval_ns
            events.extend((base + int(rng.random() * interval_ns), idx) for _ in range(c))
    events.sort()
    return [(t, names[i]) for t, i in events]


def read_trace(path: str | Path) -> list[tuple[int, str]]:
    """Events from a CSV of ``t_ns,model`` rows (a header line is allowed), sorted."""
    events = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].strip().startswith("#"):
                continue
            try:
                t = int(row[0])
            except ValueError:
                if not events:
                    continue  # header
                raise
            events.append((t, row[1].strip()))
    events.sort(key=lambda e: e[0])
    return events


def write_trace(path: str | Path, events: Iterable[tuple[int, str]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_ns", "model"])
        w.writerows(events)


def to_requests(events: Sequence[tuple[int, str]], slo_ns: Mapping[str, int]) -> list[Request]:
    """Requests with ids 0..n-1 in arrival order, each due ``slo_ns[model]`` after arrival."""
    return [Request(i, m, t, t + slo_ns[m]) for i, (t, m) in enumerate(events)]


def trace_rates(events: Sequence[tuple[int, str]]) -> dict[str, float]:
    """Mean rate per model over the trace's span, req/s (what Nexus would measure)."""
    if not events:
        return {}
    span = max(1, events[-1][0] - events[0][0]) / NS
    out: dict[str, float] = {}
    for _, m in events:
        out[m] = out.get(m, 0.0) + 1.0
    return {m: c / span for m, c in out.items()}


def burstiness(events: Sequence[tuple[int, str]]) -> float:
    """Coefficient of variation of all inter-arrival gaps: a quick check of a trace."""
    if len(events) < 3:
        return math.nan
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(events)]
    mean = sum(gaps) / len(gaps)
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    return math.sqrt(var) / mean if mean else math.nan
