"""RegionState.apply: the fold over the job log, and the indexes it keeps consistent."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from coordinator.records import HOLDING, UNSETTLED, task_id_for
from coordinator.state import RegionState
from mesh.schema import (
    JobKillRequested,
    JobSubmitted,
    LeaderElected,
    LogEntry,
    TaskPlaced,
    TaskUpdated,
)
from workloads.lifecycle import FINAL, TRANSITIONS, JobState, TaskState, job_state
from workloads.resources import Resources

S = TaskState
GiB = 2**30


def job_spec(
    name="job",
    *,
    roles=(("w", 2),),
    retries=0,
    on_lost=True,
    simulate=False,
    cpu="1",
    memory="1Gi",
    priority=0,
) -> dict:
    tasks = []
    for role, count in roles:
        group = {"role": role, "count": count, "resources": {"cpu": cpu, "memory": memory}}
        if simulate:
            group["simulate"] = {"duration": 1.0}
        else:
            group["command"] = ["true"]
        tasks.append(group)
    return {
        "name": name,
        "priority": priority,
        "restart": {"max_retries": retries, "reschedule_on_lost": on_lost},
        "tasks": tasks,
    }


class Log:
    """A job log being appended to, folded into a RegionState as it goes."""

    def __init__(self, term: int = 1) -> None:
        self.state = RegionState()
        self.seq = 0
        self.term = term
        self.append(LeaderElected(term, "c1"))

    def append(self, *events, term: int | None = None) -> bool:
        self.seq += 1
        return self.state.apply(
            self.seq, LogEntry(self.term if term is None else term, "c1", tuple(events))
        )

    def submit(self, job_id: str, client_id: str | None = None, ts: float = 1.0, **kw) -> None:
        self.append(JobSubmitted(job_id, client_id or f"client-{job_id}", job_spec(**kw), ts))

    def place(self, tid: str, node: str, attempt: int | None = None, ts: float = 2.0) -> None:
        t = self.state.tasks[tid]
        self.append(
            TaskPlaced(t.job_id, tid, t.attempt + 1 if attempt is None else attempt, node, ts)
        )

    def update(
        self, tid: str, state: TaskState, attempt: int | None = None, ts: float = 3.0, **kw
    ) -> None:
        t = self.state.tasks[tid]
        self.append(
            TaskUpdated(
                t.job_id, tid, t.attempt if attempt is None else attempt, state, t.node_id, ts, **kw
            )
        )


def check_indexes(state: RegionState) -> None:
    """The sets and counters the fold keeps equal what a full scan would compute."""
    tasks = state.tasks
    assert tasks == {tid: t for job in state.jobs.values() for tid, t in job.tasks.items()}
    assert state.waiting == {
        j for j, job in state.jobs.items() if any(t.state == S.PENDING for t in job.tasks.values())
    }
    for job in state.jobs.values():
        assert job.pending == sum(t.state == S.PENDING for t in job.tasks.values()), job.job_id
        asked = Resources()
        for t in job.tasks.values():
            if t.state == S.PENDING:
                asked = asked + t.resources
        assert job.pending_resources == asked, job.job_id
        by_state: dict = {}
        for t in job.tasks.values():
            by_state[t.state] = by_state.get(t.state, 0) + 1
        assert {k: v for k, v in job.counts.items() if v} == by_state, job.job_id
        # An ended attempt that will run again counts as PENDING for its job's state.
        effective = [
            S.PENDING if job.settles_to(t)[0] == S.PENDING else t.state for t in job.tasks.values()
        ]
        assert job.state == job_state(effective), job.job_id
    counts: dict[str, int] = {}
    for job in state.jobs.values():
        counts[str(job.state)] = counts.get(str(job.state), 0) + 1
    assert {s: n for s, n in state.job_counts.items() if n} == counts
    holding: dict[str, set[str]] = {}
    for tid, t in tasks.items():
        if t.state in HOLDING:
            holding.setdefault(t.node_id, set()).add(tid)
    assert state.node_tasks == holding
    assert set(state.node_alloc) == set(holding)  # no totals left for nodes holding nothing
    pools: dict[str, Resources] = {}
    fixed: dict[str, Resources] = {}
    for t in tasks.values():
        if t.state in HOLDING:
            spec = state.jobs[t.job_id].spec
            pools[spec.pool] = pools.get(spec.pool, Resources()) + t.resources
            if not spec.preemptible:
                fixed[spec.pool] = fixed.get(spec.pool, Resources()) + t.resources
    nonzero = lambda d: {k: v for k, v in d.items() if v != Resources()}  # noqa: E731
    assert state.pool_alloc == nonzero(pools)
    assert state.pool_fixed == nonzero(fixed)
    asked: dict[str, Resources] = {}
    for job in state.pending_jobs():
        asked[job.spec.pool] = asked.get(job.spec.pool, Resources()) + job.pending_resources
    assert state.pool_pending == nonzero(asked)
    assert state.unsettled == {tid for tid, t in tasks.items() if t.state in UNSETTLED}
    for node, tids in holding.items():
        total = Resources()
        for tid in tids:
            total = total + tasks[tid].resources
        assert state.allocated(node) == total
    gpus: dict[tuple[str, str], tuple[int, int]] = {}
    for t in tasks.values():
        if t.state in HOLDING and t.gpu_uuids:
            n = len(t.gpu_uuids)
            share = t.resources.gpu if n == 1 else t.resources.gpu // n
            for uuid in t.gpu_uuids:
                m, b = gpus.get((t.node_id, uuid), (0, 0))
                gpus[t.node_id, uuid] = (m + share, b + t.resources.gpu_memory // n)
    assert state.gpu_alloc == {k: v for k, v in gpus.items() if v != (0, 0)}
    for tid, t in tasks.items():
        if t.state == S.PENDING:
            assert t.node_id == "" and t.gpu_uuids == (), tid
        if t.state in HOLDING:
            assert t.node_id, tid
    for client, job_id in state.by_client.items():
        assert state.jobs[job_id].client_id == client
    assert set(state.by_client.values()) == set(state.jobs)


def killing_needed(state: RegionState) -> set[str]:
    """Killed jobs that still have a task the leader must stop or end."""
    return {
        j
        for j, job in state.jobs.items()
        if job.kill_requested
        and any(t.state not in FINAL and t.state != S.FAILED for t in job.tasks.values())
    }


def snapshot(state: RegionState):
    return (
        state.last_seq,
        state.term,
        state.leader_id,
        state.ignored,
        sorted(state.waiting),
        sorted(state.unsettled),
        sorted(state.killing),
        sorted((n, sorted(ts)) for n, ts in state.node_tasks.items()),
        sorted(state.by_client.items()),
        sorted(
            (tid, str(t.state), t.attempt, t.node_id, t.failures, len(t.history))
            for tid, t in state.tasks.items()
        ),
        sorted(
            (j, job.pending, job.kill_requested, job.kill_reason) for j, job in state.jobs.items()
        ),
    )


# --------------------------------------------------------------------------- submit


def test_submit_creates_tasks_named_job_role_index():
    log = Log()
    log.submit("j1", "cl-1", roles=(("ps", 1), ("worker", 3)), ts=7.5)
    s = log.state
    job = s.jobs["j1"]
    assert set(job.tasks) == {"j1.ps.0", "j1.worker.0", "j1.worker.1", "j1.worker.2"}
    assert task_id_for("j1", "worker", 2) == "j1.worker.2"
    for tid, t in job.tasks.items():
        assert s.tasks[tid] is t
        assert (t.state, t.attempt, t.node_id, t.job_id) == (S.PENDING, 0, "", "j1")
    assert s.tasks["j1.worker.1"].role == "worker" and s.tasks["j1.worker.1"].index == 1
    assert job.pending == 4
    assert s.waiting == {"j1"}
    assert s.by_client == {"cl-1": "j1"}
    assert job.submitted_at == 7.5
    assert job.submit_seq == log.seq
    assert job.state == JobState.PENDING
    assert s.tasks["j1.worker.0"].resources == Resources(cpu=1000, memory=GiB)
    check_indexes(s)


def test_duplicate_client_id_is_ignored():
    log = Log()
    log.submit("j1", "same")
    log.submit("j2", "same")
    assert set(log.state.jobs) == {"j1"}
    assert not any(t.startswith("j2.") for t in log.state.tasks)
    assert log.state.ignored == 1
    assert log.state.by_client == {"same": "j1"}


def test_duplicate_job_id_is_ignored():
    log = Log()
    log.submit("j1", "a", roles=(("w", 1),))
    log.submit("j1", "b", roles=(("w", 5),))
    assert len(log.state.jobs["j1"].tasks) == 1
    assert log.state.by_client == {"a": "j1"}
    assert log.state.ignored == 1


def test_invalid_spec_in_the_log_is_ignored_not_raised():
    # "an event that does not fit the current state is ignored, so replaying a log is always
    # safe": a JobSubmitted whose spec does not validate must not stop the fold (every
    # candidate replaying the log would fail on it), nor the good events after it.
    s = RegionState()
    entry = LogEntry(
        1,
        "c1",
        (
            JobSubmitted("bad", "c-bad", {"name": "x", "tasks": "not a list"}, 1.0),
            JobSubmitted("good", "c-good", job_spec(), 1.0),
        ),
    )
    assert s.apply(1, entry) is True
    assert "bad" not in s.jobs
    assert "good" in s.jobs
    assert s.ignored >= 1


# --------------------------------------------------------------------------- lifecycle


def test_placed_running_succeeded_updates_node_tasks_and_allocation():
    log = Log()
    log.submit("j", roles=(("w", 2),), cpu="2", memory="4Gi")
    s = log.state
    log.place("j.w.0", "n1", ts=10.0)
    t = s.tasks["j.w.0"]
    assert (t.state, t.attempt, t.node_id, t.placed_at) == (S.PLACED, 1, "n1", 10.0)
    assert s.node_tasks == {"n1": {"j.w.0"}}
    assert s.allocated("n1") == Resources(cpu=2000, memory=4 * GiB)
    assert s.allocated("n2") == Resources()
    assert s.jobs["j"].pending == 1 and s.waiting == {"j"}

    log.place("j.w.1", "n1")
    assert s.allocated("n1") == Resources(cpu=4000, memory=8 * GiB)
    assert s.jobs["j"].pending == 0 and s.waiting == set()

    log.update("j.w.0", S.STARTING)
    log.update("j.w.0", S.RUNNING, ts=11.0)
    assert t.state == S.RUNNING and t.started_at == 11.0
    assert s.jobs["j"].state == JobState.RUNNING
    assert s.node_tasks == {"n1": {"j.w.0", "j.w.1"}}

    log.update("j.w.0", S.SUCCEEDED, ts=12.0, exit_code=0, log_tail="done")
    assert (t.state, t.finished_at, t.exit_code, t.log_tail) == (S.SUCCEEDED, 12.0, 0, "done")
    assert s.node_tasks == {"n1": {"j.w.1"}}
    assert s.allocated("n1") == Resources(cpu=2000, memory=4 * GiB)

    log.update("j.w.1", S.RUNNING)  # STARTING may be skipped
    log.update("j.w.1", S.SUCCEEDED, exit_code=0)
    assert s.node_tasks == {}  # no empty sets left behind
    assert s.allocated("n1") == Resources()
    assert s.jobs["j"].state == JobState.SUCCEEDED
    assert [h[2] for h in t.history] == ["PLACED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert s.ignored == 0
    check_indexes(s)


def test_stale_attempt_events_are_ignored():
    log = Log()
    log.submit("j", roles=(("w", 1),))
    s = log.state
    log.place("j.w.0", "n1")
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.LOST)
    log.update("j.w.0", S.PENDING)
    log.place("j.w.0", "n2")  # attempt 2
    assert s.tasks["j.w.0"].attempt == 2
    before = s.ignored
    # attempt 1's node reports late: none of it applies to attempt 2
    log.update("j.w.0", S.RUNNING, attempt=1)
    log.update("j.w.0", S.FAILED, attempt=1, exit_code=3)
    log.update("j.w.0", S.SUCCEEDED, attempt=3)  # a future attempt is no better
    t = s.tasks["j.w.0"]
    assert (t.state, t.attempt, t.node_id, t.failures) == (S.PLACED, 2, "n2", 0)
    assert s.ignored == before + 3
    assert s.node_tasks == {"n2": {"j.w.0"}}
    check_indexes(s)


def test_placement_with_an_old_or_equal_attempt_is_ignored():
    log = Log()
    log.submit("j", roles=(("w", 1),))
    log.place("j.w.0", "n1", attempt=3)
    log.update("j.w.0", S.PENDING)  # placement undone
    before = log.state.ignored
    log.place("j.w.0", "n2", attempt=3)
    log.place("j.w.0", "n2", attempt=1)
    t = log.state.tasks["j.w.0"]
    assert (t.state, t.attempt) == (S.PENDING, 3)
    assert log.state.ignored == before + 2
    log.place("j.w.0", "n2", attempt=4)
    assert (t.state, t.attempt, t.node_id) == (S.PLACED, 4, "n2")
    check_indexes(log.state)


def test_placing_a_task_that_is_not_pending_is_ignored():
    log = Log()
    log.submit("j", roles=(("w", 1),))
    log.place("j.w.0", "n1")
    log.place("j.w.0", "n2", attempt=2)
    t = log.state.tasks["j.w.0"]
    assert (t.node_id, t.attempt) == ("n1", 1)
    assert log.state.node_tasks == {"n1": {"j.w.0"}}
    assert log.state.ignored == 1


def test_events_for_unknown_tasks_are_ignored():
    log = Log()
    log.append(
        TaskPlaced("nope", "nope.w.0", 1, "n1"),
        TaskUpdated("nope", "nope.w.0", 1, S.RUNNING),
        JobKillRequested("nope"),
    )
    assert log.state.ignored == 2
    assert log.state.tasks == {} and log.state.node_tasks == {} and log.state.killing == set()


@pytest.mark.parametrize(
    "path,illegal",
    [
        ([], S.RUNNING),  # PENDING -> RUNNING
        ([], S.SUCCEEDED),
        ([], S.LOST),
        (["place"], S.PREEMPTED),  # PLACED -> PREEMPTED
        (["place", S.RUNNING, S.SUCCEEDED], S.RUNNING),  # final stays final
        (["place", S.RUNNING, S.SUCCEEDED], S.PENDING),
        (["place", S.KILLED], S.PENDING),
        (["place", S.RUNNING, S.FAILED], S.RUNNING),  # FAILED only -> PENDING
        (["place", S.RUNNING, S.FAILED], S.KILLED),
        (["place", S.STARTING], S.PENDING),
        (["place", S.RUNNING], S.STARTING),
        (["place", S.RUNNING], S.RUNNING),  # a repeat is ignored too
    ],
)
def test_illegal_transitions_are_ignored_and_counted(path, illegal):
    log = Log()
    log.submit("j", roles=(("w", 1),))
    for step in path:
        if step == "place":
            log.place("j.w.0", "n1")
        else:
            log.update("j.w.0", step)
    s = log.state
    assert s.ignored == 0
    before = snapshot(s)
    log.update("j.w.0", illegal)
    assert s.ignored == 1
    after = snapshot(s)
    # nothing but the counter and the sequence moved
    assert after[4:] == before[4:]
    assert after[0] == before[0] + 1
    check_indexes(s)


def test_placed_back_to_pending_releases_the_node():
    log = Log()
    log.submit("j", roles=(("w", 1),))
    log.place("j.w.0", "n1")
    log.update("j.w.0", S.PENDING, message="placement undone")
    t = log.state.tasks["j.w.0"]
    assert (t.state, t.node_id, t.attempt) == (S.PENDING, "", 1)
    assert log.state.node_tasks == {}
    assert log.state.waiting == {"j"} and log.state.jobs["j"].pending == 1
    check_indexes(log.state)


def test_lost_then_pending_then_placed_again_with_the_next_attempt():
    log = Log()
    log.submit("j", roles=(("w", 1),))
    s = log.state
    log.place("j.w.0", "n1")
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.LOST, ts=20.0, message="node gone")
    t = s.tasks["j.w.0"]
    assert t.state == S.LOST and t.finished_at == 20.0
    assert s.unsettled == {"j.w.0"}
    assert s.node_tasks == {} and s.allocated("n1") == Resources()
    assert s.waiting == set()

    log.update("j.w.0", S.PENDING)
    assert s.unsettled == set()
    assert (t.state, t.node_id, t.finished_at) == (S.PENDING, "", None)
    assert s.waiting == {"j"} and s.jobs["j"].pending == 1

    log.place("j.w.0", "n2")
    assert (t.state, t.attempt, t.node_id) == (S.PLACED, 2, "n2")
    assert s.node_tasks == {"n2": {"j.w.0"}}
    assert t.failures == 0  # a loss is not a failure
    check_indexes(s)


def test_failures_are_counted_across_attempts():
    log = Log()
    log.submit("j", roles=(("w", 1),), retries=5)
    for attempt in (1, 2, 3):
        log.place("j.w.0", "n1")
        log.update("j.w.0", S.RUNNING)
        log.update("j.w.0", S.FAILED, exit_code=attempt, signal=None, message="boom")
        t = log.state.tasks["j.w.0"]
        assert (t.failures, t.exit_code, t.attempt) == (attempt, attempt, attempt)
        assert log.state.unsettled == {"j.w.0"}
        assert str(log.state.jobs["j"].state) == "PENDING"  # it will run again: not FAILED
        check_indexes(log.state)
        log.update("j.w.0", S.PENDING)
        assert log.state.unsettled == set()


def test_preempted_is_unsettled_until_requeued():
    log = Log()
    log.submit("j", roles=(("w", 1),))
    log.place("j.w.0", "n1")
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.PREEMPTED)
    assert log.state.unsettled == {"j.w.0"} and log.state.node_tasks == {}
    log.update("j.w.0", S.PENDING)
    assert log.state.unsettled == set() and log.state.waiting == {"j"}


# --------------------------------------------------------------------------- kill


def test_kill_request_marks_the_job_and_ends_when_its_tasks_do():
    log = Log()
    log.submit("j", roles=(("w", 3),))
    s = log.state
    log.place("j.w.0", "n1")
    log.update("j.w.0", S.RUNNING)
    log.append(JobKillRequested("j", 5.0, "user said so"))
    job = s.jobs["j"]
    assert job.kill_requested and job.kill_reason == "user said so"
    assert s.killing == {"j"}
    assert s.pending_jobs() == []  # a killed job is not placed any more
    assert s.waiting == {"j"}  # but its PENDING tasks still are PENDING

    log.append(JobKillRequested("j", 6.0, "again"))  # a second request changes nothing
    assert job.kill_reason == "user said so"

    log.update("j.w.1", S.KILLED)
    log.update("j.w.2", S.KILLED)
    assert s.killing == {"j"} and s.waiting == set()
    log.update("j.w.0", S.KILLED)
    assert s.killing == set()
    assert job.state == JobState.KILLED
    check_indexes(s)


def test_killing_keeps_a_job_whose_task_went_back_to_pending():
    # Race in the leader: a retry (FAILED -> PENDING) computed before the kill was applied is
    # appended after it, while the job's other task ended. The retried task is PENDING in a
    # killed job: pending_jobs() never places it, so only `killing` gets it KILLED.
    log = Log()
    log.submit("j", roles=(("a", 1), ("b", 1)), retries=3)
    s = log.state
    for tid in ("j.a.0", "j.b.0"):
        log.place(tid, "n1")
        log.update(tid, S.RUNNING)
    log.update("j.b.0", S.FAILED, exit_code=1)
    log.append(JobKillRequested("j", 5.0, "stop"))
    log.update("j.a.0", S.KILLED)
    log.update("j.b.0", S.PENDING, message="retry 1 of 3 after failure")
    assert s.tasks["j.b.0"].state == S.PENDING
    assert s.pending_jobs() == []
    assert "j" in s.killing, "a PENDING task of a killed job is left to wait forever"


def test_killing_does_not_hold_a_job_that_already_ended():
    # The API checks the job state before appending the kill, but the job may end before the
    # kill is applied; `killing` is "killed jobs with tasks not yet ended".
    log = Log()
    log.submit("j", roles=(("w", 1),))
    log.place("j.w.0", "n1")
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.SUCCEEDED, exit_code=0)
    log.append(JobKillRequested("j", 5.0, "late"))
    assert log.state.jobs["j"].kill_requested
    assert log.state.killing == set()


# --------------------------------------------------------------------------- seq and term


def test_reapplying_a_seq_is_a_no_op():
    log = Log()
    log.submit("j", roles=(("w", 1),))
    s = log.state
    entry = LogEntry(1, "c1", (TaskPlaced("j", "j.w.0", 1, "n1"),))
    assert s.apply(10, entry) is True
    before = snapshot(s)
    assert s.apply(10, entry) is False
    assert s.apply(9, LogEntry(1, "c1", (JobKillRequested("j"),))) is False
    assert s.apply(3, LogEntry(1, "c1", (JobSubmitted("k", "ck", job_spec(), 0.0),))) is False
    assert snapshot(s) == before
    assert s.last_seq == 10


def test_entries_with_a_lower_term_are_ignored():
    log = Log(term=1)
    log.submit("j", roles=(("w", 2),))
    log.term = 3
    log.append(LeaderElected(3, "c3"))
    s = log.state
    assert (s.term, s.leader_id) == (3, "c3")
    before = s.ignored
    assert log.append(TaskPlaced("j", "j.w.0", 1, "old"), JobKillRequested("j"), term=2) is True
    assert s.last_seq == log.seq  # consumed, not applied
    assert s.ignored == before + 2
    assert s.tasks["j.w.0"].state == S.PENDING and not s.jobs["j"].kill_requested
    assert log.append(TaskPlaced("j", "j.w.0", 1, "new"), term=3) is True
    assert s.tasks["j.w.0"].node_id == "new"
    log.term = 4
    log.append(TaskPlaced("j", "j.w.1", 1, "n4"))  # a higher term is fine
    assert s.tasks["j.w.1"].node_id == "n4"


def test_leader_elected_never_lowers_the_term():
    log = Log(term=5)
    log.append(LeaderElected(2, "old"), term=5)
    assert log.state.term == 5


# --------------------------------------------------------------------------- queries


def test_pending_jobs_by_priority_then_age():
    log = Log()
    log.submit("low", priority=1)
    log.submit("high", priority=9)
    log.submit("low2", priority=1)
    log.submit("mid", priority=5)
    log.append(JobKillRequested("mid"))
    assert [j.job_id for j in log.state.pending_jobs()] == ["high", "low", "low2"]
    for tid in ("high.w.0", "high.w.1"):
        log.place(tid, "n")
    assert [j.job_id for j in log.state.pending_jobs()] == ["low", "low2"]


# --------------------------------------------------------------------------- random sequences

JOBS = ["a", "b"]
CLIENTS = ["x", "y", "x2"]
NODES = ["n1", "n2"]
ROLES = (("w", 1), ("ps", 1))
TASK_IDS = [task_id_for(j, r, i) for j in JOBS for r, n in ROLES for i in range(n)] + ["ghost"]
# PLACED through TaskUpdated (not TaskPlaced) is covered by its own test below.
UPDATE_STATES = [s for s in TaskState if s != S.PLACED]


class Tape:
    """Choices read off a list of integers: one random tape drives a whole sequence."""

    def __init__(self, numbers: list[int]) -> None:
        self.numbers = numbers
        self.i = 0

    def pick(self, options):
        n = self.numbers[self.i] if self.i < len(self.numbers) else 0
        self.i += 1
        return options[n % len(options)]

    def below(self, n: int) -> int:
        return self.pick(range(n))


SPECS = [job_spec(roles=ROLES, retries=r) for r in (0, 1, 2)]
# GPU jobs too, so the per-GPU grants are folded (and released) under random events.
SPECS.append(job_spec(roles=ROLES))
SPECS[-1]["tasks"][0]["resources"].update({"gpu": 0.25, "gpu_memory": "1Gi"})
SPECS.append(job_spec(roles=ROLES))
SPECS[-1]["tasks"][0]["resources"].update({"gpu": 2, "gpu_memory": "2Gi"})
# Another pool and a non-preemptible job, so the per-pool sums are folded too.
SPECS.append({**job_spec(roles=ROLES), "pool": "/ml", "preemptible": False})
GPU_CHOICES = [(), ("g0",), ("g1",), ("g0", "g1")]


def next_event(tape: Tape, state: RegionState):
    kind = tape.pick(["update", "update", "update", "place", "place", "submit", "kill", "leader"])
    if kind == "submit":
        return JobSubmitted(tape.pick(JOBS), tape.pick(CLIENTS), tape.pick(SPECS), 0.0)
    if kind == "kill":
        return JobKillRequested(tape.pick(JOBS), 0.0, "r")
    if kind == "leader":
        return LeaderElected(max(0, state.term + tape.pick([0, 1, 1, -1])), "c")
    tid = tape.pick(TASK_IDS)
    t = state.tasks.get(tid)
    cur = t.attempt if t is not None else 0
    job_id = tid.split(".")[0]
    if kind == "place":
        return TaskPlaced(
            job_id,
            tid,
            tape.pick([cur + 1, cur + 1, cur, cur + 2, 0]),
            tape.pick(NODES),
            0.0,
            tape.pick(GPU_CHOICES),
        )
    attempt = tape.pick([cur, cur, cur, max(cur - 1, 0), cur + 1])
    legal = sorted(TRANSITIONS[t.state] - {S.PLACED}) if t is not None else []
    if legal and tape.below(4):
        new = tape.pick(legal)  # mostly moves that apply, to go deep
    else:
        new = tape.pick(UPDATE_STATES)
    return TaskUpdated(job_id, tid, attempt, new, "", 0.0)


def placement_inputs(state: RegionState):
    """Everything placement and the pools read from the state."""
    return (
        [
            (j.job_id, sorted(t.task_id for t in j.tasks.values() if t.state == S.PENDING))
            for j in state.pending_jobs()
        ],
        {
            j: sorted(t.node_id for t in job.tasks.values() if t.state in HOLDING)
            for j, job in state.jobs.items()
        },
        dict(state.node_alloc),
        dict(state.gpu_alloc),
        dict(state.pool_alloc),
        dict(state.pool_fixed),
        state.pool_source,
        sorted(state.preempting),
    )


def run_sequence(numbers: list[int], record=note) -> None:
    tape = Tape(numbers)
    s = RegionState()
    seq = 0
    ignored = 0
    while tape.i < len(numbers):
        events = tuple(next_event(tape, s) for _ in range(1 + tape.below(3)))
        term = max(0, s.term + tape.pick([0, 0, 0, 0, 0, 1, -1]))  # now and then a stale one
        if seq and tape.below(10) == 0:
            replay = 1 + tape.below(seq)
            before = snapshot(s)
            assert s.apply(replay, LogEntry(term, "c", events)) is False
            assert snapshot(s) == before
            continue
        attempts = {tid: t.attempt for tid, t in s.tasks.items()}
        seq += 1 + tape.below(3)
        record(f"apply({seq}, term={term}): {events}")
        epoch, inputs = s.epoch, placement_inputs(s)
        mark, queue = s.queue_changes.mark(), {j.job_id for j in s.pending_jobs()}
        assert s.apply(seq, LogEntry(term, "c", events)) is True
        assert s.epoch >= epoch
        if s.epoch == epoch:  # rounds skip work on this: nothing they read may have moved
            assert placement_inputs(s) == inputs
        # Rounds keep their list of waiting jobs from this journal: every job that
        # joined or left it (or was killed in it) must be named.
        moved = s.queue_changes.since(mark)
        assert moved is not None and {j.job_id for j in s.pending_jobs()} ^ queue <= moved
        assert s.last_seq == seq
        assert s.ignored >= ignored
        ignored = s.ignored
        for tid, t in s.tasks.items():
            assert t.attempt >= attempts.get(tid, 0)
        check_indexes(s)
        assert s.killing <= {j for j, job in s.jobs.items() if job.kill_requested}
        assert killing_needed(s) <= s.killing


SEQUENCES = settings(
    max_examples=300,
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(SEQUENCES, phases=(Phase.explicit, Phase.generate))  # a seed does not shrink
@given(st.integers(0, 2**32 - 1))
def test_indexes_stay_consistent_under_any_event_sequence(seed):
    # Uniform tapes from a seed: hypothesis's own lists favour small numbers and short
    # lengths, which rarely get several jobs through kill, failure and retry (and long
    # lists are slow to draw and to shrink). The failing example's entries are printed.
    rnd = random.Random(seed)
    run_sequence([rnd.randrange(256) for _ in range(400)])


def test_pending_to_placed_through_an_update_books_the_node():
    # PENDING -> PLACED is a legal transition, so the fold accepts it from a TaskUpdated too;
    # it must then hold the task on a node like a TaskPlaced does, or the node looks free
    # while the task counts as placed (and a later placement over-commits it).
    log = Log()
    log.submit("j", roles=(("w", 1),))
    log.append(TaskUpdated("j", "j.w.0", 0, S.PLACED, "n1", 1.0))
    # Either refused (still PENDING, nothing moved) or booked on a node: both keep the indexes.
    check_indexes(log.state)


def test_counts_of_tasks_by_state_match_job_summary():
    log = Log()
    log.submit("j", roles=(("w", 3),))
    log.place("j.w.0", "n1")
    log.update("j.w.0", S.RUNNING)
    log.place("j.w.1", "n2")
    summary = log.state.jobs["j"].summary()
    assert summary["task_states"] == dict(Counter(["RUNNING", "PLACED", "PENDING"]))
    assert summary["state"] == "RUNNING"
