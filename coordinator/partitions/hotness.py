"""How hot nodes and partitions are: busy windows fed by heartbeats, read with the clock given.

A node's **busy score** is the worst of its load signals, each a 0..1 fraction; its window
keeps the scores of the last ``window_s`` seconds, from which come p50, p90 and the trend
(least-squares slope, busy per second). A node is *hot* when its p90 is above the busy
line, *cold* otherwise, and *unknown* when its last report is older than ``stale_after_s``
(or it never reported): silence is never read as "cold", because a node that stopped
reporting may be the hottest of all.

A partition's hot fraction is ``hot / known`` in floating point. Peloton's resizer
computed ``100 * (hot / total)`` in integer division, which is 0 unless every host is hot,
so a pool with 59 % hot hosts and one with 61 % read the same; here they do not.

Reads are cheap because the window is kept ready: a sorted copy of the scores (bisect,
so p50/p90 are one index each) and running sums for the slope, re-based on the oldest
sample once per window so float error cannot build up. Memory per node is bounded by
``window_s`` and by ``max_samples``.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.partitions.sample import Sample, busy_score

if TYPE_CHECKING:
    from coordinator.partitions.config import PartitionsConfig

__all__ = [
    "HOT",
    "COLD",
    "NORMAL",
    "UNKNOWN",
    "NodeHotness",
    "NodeWindows",
    "PartitionHotness",
    "Sample",
    "busy_score",
    "partition_hotness",
]

HOT, COLD, NORMAL, UNKNOWN = "hot", "cold", "normal", "unknown"

MIN_TREND_SPAN_S = 1.0
"""Samples spanning less than this give no trend (0): the slope of a blip is noise."""

MAX_SAMPLES = 1024
"""Samples kept per node however fast it reports (a 1 s heartbeat fills 300 in 5 min)."""


@dataclass(frozen=True, slots=True)
class NodeHotness:
    node_id: str
    state: str  # "hot" | "cold" | "unknown"   (stale or no samples -> unknown, never cold)
    p50: float
    p90: float
    trend: float  # busy per second (least squares slope over the window)
    last: float = 0.0  # the newest score: what the node is doing now, not over the window


class _Window:
    """One node's samples in time order, their scores sorted, and the slope's sums over
    ``t = ts - origin``. Plain arrays of doubles (24 bytes a sample in all, a third of
    what lists of float objects cost): at 5,000 nodes reporting every second that is
    36 MB for 5-minute windows; dropping the oldest moves a few KiB, far below a
    heartbeat's own cost."""

    __slots__ = ("times", "scores", "ordered", "origin", "st", "sb", "stt", "stb")

    def __init__(self, origin: float) -> None:
        self.times = array("d")
        self.scores = array("d")
        self.ordered = array("d")
        self.origin = origin
        self.st = self.sb = self.stt = self.stb = 0.0

    def push(self, ts: float, b: float) -> None:
        self.times.append(ts)
        self.scores.append(b)
        insort(self.ordered, b)
        t = ts - self.origin
        self.st += t
        self.sb += b
        self.stt += t * t
        self.stb += t * b

    def pop_oldest(self) -> None:
        ts, b = self.times[0], self.scores[0]
        del self.times[0], self.scores[0]
        del self.ordered[bisect_left(self.ordered, b)]
        t = ts - self.origin
        self.st -= t
        self.sb -= b
        self.stt -= t * t
        self.stb -= t * b

    def trim(self, cutoff: float, window_s: float) -> None:
        """Drop samples older than ``cutoff``; re-base the sums when the origin has fallen
        a window behind (exact sums again, and t stays small)."""
        times = self.times
        if not times or times[0] >= cutoff:
            return
        while times and times[0] < cutoff:
            self.pop_oldest()
        if times and times[0] - self.origin > window_s:
            self.rebase()

    def rebase(self) -> None:
        self.origin = origin = self.times[0]
        st = sb = stt = stb = 0.0
        for ts, b in zip(self.times, self.scores, strict=True):
            t = ts - origin
            st += t
            sb += b
            stt += t * t
            stb += t * b
        self.st, self.sb, self.stt, self.stb = st, sb, stt, stb

    def slope(self) -> float:
        n = len(self.times)
        if n < 2 or self.times[-1] - self.times[0] < MIN_TREND_SPAN_S:
            return 0.0  # two samples a millisecond apart would say 1,000 busy a second
        den = n * self.stt - self.st * self.st
        if den <= 1e-9 * max(1.0, n * self.stt):  # all samples at (nearly) one instant
            return 0.0
        return (n * self.stb - self.st * self.sb) / den


