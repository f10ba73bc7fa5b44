"""Elastic training jobs through the fold and the leader's pure rounds: JobScaled and
progress folded, membership generations, the job-wide restart budget, placement at
min then grows rate-limited, shrinks and the watchdog as preemptions, admission of
what a grow offers only (within the pool's entitlement), preemption's victim order."""

from __future__ import annotations

import dataclasses

from coordinator.pooling import admitted_jobs, pool_view, preemptions
from coordinator.reconcile import reconcile
from coordinator.records import HOLDING
from coordinator.reports import agent_event
from coordinator.scheduling import PlacementConfig, gang_request
from coordinator.state import RegionState
from coordinator.views import job_detail
from mesh.schema import (
    JobKillRequested,
    JobScaled,
    JobSubmitted,
    LeaderElected,
    LogEntry,
    PoolsApplied,
    TaskEvent,
    TaskPlaced,
    TaskPreemptRequested,
    TaskUpdated,
)
from tests.unit.test_reconcile import cluster, view
from workloads.lifecycle import TaskState
from workloads.resources import Resources
from workloads.spec import parse_job_spec

S = TaskState
CONFIG = PlacementConfig(resize_every_s=10.0, progress_timeout_s=60.0)


def elastic_spec(lo=2, hi=4, *, framework="pytorch-elastic", pool="/", restarts=3, cpu="1"):
    """The spec the training parser makes of `workers: {min, max}` (built directly: the
    parser is the spec helper's)."""
    spec = parse_job_spec(
        {
            "name": "train",
            "pool": pool,
            "min_tasks": lo,
            "restart": {"max_retries": 0},
            "tasks": [
                {
                    "role": "worker",
                    "count": hi,
                    "command": ["true"],
                    "resources": {"cpu": cpu, "memory": "1Gi"},
                }
            ],
        }
    )
    return dataclasses.replace(
        spec, framework=framework, workers_min=lo, workers_max=hi, max_restarts=restarts
    )


class Log:
    def __init__(self) -> None:
        self.state = RegionState()
        self.seq = 0
        self.append(LeaderElected(1, "c1"))

    def append(self, *events) -> None:
        self.seq += 1
        assert self.state.apply(self.seq, LogEntry(1, "c1", tuple(events)))

    def submit(self, job_id="j", spec=None, ts=1.0) -> None:
        spec = spec or elastic_spec()
        self.state.parsed[job_id] = spec  # (as the leader's API hands it over)
        self.append(JobSubmitted(job_id, f"c-{job_id}", spec.to_dict(), ts))

    def tid(self, i: int, job_id="j") -> str:
        return f"{job_id}.worker.{i}"

    def place(self, *idx: int, ts=2.0, node="n1") -> None:
        evs = []
        for i in idx:
            t = self.state.tasks[self.tid(i)]
            evs.append(TaskPlaced("j", t.task_id, t.attempt + 1, node, ts))
        self.append(*evs)

    def update(self, i: int, state: TaskState, ts=3.0, **kw) -> None:
        t = self.state.tasks[self.tid(i)]
        self.append(TaskUpdated("j", t.task_id, t.attempt, state, t.node_id, ts, **kw))

    def step(self, nodes, now):
        d = reconcile(self.state, nodes, now, CONFIG)
        if d.events:
            self.append(*d.events)
        return d

    @property
    def job(self):
        return self.state.jobs["j"]

    def holding(self) -> list[int]:
        return sorted(t.index for t in self.job.tasks.values() if t.state in HOLDING)


# ------------------------------------------------------------ fold


def test_job_scaled_moves_the_target_within_bounds_only():
    log = Log()
    log.submit()
    assert log.job.target == 0  # (its workers_max until scaled)
    log.append(JobScaled("j", 3, "by hand", "alice", 5.0))
    assert log.job.target == 3
    ignored = log.state.ignored
    log.append(JobScaled("j", 5, "", "", 6.0), JobScaled("j", 1, "", "", 6.0))
    assert log.job.target == 3 and log.state.ignored == ignored + 2


def test_job_scaled_of_a_fixed_size_job_is_ignored():
    log = Log()
    log.submit(spec=elastic_spec(4, 4))
    log.append(JobScaled("j", 3, "", "", 5.0))
    assert log.job.target == 0 and log.state.ignored == 1


