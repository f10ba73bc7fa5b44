"""A region's jobs and tasks as the log fold (coordinator/state.py) keeps them: one
`JobRecord` per job, one `TaskRecord` per task, and what follows from them alone (a
job's state, what it still asks for, its summary for the API). The fold writes them;
everything else reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.pools.jobs import PendingJob
from workloads.lifecycle import JobState, TaskState, job_state, job_state_of_counts
from workloads.resources import Resources
from workloads.spec import JobSpec, TaskGroup

HOLDING = frozenset({TaskState.PLACED, TaskState.STARTING, TaskState.RUNNING})
# Attempts that ended but whose task may go on (retry, reschedule, requeue): the leader
# looks at these each round, so the fold keeps them in a set rather than a scan.
UNSETTLED = frozenset({TaskState.FAILED, TaskState.LOST, TaskState.PREEMPTED})


@dataclass(slots=True)
class TaskRecord:
    task_id: str
    job_id: str
    role: str
    index: int
    group: TaskGroup
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    node_id: str = ""
    gpu_uuids: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    log_tail: str = ""
    failures: int = 0  # attempts that ended FAILED (counts against max_retries)
    preempt_reason: str = ""  # set while this attempt is being reclaimed for another pool
    # Services (coordinator/services.py): the job generation (spec) its group is of, the
    # health verdict of its attempt ("" none yet / no check), whether its attempt runs a
    # health check, why it is being stopped for good, and its quick restarts in a row.
    generation: int = 0
    health: str = ""
    checked: bool = False
    stop_reason: str = ""
    restarts: int = 0
    placed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    history: list[tuple[float, int, str, str, str]] = field(default_factory=list)
    # Named ports its attempt was given (TaskPlaced.ports); kept after it ends, for status.
    ports: dict[str, int] = field(default_factory=dict)
    # Training (docs/training.md): the step count its task last wrote to
    # $MESH_PROGRESS_FILE (-1: none yet), and when it last moved.
    progress: int = -1
    progress_at: float | None = None

    @property
    def resources(self) -> Resources:
        return self.group.resources

    @property
    def simulated(self) -> bool:
        return self.group.simulate is not None

    def to_dict(self) -> dict:
        return {
            "task_id": self.task_id,
            "role": self.role,
            "index": self.index,
            "state": str(self.state),
            "attempt": self.attempt,
            "node_id": self.node_id,
            "gpu_uuids": list(self.gpu_uuids),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "message": self.message,
            "log_tail": self.log_tail,
            "placed_at": self.placed_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "generation": self.generation,
            "health": self.health,
            "stopping": self.stop_reason,
            "ports": dict(self.ports),
            "progress": self.progress,
            "progress_at": self.progress_at,
            "history": [
                {"ts": ts, "attempt": a, "state": s, "node_id": n, "message": m}
                for ts, a, s, n, m in self.history
            ],
        }


@dataclass(slots=True)
class JobRecord:
    job_id: str
    client_id: str
    spec: JobSpec
    submitted_at: float
    tasks: dict[str, TaskRecord]
    kill_requested: bool = False
    kill_reason: str = ""
    submit_seq: int = 0
    pending: int = 0  # tasks in PENDING, kept by the fold
    pending_resources: Resources = Resources()  # what those tasks ask for, summed
    order: tuple[int, int, int] = (0, 0, 0)  # queue: higher priority first, then older
    pending_since: float = 0.0  # when its tasks last started waiting (starvation guard)
    counted_as: JobState | None = None  # the state `RegionState.job_counts` counts it in
    counts: dict[TaskState, int] = field(default_factory=dict)  # tasks per state, by the fold
    # What admission sees of it, kept while pending_resources is the same object
    # (pooling.admitted_jobs): a window of 4,000 jobs built 4,000 of them twice a round.
    as_pending: PendingJob | None = None
    generation: int = 0  # services: bumped by every JobUpdated
    updated_at: float | None = None
    placed_ever: bool = False
    # Federation: offered to, held by or ended in another region (then out of the
    # placement queue), and the outcome that region reported.
    away: bool = False
    remote_outcome: str = ""
    # The task whose end ends the job (workloads.frameworks.primary_task), "" none.
    primary: str = ""
    # Training (coordinator/elastic.py): an elastic job's target size (0: its
    # workers_max, until a JobScaled moves it); for any training job, its membership
    # changes after the first placement (`generation` moves with each, first included),
    # when the last was, when a task's progress last moved, and its tasks' failures
    # summed with the watchdog's requeues (the job-wide budget, spec.max_restarts;
    # `requeued_at`: the last requeue's time, one requeue being one event per task).
    target: int = 0
    resizes: int = 0
    changed_at: float | None = None
    progress_at: float | None = None
    failures: int = 0
    requeued_at: float | None = None

    @property
    def is_training(self) -> bool:
        return self.spec.framework != "batch" and not self.spec.is_service

    @property
    def state(self) -> JobState:
        if self.remote_outcome:
            return JobState.__members__.get(self.remote_outcome.upper(), JobState.FAILED)
        if self.primary:
            outcome = self.primary_outcome()
            if outcome is not None and not any(
                self.counts.get(s) for s in (TaskState.PENDING, *HOLDING)
            ):
                # Its other tasks were stopped (KILLED) because it ended: the job ends
                # as the primary did, not KILLED.
                return outcome
        if self.spec.is_service:
            return self._service_state()
        if not any(self.counts.get(s) for s in UNSETTLED):
            return job_state_of_counts(self.counts)
        # An ended attempt that will run again keeps the job open: without this, a job
        # whose task failed with retries left read FAILED until the requeue was logged.
        return job_state(
            TaskState.PENDING if self.settles_to(t)[0] == TaskState.PENDING else t.state
            for t in self.tasks.values()
        )

    def primary_outcome(self) -> JobState | None:
        """SUCCEEDED or FAILED once the primary task ended for good (FAILED with no
        restart left), else None."""
        t = self.tasks.get(self.primary)
        if t is None:
            return None
        if t.state == TaskState.SUCCEEDED:
            return JobState.SUCCEEDED
        if t.state == TaskState.FAILED and self.settles_to(t)[0] is None:
            return JobState.FAILED
        return None

    def _service_state(self) -> JobState:
        """A service is RUNNING for good once placed: its replicas restart; only a kill
        ends it (KILLED, once every replica is stopped)."""
        counts = self.counts
        total = sum(counts.values())
        if total and counts.get(TaskState.KILLED, 0) + counts.get(TaskState.SUCCEEDED, 0) == total:
            return JobState.KILLED
        if not self.placed_ever:
            return JobState.PENDING
        return JobState.RUNNING

    def settles_to(self, t: TaskRecord) -> tuple[TaskState | None, str]:
        """Where a FAILED, LOST or PREEMPTED attempt goes next, and why: back to PENDING
        (retry, requeue, reschedule), KILLED (the job is being killed), or None (it ends
        as it is). One rule for the leader's decisions and the job's reported state."""
        if self.spec.is_service:
            return self._service_settles_to(t)
        if t.state == TaskState.FAILED and self.is_training:
            # A framework restarts all its workers from a failure: the budget is the job's.
            if not self.kill_requested and self.failures <= self.spec.max_restarts:
                return TaskState.PENDING, (
                    f"restart {self.failures} of {self.spec.max_restarts} after failure"
                )
            return None, ""
        if t.state == TaskState.FAILED:
            if not self.kill_requested and t.failures <= self.spec.restart.max_retries:
                why = f"retry {t.failures} of {self.spec.restart.max_retries} after failure"
                return TaskState.PENDING, why
            return None, ""
        if t.state not in UNSETTLED:
            return None, ""
        if self.kill_requested:
            return TaskState.KILLED, self.kill_reason or "job killed"
        if t.state == TaskState.PREEMPTED:
            return TaskState.PENDING, "requeued after preemption"
        if self.spec.restart.reschedule_on_lost:
            return TaskState.PENDING, "rescheduling after node loss"
        return None, ""

    def _service_settles_to(self, t: TaskRecord) -> tuple[TaskState | None, str]:
        """A replica's ended attempt always goes on (max_retries does not apply): started
        again, or, when its job is killed or it is being stopped, KILLED (FAILED cannot
        go to KILLED: it goes by PENDING, where the kill takes it)."""
        if t.state not in UNSETTLED:
            return None, ""
        stop = (self.kill_reason or "job killed") if self.kill_requested else t.stop_reason
        if stop:
            return (TaskState.PENDING if t.state == TaskState.FAILED else TaskState.KILLED), stop
        if t.state == TaskState.PREEMPTED:
            return TaskState.PENDING, "requeued after preemption"
        if t.state == TaskState.LOST:
            return TaskState.PENDING, "service replica restarted after its node was lost"
        return TaskState.PENDING, "service replica restarted after it exited"

    @property
    def finished_at(self) -> float | None:
        if self.state in (JobState.PENDING, JobState.RUNNING):
            return None
        ends = [t.finished_at for t in self.tasks.values() if t.finished_at is not None]
        return max(ends) if ends else None

    def summary(self) -> dict:
        counts: dict[str, int] = {}
        for t in self.tasks.values():
            counts[str(t.state)] = counts.get(str(t.state), 0) + 1
        return {
            "job_id": self.job_id,
            "name": self.spec.name,
            "pool": self.spec.pool,
            "priority": self.spec.priority,
            "state": str(self.state),
            "tasks": len(self.tasks),
            "task_states": counts,
            "submitted_at": self.submitted_at,
            "finished_at": self.finished_at,
            "kill_requested": self.kill_requested,
            "kind": self.spec.kind,
            "generation": self.generation,
            "updated_at": self.updated_at,
        }


def task_id_for(job_id: str, role: str, index: int) -> str:
    return f"{job_id}.{role}.{index}"
