"""coordinator.scheduling: the queue window, the starvation guard's schedule, and how a
job becomes a gang request."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.scheduling import PlacementConfig, holds_line, window


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 500), st.integers(1, 40))
def test_the_window_keeps_the_head_and_reaches_every_job(n, size):
    jobs = list(range(n))
    seen: set[int] = set()
    cursor = 0
    rounds = math.ceil(n / size) + 1
    for _ in range(rounds):
        picked, cursor = window(jobs, cursor, size)
        assert len(picked) == len(set(picked)) <= max(2 * size, n)
        assert picked[: min(size, n)] == jobs[: min(size, n)]  # the head, always
        seen.update(picked)
    assert seen == set(jobs)


def test_a_short_queue_is_looked_at_whole():
    assert window([1, 2, 3], 7, 2) == ([1, 2, 3], 0)


def test_a_starving_gang_holds_the_line_in_windows():
    c = PlacementConfig(starve_after_s=30, hold_s=60, release_s=15)
    assert not holds_line(29.9, c)
    assert holds_line(30, c) and holds_line(89.9, c)
    assert not holds_line(90, c) and not holds_line(104.9, c)
    assert holds_line(105, c)
