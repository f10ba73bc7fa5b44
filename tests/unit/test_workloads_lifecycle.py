"""The task state machine and job state derivation (workloads.lifecycle)."""

from __future__ import annotations

import itertools
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workloads import (
    ENDED,
    FINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    TaskState,
    can_transition,
    check_transition,
    job_state,
)
from workloads.lifecycle import job_state_of_counts

T = TaskState

# The edge table from the design, written out independently of the implementation.
LEGAL = {
    (T.PENDING, T.PLACED),
    (T.PENDING, T.KILLED),
    (T.PLACED, T.STARTING),
    (T.PLACED, T.RUNNING),
    (T.PLACED, T.SUCCEEDED),
    (T.PLACED, T.FAILED),
    (T.PLACED, T.KILLED),
    (T.PLACED, T.LOST),
    (T.PLACED, T.PENDING),
    (T.STARTING, T.RUNNING),
    (T.STARTING, T.SUCCEEDED),
    (T.STARTING, T.FAILED),
    (T.STARTING, T.KILLED),
    (T.STARTING, T.LOST),
    (T.RUNNING, T.SUCCEEDED),
    (T.RUNNING, T.FAILED),
    (T.RUNNING, T.KILLED),
    (T.RUNNING, T.LOST),
    (T.RUNNING, T.PREEMPTED),
    (T.FAILED, T.PENDING),
    (T.LOST, T.PENDING),
    (T.LOST, T.KILLED),
    (T.PREEMPTED, T.PENDING),
    (T.PREEMPTED, T.KILLED),
}

ALL_PAIRS = list(itertools.product(TaskState, TaskState))


def test_state_values_are_their_names():
    assert [s.value for s in TaskState] == [
        "PENDING",
        "PLACED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "KILLED",
        "LOST",
        "PREEMPTED",
    ]
    assert TaskState.RUNNING == "RUNNING"
    assert [s.value for s in JobState] == ["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "KILLED"]
    assert JobState.FAILED == "FAILED"


def test_ended_and_final():
    assert ENDED == {T.SUCCEEDED, T.FAILED, T.KILLED, T.LOST, T.PREEMPTED}
    assert FINAL == {T.SUCCEEDED, T.KILLED}
    assert isinstance(ENDED, frozenset) and isinstance(FINAL, frozenset)


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_every_pair_against_the_edge_table(src, dst):
    legal = src == dst or (src, dst) in LEGAL
    assert can_transition(src, dst) is legal
    if legal:
        check_transition(src, dst)
    else:
        with pytest.raises(IllegalTransition) as info:
            check_transition(src, dst)
        assert str(src) in str(info.value) and str(dst) in str(info.value)
        assert (info.value.src, info.value.dst) == (src, dst)
        assert isinstance(info.value, ValueError)


def test_table_matches_edges():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL
    assert set(TRANSITIONS) == set(TaskState)
    with pytest.raises(TypeError):
        TRANSITIONS[T.KILLED] = frozenset({T.PENDING})  # type: ignore[index]


def test_final_states_have_no_way_out():
    for src in FINAL:
        assert [dst for dst in TaskState if dst != src and can_transition(src, dst)] == []


def test_failed_cannot_be_killed_directly():
    assert not can_transition(T.FAILED, T.KILLED)


def test_plain_strings_and_unknown_states():
    assert can_transition("RUNNING", "SUCCEEDED")
    check_transition("PENDING", "PLACED")
    assert not can_transition("RUNNING", "BOGUS")
    assert not can_transition("BOGUS", "BOGUS")
    with pytest.raises(IllegalTransition):
        check_transition("BOGUS", "RUNNING")


def test_illegal_transition_pickles():
    err = IllegalTransition(T.SUCCEEDED, T.RUNNING)
    assert str(err) == "illegal task transition SUCCEEDED -> RUNNING"
    again = pickle.loads(pickle.dumps(err))
    assert (again.src, again.dst, str(again)) == (err.src, err.dst, str(err))


# --------------------------------------------------------------------------- job state


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], JobState.PENDING),
        ([T.PENDING], JobState.PENDING),
        ([T.PENDING, T.PENDING], JobState.PENDING),
        ([T.PENDING, T.PLACED], JobState.RUNNING),
        ([T.STARTING], JobState.RUNNING),
        ([T.RUNNING, T.SUCCEEDED], JobState.RUNNING),
        ([T.RUNNING, T.FAILED], JobState.RUNNING),  # the rest still runs
        ([T.PENDING, T.KILLED], JobState.RUNNING),
        ([T.SUCCEEDED], JobState.SUCCEEDED),
        ([T.SUCCEEDED, T.SUCCEEDED], JobState.SUCCEEDED),
        ([T.SUCCEEDED, T.KILLED], JobState.KILLED),
        ([T.KILLED], JobState.KILLED),
        ([T.SUCCEEDED, T.FAILED], JobState.FAILED),
        ([T.KILLED, T.FAILED], JobState.FAILED),
        ([T.SUCCEEDED, T.LOST], JobState.FAILED),
        ([T.KILLED, T.PREEMPTED], JobState.FAILED),
        (["SUCCEEDED", "SUCCEEDED"], JobState.SUCCEEDED),
    ],
)
def test_job_state(states, expected):
    assert job_state(states) is expected
    assert job_state(iter(states)) is expected  # any iterable, read once


@given(st.lists(st.sampled_from(list(TaskState)), max_size=20))
def test_job_state_rules(states):
    result = job_state(states)
    if not states:
        assert result is JobState.PENDING
    elif all(s in ENDED for s in states):
        assert result in (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)
        assert (result is JobState.SUCCEEDED) == all(s is T.SUCCEEDED for s in states)
        assert (result is JobState.FAILED) == any(
            s in (T.FAILED, T.LOST, T.PREEMPTED) for s in states
        )
    elif all(s is T.PENDING for s in states):
        assert result is JobState.PENDING
    else:
        assert result is JobState.RUNNING
    # Order never matters.
    assert job_state(list(reversed(states))) is result


@given(st.lists(st.sampled_from(list(TaskState)), max_size=12))
def test_job_state_from_counts_is_job_state(states):
    counts: dict[TaskState, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    counts[TaskState.RUNNING] = counts.get(TaskState.RUNNING, 0)  # a zero entry changes nothing
    assert job_state_of_counts(counts) == job_state(states)