def test_progress_of_a_running_attempt_is_folded_and_a_repeat_ignored():
    log = Log()
    log.submit()
    log.place(0, 1)
    log.update(0, S.RUNNING, ts=3.0, progress=0)
    t = log.state.tasks[log.tid(0)]
    assert (t.progress, t.progress_at) == (0, 3.0)
    log.update(0, S.RUNNING, ts=5.0, progress=7)
    assert (t.progress, t.progress_at, log.job.progress_at) == (7, 5.0, 5.0)
    assert t.state == S.RUNNING and t.started_at == 3.0
    before = log.state.ignored
    log.update(0, S.RUNNING, ts=6.0, progress=7)
    assert t.progress_at == 5.0 and log.state.ignored == before + 1
    assert job_detail(log.job, None)["task_list"][0]["progress"] == 7


def test_agent_progress_reports_become_running_updates_with_progress():
    log = Log()
    log.submit()
    log.place(0)
    log.update(0, S.STARTING)
    t = log.state.tasks[log.tid(0)]
    ev = TaskEvent("n1", "j", t.task_id, t.attempt, S.RUNNING, 3.0, progress=4)
    up = agent_event(log.state, ev)
    assert isinstance(up, TaskUpdated) and up.progress == 4
    log.append(up)
    again = TaskEvent("n1", "j", t.task_id, t.attempt, S.RUNNING, 4.0, progress=9)
    up = agent_event(log.state, again)
    assert isinstance(up, TaskUpdated) and up.state == S.RUNNING and up.progress == 9
    same = TaskEvent("n1", "j", t.task_id, t.attempt, S.RUNNING, 5.0, progress=4)
    log.append(up)
    assert agent_event(log.state, dataclasses.replace(same, progress=9)) is None


def test_generation_moves_once_per_entry_of_membership_changes_and_resizes_after_first():
    log = Log()
    log.submit()
    log.place(0, 1, ts=2.0)  # the first gang, in one entry
    assert (log.job.generation, log.job.resizes, log.job.changed_at) == (1, 0, 2.0)
    log.update(0, S.RUNNING)  # holding -> holding: no change
    assert log.job.generation == 1
    log.place(2, ts=20.0)
    assert (log.job.generation, log.job.resizes, log.job.changed_at) == (2, 1, 20.0)
    log.update(2, S.FAILED, ts=30.0)
    assert (log.job.generation, log.job.resizes) == (3, 2)


def test_a_batch_job_and_a_service_keep_their_generation():
    log = Log()
    spec = dataclasses.replace(
        elastic_spec(), framework="batch", workers_min=None, workers_max=None
    )
    log.submit(spec=spec)
    log.place(0, 1)
    assert log.job.generation == 0 and log.job.resizes == 0


def test_failures_of_a_training_job_count_against_max_restarts_summed():
    log = Log()
    log.submit(spec=elastic_spec(restarts=1))  # restart.max_retries is 0
    log.place(0, 1)
    log.update(0, S.FAILED)
    nxt, why = log.job.settles_to(log.state.tasks[log.tid(0)])
    assert nxt == S.PENDING and why == "restart 1 of 1 after failure"
    log.update(1, S.FAILED)  # another task: the job's second failure
    assert log.job.settles_to(log.state.tasks[log.tid(1)]) == (None, "")
    assert job_detail(log.job, None)["training"]["restarts"] == 2


# ------------------------------------------------------------ rounds


def _nodes(n=4):
    # (task 0 of a pytorch-elastic job is given its rendezvous port: the nodes offer some)
    nodes = (
        view(f"n{i}", cpu=1000, address="127.0.0.1", port_range=(20000, 32000))
        for i in range(1, n + 1)
    )
    return cluster(*nodes)


def test_placed_as_a_gang_of_min_then_grows_to_target_only_after_resize_every_s():
    log = Log()
    log.submit()
    nodes = _nodes(4)
    log.step(nodes, 100.0)
    assert log.holding() == [0, 1]
    changed = log.job.changed_at
    d = log.step(nodes, changed + 5.0)
    assert log.holding() == [0, 1]
    assert "next resize" in d.unplaced["j"]
    log.step(nodes, changed + 10.0)
    assert log.holding() == [0, 1, 2, 3]
    assert (log.job.generation, log.job.resizes) == (2, 1)


