"""The partitions bench's model (bench/_partitions_sim.py): the load curve it feeds the
controller, the splits it sizes, and the counting behind its figures (flaps, hot-node-
seconds, lost work, relief). The figures themselves are not asserted: a bench measures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench._partitions_sim import (
    Day,
    Fleet,
    count_flaps,
    demand,
    max_per_window,
    mean_demand,
    nodes_for,
    relief,
    simulate,
    spike_factor,
)
from coordinator.partitions.config import PartitionsConfig

QUIET = Day(nodes=100, day_s=7200.0, demand_noise=0.0, spike=0.0, spike_at_s=3000.0)


def test_the_service_curve_has_two_peaks_a_day_at_3_to_1():
    levels = [demand(QUIET, float(t)) for t in range(0, int(QUIET.day_s), 10)]
    peaks = [i for i in range(1, len(levels) - 1) if levels[i - 1] < levels[i] >= levels[i + 1]]
    assert len(peaks) == 2
    assert max(levels) / min(levels) == pytest.approx(3.0, rel=0.01)
    assert max(levels) == pytest.approx(QUIET.peak_cores, rel=0.001)
    assert sum(levels) / len(levels) == pytest.approx(mean_demand(QUIET), rel=0.001)


def test_the_spike_adds_half_within_a_minute_and_goes():
    day = replace(QUIET, spike=0.5, spike_at_s=1000.0, spike_rise_s=60.0, spike_hold_s=600.0)
    assert spike_factor(day, 999.0) == 1.0
    assert spike_factor(day, 1030.0) == pytest.approx(1.25)
    assert spike_factor(day, 1060.0) == pytest.approx(1.5)
    assert spike_factor(day, 1600.0) == pytest.approx(1.5)
    assert spike_factor(day, 1720.0) == 1.0
    assert demand(day, 1300.0) == pytest.approx(1.5 * demand(QUIET, 1300.0))


def test_demand_noise_is_the_same_for_the_same_seed_and_bounded():
    day = replace(QUIET, demand_noise=0.03)
    a = [demand(day, t * 10.0) for t in range(100)]
    assert a == [demand(day, t * 10.0) for t in range(100)]
    for t, x in zip(range(100), a, strict=True):
        assert abs(x / demand(QUIET, t * 10.0) - 1.0) <= 0.03 + 1e-12


def test_the_peak_split_keeps_the_peak_under_the_busy_line():
    day = Day(nodes=1000)
    n = nodes_for(day, day.peak_cores)
    worst = day.peak_cores * (1 + day.demand_noise) / n / day.cores + day.node_noise
    assert worst <= day.busy_line
    fewer = day.peak_cores * (1 + day.demand_noise) / (n - 1) / day.cores + day.node_noise
    assert fewer > day.busy_line  # and it is the smallest such split
    assert nodes_for(day, mean_demand(day)) < n


def test_a_node_moved_back_within_the_cooldown_is_a_flap():
    moves = [
        ("a", 0.0, 30.0, "batch", "stateless"),
        ("a", 200.0, 230.0, "stateless", "batch"),  # back 170 s after converging: a flap
        ("b", 0.0, 30.0, "batch", "stateless"),
        ("b", 400.0, 430.0, "stateless", "batch"),  # back after 370 s: not within 300
        ("c", 0.0, 30.0, "batch", "stateless"),
        ("c", 100.0, 130.0, "stateless", "batch/x"),  # not back where it came from
    ]
    assert count_flaps(moves, 300.0) == 1
    assert count_flaps(moves, 100.0) == 0
    assert count_flaps([], 300.0) == 0


def test_moves_in_any_hour():
    assert max_per_window([0, 10, 3599, 3600, 3601, 7300], 3600) == 4
    assert max_per_window([], 3600) == 0


def test_relief_is_from_becoming_hot_to_no_longer_hot_after_the_spike():
    times = [0, 10, 20, 30, 40, 50]
    assert relief(times, [0.9, 0.1, 0.7, 0.8, 0.5, 0.9], 10, 0.6) == (20, 40)
    assert relief(times, [0.0] * 6, 10, 0.6) == (None, None)
    assert relief(times, [0.0, 0.0, 0.0, 0.7, 0.7, 0.7], 10, 0.6) == (30, None)


def test_static_split_counts_batch_work_and_hot_node_seconds():
    day = replace(QUIET, day_s=600.0, node_noise=0.0, peak_share=0.9)
    r, _, _ = simulate(day, "static", 10, None)
    # 90 batch nodes, all day, none preempted; 10 stateless nodes far above the line.
    assert r.batch_core_s == 90 * day.cores * day.day_s
    assert r.lost_core_s == 0 and r.moves == []
    assert r.hot_node_s == 10 * day.day_s
    assert set(r.stateless_nodes) == {10}
    cool = replace(day, peak_share=0.01)
    assert simulate(cool, "static", 10, None)[0].hot_node_s == 0


def test_preempting_a_node_loses_what_its_tasks_had_run():
    day = replace(QUIET, task_mean_s=1000.0)
    fleet = Fleet(day, 0)
    i = 3  # 2 + 3 % 5 = 5 tasks of 16/5 cores
    fleet.restart_tasks(i, 100.0)
    ends = list(fleet.task_end[i])
    t = min(ends) - 1.0
    assert fleet.preempt(i, t) == pytest.approx(5 * (t - 100.0) * day.cores / 5)
    # Past a task's end it restarted: only the part since counts.
    later = max(ends) + 1.0
    lost = fleet.preempt(i, later)
    assert lost == pytest.approx(sum(later - e for e in ends) * day.cores / 5)


def test_dynamic_moves_converge_after_the_drain_and_lose_batch_work():
    day = replace(QUIET, day_s=1800.0, peak_share=0.6)
    r, fleet, controlling = simulate(day, "dynamic", 10, PartitionsConfig())
    assert controlling is not None and r.decide_calls == 180
    assert r.moves, "a stateless partition far above the line borrows"
    assert all(end - start == day.drain_s for _, start, end, _, _ in r.moves)
    assert r.moves[0][3:] == ("batch", "stateless")
    assert {m[3:] for m in r.moves} <= {("batch", "stateless"), ("stateless", "batch")}
    assert r.lost_core_s > 0
    assert max(r.stateless_nodes) > 10
    # Batch work is the batch nodes' time less what the preempted tasks had done.
    assert r.batch_core_s < 90 * day.cores * day.day_s - r.lost_core_s
