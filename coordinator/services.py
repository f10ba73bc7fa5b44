"""Service jobs kept at their count: the leader's pure decisions for `kind: service`.

A service's task group keeps `count` replicas. Each replica is a task of the job; a
replica that exits or is lost is started again as a new attempt of the same task (after
its backoff: `restart_delay`). A replica that must move, because its node is draining
or because `mesh job update` gave the job a newer spec (generation), is *replaced*: a
new replica task is added (`ReplicaAdded`, PENDING on the current spec, placed like any
task), and the old one is stopped (`TaskStopRequested`) only once that leaves enough
replicas available. So, per group, every round:

- *available*: RUNNING, and healthy where the attempt runs a health check;
- *old*: holding a draining node, or of an older generation; *new*: the rest;
- stop an old replica (or one beyond the count) when the group stays at or above
  `count - max_unavailable` available without it (one that is not available costs
  nothing to stop);
- add replicas while fewer than `count` are new and the group (old and new, not
  stopping) is below `count + max_surge`.

With the default (`max_unavailable: 0`, `max_surge: 1`) one replica moves at a time: the
new one is started, and the old one is stopped once the new one is available. Where no
node can take the replacement, the old one keeps running (a drain waits for it) unless
`max_unavailable` allows it to go first. Replicas that just fail cannot be helped: the
rules only ever decide stops that keep the floor.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.records import HOLDING, JobRecord, TaskRecord, task_id_for
from coordinator.state import RegionState
from mesh.schema import ReplicaAdded, TaskStopRequested
from workloads.lifecycle import FINAL, TaskState
from workloads.spec import TaskGroup


def restart_delay(job: JobRecord, t: TaskRecord) -> float:
    """How long a replica's ended attempt waits before it is started again: the
    backoff doubled per quick restart in a row (`TaskRecord.restarts`), capped."""
    r = job.spec.restart
    n = max(t.restarts, 1)
    if n > 64:  # 2**64 x any backoff is past any cap
        return r.max_backoff_s
    return min(r.backoff_s * 2 ** (n - 1), r.max_backoff_s)


def available(t: TaskRecord) -> bool:
    """A replica that serves: RUNNING, healthy where its attempt runs a health check,
    and not being stopped."""
    return (
        t.state == TaskState.RUNNING
        and (not t.checked or t.health == "healthy")
        and not t.stop_reason
    )


def keep_services(
    state: RegionState, draining: frozenset[str], now: float
) -> list[ReplicaAdded | TaskStopRequested]:
    """The replicas to add and to stop this round, for every service job."""
    events: list[ReplicaAdded | TaskStopRequested] = []
    for job_id in sorted(state.services):
        job = state.jobs[job_id]
        live = [t for t in job.tasks.values() if t.state not in FINAL and not t.stop_reason]
        roles = {g.role for g in job.spec.tasks}
        for t in sorted(live, key=lambda t: t.task_id):
            if t.role not in roles:  # its group is gone from the spec
                events.append(_stop(t, now, "its task group was removed by an update"))
        for group in job.spec.tasks:
            mine = [t for t in live if t.role == group.role]
            events.extend(_keep_group(job, group, mine, draining, now))
    return events


def _old(job: JobRecord, t: TaskRecord, draining: frozenset[str]) -> str:
    """Why this replica must be replaced ("" if it need not)."""
    if t.generation < job.generation:
        return f"replaced by the job's update (generation {job.generation})"
    if t.state in HOLDING and t.node_id in draining:
        return f"moved off draining node {t.node_id}"
    return ""


def _keep_group(
    job: JobRecord,
    group: TaskGroup,
    live: list[TaskRecord],
    draining: frozenset[str],
    now: float,
) -> Iterable[ReplicaAdded | TaskStopRequested]:
    policy = job.spec.update
    floor = max(group.count - policy.max_unavailable, 0)
    old = [(why, t) for t in live if (why := _old(job, t, draining))]
    new = [t for t in live if not _old(job, t, draining)]
    up = sum(1 for t in live if available(t))
    # Stop candidates: old replicas, then new ones beyond the count (a lowered count);
    # those not serving first (they cost nothing), then the youngest.
    extra = sorted(new, key=lambda t: (available(t), -t.index))[: max(len(new) - group.count, 0)]
    candidates = [
        (why, t, False) for why, t in sorted(old, key=lambda x: (available(x[1]), x[1].index))
    ]
    candidates += [("beyond the group's count", t, True) for t in extra]
    stopped = stopped_new = 0
    for why, t, is_new in candidates:
        if available(t) and up - 1 < floor:
            continue
        up -= available(t)
        stopped += 1
        stopped_new += is_new
        yield _stop(t, now, why)
    want = group.count - (len(new) - stopped_new)
    room = group.count + policy.max_surge - (len(live) - stopped)
    adding = min(want, room)
    if adding <= 0:
        return
    index = max((t.index for t in job.tasks.values() if t.role == group.role), default=-1)
    why = "replacement" if old else "replica to make up the count"
    for k in range(1, adding + 1):
        tid = task_id_for(job.job_id, group.role, index + k)
        yield ReplicaAdded(job.job_id, tid, group.role, index + k, f"service {why}", now)


def _stop(t: TaskRecord, now: float, why: str) -> TaskStopRequested:
    return TaskStopRequested(t.job_id, t.task_id, t.attempt, why, now)