def test_grow_takes_what_fits_now_up_to_the_target():
    log = Log()
    log.submit(spec=elastic_spec(2, 4))
    log.append(JobScaled("j", 3, "", "", 1.0))
    nodes = _nodes(5)
    log.step(nodes, 100.0)
    log.step(nodes, 200.0)
    assert log.holding() == [0, 1, 2]  # the target, not max
    assert reconcile(log.state, nodes, 300.0, CONFIG).unplaced["j"].startswith("elastic: at")


def test_scale_down_stops_the_highest_indexes_as_preemptions_never_task_0():
    log = Log()
    log.submit(spec=elastic_spec(1, 4))
    nodes = _nodes(4)
    log.place(0, 1, 2, 3, ts=100.0)
    for i in range(4):
        log.update(i, S.RUNNING, ts=101.0)
    log.append(JobScaled("j", 1, "", "", 102.0))
    assert reconcile(log.state, nodes, 105.0, CONFIG).events == []  # not due yet
    d = log.step(nodes, 111.0)
    stops = [e for e in d.events if isinstance(e, TaskPreemptRequested)]
    assert [e.task_id for e in stops] == [log.tid(3), log.tid(2), log.tid(1)]
    assert {e.reason for e in stops} == {"resize to 1"}
    assert {k.task_id for k in reconcile(log.state, nodes, 112.0, CONFIG).kills} == {
        log.tid(i) for i in (1, 2, 3)
    }
    for i in (3, 2, 1):
        log.update(i, S.PREEMPTED, ts=113.0)
    log.step(nodes, 113.0)  # requeued: back to PENDING, above the target
    assert log.holding() == [0]
    assert all(log.state.tasks[log.tid(i)].state == S.PENDING for i in (1, 2, 3))
    assert log.step(nodes, 500.0).events == []  # nothing grows past the target
    # Tasks resting above the target are no demand of their pool (no entitlement or
    # preemption is claimed for them), though they wait in the queue.
    assert log.state.pool_pending["/"].cpu == 3000
    demand = pool_view(log.state, Resources(cpu=4000, memory=64 * 2**30), 500.0).demand
    assert demand.get("/", Resources()).cpu == 0


def test_the_watchdog_requeues_a_job_stalled_after_a_membership_change():
    log = Log()
    log.submit(spec=elastic_spec(2, 2 + 1))
    nodes = _nodes(2)  # room for two: it stays at min, no further change
    log.step(nodes, 100.0)
    for i in (0, 1):
        log.update(i, S.RUNNING, ts=101.0, progress=5)
    changed = log.job.changed_at
    assert reconcile(log.state, nodes, changed + 59.0, CONFIG).events == []
    log.update(0, S.RUNNING, ts=changed + 40.0, progress=6)
    log.update(0, S.RUNNING, ts=changed + 70.0, progress=7)
    d = reconcile(log.state, nodes, changed + 140.0, CONFIG)
    assert d.events == []  # progress kept moving past progress_timeout_s after the change
    log.append(  # a change: task 1 lost and placed again, then no progress
        TaskUpdated("j", log.tid(1), 1, S.LOST, "n2", 250.0),
    )
    log.step(nodes, 251.0)  # back to PENDING
    log.step(nodes, 252.0)  # placed again: holding < min is restored at once
    assert log.holding() == [0, 1]
    log.update(1, S.RUNNING, ts=253.0)
    d = reconcile(log.state, nodes, log.job.changed_at + 61.0, CONFIG)
    requeue = [e for e in d.events if isinstance(e, TaskPreemptRequested)]
    assert sorted(e.task_id for e in requeue) == [log.tid(0), log.tid(1)]
    assert "watchdog" in requeue[0].reason


