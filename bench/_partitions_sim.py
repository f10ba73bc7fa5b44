"""The partitions bench's model: a fleet over a simulated day, in process, driving the real
controller (a helper of bench/partitions.py; the leading underscore keeps it off the
bench runner's list).

Why in process and not hollow agents over NATS: 1,000 nodes times a day of 10 s
heartbeats is 8.6 million samples; a hollow fleet would need the day in real time, and
the point is the controller's policy over a day, not the transport (the integration tests
cover the transport). What is real here: `Controlling` (the leader's hotness windows and
its call of `decide`), `controller.decide` and `break_glass`, `NodeWindows` and
`partition_hotness`, and `workloads.load.load_at` for the service's curve. What is a
model: how load spreads over nodes, the batch backlog, and the drain delay.

The model, as simple as the figures allow:

- **Service demand** (cores) at time t is a diurnal `LoadCurve` (two peaks a day, peak to
  trough 3:1) times a spike factor (one +50 % spike that rises within a minute, holds,
  and falls again) times (1 + demand noise x jitter(seed, step)).
- It is **spread evenly** over the nodes serving `stateless` (a node draining out of
  stateless keeps serving until it flips: the services' surge starts the replacement
  first). A node's busy is its share / cores plus per-node noise; it is **hot** when its
  busy is above the busy line. Only serving nodes count for hot-node-seconds: a batch
  node is meant to be full.
- **Batch** has a backlog that never empties: a batch node not in a move runs
  `tasks` tasks that fill its cores, each restarted as it ends. A node that starts a move
  out of batch has its tasks preempted at once; the core-seconds they had run are lost
  work. Batch work done = batch nodes' cores x time, minus the lost work.
- A **move** converges ``drain_s`` after it starts (the grace period of the kills, or the
  surge's replacement); meanwhile the node serves what it served before (out of
  stateless) or nothing (out of batch: its tasks were stopped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from coordinator.partitions.config import BATCH, STATELESS, PartitionsConfig
from coordinator.partitions.controller import Move, NodeFacts
from coordinator.partitions.controlling import Controlling
from coordinator.partitions.hotness import Sample
from workloads.load import LoadCurve, jitter, load_at

_S, _B = 0, 1  # partition codes in the fleet's arrays
_NAMES = (STATELESS, BATCH)
_CODE = {STATELESS: _S, BATCH: _B}


@dataclass(frozen=True, slots=True)
class Day:
    """One simulated day's settings (the same for every policy of a run)."""

    nodes: int = 1000
    cores: int = 16
    zones: int = 10
    day_s: float = 86400.0
    step_s: float = 10.0  # one sample per node per step; the controller runs each interval_s
    peak_share: float = 0.3  # the service's diurnal peak, as a share of the fleet's cores
    peak_to_trough: float = 3.0
    demand_noise: float = 0.03  # +- fraction of demand, the whole service, each step
    node_noise: float = 0.05  # +- busy, each node, each step
    spike_at_s: float = 0.55 * 86400.0
    spike: float = 0.5  # +50 %
    spike_rise_s: float = 60.0
    spike_hold_s: float = 600.0
    drain_s: float = 30.0
    batch_busy: float = 0.95
    task_mean_s: float = 1800.0
    non_preemptible_every: int = 50  # every n-th node runs non-preemptible batch work
    busy_line: float = 0.7
    seed: int = 0

    @property
    def peak_cores(self) -> float:
        return self.peak_share * self.nodes * self.cores

    def curve(self) -> LoadCurve:
        """The service's load curve: level 1 at the peak, 1/3 at the trough, two periods a
        day, at the mean and rising at t = 0."""
        return LoadCurve(
            curve="diurnal", peak=1.0, trough=1.0 / self.peak_to_trough, period_s=self.day_s / 2
        )


def spike_factor(day: Day, t: float) -> float:
    """1 outside the spike; rises linearly to 1 + spike over spike_rise_s, holds for
    spike_hold_s, falls back over spike_rise_s."""
    x = t - day.spike_at_s
    rise, hold = day.spike_rise_s, day.spike_hold_s
    if x <= 0 or x >= 2 * rise + hold:
        return 1.0
    if x < rise:
        return 1.0 + day.spike * x / rise
    if x <= rise + hold:
        return 1.0 + day.spike
    return 1.0 + day.spike * (2 * rise + hold - x) / rise


