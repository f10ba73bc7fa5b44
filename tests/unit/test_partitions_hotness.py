"""Hotness windows (coordinator.partitions.hotness): busy score, per-node windows bounded in
time and size, stale -> unknown (never cold), and partitions told apart at 59 % and 61 %."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.partitions.config import PartitionsConfig
from coordinator.partitions.hotness import (
    COLD,
    HOT,
    MIN_TREND_SPAN_S,
    NORMAL,
    UNKNOWN,
    NodeHotness,
    NodeWindows,
    Sample,
    busy_score,
    partition_hotness,
)

CFG = PartitionsConfig()


def sample(ts: float, busy: float, **kw) -> Sample:
    return Sample(
        ts, cpu_busy=busy, load_per_core=kw.pop("load", 0.0), mem_used=kw.pop("mem", 0.0), **kw
    )


def test_busy_score_is_the_worst_signal_clipped():
    assert busy_score(sample(0, 0.3)) == 0.3
    assert busy_score(sample(0, 0.3, load=2.5)) == 1.0  # load per core clipped at 1
    assert busy_score(sample(0, 0.1, mem=0.45)) == 0.45
    assert busy_score(sample(0, 0.1, cpu_pressure=0.8)) == 0.8
    assert busy_score(sample(0, 0.1, mem_pressure=0.6)) == 0.6
    assert busy_score(sample(0, 0.1, gpu_util=0.95)) == 0.95
    assert busy_score(sample(0, -0.5)) == 0.0
    assert busy_score(Sample(0, 0.2, 0.1, 0.1, None, None, None)) == 0.2


def test_percentiles_and_state():
    w = NodeWindows(CFG.window_s)
    for i in range(10):  # scores 0.0, 0.1, ..., 0.9 one second apart
        w.add("a", sample(100 + i, i / 10))
    h = w.node("a", 109.0, CFG)
    assert (h.p50, h.p90) == (0.4, 0.8)  # nearest rank: 5th and 9th of 10
    assert h.state == HOT  # p90 0.8 is above the busy line 0.7
    calm = dataclasses.replace(CFG, busy_line=0.8)
    assert w.node("a", 109.0, calm).state == COLD  # not above 0.8: the line is strict


def test_hot_when_p90_above_the_line():
    w = NodeWindows(CFG.window_s)
    for i in range(10):
        w.add("a", sample(100 + i, 0.9 if i >= 8 else 0.2))  # 2 of 10 samples high
    assert w.node("a", 109.0, CFG).state == HOT
    w2 = NodeWindows(CFG.window_s)
    for i in range(10):
        w2.add("b", sample(100 + i, 0.9 if i >= 9 else 0.2))  # 1 of 10: that is the p100
    assert w2.node("b", 109.0, CFG).state == COLD


def test_trend_is_the_least_squares_slope():
    w = NodeWindows(CFG.window_s)
    t0 = 1_700_000_000.0  # epoch-sized times: the sums are kept relative, no cancellation
    for i in range(60):
        w.add("a", sample(t0 + 2 * i, 0.2 + 0.005 * i))  # +0.0025 busy per second
    h = w.node("a", t0 + 118, CFG)
    assert h.trend == pytest.approx(0.0025, rel=1e-9)
    flat = NodeWindows(CFG.window_s)
    for i in range(5):
        flat.add("f", sample(t0 + i, 0.5))
    assert flat.node("f", t0 + 4, CFG).trend == pytest.approx(0.0, abs=1e-12)
    one = NodeWindows(CFG.window_s)
    one.add("o", sample(t0, 0.5))
    assert one.node("o", t0, CFG).trend == 0.0


def test_stale_or_silent_is_unknown_never_cold():
    w = NodeWindows(CFG.window_s)
    assert w.node("never", 50.0, CFG) == NodeHotness("never", UNKNOWN, 0.0, 0.0, 0.0)
    for i in range(5):
        w.add("a", sample(100 + i, 0.1))
    assert w.node("a", 104 + CFG.stale_after_s, CFG).state == COLD
    assert w.node("a", 104 + CFG.stale_after_s + 0.5, CFG).state == UNKNOWN
    assert w.node("a", 104 + CFG.window_s + 10, CFG).state == UNKNOWN  # window emptied
    assert w.samples("a") == 0


def test_window_drops_old_samples_and_is_bounded_in_size():
    w = NodeWindows(60.0, max_samples=50)
    for i in range(1000):
        w.add("a", sample(float(i), (i % 7) / 7))
        assert w.samples("a") <= 50
    fast = NodeWindows(60.0)
    for i in range(500):
        fast.add("b", sample(i * 1.0, 0.5))
    assert fast.samples("b") == 61  # ts 439..499: older than 60 s before the newest dropped
    fast.forget("b")
    assert "b" not in fast and len(fast) == 0


def test_out_of_order_and_non_finite_samples_are_dropped():
    w = NodeWindows(CFG.window_s)
    w.add("a", sample(10.0, 0.5))
    w.add("a", sample(9.0, 0.9))
    w.add("a", sample(math.inf, 0.9))
    w.add("a", sample(math.nan, 0.9))
    assert w.samples("a") == 1
    w.add("a", sample(10.0, 0.6))  # same instant: kept
    assert w.samples("a") == 2
    w.add("a", sample(11.0, math.nan, load=0.2))  # a NaN signal never reaches the window
    assert not math.isnan(w.node("a", 11.0, CFG).p90)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    steps=st.lists(st.tuples(st.floats(0.0, 40.0), st.floats(0.0, 1.0)), min_size=1, max_size=120),
    window=st.floats(5.0, 120.0),
)
def test_window_matches_a_recomputation_from_scratch(steps, window):
    """The incremental window (sorted copy, running sums re-based) agrees with sorting and
    fitting the in-window samples afresh, however samples come and go."""
    cfg = dataclasses.replace(CFG, window_s=window, stale_after_s=1e5)
    w = NodeWindows(window)
    kept: list[tuple[float, float]] = []
    ts = 1_700_000_000.0
    for gap, busy in steps:
        ts += gap
        w.add("n", sample(ts, busy))
        kept = [(t, b) for t, b in kept + [(ts, busy)] if t >= ts - window]
    h = w.node("n", ts, cfg)
    scores = sorted(b for _, b in kept)
    n = len(scores)
    assert h.p50 == scores[math.ceil(0.5 * n) - 1]
    assert h.p90 == scores[math.ceil(0.9 * n) - 1]
    xs = [t - kept[0][0] for t, _ in kept]
    mx, my = sum(xs) / n, sum(b for _, b in kept) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = (
        sum((x - mx) * (b - my) for x, (_, b) in zip(xs, kept, strict=True)) / sxx
        if n > 1 and xs[-1] >= MIN_TREND_SPAN_S and sxx > 1e-6
        else 0.0
    )
    assert h.trend == pytest.approx(slope, rel=1e-6, abs=1e-9)


def node(i: int, state: str, p90: float = 0.5, trend: float = 0.0) -> NodeHotness:
    return NodeHotness(f"n{i}", state, p90 - 0.1, p90, trend)


def fleet(hot: int, total: int) -> list[NodeHotness]:
    return [node(i, HOT, 0.9) if i < hot else node(i, COLD, 0.3) for i in range(total)]


def test_59_and_61_percent_hot_are_told_apart():
    """Peloton's resizer reads 100 * (hot / total) in integer division: 0 for both."""
    p59 = partition_hotness(CFG, "stateless", fleet(59, 100))
    p61 = partition_hotness(CFG, "stateless", fleet(61, 100))
    assert (p59.hot_fraction, p61.hot_fraction) == (0.59, 0.61)
    assert (p59.state, p61.state) == (NORMAL, HOT)
    assert partition_hotness(CFG, "stateless", fleet(39, 100)).state == COLD
    assert partition_hotness(CFG, "stateless", fleet(60, 100)).state == NORMAL  # > 60 %: hot
    assert partition_hotness(CFG, "stateless", fleet(3, 5)).state == NORMAL  # 3/5 is 0.6


