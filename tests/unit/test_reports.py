"""What agents' reports mean for the log (coordinator/reports.py): a report judged on
the state, reports fetched together judged in order, late starts, and how a fetch is
cut into appends."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.reports import (
    Kill,
    agent_event,
    report_outcomes,
    report_parts,
    reports_fetch,
    still_placed,
)
from mesh.schema import TaskEvent, TaskPreemptRequested, TaskUpdated
from tests.unit.test_reconcile import Log
from workloads.lifecycle import JobState, TaskState

S = TaskState


def test_agent_events_become_log_updates_preemptions_or_stale_kills():
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "a")
    t = log.state.tasks["j.w.0"]
    # A report the log already holds (redelivered to a new leader): nothing to log again.
    assert agent_event(log.state, TaskEvent("a", "j", "j.w.0", 1, S.RUNNING, 3.5)) is None
    done = agent_event(log.state, TaskEvent("a", "j", "j.w.0", 1, S.SUCCEEDED, 4.0, exit_code=0))
    assert isinstance(done, TaskUpdated) and done.state == S.SUCCEEDED and done.exit_code == 0
    # A KILLED report of an attempt being reclaimed is logged as PREEMPTED, with the reason.
    log.append(TaskPreemptRequested("j", "j.w.0", t.attempt, "preempted: for /a", 4.0))
    killed = agent_event(log.state, TaskEvent("a", "j", "j.w.0", 1, S.KILLED, 5.0))
    assert killed.state == S.PREEMPTED and killed.message == "preempted: for /a"
    # The same attempt reported running from another node: a stale copy to kill there.
    stale = agent_event(log.state, TaskEvent("b", "j", "j.w.0", 1, S.RUNNING, 5.0))
    assert stale == Kill(
        "b", "j", "j.w.0", 1, "stale copy: this attempt is no longer assigned to this node"
    )
    # An ended stale copy, or an unknown task: nothing to do.
    assert agent_event(log.state, TaskEvent("b", "j", "j.w.0", 1, S.FAILED, 5.0)) is None
    assert agent_event(log.state, TaskEvent("a", "x", "x.w.0", 1, S.RUNNING, 5.0)) is None
    # A RUNNING redelivered after the attempt's SUCCEEDED was logged: not logged again.
    log.submit("k", count=1)
    log.run("k.w.0", "a")
    log.update("k.w.0", S.SUCCEEDED, exit_code=0)
    assert agent_event(log.state, TaskEvent("a", "k", "k.w.0", 1, S.RUNNING, 6.0)) is None


def test_reports_logged_together_are_judged_in_order():
    """The same report twice in one fetch (two stream messages for one transition) is
    logged once, and a start logged in the fetch is not logged again after its end."""
    log = Log()
    log.submit("j", count=2)
    log.place("j.w.0", "a")
    log.place("j.w.1", "a")
    running = TaskEvent("a", "j", "j.w.0", 1, S.RUNNING, 3.0)
    done = TaskEvent("a", "j", "j.w.0", 1, S.SUCCEEDED, 4.0, exit_code=0)
    other = TaskEvent("a", "j", "j.w.1", 1, S.RUNNING, 3.0)
    stale = TaskEvent("b", "j", "j.w.1", 1, S.RUNNING, 3.0)
    updates, kills = report_outcomes(log.state, [running, other, running, done, running, stale])
    assert [(u.task_id, u.state) for u in updates] == [
        ("j.w.0", S.RUNNING),
        ("j.w.1", S.RUNNING),
        ("j.w.0", S.SUCCEEDED),
    ]
    assert [(k.node_id, k.task_id) for k in kills] == [("b", "j.w.1")]
    # Judged on the state alone, each copy was a transition to log.
    assert all(isinstance(agent_event(log.state, ev), TaskUpdated) for ev in (running, running))
    log.append(*updates)
    assert log.state.tasks["j.w.0"].state == S.SUCCEEDED
    assert report_outcomes(log.state, [running, done]) == ([], [])


def test_a_start_that_reaches_the_leader_after_its_end_completes_the_history():
    """The events stream redelivers a RUNNING a dead leader fetched only after ack_wait,
    behind the node's SUCCEEDED (seen after a hub restart): logged as a late start, the
    attempt's history reads placed, running, succeeded, and its state does not move."""
    log = Log()
    log.submit("j", count=1)
    log.place("j.w.0", "a")
    running = TaskEvent("a", "j", "j.w.0", 1, S.RUNNING, 3.0)
    done = TaskEvent("a", "j", "j.w.0", 1, S.SUCCEEDED, 4.0, exit_code=0)
    log.append(*report_outcomes(log.state, [done])[0])
    updates, kills = report_outcomes(log.state, [running, running])
    assert [(u.state, u.ts) for u in updates] == [(S.RUNNING, 3.0)] and not kills
    log.append(*updates)
    t = log.state.tasks["j.w.0"]
    assert t.state == S.SUCCEEDED and t.started_at == 3.0 and t.finished_at == 4.0
    history = [(h[0], h[2]) for h in t.history]
    assert history == [(2.0, "PLACED"), (3.0, "RUNNING"), (4.0, "SUCCEEDED")]
    assert log.state.jobs["j"].state == JobState.SUCCEEDED
    # Once logged, it is the log's: a third copy is not logged, and one logged anyway
    # (by a deposed leader) is ignored by the fold.
    assert report_outcomes(log.state, [running]) == ([], [])
    ignored = log.state.ignored
    log.append(*updates)
    assert len(t.history) == 3 and log.state.ignored == ignored + 1
    # An overtaken start and its end in one fetch: both logged, start first or not.
    log.submit("k", count=1)
    log.place("k.w.0", "a")
    r, d = (dataclasses.replace(ev, job_id="k", task_id="k.w.0") for ev in (running, done))
    updates, _ = report_outcomes(log.state, [d, r, d, r])
    assert [u.state for u in updates] == [S.SUCCEEDED, S.RUNNING]
    log.append(*updates)
    assert [h[2] for h in log.state.tasks["k.w.0"].history] == ["PLACED", "RUNNING", "SUCCEEDED"]
    # Another node's start of an ended attempt is not this attempt's: a stale copy.
    assert isinstance(agent_event(log.state, dataclasses.replace(r, node_id="b")), Kill)


