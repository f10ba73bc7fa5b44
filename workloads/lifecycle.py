r"""The task lifecycle as a state machine, and a job's state derived from its tasks'.

Agents report transitions and the coordinator folds them from the job log; both check each
one here, so a late, duplicated or reordered report can never move a task somewhere it
cannot be (a SUCCEEDED task back to RUNNING, say).

::

    PENDING --> PLACED --> STARTING --> RUNNING --> SUCCEEDED
       ^          |  \                  ^   |
       |          |   +-----------------+   +-----> FAILED -----+
       |          |   (STARTING skipped)    +-----> LOST -------+  (LOST, PREEMPTED
       |          |                         +-----> PREEMPTED --+   may also -> KILLED)
       |          +--> PENDING (placement undone)               |
       +--------------------------------------------------------+ retry/reschedule/requeue

    Also PENDING, PLACED, STARTING, RUNNING -> KILLED, and PLACED, STARTING -> SUCCEEDED,
    FAILED, LOST (an attempt that ended before RUNNING was reported).

SUCCEEDED and KILLED are final. A task that FAILED, was LOST or PREEMPTED goes back to
PENDING when the restart policy gives it another attempt. ``TRANSITIONS`` is the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType

__all__ = [
    "ENDED",
    "FINAL",
    "TRANSITIONS",
    "IllegalTransition",
    "JobState",
    "TaskState",
    "can_transition",
    "check_transition",
    "is_late_start",
    "job_state",
]


class TaskState(StrEnum):
    """Where one task's current attempt stands. Values equal the names (``"RUNNING"``)."""

    PENDING = "PENDING"  # waiting for a placement
    PLACED = "PLACED"  # assigned to a node, not yet started there
    STARTING = "STARTING"  # the agent is starting it
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # exited 0
    FAILED = "FAILED"  # exited non-zero, or could not start
    KILLED = "KILLED"  # stopped on purpose (user or job kill)
    LOST = "LOST"  # its node went away
    PREEMPTED = "PREEMPTED"  # stopped to give its resources to another pool or job


class JobState(StrEnum):
    """A job's state, derived from its tasks' by :func:`job_state`."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"


_S = TaskState

ENDED: frozenset[TaskState] = frozenset({_S.SUCCEEDED, _S.FAILED, _S.KILLED, _S.LOST, _S.PREEMPTED})
"""States in which an attempt is over (though the task may get another one)."""

FINAL: frozenset[TaskState] = frozenset({_S.SUCCEEDED, _S.KILLED})
"""States a task never leaves."""

TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = MappingProxyType(
    {
        _S.PENDING: frozenset({_S.PLACED, _S.KILLED}),
        # An agent may skip reporting STARTING; PENDING means the placement was undone.
        _S.PLACED: frozenset(
            {_S.STARTING, _S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.KILLED, _S.LOST, _S.PENDING}
        ),
        _S.STARTING: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.KILLED, _S.LOST}),
        _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.KILLED, _S.LOST, _S.PREEMPTED}),
        # A job killed while a retry waits kills the task from PENDING, so FAILED needs no KILLED.
        _S.FAILED: frozenset({_S.PENDING}),
        _S.LOST: frozenset({_S.PENDING, _S.KILLED}),
        _S.PREEMPTED: frozenset({_S.PENDING, _S.KILLED}),
        _S.SUCCEEDED: frozenset(),
        _S.KILLED: frozenset(),
    }
)
"""Legal moves: state -> the states it may go to next (a repeat of the same state aside)."""

_FAILURES = frozenset({_S.FAILED, _S.LOST, _S.PREEMPTED})


class IllegalTransition(ValueError):
    """A task was reported moving between two states that no legal edge joins."""

    def __init__(self, src: object, dst: object) -> None:
        self.src = src
        self.dst = dst
        super().__init__(f"illegal task transition {src} -> {dst}")

    def __reduce__(self):  # pickle with both states
        return (type(self), (self.src, self.dst))


def _state(value: object) -> TaskState | None:
    try:
        return TaskState(value)
    except ValueError:
        return None


def can_transition(src: TaskState, dst: TaskState) -> bool:
    """True when a task in ``src`` may move to ``dst``. ``src == dst`` is always allowed, as a
    no-op, so that a re-delivered report is harmless. Unknown states are never allowed."""
    a, b = _state(src), _state(dst)
    if a is None or b is None:
        return False
    return a == b or b in TRANSITIONS[a]


def is_late_start(was: TaskState, new: TaskState) -> bool:
    """Whether a report is an attempt's start reaching the region after its end: the
    events stream hands a leader a message it fetched but did not acknowledge (it died,
    or could not log it) again only after ack_wait, and the node's later messages (its
    SUCCEEDED) come first. Not a transition: logged, it completes the attempt's history
    (and start time) and moves nothing; dropped, a run that did start would read as
    never started."""
    return new == TaskState.RUNNING and was in ENDED


def check_transition(src: TaskState, dst: TaskState) -> None:
    """Raise :class:`IllegalTransition` unless :func:`can_transition` allows the move."""
    if not can_transition(src, dst):
        raise IllegalTransition(src, dst)


def job_state(task_states: Iterable[TaskState]) -> JobState:
    """A job's state from its tasks' current states.

    The caller represents a task that will be retried (FAILED, LOST or PREEMPTED with
    attempts left) as PENDING, so an ended state here means that task is done for good.
    No tasks: PENDING. All ended: FAILED if any failed, was lost or preempted, else KILLED if
    any was killed, else SUCCEEDED. Otherwise RUNNING once any task has left PENDING.
    """
    states = [TaskState(s) for s in task_states]
    if not states:
        return JobState.PENDING
    if all(s in ENDED for s in states):
        if any(s in _FAILURES for s in states):
            return JobState.FAILED
        if any(s is TaskState.KILLED for s in states):
            return JobState.KILLED
        return JobState.SUCCEEDED
    if any(s is not TaskState.PENDING for s in states):
        return JobState.RUNNING
    return JobState.PENDING


def job_state_of_counts(counts: Mapping[TaskState, int]) -> JobState:
    """:func:`job_state` from how many tasks are in each state: what the job-log fold
    keeps per job, so a job's state costs O(states), not O(tasks), per event."""
    total = sum(counts.values())
    if not total:
        return JobState.PENDING
    if sum(n for s, n in counts.items() if s in ENDED) == total:
        if any(counts.get(s) for s in _FAILURES):
            return JobState.FAILED
        if counts.get(TaskState.KILLED):
            return JobState.KILLED
        return JobState.SUCCEEDED
    if counts.get(TaskState.PENDING, 0) < total:
        return JobState.RUNNING
    return JobState.PENDING