def test_partition_summary_and_forecast():
    nodes = [
        node(0, HOT, 0.9, 0.0),
        node(1, COLD, 0.65, 0.01),
        node(2, COLD, 0.3, 0.0),
        node(3, UNKNOWN, 0.99, 1.0),
    ]
    ph = partition_hotness(CFG, "stateless", nodes)
    assert (ph.nodes, ph.known, ph.hot) == (4, 3, 1)
    assert ph.hot_fraction == pytest.approx(1 / 3)
    # node 1: 0.65 + 0.01/s x 10 s = 0.75 > 0.7 next interval; the unknown node counts not
    assert ph.forecast_fraction == pytest.approx(2 / 3)
    assert ph.trend == pytest.approx(0.01 / 3)
    assert (ph.p50, ph.p90) == (pytest.approx(0.55), 0.9)
    assert ph.state == COLD  # 1/3 hot is below 40 %


def test_more_than_half_unknown_is_unknown():
    half = [node(i, UNKNOWN) for i in range(5)] + [node(5 + i, COLD) for i in range(5)]
    assert partition_hotness(CFG, "batch", half).state == COLD  # exactly half: still known
    more = half + [node(99, UNKNOWN)]
    assert partition_hotness(CFG, "batch", more).state == UNKNOWN
    assert partition_hotness(CFG, "batch", [node(0, UNKNOWN)]).state == UNKNOWN
    empty = partition_hotness(CFG, "batch/critical", [])
    assert (empty.state, empty.hot_fraction, empty.nodes) == (COLD, 0.0, 0)


def test_the_newest_report_is_kept_apart_from_the_window():
    """A spike shows in each node's newest score before its window's p90 moves (a tenth
    of the window must be high first): `last` says what the load is now, and a spike's
    borrow is sized from it."""
    w = NodeWindows(window_s=60.0)
    for t in range(60):
        w.add("a", Sample(float(t), 0.3, 0.3, 0.1))
    w.add("a", Sample(60.0, 0.95, 0.95, 0.1))
    for t in range(61):
        w.add("b", Sample(float(t), 0.3, 0.3, 0.1))
    a, b = w.node("a", 60.0, CFG), w.node("b", 60.0, CFG)
    assert a.state == COLD and a.p90 == 0.3 and a.last == 0.95  # the window lags
    assert b.last == 0.3
    ph = partition_hotness(CFG, "stateless", [a, b])
    assert ph.hot_fraction == 0.0 and ph.last == pytest.approx((0.95 + 0.3) / 2)
