"""What agents' reports mean for the region's log. Pure.

The leader fetches task events from the region's events stream and logs what they mean:
a transition of the current attempt, a late start (`lifecycle.is_late_start`), a kill
for a copy that should not be running, or nothing (a transition the log already has,
redelivered). Reports fetched together are judged in order, each on the state the ones
before it leave, and logged in parts of one append each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coordinator.records import TaskRecord
from coordinator.state import RegionState
from mesh.schema import TaskEvent, TaskUpdated
from workloads.lifecycle import ENDED, TaskState, can_transition, is_late_start


@dataclass(frozen=True, slots=True)
class Kill:
    node_id: str
    job_id: str
    task_id: str
    attempt: int
    reason: str


def agent_event(
    state: RegionState, ev: TaskEvent, now_in: TaskState | None = None, started: bool = False
) -> TaskUpdated | Kill | None:
    """What an agent's report means for the log: the current attempt's transition (a
    KILLED of an attempt being reclaimed is logged as PREEMPTED, so it is requeued), a
    late start (`lifecycle.is_late_start`), a kill for a copy that should not be running, or
    nothing (unknown or already ended). `now_in`: the task's state as reports not yet
    logged leave it; `started`: whether one of those was this attempt's start
    (`report_outcomes`)."""
    t = state.tasks.get(ev.task_id)
    if t is None:
        return None
    if ev.attempt == t.attempt and ev.node_id == t.node_id:
        new_state, message = ev.state, ev.message
        if new_state == TaskState.KILLED and t.preempt_reason:
            new_state, message = TaskState.PREEMPTED, t.preempt_reason
        job = state.jobs[t.job_id]
        if new_state == TaskState.SUCCEEDED and job.spec.is_service:
            # A service replica is meant to run for good: its exit is a failure to
            # serve, and it is started again (after its backoff).
            new_state = TaskState.FAILED
            message = f"service replica exited with code 0{': ' + message if message else ''}"
        was = t.state if now_in is None else now_in
        if is_late_start(was, new_state):
            if started or t.started_at is not None:
                return None  # the log has this start (a RUNNING redelivered)
            return _update(ev, TaskState.RUNNING, message)  # a late start
        if new_state == was == TaskState.RUNNING:
            # A running attempt's health verdict changed (a service replica), or its
            # training progress moved (docs/training.md: the watchdog, `mesh job status`).
            health = ev.health if ev.health and ev.health != t.health else ""
            if health or (ev.progress >= 0 and ev.progress != t.progress):
                text = (message or f"health check: {health}") if health else ""
                return TaskUpdated(
                    ev.job_id, ev.task_id, ev.attempt, new_state, ev.node_id, ev.ts,
                    message=text, health=health, progress=ev.progress,
                )  # fmt: skip
        if new_state == was or not can_transition(was, new_state):
            # The log has it already (an event redelivered to a new leader after the old
            # one logged it but died before acknowledging it), or a later one of the same
            # attempt: logged, the attempt would read as having ended twice.
            return None
        return _update(ev, new_state, message)
    if ev.state in ENDED:
        return None
    return Kill(
        ev.node_id,
        ev.job_id,
        ev.task_id,
        ev.attempt,
        "stale copy: this attempt is no longer assigned to this node",
    )


def _update(ev: TaskEvent, new_state: TaskState, message: str) -> TaskUpdated:
    running = new_state == TaskState.RUNNING
    return TaskUpdated(
        ev.job_id,
        ev.task_id,
        ev.attempt,
        new_state,
        ev.node_id,
        ev.ts,
        ev.exit_code,
        ev.signal,
        message,
        ev.log_tail,
        ev.health if running else "",
        progress=ev.progress if running else -1,
    )


def report_outcomes(
    state: RegionState, events: Iterable[TaskEvent]
) -> tuple[list[TaskUpdated], list[Kill]]:
    """What agents' reports, logged together, mean for the log, in order: each is judged
    on the state the ones before it leave, so a report that came twice in one fetch
    (two stream messages for one transition, whatever their route: the stream's
    de-duplication window is a time, and its id the sender's) is logged once; judged
    each on the state alone, both were, in one entry."""
    updates: list[TaskUpdated] = []
    kills: list[Kill] = []
    now_in: dict[str, TaskState] = {}
    started: set[str] = set()
    for ev in events:
        tid = ev.task_id
        outcome = agent_event(state, ev, now_in.get(tid), tid in started)
        if isinstance(outcome, TaskUpdated):
            updates.append(outcome)
            if outcome.state == TaskState.RUNNING:
                started.add(tid)
            was = now_in.get(tid, state.tasks[tid].state)
            if not is_late_start(was, outcome.state):
                now_in[tid] = outcome.state
        elif isinstance(outcome, Kill):
            kills.append(outcome)
    return updates, kills


def report_parts(sizes: Sequence[int], limit: int) -> list[range]:
    """Consecutive messages of agent reports (`sizes`: how many each carries) cut into
    parts logged one append each: a part ends at the message that brings it to `limit`
    reports, or at the last. A message is never split: its acknowledgement covers all
    of it."""
    parts, start, count = [], 0, 0
    for k, n in enumerate(sizes):
        count += n
        if count >= limit or k == len(sizes) - 1:
            parts.append(range(start, k + 1))
            start, count = k + 1, 0
    return parts


def reports_fetch(reports: int, messages: int, limit: int, most: int) -> int:
    """How many messages the next fetch of agent reports asks for: about `limit`
    reports' worth at the last fetch's reports per message, 1 to `most`. A message may
    carry many of a node's reports, and a fetch logged in many parts could outlast the
    ack_wait of its last part."""
    per_message = max(reports / messages, 1.0) if messages else 1.0
    return max(1, min(most, int(limit / per_message)))


def still_placed(state: RegionState, keys: Iterable[tuple[str, int]]) -> list[TaskRecord]:
    """Of these placements (task, attempt), those the state has PLACED at that attempt:
    whose assignment is still worth sending. In task order."""
    due = []
    for tid, attempt in sorted(keys):
        t = state.tasks.get(tid)
        if t is not None and t.attempt == attempt and t.state == TaskState.PLACED:
            due.append(t)
    return due