def test_the_watchdog_requeues_a_job_whose_late_reports_came_after_the_change():
    """Steps reported just after a change (made before the workers noticed it, or read
    late by the agent), then nothing: requeued progress_timeout_s after the last one."""
    log = Log()
    log.submit(spec=elastic_spec(2, 3))
    nodes = _nodes(2)
    log.step(nodes, 100.0)
    for i in (0, 1):
        log.update(i, S.RUNNING, ts=101.0, progress=5)
    changed = log.job.changed_at
    log.update(0, S.RUNNING, ts=changed + 2.0, progress=9)  # the late report
    assert reconcile(log.state, nodes, changed + 61.0, CONFIG).events == []
    d = reconcile(log.state, nodes, changed + 62.0, CONFIG)
    requeue = [e for e in d.events if isinstance(e, TaskPreemptRequested)]
    assert [e.task_id for e in requeue] == [log.tid(1), log.tid(0)]
    assert requeue[0].reason == (
        "requeued by the watchdog: no progress in 60s (its last membership change 62s "
        "ago; progress_timeout_s 60)"
    )


def _stall_and_requeue(log, nodes):
    """Tasks 0 and 1 report progress 1 s after the job's last membership change, then
    nothing: the watchdog's round, the requeue applied, both PREEMPTED and placed again.
    Returns the watchdog's events."""
    ts = log.job.changed_at + 1.0
    for i in (0, 1):
        log.update(i, S.RUNNING, ts=ts, progress=int(ts))
    d = log.step(nodes, ts + 61.0)
    if any(isinstance(e, JobKillRequested) for e in d.events):
        return d.events
    for i in (1, 0):
        log.update(i, S.PREEMPTED, ts=ts + 62.0)
    log.step(nodes, ts + 62.0)  # back to PENDING
    log.step(nodes, ts + 63.0)  # placed again, a gang of min
    assert log.holding() == [0, 1]
    return d.events


def test_each_watchdog_requeue_spends_a_restart_and_a_job_hung_past_them_is_killed():
    log = Log()
    log.submit(spec=elastic_spec(2, 3, restarts=2))
    nodes = _nodes(2)
    log.step(nodes, 100.0)
    for n in (1, 2):
        events = _stall_and_requeue(log, nodes)
        requeue = [e for e in events if isinstance(e, TaskPreemptRequested)]
        assert len(requeue) == 2 and requeue[0].reason.startswith("requeued by the watchdog")
        # One requeue is one restart, however many tasks it stopped; a replay agrees.
        assert log.job.failures == n
        assert job_detail(log.job, None)["training"]["restarts"] == n
    events = _stall_and_requeue(log, nodes)
    assert not any(isinstance(e, TaskPreemptRequested) for e in events)
    (kill,) = events
    assert isinstance(kill, JobKillRequested) and kill.job_id == "j"
    assert kill.reason == (
        "stalled: no progress in 61s (its last membership change 62s ago; "
        "progress_timeout_s 60); restarts 2 of 2 used: the job ends"
    )
    assert log.job.kill_requested and log.job.kill_reason == kill.reason
    assert {k.task_id for k in reconcile(log.state, nodes, kill.ts + 1.0, CONFIG).kills} == {
        log.tid(0),
        log.tid(1),
    }


def test_a_job_with_no_restarts_is_killed_at_its_first_stall():
    log = Log()
    log.submit(spec=elastic_spec(2, 3, restarts=0))
    nodes = _nodes(2)
    log.step(nodes, 100.0)
    (kill,) = _stall_and_requeue(log, nodes)
    assert isinstance(kill, JobKillRequested) and "restarts 0 of 0 used" in kill.reason


def test_admission_of_a_grow_counts_only_the_offered_tasks_and_stays_in_entitlement():
    """Two pools share 5 cpu; "b" holds 2, so "a" is entitled to 3: a job of "a" at min
    2 may not grow to 4, though idle capacity is there (admission refuses the grow), but
    may grow to 3 once scaled there: admitted for the one task it offers, where weighing
    every waiting task (two) would refuse it."""
    log = Log()
    log.append(
        PoolsApplied({"pools": {"/a": {"cpu": {"share": 1}}, "/b": {"cpu": {"share": 1}}}}, 0.0)
    )
    log.submit(spec=elastic_spec(2, 4, pool="/a"))
    other = dataclasses.replace(
        elastic_spec(2, 2, pool="/b"), framework="batch", workers_min=None, workers_max=None
    )
    log.state.parsed["k"] = other
    log.append(JobSubmitted("k", "c-k", other.to_dict(), 1.0))
    log.append(*(TaskPlaced("k", f"k.worker.{i}", 1, f"n{i + 3}", 1.0) for i in range(2)))
    nodes = _nodes(5)
    log.step(nodes, 100.0)
    assert log.holding() == [0, 1]
    d = log.step(nodes, 200.0)
    assert log.holding() == [0, 1]
    assert d.unplaced["j"] == "pool /a: cpu allocation 2 + job 2 > entitlement 3"
    log.append(JobScaled("j", 3, "", "", 201.0))
    view_ = pool_view(log.state, Resources(cpu=5000, memory=80 * 2**30), 202.0)
    assert "j" in admitted_jobs(log.state, view_, [log.job])[1]  # all waiting weighed
    log.step(nodes, 202.0)
    assert log.holding() == [0, 1, 2]
    assert log.state.pool_alloc["/a"].cpu == 3000  # its entitlement, not above


