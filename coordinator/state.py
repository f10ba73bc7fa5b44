"""The region's state as a fold over the job log.

Every candidate (leader or follower) applies the same log entries in stream order,
so a follower that takes over holds exactly what the leader held. `apply` is pure
bookkeeping: it records what happened and never decides anything (decisions live in
`coordinator/reconcile.py`); an event that does not fit the current state (a stale
attempt, an illegal transition) is ignored, so replaying a log is always safe.
"""

from __future__ import annotations

from dataclasses import replace

from sortedcontainers import SortedDict

from coordinator.changes import Changes
from coordinator.partitions.membership import Membership
from coordinator.pools import PoolConfigError, PoolTree, parse_pool_tree
from coordinator.records import HOLDING, UNSETTLED, JobRecord, TaskRecord, task_id_for
from mesh.schema import (
    BreakGlassEnded,
    BreakGlassSet,
    DuplicateStopped,
    FedHoldRecorded,
    FedHomeRecorded,
    JobKillRequested,
    JobScaled,
    JobSubmitted,
    JobUpdated,
    LeaderElected,
    LogEntry,
    NodePartitionChanged,
    NodePartitionSet,
    PartitionsConfigSet,
    PoolsApplied,
    ReplicaAdded,
    SiteRecorded,
    TaskPlaced,
    TaskPreemptRequested,
    TaskStopRequested,
    TaskUpdated,
)
from workloads import frameworks
from workloads.lifecycle import (
    ENDED,
    FINAL,
    JobState,
    TaskState,
    can_transition,
    is_late_start,
)
from workloads.quantity import SpecError
from workloads.resources import NOTHING, Resources, gpu_share
from workloads.spec import JobSpec, TaskGroup, parse_job_spec

# How the elastic watchdog's requeue reasons begin (coordinator/elastic.py): the fold
# counts each requeue against the job's restart budget.
WATCHDOG = "requeued by the watchdog"
HISTORY_LIMIT = 64
# A service replica that ran this long before it ended restarts after the first backoff
# again; one that ended sooner waits twice as long as the last time (up to max_backoff).
BACKOFF_RESET_S = 60.0


_PARTITION_EVENTS = (
    NodePartitionSet,
    NodePartitionChanged,
    BreakGlassSet,
    BreakGlassEnded,
    PartitionsConfigSet,
)


def _add_to(acc: dict[str, Resources], key: str, r: Resources, sign: int) -> None:
    """Add (sign > 0) or take away `r` at `key`; a key that comes to nothing goes."""
    new = acc.get(key, NOTHING) + r if sign > 0 else acc.get(key, NOTHING) - r
    if new == NOTHING:
        acc.pop(key, None)
    else:
        acc[key] = new


