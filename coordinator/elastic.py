"""An elastic training job's size, decided by the scheduler (docs/training.md). Pure.

The job is admitted and placed as a gang of `workers_min`; after that the scheduler
moves it toward its target (`JobRecord.target`, moved by `JobScaled`): waiting tasks
below the target are offered to placement (grow), holding tasks at or above it are
stopped, highest index first (shrink). Each resize waits `resize_every_s` after the
job's last membership change: a framework restarts its workers' rendezvous on every
change, and resizing faster than it settles only restarts it again. Task 0 hosts the
rendezvous (torchrun's c10d store, the MPI launcher): it is never stopped by a resize.
The watchdog requeues a job whose progress stopped within `progress_timeout_s` of a
membership change (a rendezvous that never completed), so a stuck job is placed afresh,
not held forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.records import HOLDING, JobRecord
from coordinator.state import WATCHDOG
from workloads.lifecycle import TaskState

__all__ = ["WATCHDOG", "Facts", "Offer", "facts", "hung", "offer", "stalled", "stops"]


@dataclass(frozen=True, slots=True)
class Facts:
    """What the decisions read of one elastic job. `tasks`: index -> state of its
    worker group's tasks; `stopping`: indexes being stopped (preempted) now;
    `changed_at`: its last membership change (None: never placed); `progress_at`: when a
    task's progress last moved (None: it never reported any)."""

    min: int
    max: int
    target: int
    tasks: Mapping[int, TaskState]
    stopping: frozenset[int]
    changed_at: float | None
    now: float
    resize_every_s: float
    progress_at: float | None = None


@dataclass(frozen=True, slots=True)
class Offer:
    """Waiting task indexes placement may place now, lowest first; `gang`: how many of
    them must be placed together (0: any that fit)."""

    indexes: tuple[int, ...]
    gang: int
    why: str = ""  # when nothing is offered: why the job waits


def facts(job: JobRecord, now: float, resize_every_s: float) -> Facts:
    spec = job.spec
    lo = spec.workers_min or 1
    hi = spec.workers_max or len(job.tasks)
    return Facts(
        lo,
        hi,
        job.target or hi,
        {t.index: t.state for t in job.tasks.values()},
        frozenset(t.index for t in job.tasks.values() if t.preempt_reason),
        job.changed_at,
        now,
        resize_every_s,
        job.progress_at,
    )


def _holding(f: Facts) -> list[int]:
    return sorted(i for i, s in f.tasks.items() if s in HOLDING)


def _due(f: Facts) -> bool:
    return f.changed_at is None or f.now >= f.changed_at + f.resize_every_s


def offer(f: Facts) -> Offer:
    """Which waiting tasks may be placed now. Below min (first admission, or after
    failures took it below): the lowest waiting indexes a gang of min needs, at once.
    At or above min: a grow, only once the last change is `resize_every_s` old and no
    task is being stopped: the waiting indexes below the target, as many as it lacks."""
    holding = _holding(f)
    waiting = sorted(i for i, s in f.tasks.items() if s == TaskState.PENDING)
    if len(holding) < f.min:
        need = f.min - len(holding)
        return Offer(tuple(waiting[:need]), need)
    room = min(f.target, f.max) - len(holding)
    grow = tuple(i for i in waiting if i < f.target)[: max(room, 0)]
    if not grow:
        return Offer((), 0, f"at its target size of {f.target}")
    if f.stopping:
        return Offer((), 0, "a resize is under way: tasks are being stopped")
    if not _due(f):
        at = f.changed_at + f.resize_every_s  # (not due: changed_at is set)
        return Offer((), 0, f"next resize (to {f.target}) {at - f.now:.1f}s from now")
    return Offer(grow, 0)


def stops(f: Facts) -> tuple[int, ...]:
    """Holding tasks to stop to shrink to the target: index >= target, highest first,
    never task 0, never below min; one resize at a time, each `resize_every_s` apart."""
    if f.stopping or not _due(f):
        return ()
    holding = _holding(f)
    spare = len(holding) - f.min
    over = [i for i in reversed(holding) if i >= f.target and i != 0]
    return tuple(over[: max(spare, 0)])


def stalled(f: Facts, timeout_s: float) -> str | None:
    """The watchdog: a job that has reported progress, whose progress has not moved in
    `timeout_s`, and last moved less than `timeout_s` after its last membership change
    (it never showed it got past the change), is requeued (all its tasks stopped and
    placed again). Why, or None.

    Progress that moved after the change is not enough: the steps a job's workers make
    until they notice a change (a launcher polling its hosts, torchrun's agents) reach
    the log after it, and so do those the agent reports late (it reads the progress file
    every second and reports at most every 2 s), so a job hung at the change still shows
    progress after it. It must keep moving, no gap of `timeout_s`, for `timeout_s` past
    the change."""
    if f.progress_at is None or f.changed_at is None or f.stopping:
        return None
    if not any(s == TaskState.RUNNING for s in f.tasks.values()):
        return None
    last = max(f.progress_at, f.changed_at)
    if f.progress_at >= f.changed_at + timeout_s or f.now < last + timeout_s:
        return None
    return (
        f"{WATCHDOG}: no progress in {f.now - last:.0f}s (its last membership change "
        f"{f.now - f.changed_at:.0f}s ago; progress_timeout_s {timeout_s:g})"
    )


def hung(stalled_why: str | None, restarts_used: int, max_restarts: int) -> str | None:
    """A stalled job (`stalled_why`, what `stalled` said) with no restart left ends
    instead of being requeued again (each requeue spends one, as a failure does): why it
    ends, or None."""
    if stalled_why is None or restarts_used < max_restarts:
        return None
    detail = stalled_why.split(": ", 1)[1]
    return f"stalled: {detail}; restarts {restarts_used} of {max_restarts} used: the job ends"