def test_gang_request_offers_min_first_then_the_grow():
    log = Log()
    log.submit()
    first = gang_request(log.job, 0.0, CONFIG, 100.0)
    assert [t.task_id for t in first.tasks] == [log.tid(0), log.tid(1)] and first.gang == 2
    log.place(0, 1, ts=100.0)
    assert gang_request(log.job, 0.0, CONFIG, 105.0).tasks == ()
    grow = gang_request(log.job, 0.0, CONFIG, 110.0)
    assert [t.task_id for t in grow.tasks] == [log.tid(2), log.tid(3)] and grow.gang == 0


def test_preemption_shrinks_an_elastic_job_from_its_highest_index_down_to_min():
    log = Log()
    log.append(
        PoolsApplied({"pools": {"/a": {"cpu": {"share": 1}}, "/b": {"cpu": {"share": 1}}}}, 0.0)
    )
    log.submit(spec=elastic_spec(2, 4, pool="/a"))
    log.place(0, 1, 2, 3, ts=10.0)
    other = dataclasses.replace(
        elastic_spec(2, 2, pool="/b"), framework="batch", workers_min=None, workers_max=None
    )
    log.state.parsed["k"] = other
    log.append(JobSubmitted("k", "c-k", other.to_dict(), 1.0))
    view_ = pool_view(log.state, Resources(cpu=4000, memory=80 * 2**30), 20.0)
    events, _ = preemptions(log.state, view_, {"/a": 5}, 1, 20.0)
    assert [e.task_id for e in events] == [log.tid(3), log.tid(2)]


def test_a_due_grow_that_finds_no_room_waits_and_grows_when_capacity_frees():
    log = Log()
    log.submit(spec=elastic_spec(2, 3))
    other = dataclasses.replace(
        elastic_spec(1, 1), framework="batch", workers_min=None, workers_max=None
    )
    log.state.parsed["k"] = other
    log.append(JobSubmitted("k", "c-k", other.to_dict(), 1.0))
    log.append(TaskPlaced("k", "k.worker.0", 1, "n3", 1.0))
    nodes = _nodes(3)
    log.step(nodes, 100.0)
    assert log.holding() == [0, 1]
    for now in (120.0, 121.0, 130.0):  # due, but no node has room: it waits (parked)
        log.step(nodes, now)
        assert log.holding() == [0, 1]
    log.append(TaskUpdated("k", "k.worker.0", 1, S.SUCCEEDED, "n3", 131.0))
    log.step(nodes, 132.0)
    assert log.holding() == [0, 1, 2]
    assert log.state.tasks[log.tid(2)].node_id == "n3"


def test_coordinator_config_carries_the_resize_settings_into_placement():
    from coordinator.service import CoordinatorConfig
    from mesh.cli.parser import build_parser

    c = CoordinatorConfig("nats://127.0.0.1:1", resize_every_s=3.0, progress_timeout_s=30.0)
    assert (c.placement.resize_every_s, c.placement.progress_timeout_s) == (3.0, 30.0)
    assert CoordinatorConfig("nats://127.0.0.1:1").placement.resize_every_s == 10.0
    args = build_parser().parse_args(
        ["coordinator", "--resize-every", "4", "--progress-timeout", "50"]
    )
    assert (args.resize_every, args.progress_timeout) == (4.0, 50.0)
    args = build_parser().parse_args(["job", "scale", "j-1", "--workers", "3"])
    assert (args.job_id, args.workers) == ("j-1", 3)
    args = build_parser().parse_args(["job", "hosts", "j-1", "--format", "mpi"])
    assert args.format == "mpi"