class RegionState:
    """Jobs and tasks of one region, rebuilt by applying log entries in order."""

    def __init__(self) -> None:
        self.last_seq = 0
        # Moved by every applied event that can change what placement or the pools
        # decide: all but a holding task moving between holding states (PLACED ->
        # STARTING -> RUNNING), which is most of a busy region's log. Rounds key their
        # memos on it, not on last_seq.
        self.epoch = 0
        self.queue_changes = Changes()  # jobs that joined or left the queue, or were killed in it
        self.term = 0
        self.leader_id = ""
        self.jobs: dict[str, JobRecord] = {}
        self.by_client: dict[str, str] = {}
        self.tasks: dict[str, TaskRecord] = {}
        self.node_tasks: dict[str, set[str]] = {}  # tasks holding resources on a node
        self.node_alloc: dict[str, Resources] = {}  # what those tasks hold, summed
        self.node_changes = Changes()  # nodes whose tasks or grants changed, in order
        # Per job pool, what its holding tasks hold, and the part held by non-preemptible
        # jobs: kept here so a round does not re-sum every running task.
        self.pool_alloc: dict[str, Resources] = {}
        self.pool_fixed: dict[str, Resources] = {}
        # Per job pool, what the waiting tasks of jobs not being killed ask for: the
        # pools' demand, which a round summed over the whole queue before.
        self.pool_pending: dict[str, Resources] = {}
        # Per (node, GPU uuid): milli-GPUs and GPU memory granted there, summed.
        self.gpu_alloc: dict[tuple[str, str], tuple[int, int]] = {}
        # Values derived from the state by pure functions, memoised per log position
        # (reconcile runs on every event; the log moves less often).
        self.memo: dict[str, tuple[object, object]] = {}
        self.waiting: set[str] = set()  # jobs with PENDING tasks
        # The same jobs in queue order (JobRecord.order -> job id), kept sorted as they
        # come and go: a region with 100,000 jobs queued must not sort them every round.
        self.queue: SortedDict = SortedDict()
        self._submitted = 0  # jobs submitted so far: ties in one log entry keep their order
        self.unsettled: set[str] = set()  # tasks in UNSETTLED states
        self.killing: set[str] = set()  # killed jobs with tasks not yet ended
        self.ignored = 0  # events that did not fit (stale/illegal)
        self.pools = PoolTree(())  # the root alone until a tree is applied
        self.pool_source: dict = {}
        self.preempting: set[str] = set()  # tasks whose attempt is being reclaimed
        self.services: set[str] = set()  # service jobs not killed: kept running each round
        self.stopping: set[str] = set()  # service replicas being stopped for good
        self.parsed: dict[str, JobSpec] = {}  # job id -> its spec, parsed by this process
        self.job_counts: dict[str, int] = {}  # jobs per JobState, kept by the fold
        self._recount_due: dict[str, JobRecord] = {}  # jobs an entry moved, counted after it
        # Which partition each node is in, moves in flight, break-glass (docs/partitions.md).
        self.partitions = Membership()
        # Federation (coordinator/federation/fold.py): per job, the home's latest record
        # (jobs of this region), the holder's (other regions' jobs, the same id here), and
        # the jobs submitted here that may spill.
        self.fed_home: dict[str, FedHomeRecorded] = {}
        self.fed_held: dict[str, FedHoldRecorded] = {}
        self.federated: set[str] = set()
        # Edge sites (edge/sites.py): per site, its latest SiteRecorded; and the stale
        # copies already said stopped (task, attempt, node), so each is logged once.
        self.sites: dict[str, SiteRecorded] = {}
        self.duplicates: set[tuple[str, int, str]] = set()
        # Named ports of holding tasks: node -> task -> ports (coordinator/ports.py
        # groups them by address with the cluster view, several agents may share one).
        self.node_ports: dict[str, dict[str, tuple[int, ...]]] = {}
        # Jobs whose primary task ended SUCCEEDED or FAILED and that are not killed yet:
        # the leader ends them with it (reconcile._end_with_primary).
        self.primary_ended: set[str] = set()
        # Training: elastic jobs not ended (the leader resizes them each round), and the
        # training jobs whose membership an entry moved, with the first change's time and
        # whether they had been placed before it (generation moves once per entry).
        self.elastic: set[str] = set()
        self._membership_due: dict[str, tuple[float, bool]] = {}

    # ------------------------------------------------------------ fold

    def apply(self, seq: int, entry: LogEntry) -> bool:
        """Apply one log entry; False if it was already applied (seq not new)."""
        if seq <= self.last_seq:
            return False
        self.last_seq = seq
        if entry.term < self.term:
            # A deposed leader's write cannot land (appends are fenced), but a log is
            # replayed by code that must not trust that: ignore it.
            self.ignored += len(entry.events)
            return True
        for ev in entry.events:
            self._apply_event(seq, ev)
        # Once per job and entry, not per event: a job's state is a walk of its counts,
        # and a 64-task gang placed in one entry walked them 64 times.
        if self._membership_due:
            self._membership_moved()
        due = self._recount_due
        for job in due.values():
            self._recount(job)
        due.clear()
        return True

    def _membership(self, job: JobRecord, ts: float, placed_before: bool) -> None:
        if job.is_training and job.job_id not in self._membership_due:
            self._membership_due[job.job_id] = (ts, placed_before)

    def _membership_moved(self) -> None:
        """A training job's tasks started or stopped holding in this entry: its
        generation moves (MESH_GENERATION: the workers' rendezvous round), once."""
        for job_id, (ts, placed_before) in self._membership_due.items():
            job = self.jobs[job_id]
            job.generation += 1
            job.changed_at = ts
            if placed_before:
                job.resizes += 1
        self._membership_due.clear()

    def _job_scaled(self, ev: JobScaled) -> None:
        job = self.jobs.get(ev.job_id)
        spec = job.spec if job is not None else None
        if (
            spec is None
            or not spec.is_elastic
            or job.kill_requested
            or not (spec.workers_min or 1) <= ev.workers <= (spec.workers_max or 0)
        ):
            self.ignored += 1
            return
        job.target = ev.workers

    def _apply_event(self, seq: int, ev: object) -> None:
        if isinstance(ev, TaskUpdated):
            self._task_updated(ev)
            return
        if isinstance(ev, SiteRecorded | DuplicateStopped):
            self._edge_event(ev)
            return
        self.epoch += 1
        if isinstance(ev, TaskPlaced):
            self._task_placed(ev)
        elif isinstance(ev, JobSubmitted):
            self._job_submitted(seq, ev)
        elif isinstance(ev, JobKillRequested):
            job = self.jobs.get(ev.job_id)
            if job is not None and not job.kill_requested:
                if not job.away:
                    _add_to(self.pool_pending, job.spec.pool, job.pending_resources, -1)
                job.kill_requested = True
                self.primary_ended.discard(job.job_id)
                self.queue_changes.add(job.job_id)
                job.kill_reason = ev.reason
                self.services.discard(job.job_id)
                self._track_killing(job)
                # (a failed task with retries left no longer reruns)
                self._recount_due[job.job_id] = job
        elif isinstance(ev, TaskPreemptRequested):
            task = self.tasks.get(ev.task_id)
            if task is not None and task.attempt == ev.attempt and task.state in HOLDING:
                task.preempt_reason = ev.reason
                self.preempting.add(task.task_id)
                job = self.jobs[task.job_id]
                if ev.reason.startswith(WATCHDOG) and job.requeued_at != ev.ts:
                    job.requeued_at = ev.ts  # a hung job: a restart, as a failure is
                    job.failures += 1
            else:
                self.ignored += 1
        elif isinstance(ev, JobUpdated):
            self._job_updated(ev)
        elif isinstance(ev, ReplicaAdded):
            self._replica_added(ev)
        elif isinstance(ev, TaskStopRequested):
            task = self.tasks.get(ev.task_id)
            if task is None or task.attempt != ev.attempt or task.state in FINAL:
                self.ignored += 1
            elif not task.stop_reason:
                task.stop_reason = ev.reason or "stopped"
                self.stopping.add(task.task_id)
                self._history(task, ev.ts, f"stopping: {task.stop_reason}")
        elif isinstance(ev, PoolsApplied):
            try:
                self.pools = parse_pool_tree(ev.source)
                self.pool_source = ev.source
            except PoolConfigError:
                self.ignored += 1
        elif isinstance(ev, LeaderElected):
            self.term = max(self.term, ev.term)
            self.leader_id = ev.leader_id
        elif isinstance(ev, _PARTITION_EVENTS):
            self._partition_event(ev)
        elif isinstance(ev, FedHomeRecorded):
            self._fed_home(ev)
        elif isinstance(ev, FedHoldRecorded):
            self.fed_held[ev.job_id] = ev  # (only its holder logs it: each supersedes the last)
        elif isinstance(ev, JobScaled):
            self._job_scaled(ev)

    def _edge_event(self, ev: SiteRecorded | DuplicateStopped) -> None:
        """A site's status (each record replaces the last), or a stale copy stopped: a
        line in the task's history that `mesh job status -o wide` shows."""
        if isinstance(ev, SiteRecorded):
            self.sites[ev.site] = ev
            return
        task = self.tasks.get(ev.task_id)
        key = (ev.task_id, ev.attempt, ev.node_id)
        if task is None or key in self.duplicates:
            self.ignored += 1
            return
        self.duplicates.add(key)
        task.history.append((ev.ts, ev.attempt, "KILLED", ev.node_id, ev.message))
        if len(task.history) > HISTORY_LIMIT:
            del task.history[: len(task.history) - HISTORY_LIMIT]

    def _fed_home(self, ev: FedHomeRecorded) -> None:
        """The home's record of one of its jobs moved: the job leaves the placement queue
        while another region has it (and comes back when it returns)."""
        job = self.jobs.get(ev.job_id)
        if job is None or job.job_id in self.fed_held:
            self.ignored += 1
            return
        self.fed_home[ev.job_id] = ev
        away = ev.phase in ("nominated", "held") or (ev.phase == "done" and bool(ev.region))
        if ev.phase == "done" and ev.region:
            job.remote_outcome = ev.outcome or "done"
        if away != job.away:
            job.away = away
            if not job.kill_requested:
                _add_to(self.pool_pending, job.spec.pool, job.pending_resources, -1 if away else 1)
            if away and job.job_id in self.waiting:
                self.waiting.discard(job.job_id)
                del self.queue[job.order]
                self.queue_changes.add(job.job_id)
            elif not away and job.pending > 0:
                self._wait(job)
        self._recount_due[job.job_id] = job

    def _partition_event(self, ev: object) -> None:
        """Partition membership, moves and break-glass, kept by `Membership`. A node whose
        partition or cordon moved has its placement row rebuilt (the grants journal); a
        new config changes every node's allocatable, so the snapshot is built whole."""
        m = self.partitions
        if isinstance(ev, NodePartitionSet):
            done = m.set_desired(
                ev.node_id, ev.desired, ev.source, ev.reason, ev.break_glass, ev.ts
            )
        elif isinstance(ev, NodePartitionChanged):
            done = m.converged(ev.node_id, ev.partition, ev.ts)
        elif isinstance(ev, BreakGlassSet):
            m.glass_set(ev.to, ev.nodes, ev.reason, ev.by, ev.until_ts, ev.ts)
            return
        elif isinstance(ev, BreakGlassEnded):
            done = m.glass_ended()
        else:
            done = m.set_config(ev.source)
            self.memo.pop("snapshot", None)
        if not done:
            self.ignored += 1
        elif isinstance(ev, NodePartitionSet | NodePartitionChanged):
            self.node_changes.add(ev.node_id)

    def _job_submitted(self, seq: int, ev: JobSubmitted) -> None:
        if ev.job_id in self.jobs or ev.client_id in self.by_client:
            self.ignored += 1
            return
        try:
            # The leader's API hands over what it parsed (the log holds its `to_dict`,
            # which parses back equal), so the leader does not parse every spec twice.
            spec = self.parsed.pop(ev.job_id, None) or parse_job_spec(ev.spec)
        except SpecError:
            # Validated before it was logged; a log written by other code must still not
            # stop the fold, or every candidate would fail on the same entry.
            self.ignored += 1
            return
        tasks: dict[str, TaskRecord] = {}
        for group in spec.tasks:
            for i in range(group.count):
                tid = task_id_for(ev.job_id, group.role, i)
                tasks[tid] = TaskRecord(tid, ev.job_id, group.role, i, group)
        job = JobRecord(ev.job_id, ev.client_id, spec, ev.ts, tasks, submit_seq=seq)
        primary = frameworks.primary_task(spec)
        if primary is not None and task_id_for(ev.job_id, *primary) in tasks:
            job.primary = task_id_for(ev.job_id, *primary)
        job.pending = len(tasks)
        job.counts = {TaskState.PENDING: len(tasks)}
        job.pending_resources = asked = spec.total_resources
        _add_to(self.pool_pending, spec.pool, asked, +1)
        self._submitted += 1
        job.order = (-spec.priority, seq, self._submitted)
        job.pending_since = ev.ts
        self.jobs[ev.job_id] = job
        self._wait(job)
        self.by_client[ev.client_id] = ev.job_id
        self.tasks.update(tasks)
        if spec.spill_after_s is not None and spec.regions and ev.job_id not in self.fed_held:
            self.federated.add(ev.job_id)  # (a job held for another region never spills on)
        if spec.is_service:
            self.services.add(job.job_id)
        if spec.is_elastic:
            self.elastic.add(job.job_id)
        self._recount_due[job.job_id] = job

    def _job_updated(self, ev: JobUpdated) -> None:
        """A running service's new spec: the job's generation moves on. A replica whose
        group and health check the update leaves as they were is of the new generation
        at once (nothing to replace); one still waiting takes the new group now; the
        rest are replaced by the leader, one by one (coordinator/services.py)."""
        job = self.jobs.get(ev.job_id)
        try:
            spec = parse_job_spec(ev.spec)
        except SpecError:
            spec = None
        if (
            job is None
            or spec is None
            or job.kill_requested
            or not job.spec.is_service
            or spec.kind != job.spec.kind
            or spec.name != job.spec.name
        ):
            self.ignored += 1
            return
        same_run = spec.health == job.spec.health
        old_pool = job.spec.pool
        if spec.pool != old_pool:
            # What it holds and waits for moves with it between pools.
            for t in job.tasks.values():
                if t.state in HOLDING:
                    self._pool_hold(t, -1)
            _add_to(self.pool_pending, old_pool, job.pending_resources, -1)
        job.spec = spec
        if spec.pool != old_pool:
            for t in job.tasks.values():
                if t.state in HOLDING:
                    self._pool_hold(t, +1)
            _add_to(self.pool_pending, spec.pool, job.pending_resources, +1)
        job.generation += 1
        job.updated_at = ev.ts
        groups = {g.role: g for g in spec.tasks}
        for t in job.tasks.values():
            group = groups.get(t.role)
            if t.state in FINAL or group is None:
                continue
            if t.state == TaskState.PENDING:
                self._regroup(t, group, job.generation, ev.ts)
            elif same_run and replace(group, count=1) == replace(t.group, count=1):
                t.generation = job.generation  # (a count is no part of how a replica runs)
        self._recount_due[job.job_id] = job

    def _regroup(self, task: TaskRecord, group: TaskGroup, generation: int, ts: float) -> None:
        """A waiting replica takes its job's current group (what it asks for moves too)."""
        if group != task.group:
            self._count_pending(task, -1, ts)
            task.group = group
            self._count_pending(task, +1, ts)
        task.generation = generation

    def _replica_added(self, ev: ReplicaAdded) -> None:
        job = self.jobs.get(ev.job_id)
        group = None
        if job is not None and job.spec.is_service and not job.kill_requested:
            group = next((g for g in job.spec.tasks if g.role == ev.role), None)
        if group is None or ev.task_id in self.tasks:
            self.ignored += 1
            return
        task = TaskRecord(ev.task_id, job.job_id, ev.role, ev.index, group)
        task.generation = job.generation
        job.tasks[task.task_id] = task
        self.tasks[task.task_id] = task
        job.counts[TaskState.PENDING] = job.counts.get(TaskState.PENDING, 0) + 1
        self._count_pending(task, +1, ev.ts)
        self._history(task, ev.ts, ev.reason)
        self._recount_due[job.job_id] = job

    def _task_placed(self, ev: TaskPlaced) -> None:
        task = self.tasks.get(ev.task_id)
        if task is None or task.state != TaskState.PENDING or ev.attempt <= task.attempt:
            self.ignored += 1
            return
        self._count_pending(task, -1, ev.ts)
        self._move(task, TaskState.PLACED)
        task.attempt = ev.attempt
        task.node_id = ev.node_id
        task.gpu_uuids = ev.gpu_uuids
        task.placed_at = ev.ts
        task.exit_code = task.signal = None
        task.message = task.log_tail = ""
        task.started_at = task.finished_at = None
        job = self.jobs[task.job_id]
        self._membership(job, ev.ts, job.placed_ever)
        job.placed_ever = True
        task.health = ""
        task.checked = job.spec.health is not None
        self.node_tasks.setdefault(ev.node_id, set()).add(task.task_id)
        self.node_alloc[ev.node_id] = self.node_alloc.get(ev.node_id, NOTHING) + task.resources
        self.node_changes.add(ev.node_id)
        self._pool_hold(task, +1)
        self._grant_gpus(task, +1)
        self._hold_ports(task, ev.ports)
        self._history(task, ev.ts, "")
        self._recount_due[task.job_id] = self.jobs[task.job_id]

    def _task_updated(self, ev: TaskUpdated) -> None:
        task = self.tasks.get(ev.task_id)
        if (
            task is not None
            and ev.attempt == task.attempt
            and task.state == ev.state == TaskState.RUNNING
            and ev.health
            and ev.health != task.health
        ):
            # A replica's health check verdict changed: what counts as available moves.
            self.epoch += 1
            task.health = ev.health
            self._history(task, ev.ts, ev.message or f"health: {ev.health}")
            self._progress(task, ev)
            return
        if (
            task is not None
            and ev.attempt == task.attempt
            and task.state == ev.state == TaskState.RUNNING
            and ev.progress >= 0
        ):
            if not self._progress(task, ev):
                self.ignored += 1
            return  # (not in the history: a step count moves every few seconds)
        if task is None or ev.attempt != task.attempt or task.state == ev.state:
            self.ignored += 1
            return
        if is_late_start(task.state, ev.state):
            self._late_start(task, ev)
            return
        if ev.state == TaskState.PLACED:
            self.ignored += 1  # placing books a node: only TaskPlaced does that
            return
        if not can_transition(task.state, ev.state):
            self.ignored += 1
            return
        was_holding = task.state in HOLDING
        if not (was_holding and ev.state in HOLDING):
            self.epoch += 1
        if task.state == TaskState.PENDING:
            self._count_pending(task, -1, ev.ts)
        job = self.jobs[task.job_id]
        if ev.state == TaskState.PENDING:
            if job.spec.is_service and task.generation < job.generation:
                # Restarted on its job's current spec, not the one it was started with.
                group = next((g for g in job.spec.tasks if g.role == task.role), None)
                if group is not None:
                    task.group, task.generation = group, job.generation
            self._count_pending(task, +1, ev.ts)
        self._move(task, ev.state)
        if ev.state in UNSETTLED:
            self.unsettled.add(task.task_id)
        else:
            self.unsettled.discard(task.task_id)
        if ev.state == TaskState.RUNNING:
            task.started_at = ev.ts
            task.health = ev.health
            self._progress(task, ev)
        if ev.state in ENDED or ev.state in FINAL:
            task.finished_at = ev.ts
            task.exit_code = ev.exit_code
            task.signal = ev.signal
            task.log_tail = ev.log_tail
            if ev.state == TaskState.FAILED:
                task.failures += 1
                job.failures += 1
            if job.spec.is_service and ev.state in UNSETTLED:
                ran = ev.ts - task.started_at if task.started_at is not None else 0.0
                task.restarts = 1 if ran >= BACKOFF_RESET_S else task.restarts + 1
            if ev.state in FINAL and task.stop_reason:
                self.stopping.discard(task.task_id)
        task.message = ev.message
        if was_holding and task.state not in HOLDING:
            self._membership(job, ev.ts, True)
            if task.preempt_reason:
                task.preempt_reason = ""
                self.preempting.discard(task.task_id)
            held = self.node_tasks.get(task.node_id)
            if held is not None and task.task_id in held:
                held.discard(task.task_id)
                self.node_alloc[task.node_id] = self.node_alloc[task.node_id] - task.resources
                self.node_changes.add(task.node_id)
                self._pool_hold(task, -1)
                self._grant_gpus(task, -1)
                self._free_ports(task)
                if not held:
                    del self.node_tasks[task.node_id]
                    del self.node_alloc[task.node_id]
        if ev.state == TaskState.PENDING:
            task.node_id = ""
            task.gpu_uuids = ()
            task.finished_at = None
        self._history(task, ev.ts, ev.message)
        if job.kill_requested:
            self._track_killing(job)
        if job.primary == task.task_id:
            self._primary_moved(job, task)
        self._recount_due[job.job_id] = job

    def _late_start(self, task: TaskRecord, ev: TaskUpdated) -> None:
        """An attempt's start logged after its end (lifecycle.is_late_start): its start
        time and its place in the history, before the entries of the attempt it
        precedes; the task stays where it is."""
        if task.started_at is not None or ev.node_id != task.node_id:
            self.ignored += 1
            return
        task.started_at = ev.ts
        at = len(task.history)
        while at > 0:
            ts, attempt, state, _, _ = task.history[at - 1]
            if attempt != task.attempt or state == TaskState.PLACED or ts <= ev.ts:
                break
            at -= 1
        entry = (ev.ts, task.attempt, str(TaskState.RUNNING), task.node_id, ev.message)
        task.history.insert(at, entry)
        if len(task.history) > HISTORY_LIMIT:
            del task.history[: len(task.history) - HISTORY_LIMIT]

    def _progress(self, task: TaskRecord, ev: TaskUpdated) -> bool:
        """A RUNNING attempt's training progress; whether it moved."""
        if ev.progress < 0 or ev.progress == task.progress:
            return False
        task.progress = ev.progress
        task.progress_at = ev.ts
        self.jobs[task.job_id].progress_at = ev.ts
        return True

    def _move(self, task: TaskRecord, new: TaskState) -> None:
        counts = self.jobs[task.job_id].counts
        counts[task.state] -= 1
        counts[new] = counts.get(new, 0) + 1
        task.state = new

    def _recount(self, job: JobRecord) -> None:
        """Keep `job_counts` current, so a region-wide count costs nothing per request
        (the API's cluster.info is polled; recounting 100,000 jobs held the loop)."""
        now = job.state
        if now is job.counted_as:
            return
        if job.job_id in self.elastic and now not in (JobState.PENDING, JobState.RUNNING):
            self.elastic.discard(job.job_id)
        if job.counted_as is not None:
            self.job_counts[str(job.counted_as)] -= 1
        self.job_counts[str(now)] = self.job_counts.get(str(now), 0) + 1
        job.counted_as = now

    def _track_killing(self, job: JobRecord) -> None:
        """A killed job stays in `killing` while any task may still run or be retried."""
        ends = FINAL if job.spec.is_service else FINAL | {TaskState.FAILED}
        if all(t.state in ends for t in job.tasks.values()):
            self.killing.discard(job.job_id)
        else:
            self.killing.add(job.job_id)

    def _hold_ports(self, task: TaskRecord, ports: dict[str, int]) -> None:
        task.ports = dict(ports)
        if ports:
            self.node_ports.setdefault(task.node_id, {})[task.task_id] = tuple(ports.values())

    def _free_ports(self, task: TaskRecord) -> None:
        """A task that stops holding gives its ports back to its node's address."""
        held = self.node_ports.get(task.node_id)
        if held is not None and held.pop(task.task_id, None) is not None and not held:
            del self.node_ports[task.node_id]

    def _primary_moved(self, job: JobRecord, task: TaskRecord) -> None:
        if task.state in (TaskState.SUCCEEDED, TaskState.FAILED) and not job.kill_requested:
            self.primary_ended.add(job.job_id)
        else:
            self.primary_ended.discard(job.job_id)

    def _grant_gpus(self, task: TaskRecord, sign: int) -> None:
        """Book (or release) the task's share of each GPU it was given: a fraction of one
        GPU, or whole GPUs with its GPU memory split evenly."""
        uuids = task.gpu_uuids
        if not uuids:
            return
        r = task.resources
        milli, memory = gpu_share(r.gpu, r.gpu_memory, len(uuids))
        for uuid in uuids:
            key = (task.node_id, uuid)
            had_milli, had_memory = self.gpu_alloc.get(key, (0, 0))
            now = (had_milli + sign * milli, had_memory + sign * memory)
            if now == (0, 0):
                self.gpu_alloc.pop(key, None)
            else:
                self.gpu_alloc[key] = now

    def _pool_hold(self, task: TaskRecord, sign: int) -> None:
        spec = self.jobs[task.job_id].spec
        sums = (self.pool_alloc,) if spec.preemptible else (self.pool_alloc, self.pool_fixed)
        for acc in sums:
            _add_to(acc, spec.pool, task.resources, sign)

    def _count_pending(self, task: TaskRecord, delta: int, ts: float) -> None:
        job = self.jobs[task.job_id]
        if job.pending == 0 and delta > 0:
            job.pending_since = ts
        job.pending += delta
        if delta > 0:
            job.pending_resources = job.pending_resources + task.resources
        else:
            job.pending_resources = job.pending_resources - task.resources
        if job.away:
            return  # (its home's queue and pools do not count it while it is away)
        if not job.kill_requested:
            _add_to(self.pool_pending, job.spec.pool, task.resources, delta)
        if job.pending > 0:
            self._wait(job)
        elif job.job_id in self.waiting:
            self.waiting.discard(job.job_id)
            del self.queue[job.order]
            self.queue_changes.add(job.job_id)

    def _wait(self, job: JobRecord) -> None:
        if job.job_id not in self.waiting:
            self.waiting.add(job.job_id)
            self.queue[job.order] = job.job_id
            self.queue_changes.add(job.job_id)

    def _history(self, task: TaskRecord, ts: float, message: str) -> None:
        task.history.append((ts, task.attempt, str(task.state), task.node_id, message))
        if len(task.history) > HISTORY_LIMIT:
            del task.history[: len(task.history) - HISTORY_LIMIT]

    # ------------------------------------------------------------ queries

    def allocated(self, node_id: str) -> Resources:
        return self.node_alloc.get(node_id, NOTHING)

    def pending_jobs(self) -> list[JobRecord]:
        """Jobs with PENDING tasks, highest priority first, then oldest first."""
        queue = self.queue  # its keys iterate in C; its values view does not
        jobs = map(self.jobs.__getitem__, map(queue.__getitem__, queue.keys()))
        return [job for job in jobs if not job.kill_requested]
