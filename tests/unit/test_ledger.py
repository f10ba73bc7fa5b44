"""The reliability ledger's duplicate count (agent/ledger.py) and its fleet recorder."""

from __future__ import annotations

import doctest
import random

from hypothesis import given, settings
from hypothesis import strategies as st

import agent.ledger
from agent.ledger import DROPPED, Run, RunBook, count_duplicates, read_runs


def test_doctests() -> None:
    assert doctest.testmod(agent.ledger).failed == 0


def test_retries_in_sequence_are_no_duplicate() -> None:
    runs = [
        Run("t", 1, 1, "n1", 0.0, 1.0, "FAILED"),
        Run("t", 1, 2, "n1", 1.5, 2.0, "FAILED"),  # an in-place restart
        Run("t", 2, 1, "n2", 2.0, 3.0, "SUCCEEDED"),  # touching ends do not overlap
        Run("u", 1, 1, "n1", 0.0, 9.0, "SUCCEEDED"),  # another task at the same time
    ]
    d = count_duplicates(runs)
    assert d.total == 0 and not d.tasks


def test_run_after_success() -> None:
    ok = Run("t", 1, 1, "n1", 0.0, 1.0, "SUCCEEDED")
    again = Run("t", 2, 1, "n2", 5.0, 6.0, "FAILED")
    d = count_duplicates([again, ok])
    assert d.after_success == (again,)
    assert d.tasks == {"t"} and d.summary()["after_success"] == 1


def test_same_run_twice_is_repeated_not_also_overlapping() -> None:
    a = Run("t", 1, 1, "n1", 0.0, 4.0, "SUCCEEDED")
    b = Run("t", 1, 1, "n2", 1.0, 3.0, "SUCCEEDED")  # one attempt on two nodes
    d = count_duplicates([a, b])
    assert d.repeated == (b,) and d.overlapping == ()


def test_overlap_with_an_open_run() -> None:
    a = Run("t", 1, 1, "n1", 0.0, None, "")  # still running (its node was cut off)
    b = Run("t", 2, 1, "n2", 100.0, 101.0, "FAILED")
    d = count_duplicates([a, b])
    assert d.overlapping == ((a, b),) and d.after_success == ()


def _sequence(draw_gaps: list[float], tasks: int) -> list[Run]:
    """Runs of `tasks` tasks, each one after another (attempts and runs counting up),
    only the last of each task SUCCEEDED: no duplicate by construction."""
    runs = []
    it = iter(draw_gaps)
    for i in range(tasks):
        t = 0.0
        n = 1 + int(next(it, 0.0) * 3) % 4
        for k in range(n):
            start = t + next(it, 0.5)
            end = start + next(it, 0.5) + 0.01
            attempt, run = 1 + k // 2, 1 + k % 2
            outcome = "SUCCEEDED" if k == n - 1 else "FAILED"
            runs.append(Run(f"t{i}", attempt, run, f"n{k % 3}", start, end, outcome))
            t = end
    return runs


gaps = st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(gaps, st.integers(1, 6), st.randoms())
def test_sequential_runs_never_count_and_order_does_not_matter(g, tasks, rnd) -> None:
    runs = _sequence(g, tasks)
    rnd.shuffle(runs)
    assert count_duplicates(runs).total == 0


@settings(max_examples=200, deadline=None)
@given(gaps, st.integers(1, 6), st.integers(0, 10_000))
def test_a_copy_of_any_run_counts_once(g, tasks, pick) -> None:
    runs = _sequence(g, tasks)
    copy = runs[pick % len(runs)]
    d = count_duplicates([*runs, copy])
    assert len(d.repeated) == 1 and d.tasks == {copy.task_id}


@settings(max_examples=200, deadline=None)
@given(gaps, st.integers(1, 6), st.integers(0, 10_000), st.floats(0.0, 10.0))
def test_a_run_after_success_counts(g, tasks, pick, later) -> None:
    runs = _sequence(g, tasks)
    done = [r for r in runs if r.outcome == "SUCCEEDED"][pick % tasks]
    extra = Run(done.task_id, 99, 1, "nx", done.end + later, done.end + later + 1, "FAILED")
    d = count_duplicates([*runs, extra])
    assert d.after_success == (extra,) and d.total == 1


@settings(max_examples=200, deadline=None)
@given(gaps, st.integers(1, 6), st.integers(0, 10_000), st.floats(0.0, 1.0))
def test_a_run_inside_another_overlaps(g, tasks, pick, frac) -> None:
    runs = _sequence(g, tasks)
    host = runs[pick % len(runs)]
    start = host.start + frac * (host.end - host.start) * 0.99
    extra = Run(host.task_id, 50, 1, "ny", start, start + 0.001, "KILLED")
    d = count_duplicates([*runs, extra])
    assert len(d.overlapping) >= 1
    assert all(extra in pair for pair in d.overlapping)


def test_runbook_in_memory_and_on_file(tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    book = RunBook(path)
    book.started("t", 1, "n1", ts=1.0)
    book.started("u", 1, "n1", ts=2.0)
    book.ended("t", 1, "n1", "SUCCEEDED", ts=3.0)
    book.ended("t", 1, "n1", "FAILED", ts=4.0)  # nothing open: ignored
    book.started("v", 1, "n2", ts=5.0, run=2)
    assert book.runs() == [
        Run("t", 1, 1, "n1", 1.0, 3.0, "SUCCEEDED"),
        Run("u", 1, 1, "n1", 2.0),
        Run("v", 1, 2, "n2", 5.0),
    ]
    book.close()
    with open(path, "a") as f:
        f.write('{"task_id": "w", "atte')  # a write torn by SIGKILL
    assert read_runs(path) == book.runs()
    closed = read_runs(path, closed_at=4.0)
    assert closed[1] == Run("u", 1, 1, "n1", 2.0, 4.0, DROPPED)
    assert closed[2] == Run("v", 1, 2, "n2", 5.0, 5.0, DROPPED)  # never before its start


def test_runbook_many_runs_round_trip(tmp_path) -> None:
    rng = random.Random(3)
    book = RunBook(tmp_path / "l.jsonl")
    for i in range(200):
        book.started(f"t{i}", 1 + i % 3, f"n{i % 7}", ts=float(i))
        if rng.random() < 0.8:
            book.ended(f"t{i}", 1 + i % 3, f"n{i % 7}", "SUCCEEDED", ts=i + 0.5)
    book.close()
    assert read_runs(tmp_path / "l.jsonl") == book.runs()