@settings(max_examples=200, deadline=None)
@given(
    order=st.permutations(range(4)),
    cuts=st.lists(st.integers(0, 4), max_size=3),
)
def test_an_attempts_reports_in_any_order_and_batching_log_each_transition_once(order, cuts):
    """RUNNING and SUCCEEDED of one attempt, each delivered twice, in any order and cut
    into fetches anywhere: the history has each once, in the attempt's order."""
    log = Log()
    log.submit("j", count=1)
    log.place("j.w.0", "a")
    running = TaskEvent("a", "j", "j.w.0", 1, S.RUNNING, 3.0)
    done = TaskEvent("a", "j", "j.w.0", 1, S.SUCCEEDED, 4.0, exit_code=0)
    deliveries = [(running, done, running, done)[k] for k in order]
    bounds = [0, *sorted(cuts), 4]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        updates, _ = report_outcomes(log.state, deliveries[lo:hi])
        log.append(*updates)
    t = log.state.tasks["j.w.0"]
    assert [h[2] for h in t.history] == ["PLACED", "RUNNING", "SUCCEEDED"]
    assert (t.state, t.started_at, t.finished_at) == (S.SUCCEEDED, 3.0, 4.0)


def test_still_placed_keeps_only_placements_the_state_has_at_that_attempt():

    log = Log()
    log.submit("j", count=3)
    log.place("j.w.0", "a")
    log.run("j.w.1", "a")  # RUNNING: its assignment arrived
    log.place("j.w.2", "b")
    keys = {("j.w.2", 1), ("j.w.0", 1), ("j.w.1", 1), ("j.w.0", 2), ("gone", 1)}
    assert [t.task_id for t in still_placed(log.state, keys)] == ["j.w.0", "j.w.2"]


@given(st.lists(st.integers(0, 64), max_size=60), st.integers(1, 200))
def test_report_parts_cover_every_message_once_in_order_and_stay_near_the_limit(sizes, limit):
    parts = report_parts(sizes, limit)
    assert [k for part in parts for k in part] == list(range(len(sizes)))
    for part in parts:
        counts = [sizes[k] for k in part]
        # a part passes the limit only by its last message, and stops short of it only
        # at the end of the fetch
        assert sum(counts[:-1]) < limit
        assert sum(counts) >= limit or part.stop == len(sizes)


def test_a_fetch_asks_for_about_a_part_s_worth_of_messages():
    assert reports_fetch(10_000, 10_000, 10_000, 10_000) == 10_000  # one report each
    assert reports_fetch(64_000, 1_000, 10_000, 10_000) == 156  # 64 a message
    assert reports_fetch(0, 5, 10_000, 10_000) == 10_000  # only bad messages
    assert reports_fetch(0, 0, 10_000, 500) == 500
    assert reports_fetch(10**9, 1, 10_000, 10_000) == 1