def demand(day: Day, t: float) -> float:
    """The service's demand in cores at t (curve x spike x noise)."""
    step = int(t // day.step_s)
    noise = 1.0 + day.demand_noise * jitter(day.seed, step)
    return load_at(day.curve(), t, day.peak_cores) * spike_factor(day, t) * noise


def mean_demand(day: Day) -> float:
    """The day's mean demand (cores) without spike or noise: the curve's mid level."""
    return day.peak_cores * (1.0 + 1.0 / day.peak_to_trough) / 2.0


def nodes_for(day: Day, cores_demand: float) -> int:
    """Stateless nodes that keep this demand under the busy line, with the demand noise
    at its worst and the node noise on top."""
    per_node = day.cores * (day.busy_line - day.node_noise)
    return min(day.nodes, math.ceil(cores_demand * (1.0 + day.demand_noise) / per_node))


def count_flaps(moves: Sequence[tuple[str, float, float, str, str]], cooldown_s: float) -> int:
    """Moves that took a node back where it came from within ``cooldown_s`` of its last
    move converging. ``moves``: (node_id, started, converged, source, target)."""
    last: dict[str, tuple[float, str]] = {}
    flaps = 0
    for node_id, started, converged, source, target in sorted(moves, key=lambda m: m[1]):
        prev = last.get(node_id)
        if prev is not None and target == prev[1] and started - prev[0] < cooldown_s:
            flaps += 1
        last[node_id] = (converged, source)
    return flaps


def max_per_window(times: Sequence[float], window_s: float) -> int:
    """The most events in any window of ``window_s`` (e.g. moves in any hour)."""
    ts = sorted(times)
    best = lo = 0
    for hi, t in enumerate(ts):
        while t - ts[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def relief(
    times: Sequence[float], hot_fraction: Sequence[float], since: float, threshold: float
) -> tuple[float | None, float | None]:
    """(when the partition first became hot at or after ``since``, when it was first no
    longer hot after that), hot meaning a hot fraction above ``threshold``; (None, None)
    when it never became hot, (t, None) when it stayed hot to the end."""
    hot_at = None
    for t, f in zip(times, hot_fraction, strict=True):
        if t < since:
            continue
        if hot_at is None:
            if f > threshold:
                hot_at = t
        elif f <= threshold:
            return hot_at, t
    return hot_at, None


@dataclass
class Result:
    """One policy's day, as the bench reports it."""

    policy: str
    batch_core_s: float = 0.0
    lost_core_s: float = 0.0
    service_core_s: float = 0.0
    hot_node_s: float = 0.0
    hot_service_core_s: float = 0.0  # service load that ran on hot nodes
    moves: list[tuple[str, float, float, str, str]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    stateless_nodes: list[int] = field(default_factory=list)
    hot_fraction: list[float] = field(default_factory=list)
    decide_calls: int = 0
    frozen: int = 0


class Fleet:
    """The nodes' partitions, moves in flight and batch tasks, in arrays."""

    def __init__(self, day: Day, stateless: int) -> None:
        n = day.nodes
        self.day = day
        self.ids = [f"n{i:05d}" for i in range(n)]
        self.zone = [f"z{i % day.zones}" for i in range(n)]
        # The highest ids start in stateless, so disruption order (node id) differs from it.
        self.part = np.full(n, _B, dtype=np.int8)
        self.part[n - stateless :] = _S
        self.desired = self.part.copy()
        self.until = np.full(n, math.inf)
        self.last_moved = np.zeros(n)
        self.home = [""] * n
        self.tasks = [2 + i % 5 for i in range(n)]
        self.priority = [(i * 37) % 100 for i in range(n)]
        self.non_preemptible = [
            day.non_preemptible_every > 0 and i % day.non_preemptible_every == 0 for i in range(n)
        ]
        self.task_start = [[0.0] * k for k in self.tasks]
        self.task_end = [
            [self._duration(i, j, 0) for j in range(k)] for i, k in enumerate(self.tasks)
        ]
        self.task_n = [[0] * k for k in self.tasks]
        self.started: dict[int, float] = {}  # node index -> when its move in flight started
        self._facts: list[NodeFacts | None] = [None] * n

    def _duration(self, i: int, j: int, k: int) -> float:
        x = jitter(self.day.seed * 1_000_003 + i * 64 + j, k)
        return self.day.task_mean_s * (1.0 + 0.5 * x)

    def restart_tasks(self, i: int, t: float) -> None:
        for j in range(self.tasks[i]):
            self.task_n[i][j] += 1
            self.task_start[i][j] = t
            self.task_end[i][j] = t + self._duration(i, j, self.task_n[i][j])

    def preempt(self, i: int, t: float) -> float:
        """Stop node i's batch tasks at t: the core-seconds they had run (lost)."""
        per_task = self.day.cores / self.tasks[i]
        lost = 0.0
        for j in range(self.tasks[i]):
            while self.task_end[i][j] <= t:  # ended and restarted since it was last looked at
                self.task_n[i][j] += 1
                self.task_start[i][j] = self.task_end[i][j]
                self.task_end[i][j] += self._duration(i, j, self.task_n[i][j])
            lost += (t - self.task_start[i][j]) * per_task
        return lost

    def start_move(self, i: int, target: str, t: float, drain_s: float) -> float:
        """Start moving node i; returns the batch work lost to it."""
        source = _NAMES[self.part[i]]
        self.desired[i] = _CODE[target]
        self.until[i] = t + drain_s
        self.started[i] = t
        self._facts[i] = None
        return self.preempt(i, t) if source == BATCH else 0.0

    def converge(self, t: float, result: Result) -> list[int]:
        """Flip the nodes whose drain has ended by t; returns their indexes."""
        done = [int(i) for i in np.nonzero(self.until <= t)[0]]
        for i in done:
            source, target = _NAMES[self.part[i]], _NAMES[self.desired[i]]
            self.part[i] = self.desired[i]
            self.until[i] = math.inf
            self.last_moved[i] = t
            if target == BATCH:
                self.restart_tasks(i, t)
            if self.home[i] == target:
                self.home[i] = ""
            elif self.home[i] == "":
                self.home[i] = source
            self._facts[i] = None
            result.moves.append((self.ids[i], self.started.pop(i), t, source, target))
        return done

    def facts(self) -> list[NodeFacts]:
        out = []
        for i, f in enumerate(self._facts):
            if f is None:
                part, desired = _NAMES[self.part[i]], _NAMES[self.desired[i]]
                batch = part == BATCH
                f = self._facts[i] = NodeFacts(
                    node_id=self.ids[i],
                    zone=self.zone[i],
                    partition=part,
                    desired=desired,
                    draining=part != desired,
                    last_moved=float(self.last_moved[i]),
                    home=self.home[i],
                    tasks=self.tasks[i] if batch else 1,
                    priority_sum=self.tasks[i] * self.priority[i] if batch else 0,
                    non_preemptible=batch and self.non_preemptible[i],
                    services=0 if batch else 1,
                )
            out.append(f)
        return out

    def apply(self, moves: Sequence[Move], t: float) -> float:
        index = {m.node_id: int(m.node_id[1:]) for m in moves}
        return sum(self.start_move(index[m.node_id], m.target, t, self.day.drain_s) for m in moves)


def simulate(
    day: Day,
    policy: str,
    stateless: int,
    cfg: PartitionsConfig | None = None,
) -> tuple[Result, Fleet, Controlling | None]:
    """One policy's day: static (``cfg`` None: the split never changes) or dynamic (the
    real controller, every ``cfg.interval_s``). Same day, same seeds, same noise.
    A node's hotness window starts again when its move converges, as the product does
    (`Controlling` sees the new partition at its next decision)."""
    fleet = Fleet(day, stateless)
    result = Result(policy)
    rng = np.random.default_rng(day.seed)
    controlling = Controlling() if cfg is not None else None
    every = max(1, round(cfg.interval_s / day.step_s)) if cfg is not None else 0
    steps = int(day.day_s // day.step_s)
    step_s, cores, line = day.step_s, day.cores, day.busy_line
    for k in range(steps):
        t = k * step_s
        fleet.converge(t, result)
        d = demand(day, t)
        noise = rng.uniform(-1.0, 1.0, day.nodes)
        serving = fleet.part == _S
        batch_on = (fleet.part == _B) & (fleet.desired == _B)
        n_serv = int(serving.sum())
        share = d / n_serv if n_serv else 0.0
        busy = np.where(
            serving,
            share / cores + day.node_noise * noise,
            np.where(batch_on, day.batch_busy + 0.03 * noise, 0.05),
        ).clip(0.0, 1.0)
        hot = serving & (busy > line)
        n_hot = int(hot.sum())
        result.hot_node_s += n_hot * step_s
        result.hot_service_core_s += min(share, cores) * n_hot * step_s
        result.service_core_s += min(d, n_serv * cores) * step_s
        result.batch_core_s += int(batch_on.sum()) * cores * step_s
        result.times.append(t)
        result.stateless_nodes.append(n_serv)
        result.hot_fraction.append(n_hot / n_serv if n_serv else 0.0)
        if controlling is None:
            continue
        windows = controlling.windows
        windows.window_s = cfg.window_s
        ids = fleet.ids
        for i, b in enumerate(busy.tolist()):
            # As sample_from_state builds one: CPU busy, load per core, memory used;
            # a simulated node reports no PSI and has no GPUs (None: unknown, not idle).
            windows.add(ids[i], Sample(t, b, b, 0.3))
        if k % every == 0:
            moves, why = controlling(cfg, fleet.facts(), t)
            result.decide_calls += 1
            result.frozen += why.startswith("frozen")
            result.lost_core_s += fleet.apply(moves, t)
    result.batch_core_s -= result.lost_core_s
    return result, fleet, controlling