def _rank(n: int, tenths: int) -> int:
    """The nearest-rank index of the ``tenths``/10 quantile among ``n`` sorted values:
    ceil(q * n) - 1, in integers so that 9 of 10 is exactly the p90."""
    return max(0, (tenths * n + 9) // 10 - 1)


class NodeWindows:
    """Per node, the busy scores of the last ``window_s`` seconds. Pure: time is passed in
    (the sample's ``ts`` on add, ``now`` on read), nothing is read from a clock.

    A sample older than the node's newest is dropped (heartbeats of one node arrive in
    order; a reordered one would bend the slope). Reads trim what the window has left
    behind, so time is expected to move forward between calls."""

    def __init__(self, window_s: float = 300.0, max_samples: int = MAX_SAMPLES) -> None:
        self.window_s = window_s  # the shell sets this when the config changes
        self.max_samples = max_samples
        self._nodes: dict[str, _Window] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def samples(self, node_id: str) -> int:
        """How many samples the node's window holds now (0 for a node never seen)."""
        w = self._nodes.get(node_id)
        return len(w.times) if w is not None else 0

    def add(self, node_id: str, s: Sample) -> None:
        ts = s.ts
        if not math.isfinite(ts):
            return
        w = self._nodes.get(node_id)
        if w is None:
            w = self._nodes[node_id] = _Window(ts)
        elif w.times and ts < w.times[-1]:
            return
        b = busy_score(s)
        if b != b:  # NaN: a broken report says nothing, and would poison the sorted window
            return
        w.push(ts, b)
        w.trim(ts - self.window_s, self.window_s)
        if len(w.times) > self.max_samples:
            while len(w.times) > self.max_samples:
                w.pop_oldest()
            if w.times[0] - w.origin > self.window_s:
                w.rebase()

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def node(self, node_id: str, now: float, cfg: PartitionsConfig) -> NodeHotness:
        """The node's hotness at ``now``: unknown when it has no sample in the window or
        its newest is older than ``cfg.stale_after_s``; else hot when p90 > busy line."""
        w = self._nodes.get(node_id)
        if w is None:
            return NodeHotness(node_id, UNKNOWN, 0.0, 0.0, 0.0)
        w.trim(now - cfg.window_s, cfg.window_s)
        ordered = w.ordered
        n = len(ordered)
        if n == 0:
            return NodeHotness(node_id, UNKNOWN, 0.0, 0.0, 0.0)
        p50 = ordered[_rank(n, 5)]
        p90 = ordered[_rank(n, 9)]
        stale = now - w.times[-1] > cfg.stale_after_s
        state = UNKNOWN if stale else (HOT if p90 > cfg.busy_line else COLD)
        return NodeHotness(node_id, state, p50, p90, w.slope(), w.scores[-1])


@dataclass(frozen=True, slots=True)
class PartitionHotness:
    partition: str
    nodes: int
    known: int
    hot: int
    hot_fraction: float  # hot / known as a float (NOT integer division); 0 when known == 0
    p50: float  # median over known nodes of their p50
    p90: float  # p90 over known nodes of their p90
    trend: float  # mean over known nodes of their trend (busy per second)
    forecast_fraction: float  # hot fraction one interval ahead, each node's p90 + trend x interval
    state: str  # "hot" | "cold" | "normal" | "unknown" (more than half its nodes unknown)
    last: float = 0.0  # mean over known nodes of their newest score: the load now


def partition_hotness(
    cfg: PartitionsConfig, partition: str, nodes: Sequence[NodeHotness]
) -> PartitionHotness:
    """Sum up a partition's nodes. "unknown" when more than half of them are unknown (the
    controller then freezes); otherwise hot above ``cfg.hot_fraction``, cold below
    ``cfg.cold_fraction``, normal in the dead band between. A partition with no nodes at
    all is cold (nothing in it is busy)."""
    line = cfg.busy_line
    ahead = cfg.interval_s
    p50s: list[float] = []
    p90s: list[float] = []
    hot = coming = 0
    trend_sum = last_sum = 0.0
    for h in nodes:
        state = h.state
        if state == UNKNOWN:
            continue
        p90 = h.p90
        p50s.append(h.p50)
        p90s.append(p90)
        trend_sum += h.trend
        last_sum += h.last
        if state == HOT:
            hot += 1
        if p90 + h.trend * ahead > line:
            coming += 1
    total, known = len(nodes), len(p90s)
    if known:
        p50s.sort()
        p90s.sort()
        p50, p90 = p50s[_rank(known, 5)], p90s[_rank(known, 9)]
        fraction, forecast, trend = hot / known, coming / known, trend_sum / known
        last = last_sum / known
    else:
        p50 = p90 = fraction = forecast = trend = last = 0.0
    if 2 * (total - known) > total:
        state = UNKNOWN
    elif fraction > cfg.hot_fraction:
        state = HOT
    elif fraction < cfg.cold_fraction:
        state = COLD
    else:
        state = NORMAL
    return PartitionHotness(
        partition, total, known, hot, fraction, p50, p90, trend, forecast, state, last
    )
