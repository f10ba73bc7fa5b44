"""What admission and preemption see of a job: its pool, its gang's size, its priority."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.pools.tree import POOL_KINDS
from workloads.resources import Resources

__all__ = ["PendingJob", "RunningJob"]


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting in its pool's queue: a gang, admitted all together or not at all.

    ``resources`` is the whole gang's request (``JobSpec.total_resources``).
    ``priority``: higher first within the pool. A non-``preemptible`` job may use only its
    pool's reservation, never capacity borrowed from other pools.
    """

    job_id: str
    pool: str
    resources: Resources
    priority: int = 0
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class RunningJob:
    """An admitted job (placed or not yet): what it holds and how it may be reclaimed.

    ``resources`` is everything the gang holds now, over its ``tasks`` tasks. An elastic
    job (``min_tasks`` below ``tasks``) can shrink, one task at a time, down to
    ``min_tasks``; its tasks are alike, so ``resources`` divides evenly by ``tasks``.
    ``running_for`` is seconds since it started (0 if admitted but not yet running),
    computed by the caller from its clock.
    """

    job_id: str
    pool: str
    resources: Resources
    tasks: int = 1
    min_tasks: int | None = None
    priority: int = 0
    preemptible: bool = True
    running_for: float = 0.0

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"job {self.job_id}: tasks must be at least 1, got {self.tasks}")
        if self.min_tasks is not None:
            if not 1 <= self.min_tasks <= self.tasks:
                raise ValueError(f"job {self.job_id}: min_tasks must be 1..tasks ({self.tasks}), "
                                 f"got {self.min_tasks}")
            if any(getattr(self.resources, k) % self.tasks for k in POOL_KINDS):
                raise ValueError(f"job {self.job_id}: an elastic job's resources "
                                 f"({self.resources}) must divide evenly among its "
                                 f"{self.tasks} tasks")

    @property
    def shrinkable(self) -> int:
        """Tasks that can go before the job falls below its minimum."""
        return 0 if self.min_tasks is None else self.tasks - self.min_tasks

    @property
    def per_task(self) -> Resources:
        t = self.tasks
        r = self.resources
        return Resources(r.cpu // t, r.memory // t, r.disk // t, r.gpu // t, r.gpu_memory // t)
