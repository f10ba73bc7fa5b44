"""reconcile(): the leader's pure decisions, one rule at a time, over states built by folding
real log events (RegionState.apply) and hand-made node views."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from coordinator.cluster import DOWN, READY, SUSPECT, ClusterView, NodeView
from coordinator.reconcile import FORGOTTEN_AFTER_S, Decisions, reconcile
from coordinator.records import HOLDING
from coordinator.reports import Kill
from coordinator.state import RegionState
from mesh.schema import (
    JobKillRequested,
    JobSubmitted,
    LeaderElected,
    LogEntry,
    NodeState,
    TaskPlaced,
    TaskUpdated,
)
from workloads.lifecycle import JobState, TaskState
from workloads.resources import Resources

S = TaskState
GiB = 2**30
NOW = 1000.0


def job_spec(
    name="job",
    *,
    count=2,
    retries=0,
    on_lost=True,
    simulate=False,
    cpu="1",
    memory="1Gi",
    priority=0,
) -> dict:
    group = {"role": "w", "count": count, "resources": {"cpu": cpu, "memory": memory}}
    if simulate:
        group["simulate"] = {"duration": 1.0}
    else:
        group["command"] = ["true"]
    return {
        "name": name,
        "priority": priority,
        "restart": {"max_retries": retries, "reschedule_on_lost": on_lost},
        "tasks": [group],
    }


class Log:
    """A job log folded into a RegionState, as the leader's shell does."""

    def __init__(self) -> None:
        self.state = RegionState()
        self.seq = 0
        self.append(LeaderElected(1, "c1"))

    def append(self, *events) -> None:
        self.seq += 1
        assert self.state.apply(self.seq, LogEntry(1, "c1", tuple(events)))

    def submit(self, job_id: str, **kw) -> None:
        self.append(JobSubmitted(job_id, f"client-{job_id}", job_spec(**kw), 1.0))

    def place(self, tid: str, node: str) -> None:
        t = self.state.tasks[tid]
        self.append(TaskPlaced(t.job_id, tid, t.attempt + 1, node, 2.0))

    def update(self, tid: str, state: TaskState, **kw) -> None:
        t = self.state.tasks[tid]
        self.append(TaskUpdated(t.job_id, tid, t.attempt, state, t.node_id, 3.0, **kw))

    def run(self, tid: str, node: str) -> None:
        self.place(tid, node)
        self.update(tid, S.RUNNING)

    def occupy(self, job_id: str, node: str, **kw) -> None:
        """A one-task job RUNNING on `node`, holding what it asked for there."""
        self.submit(job_id, count=1, **kw)
        self.run(f"{job_id}.w.0", node)

    def decide(self, nodes: ClusterView, now: float = NOW) -> Decisions:
        return reconcile(self.state, nodes, now)

    def step(self, nodes: ClusterView, now: float = NOW) -> Decisions:
        """One round: decide, then append and apply what was decided."""
        d = self.decide(nodes, now)
        if d.events:
            self.append(*d.events)
        return d


def view(
    node_id: str,
    status: str = READY,
    *,
    cpu: int = 8000,
    memory: int = 16 * GiB,
    simulated: bool = False,
    tasks: tuple[str, ...] = (),
    address: str = "",
    port_range: tuple[int, int] = (0, 0),
) -> NodeView:
    state = NodeState(
        node_id=node_id,
        region="r",
        seq=1,
        ts=0.0,
        capacity=Resources(cpu=cpu, memory=memory),
        simulated=simulated,
        tasks=tuple(tasks),
        address=address,
        port_range=port_range,
    )
    return NodeView(state, last_seen=0.0, status=status)


HEARD = 100.0  # the receiver's clock when a test's cluster view is made
AGE = {READY: 0.0, SUSPECT: 3.0, DOWN: 10.0}  # heartbeat age that gives each status


def cluster(*views: NodeView) -> ClusterView:
    """A cluster view holding these nodes at their statuses, as heartbeats and a sweep
    set them (oldest heartbeat first, as the receiver's clock runs)."""
    cv = ClusterView("r", suspect_after=AGE[SUSPECT], down_after=AGE[DOWN])
    for v in sorted(views, key=lambda v: -AGE[v.status]):
        cv.observe(v.state, HEARD - AGE[v.status])
    cv.sweep(HEARD)
    assert {v.node_id: v.status for v in views} == {n: v.status for n, v in cv.nodes.items()}
    return cv


def updates(d: Decisions) -> list[tuple[str, TaskState]]:
    return [(e.task_id, e.state) for e in d.events if isinstance(e, TaskUpdated)]


def placements(d: Decisions) -> list[tuple[str, str, int]]:
    return [(e.task_id, e.node_id, e.attempt) for e in d.events if isinstance(e, TaskPlaced)]


def snapshot(state: RegionState):
    return (
        state.last_seq,
        state.ignored,
        sorted(state.waiting),
        sorted(state.unsettled),
        sorted(state.killing),
        sorted((n, sorted(t)) for n, t in state.node_tasks.items()),
        sorted(
            (tid, str(t.state), t.attempt, t.node_id, t.failures) for tid, t in state.tasks.items()
        ),
    )


# --------------------------------------------------------------------------- lost nodes


def test_tasks_on_a_down_node_become_lost():
    log = Log()
    log.submit("j", count=3)
    log.run("j.w.0", "n1")
    log.place("j.w.1", "n1")  # PLACED holds the node too
    log.run("j.w.2", "n2")
    nodes = cluster(view("n1", DOWN), view("n2"))
    d = log.decide(nodes)
    assert updates(d) == [("j.w.0", S.LOST), ("j.w.1", S.LOST)]
    for e in d.events:
        assert (e.attempt, e.node_id, e.ts) == (1, "n1", NOW)
        assert "n1" in e.message
    assert placements(d) == [] and d.kills == []
    log.append(*d.events)
    assert log.state.tasks["j.w.0"].state == S.LOST
    assert "n1" not in log.state.node_tasks
    assert log.state.node_tasks == {"n2": {"j.w.2"}}


@pytest.mark.parametrize("status", [READY, SUSPECT])
def test_tasks_on_a_live_or_suspect_node_are_not_lost(status):
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")
    d = log.decide(cluster(view("n1", status, tasks=("j.w.0#1",))))
    assert d.events == [] and d.kills == []


def test_a_node_missing_from_the_view_does_not_lose_its_tasks():
    # the shell seeds nodes it never heard from; reconcile itself only acts on DOWN
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "gone")
    assert log.decide(cluster(view("other"))).events == []


def test_lost_with_reschedule_on_lost_goes_back_to_pending_then_is_placed_again():
    log = Log()
    log.submit("j", count=1, on_lost=True)
    log.run("j.w.0", "n1")
    nodes = cluster(view("n1", DOWN), view("n2"))
    d = log.step(nodes)
    assert updates(d) == [("j.w.0", S.LOST)]
    d = log.step(nodes)
    assert updates(d) == [("j.w.0", S.PENDING)]
    assert d.events[0].attempt == 1
    assert "node loss" in d.events[0].message
    assert placements(d) == []  # placed in the next round, from a settled state
    d = log.step(nodes)
    assert placements(d) == [("j.w.0", "n2", 2)]
    t = log.state.tasks["j.w.0"]
    assert (t.state, t.attempt, t.node_id) == (S.PLACED, 2, "n2")
    assert log.step(nodes).events == []


def test_lost_without_reschedule_on_lost_stays_lost():
    log = Log()
    log.submit("j", count=1, on_lost=False)
    log.run("j.w.0", "n1")
    nodes = cluster(view("n1", DOWN), view("n2"))
    log.step(nodes)
    d = log.step(nodes)
    assert d.events == [] and d.kills == []
    assert log.state.tasks["j.w.0"].state == S.LOST
    assert log.state.jobs["j"].state == JobState.FAILED


# --------------------------------------------------------------------------- retries


def test_failed_with_retries_left_goes_back_to_pending_until_exhausted():
    log = Log()
    log.submit("j", count=1, retries=2)
    nodes = cluster(view("n1"))
    for attempt in (1, 2, 3):
        d = log.step(nodes)
        assert placements(d) == [("j.w.0", "n1", attempt)]
        log.update("j.w.0", S.RUNNING)
        log.update("j.w.0", S.FAILED, exit_code=1)
        d = log.step(nodes)
        if attempt <= 2:
            assert updates(d) == [("j.w.0", S.PENDING)]
            assert d.events[0].message == f"retry {attempt} of 2 after failure"
        else:
            assert d.events == []  # 3 failures: 1 run + 2 retries used up
    t = log.state.tasks["j.w.0"]
    assert (t.state, t.failures, t.attempt) == (S.FAILED, 3, 3)
    assert log.state.jobs["j"].state == JobState.FAILED


def test_failed_without_retries_ends_the_task():
    log = Log()
    log.submit("j", count=1, retries=0)
    log.run("j.w.0", "n1")
    log.update("j.w.0", S.FAILED, exit_code=2)
    d = log.decide(cluster(view("n1")))
    assert d.events == [] and d.kills == []


def test_preempted_is_requeued():
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")
    log.update("j.w.0", S.PREEMPTED)
    d = log.decide(cluster(view("n1")))
    assert updates(d) == [("j.w.0", S.PENDING)]
    assert placements(d) == []


def test_losses_and_preemptions_do_not_use_up_retries():
    log = Log()
    log.submit("j", count=1, retries=0)
    nodes = cluster(view("n1"))
    log.step(nodes)
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.PREEMPTED)
    assert updates(log.step(nodes)) == [("j.w.0", S.PENDING)]
    log.step(nodes)
    log.update("j.w.0", S.LOST)
    assert updates(log.step(nodes)) == [("j.w.0", S.PENDING)]


# --------------------------------------------------------------------------- kills


def killed_job_log(reason: str = "user asked") -> Log:
    log = Log()
    log.submit("j", count=3)
    log.run("j.w.0", "n1")
    log.place("j.w.1", "n2")
    log.update("j.w.1", S.PENDING)  # placement undone: PENDING again, attempt 1
    log.append(JobKillRequested("j", 5.0, reason))
    return log


def test_killed_job_kills_pending_tasks_and_stops_running_ones():
    log = killed_job_log()
    nodes = cluster(view("n1"), view("n2"))
    d = log.decide(nodes)
    assert sorted(updates(d)) == [("j.w.1", S.KILLED), ("j.w.2", S.KILLED)]
    by_task = {e.task_id: e for e in d.events}
    assert by_task["j.w.1"].attempt == 1 and by_task["j.w.2"].attempt == 0
    assert all(e.message == "user asked" for e in d.events)
    assert d.kills == [Kill("n1", "j", "j.w.0", 1, "user asked")]
    assert placements(d) == []


def test_killed_job_is_never_placed():
    log = Log()
    log.submit("j", count=1)
    log.append(JobKillRequested("j", 5.0, ""))
    d = log.step(cluster(view("n1")))
    assert updates(d) == [("j.w.0", S.KILLED)]
    assert d.events[0].message == "job killed"  # a default reason
    d = log.step(cluster(view("n1")))
    assert d.events == [] and d.kills == [] and d.unplaced == {}
    assert log.state.jobs["j"].state == JobState.KILLED
    assert log.state.killing == set()


def test_kill_is_resent_until_the_agent_reports_it():
    log = killed_job_log()
    nodes = cluster(view("n1"), view("n2"))
    log.step(nodes)
    again = log.decide(nodes)
    assert again.events == []
    assert again.kills == [Kill("n1", "j", "j.w.0", 1, "user asked")]
    log.update("j.w.0", S.KILLED)
    done = log.decide(nodes)
    assert done.events == [] and done.kills == []
    assert log.state.jobs["j"].state == JobState.KILLED


@pytest.mark.parametrize("ended", [S.LOST, S.PREEMPTED])
def test_killed_job_ends_lost_and_preempted_tasks_as_killed(ended):
    log = Log()
    log.submit("j", count=1, on_lost=True)
    log.run("j.w.0", "n1")
    log.update("j.w.0", ended)
    log.append(JobKillRequested("j", 5.0, "stop"))
    d = log.decide(cluster(view("n1")))
    assert updates(d) == [("j.w.0", S.KILLED)]
    assert d.events[0].message == "stop"


def test_killed_job_does_not_retry_a_failed_task():
    log = Log()
    log.submit("j", count=1, retries=5)
    log.run("j.w.0", "n1")
    log.update("j.w.0", S.FAILED, exit_code=1)
    log.append(JobKillRequested("j", 5.0, "stop"))
    d = log.decide(cluster(view("n1")))
    assert d.events == [] and d.kills == []


# --------------------------------------------------------------------------- stale copies


def moved_task_log() -> Log:
    """j.w.0 ran on n1 (attempt 1), was lost and now runs on n2 (attempt 2)."""
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")
    log.update("j.w.0", S.LOST)
    log.update("j.w.0", S.PENDING)
    log.run("j.w.0", "n2")
    return log


def test_a_copy_reported_by_a_node_it_is_not_assigned_to_is_killed():
    log = moved_task_log()
    d = log.decide(cluster(view("n1", tasks=("j.w.0#1",)), view("n2", tasks=("j.w.0#2",))))
    assert d.kills == [
        Kill("n1", "j", "j.w.0", 1, "stale copy: this attempt is no longer assigned to this node")
    ]
    assert d.events == []


def test_an_old_attempt_on_the_assigned_node_is_killed():
    log = moved_task_log()
    d = log.decide(cluster(view("n2", tasks=("j.w.0#1", "j.w.0#2"))))
    assert [(k.node_id, k.task_id, k.attempt) for k in d.kills] == [("n2", "j.w.0", 1)]


def test_a_suspect_node_reporting_a_stale_copy_is_told_to_kill_it():
    log = moved_task_log()
    d = log.decide(cluster(view("n1", SUSPECT, tasks=("j.w.0#1",)), view("n2")))
    assert [(k.node_id, k.attempt) for k in d.kills] == [("n1", 1)]


def test_a_down_nodes_last_report_is_not_acted_on():
    log = moved_task_log()
    d = log.decide(cluster(view("n1", DOWN, tasks=("j.w.0#1",)), view("n2")))
    assert d.kills == []


def test_a_copy_of_a_finished_task_is_killed():
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")
    log.update("j.w.0", S.SUCCEEDED, exit_code=0)
    d = log.decide(cluster(view("n1", tasks=("j.w.0#1",))))
    assert [(k.node_id, k.task_id, k.attempt) for k in d.kills] == [("n1", "j.w.0", 1)]


@pytest.mark.parametrize(
    "key",
    [
        "garbage",
        "j.w.0",
        "j.w.0#",
        "j.w.0#x",
        "j.w.0#-1",
        "#1",
        "nope#1",
        "j.w.0#1.5",
        "j.w.0# 1",
        "",
    ],
)
def test_malformed_or_unknown_live_task_keys_are_ignored(key):
    log = moved_task_log()
    d = log.decide(cluster(view("n2", tasks=(key, "j.w.0#2"))))
    assert d.kills == [] and d.events == []


@pytest.mark.parametrize("key", ["j.w.0#\u00b2", "j.w.0#\u2460", "j.w.0#1\u00b9"])
def test_non_decimal_digits_in_a_live_task_key_do_not_crash_reconcile(key):
    # str.isdigit() is True for superscripts and circled digits, but int() refuses them; a
    # heartbeat's `tasks` comes from an agent over the wire and is only length-checked.
    log = moved_task_log()
    d = log.decide(cluster(view("n2", tasks=(key, "j.w.0#2"))))
    assert d.kills == [] and d.events == []


# --------------------------------------------------------------------------- placement


def test_placement_waits_while_other_events_are_pending_in_the_round():
    log = Log()
    log.submit("a", count=1)
    log.submit("b", count=1)
    log.run("b.w.0", "n1")
    nodes = cluster(view("n1", DOWN), view("n2"))
    d = log.step(nodes)
    assert updates(d) == [("b.w.0", S.LOST)]
    assert placements(d) == []  # "a" waits although n2 has room
    d = log.step(nodes)
    assert updates(d) == [("b.w.0", S.PENDING)]
    assert placements(d) == []
    d = log.step(nodes)
    assert sorted(placements(d)) == [("a.w.0", "n2", 1), ("b.w.0", "n2", 2)]


def test_kills_alone_do_not_hold_placement_back():
    log = moved_task_log()
    log.submit("k", count=1)
    d = log.decide(cluster(view("n1", tasks=("j.w.0#1",)), view("n2")))
    assert len(d.kills) == 1
    assert [p[0] for p in placements(d)] == ["k.w.0"]


def test_suspect_and_down_nodes_get_no_new_placements():
    log = Log()
    log.submit("j", count=1, cpu="1")
    d = log.decide(
        cluster(
            view("big", SUSPECT, cpu=64000), view("small", cpu=1000), view("dead", DOWN, cpu=64000)
        )
    )
    assert placements(d) == [("j.w.0", "small", 1)]
    d = log.decide(cluster(view("big", SUSPECT, cpu=64000), view("dead", DOWN)))
    assert placements(d) == []
    assert d.unplaced["j"].endswith("no ready nodes")


def test_placement_counts_what_the_node_already_holds():
    log = Log()
    log.occupy("old", "a", cpu="3")
    log.submit("new", count=1, cpu="2")
    d = log.decide(cluster(view("a", cpu=4000), view("b", cpu=8000)))
    # a has 1 core left: the 2-core task must go to b although a is the tighter node on paper
    assert placements(d) == [("new.w.0", "b", 1)]


def test_a_gang_waits_whole_and_says_why():
    log = Log()
    log.submit("j", count=3, cpu="4")
    d = log.decide(cluster(view("a", cpu=8000)))
    assert placements(d) == []
    # 12 cores asked of an 8-core region: it can never fit, and says so
    assert d.unplaced["j"].startswith(
        "can never fit the region as it is: needs 12 cpu in one gang; the region has 8 cpu "
        "in 1 ready node"
    )
    busy = Log()
    busy.occupy("old", "a", cpu="4")
    busy.submit("j", count=3, cpu="4")
    d = busy.decide(cluster(view("a", cpu=12000)))
    assert placements(d) == []  # it fits the idle node, not the busy one: admission says so
    assert d.unplaced["j"] == "pool /: cpu allocation 4 + job 12 > entitlement 12"
    fragmented = Log()
    fragmented.occupy("old", "c", cpu="4")
    fragmented.submit("j", count=3, cpu="4")
    d = fragmented.decide(cluster(view("a", cpu=6000), view("b", cpu=6000), view("c", cpu=6000)))
    assert placements(d) == []  # 14 of 18 cores free, but only 2 tasks fit: none start
    assert "fits no node" in d.unplaced["j"] and "3 nodes: insufficient cpu" in d.unplaced["j"]
    log2 = Log()
    log2.submit("j", count=3, cpu="4")
    d = log2.decide(cluster(view("a", cpu=8000), view("b", cpu=4000)))
    assert sorted(p[1] for p in placements(d)) == ["a", "a", "b"]


def test_simulated_jobs_go_to_simulated_nodes():
    log = Log()
    log.submit("sim", count=1, simulate=True)
    log.submit("real", count=1)
    d = log.decide(cluster(view("hollow", simulated=True), view("metal")))
    assert sorted(placements(d)) == [("real.w.0", "metal", 1), ("sim.w.0", "hollow", 1)]


def test_higher_priority_job_is_placed_first():
    log = Log()
    log.submit("low", count=1, cpu="4", priority=1)
    log.submit("high", count=1, cpu="4", priority=10)
    d = log.decide(cluster(view("a", cpu=4000)))
    assert placements(d) == [("high.w.0", "a", 1)]
    assert set(d.unplaced) == {"low"}


def test_nothing_to_do():
    log = Log()
    d = log.decide(cluster(view("a")))
    assert (d.events, d.kills, d.unplaced) == ([], [], {})


def test_reconcile_does_not_change_the_state():
    log = killed_job_log()
    log.submit("other", count=2)
    log.run("other.w.0", "n3")
    nodes = cluster(view("n1"), view("n2", tasks=("j.w.1#1",)), view("n3", DOWN))
    before = snapshot(log.state)
    first = log.decide(nodes)
    assert snapshot(log.state) == before
    second = log.decide(nodes)
    assert (first.events, first.kills, first.unplaced) == (
        second.events,
        second.kills,
        second.unplaced,
    )


def test_a_node_that_was_down_and_comes_back_has_its_stale_copy_killed():
    log = Log()
    log.submit("j", count=1)
    nodes = cluster(view("n1"), view("n2", cpu=4000))
    log.step(nodes)  # best fit: n2
    assert log.state.tasks["j.w.0"].node_id == "n2"
    log.update("j.w.0", S.RUNNING)
    # n1 heartbeats on; n2 falls silent until it is DOWN (the same view, kept).
    nodes.observe(nodes.nodes["n1"].state, HEARD + AGE[DOWN])
    assert nodes.sweep(HEARD + AGE[DOWN]) == ["n2"]
    for _ in range(3):
        log.step(nodes)
    t = log.state.tasks["j.w.0"]
    assert (t.state, t.node_id, t.attempt) == (S.PLACED, "n1", 2)
    # n2 is back, still running the old copy.
    nodes.observe(view("n2", tasks=("j.w.0#1",)).state, HEARD + AGE[DOWN] + 1)
    d = log.step(nodes)
    assert d.kills == [
        Kill("n2", "j", "j.w.0", 1, "stale copy: this attempt is no longer assigned to this node")
    ]
    assert d.events == []


# --------------------------------------------------------------------------- random rounds


def run_rounds(seed: int) -> None:
    """Random jobs, nodes and outcomes driven round after round: whatever happens, a READY
    node is never given more than its capacity, and nothing is placed on a node that is not
    READY."""
    rnd = random.Random(seed)
    log = Log()
    statuses = [READY, READY, READY, SUSPECT, DOWN]
    nodes = cluster(
        *(
            view(
                f"n{i}",
                rnd.choice(statuses),
                cpu=rnd.choice([2000, 4000, 8000]),
                memory=rnd.choice([2, 4, 8]) * GiB,
                simulated=rnd.random() < 0.2,
            )
            for i in range(rnd.randint(1, 4))
        )
    )
    silent = {n for n, v in nodes.nodes.items() if v.status != READY}
    clock = HEARD
    for j in range(rnd.randint(1, 5)):
        log.submit(
            f"j{j}",
            count=rnd.randint(1, 3),
            cpu=str(rnd.randint(1, 4)),
            memory=f"{rnd.randint(1, 3)}Gi",
            retries=rnd.randint(0, 2),
            on_lost=rnd.random() < 0.7,
            simulate=rnd.random() < 0.2,
            priority=rnd.randint(0, 3),
        )
    for _ in range(30):
        if rnd.random() < 0.15:
            log.append(JobKillRequested(f"j{rnd.randrange(5)}", 0.0, "r"))
        before = {tid: (t.state, t.node_id) for tid, t in log.state.tasks.items()}
        d = log.step(nodes)
        for e in d.events:
            if isinstance(e, TaskPlaced):
                assert nodes.nodes[e.node_id].status == READY
                assert before[e.task_id][0] == S.PENDING
        for k in d.kills:
            assert k.node_id in nodes.nodes or k.node_id in {n for _, n in before.values()}
        for n, v in nodes.nodes.items():
            if v.status == READY:
                assert log.state.allocated(n).fits_in(v.state.capacity), n
        # agents move some running tasks along
        for tid, t in list(log.state.tasks.items()):
            down = nodes.nodes[t.node_id].status == DOWN if t.node_id else True
            if t.state in HOLDING and not down and rnd.random() < 0.5:
                log.update(
                    tid, rnd.choice([S.RUNNING, S.SUCCEEDED, S.FAILED, S.PREEMPTED, S.KILLED])
                )
        # nodes fall silent or speak again; the others heartbeat what they hold (the
        # same view kept round after round, as the leader keeps it)
        if rnd.random() < 0.3:
            silent ^= {rnd.choice(sorted(nodes.nodes))}
        clock += rnd.choice([0.5, 2.0, 4.0])
        for n in sorted(nodes.nodes.keys() - silent):
            st = nodes.nodes[n].state
            held = tuple(
                f"{t.task_id}#{t.attempt}"
                for t in log.state.tasks.values()
                if t.node_id == n and t.state in HOLDING and rnd.random() < 0.9
            )
            nodes.observe(dataclasses.replace(st, seq=st.seq + 1, ts=clock, tasks=held), clock)
        nodes.sweep(clock)
    # all indexes still agree with a scan
    s = log.state
    assert s.unsettled == {
        tid for tid, t in s.tasks.items() if t.state in (S.FAILED, S.LOST, S.PREEMPTED)
    }
    assert s.waiting == {
        j for j, job in s.jobs.items() if any(t.state == S.PENDING for t in job.tasks.values())
    }


@settings(
    max_examples=150,
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=(Phase.explicit, Phase.generate),
)  # a seed does not shrink
@given(st.integers(0, 2**32 - 1))
def test_random_rounds_never_over_commit_a_ready_node(seed):
    run_rounds(seed)


def test_no_pending_task_is_left_behind_when_there_is_room():
    # Jobs of every kind, one roomy node, agents that finish everything: the log drains.
    log = Log()
    for j in range(4):
        log.submit(f"j{j}", count=2, retries=1)
    nodes = cluster(view("n1", cpu=64000, memory=64 * GiB))
    for _ in range(10):
        log.step(nodes)
        for tid, t in log.state.tasks.items():
            if t.state in HOLDING:
                log.update(tid, S.SUCCEEDED, exit_code=0)
    assert all(job.state == JobState.SUCCEEDED for job in log.state.jobs.values())
    assert log.decide(nodes).events == []


def beat(node_id: str, seq: int, ts: float, tasks: tuple[str, ...] = ()) -> NodeView:
    """A heartbeat with its own sequence and (agent-clock) time."""
    v = view(node_id, tasks=tasks)
    v.state = dataclasses.replace(v.state, seq=seq, ts=ts)
    return v


def heard(kept: ClusterView | None):
    """Each heartbeat as a view of its own (every node looked at), or into one view kept
    round after round, as the leader keeps it (only the nodes that heartbeat since)."""
    clock = iter(range(1000))

    def next_view(v: NodeView) -> ClusterView:
        if kept is None:
            return cluster(v)
        kept.observe(v.state, HEARD + next(clock) * 0.01)
        kept.observe(beat("other", next(clock), 0.0).state, HEARD + next(clock) * 0.01)
        return kept

    return next_view


def events(nodes: ClusterView, checks: int, checked: int, last: int, floor: int) -> ClusterView:
    """The leader's checks of the events stream, as its shell records them: `checks`
    begun, the last completed being number `checked`, which read the stream's last
    sequence `last` and the consumer acknowledged up to `floor`."""
    nodes.events_checks, nodes.events_checked = checks, checked
    nodes.events_last, nodes.events_floor = last, floor
    return nodes


@pytest.mark.parametrize("kept", [False, True])
def test_a_running_task_its_node_stopped_listing_is_lost_after_a_while(kept):
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")  # RUNNING since ts 3.0 (the agent's clock)
    nodes = heard(cluster() if kept else None)
    assert updates(log.step(events(nodes(beat("n1", 2, 4.0, ("j.w.0#1",))), 1, 1, 5, 5))) == []
    # The agent restarted without it: missing, but not yet for FORGOTTEN_AFTER_S.
    assert updates(log.step(events(nodes(beat("n1", 3, 5.0)), 1, 1, 5, 5))) == []
    late = 5.0 + FORGOTTEN_AFTER_S - 0.1
    assert updates(log.step(events(nodes(beat("n1", 4, late)), 2, 2, 6, 6))) == []
    d = log.step(events(nodes(beat("n1", 5, 5.0 + FORGOTTEN_AFTER_S)), 2, 2, 6, 6))
    assert updates(d) == [("j.w.0", S.LOST)]
    assert "node n1 has not reported it for 10s" in d.events[0].message


def missed_long_enough(kept: bool):
    """A RUNNING task its node stopped listing at ts 5.0 (the events stream then at 7,
    all handled), and the agent's clock FORGOTTEN_AFTER_S later."""
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")
    nodes = heard(cluster() if kept else None)
    log.step(events(nodes(beat("n1", 2, 5.0)), 1, 1, 7, 7))
    return log, nodes, 5.0 + FORGOTTEN_AFTER_S


@pytest.mark.parametrize("kept", [False, True])
def test_a_forgotten_task_waits_until_the_events_stored_before_are_handled(kept):
    """Its node stops listing an ended task once the outcome is in the events stream:
    while the leader has not logged it (the log's server died, a failover), LOST would
    run a task again that succeeded."""
    log, nodes, ts = missed_long_enough(kept)
    # Long enough by the agent's clock, but no check of the events began since.
    assert updates(log.step(events(nodes(beat("n1", 3, ts)), 1, 1, 7, 7))) == []
    # One began, not done yet; then done: the stream held up to 9, handled up to 8.
    assert updates(log.step(events(nodes(beat("n1", 4, ts + 1)), 2, 1, 7, 7))) == []
    assert updates(log.step(events(nodes(beat("n1", 5, ts + 2)), 2, 2, 9, 8))) == []
    # A later check: handled past 9 (more events came meanwhile): nobody logged an end.
    d = log.step(events(nodes(beat("n1", 6, ts + 3)), 3, 3, 12, 9))
    assert updates(d) == [("j.w.0", S.LOST)]


@pytest.mark.parametrize("kept", [False, True])
def test_a_forgotten_task_whose_outcome_is_logged_meanwhile_is_not_lost(kept):
    log, nodes, ts = missed_long_enough(kept)
    assert updates(log.step(events(nodes(beat("n1", 3, ts)), 2, 2, 9, 8))) == []
    log.update("j.w.0", S.SUCCEEDED, exit_code=0)  # event 9: logged, then acknowledged
    d = log.step(events(nodes(beat("n1", 4, ts + 1)), 3, 3, 9, 9))
    assert updates(d) == [] and placements(d) == []
    assert log.state.tasks["j.w.0"].state == S.SUCCEEDED


@pytest.mark.parametrize("kept", [False, True])
def test_an_events_stream_made_again_counts_from_what_it_holds(kept):
    log, nodes, ts = missed_long_enough(kept)
    assert updates(log.step(events(nodes(beat("n1", 3, ts)), 2, 2, 9, 8))) == []
    # Deleted and made again: it holds 2 events, both handled; 9 is gone for good.
    d = log.step(events(nodes(beat("n1", 4, ts + 1)), 3, 3, 2, 2))
    assert updates(d) == [("j.w.0", S.LOST)]


@pytest.mark.parametrize("kept", [False, True])
def test_a_task_listed_again_in_time_is_not_lost(kept):
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")
    nodes = heard(cluster() if kept else None)
    log.step(nodes(beat("n1", 2, 5.0)))  # missing once (e.g. it just ended)
    log.step(nodes(beat("n1", 3, 6.0, ("j.w.0#1",))))  # listed again: forgotten no more
    assert updates(log.step(nodes(beat("n1", 4, 6.0 + FORGOTTEN_AFTER_S)))) == []


def test_a_round_looks_past_windows_where_nothing_fits():
    """A long queue is looked at a window at a time; windows where nothing fits are passed
    over in the same round, so a job far back that fits is placed at once."""
    from coordinator.scheduling import PlacementConfig

    log = Log()
    for i in range(30):
        log.submit(f"big{i:02d}", count=1, cpu="64")  # fits no node
    log.submit("small", count=1, cpu="1")
    config = PlacementConfig(window_jobs=2, windows_per_round=20)
    d = reconcile(log.state, cluster(view("a", cpu=4000)), NOW, config)
    assert placements(d) == [("small.w.0", "a", 1)]
    assert "can never fit" in d.unplaced["big00"]  # set aside, and saying so
    one = PlacementConfig(window_jobs=2, windows_per_round=1)  # one window per round
    d = reconcile(log.state, cluster(view("a", cpu=4000)), NOW, one)
    assert placements(d) == []


def spy_on_placement(monkeypatch, step: str = "place_jobs") -> list[list[str]]:
    """The job ids each call of reconcile's `step` (placement, or admission) is given,
    in order."""
    import coordinator.reconcile as rec

    looked: list[list[str]] = []
    real = getattr(rec, step)

    def spy(state, arg, jobs, *a, **kw):
        looked.append([j.job_id for j in jobs])
        return real(state, arg, jobs, *a, **kw)

    monkeypatch.setattr(rec, step, spy)
    return looked


def test_a_job_that_fits_no_node_is_parked_until_something_could_make_room(monkeypatch):
    """A job that fits no node is not placed again by every round (each new job made the
    whole backlog be re-placed): it is passed over, still saying why, until a node whose
    row changed (grants or what it measured) has room for one of its tasks, or the
    ready nodes change. Time alone, or a heartbeat that measured the same, lets it be."""
    looked = spy_on_placement(monkeypatch)
    log = Log()
    log.occupy("old", "a", cpu="2")
    log.occupy("tiny", "b", cpu="1")
    log.submit("wide", count=1, cpu="7")  # a: 6 of 8 cores free, b: 5 of 6
    nodes = cluster(view("a", cpu=8000), view("b", cpu=6000))
    d = log.step(nodes)
    assert placements(d) == [] and "fits no node" in d.unplaced["wide"]
    assert looked == [["wide"]]
    log.submit("small", count=1, cpu="1")
    d = log.step(nodes, NOW + 0.1)
    assert [p[0] for p in placements(d)] == ["small.w.0"]
    assert looked[-1] == ["small"]  # "wide" was not looked at again
    assert "fits no node" in d.unplaced["wide"]  # and still says why
    b = nodes.nodes["b"].state
    nodes.observe(dataclasses.replace(b, seq=2, ts=1.0), HEARD + 1)  # nothing new measured
    n = len(looked)
    d = log.step(nodes, NOW + 600)
    assert looked[n:] == [] and "fits no node" in d.unplaced["wide"]
    # A release where 7 cores cannot be free (b has 6): not looked at.
    log.update("tiny.w.0", S.SUCCEEDED)
    d = log.step(nodes, NOW + 601)
    assert looked[n:] == [] and "fits no node" in d.unplaced["wide"]
    # b's heartbeat measures 8 cores (its agent restarted bigger): placed there.
    bigger = dataclasses.replace(b, seq=3, ts=2.0, capacity=Resources(cpu=8000, memory=16 * GiB))
    nodes.observe(bigger, HEARD + 2)
    d = log.step(nodes, NOW + 602)
    assert placements(d) == [("wide.w.0", "b", 1)]
    # New ready nodes: a parked job is looked at, and placed on the node it fits.
    log.submit("wider", count=1, memory="20Gi")  # 16 GiB per node
    d = log.step(nodes, NOW + 603)
    assert placements(d) == [] and "fits no node" in d.unplaced["wider"]
    n = len(looked)
    assert log.step(nodes, NOW + 604).events == [] and looked[n:] == []  # parked
    nodes.observe(view("c", memory=32 * GiB).state, HEARD + 3)
    d = log.step(nodes, NOW + 605)
    assert placements(d) == [("wider.w.0", "c", 1)]


def test_a_job_its_pool_can_never_admit_is_parked_until_the_pools_change(monkeypatch):
    """A job above its pool's limit is not admitted again by every round (a backlog held
    by a limit of zero was, for every batch of submits): it is passed over, still saying
    why, until the pool tree is applied again."""
    from mesh.schema import PoolsApplied

    admitted = spy_on_placement(monkeypatch, "admitted_jobs")
    log = Log()
    held = {"pools": {"/held": {"cpu": {"limit": 0}}, "/open": {}}}
    log.append(PoolsApplied(held, 1.0))
    for job_id, pool in (("waits", "/held"), ("runs", "/open")):
        spec = job_spec(job_id, count=1)
        spec["pool"] = pool
        log.append(JobSubmitted(job_id, f"client-{job_id}", spec, 1.0))
    nodes = cluster(view("a"))
    d = log.step(nodes)
    assert placements(d) == [("runs.w.0", "a", 1)]
    assert "can never be admitted" in d.unplaced["waits"]
    assert admitted == [["waits", "runs"]]
    spec = job_spec("more", count=1)
    spec["pool"] = "/open"
    log.append(JobSubmitted("more", "client-more", spec, 1.0))
    d = log.step(nodes, NOW + 0.1)
    assert placements(d) == [("more.w.0", "a", 1)]
    assert admitted[1:] == [["more"]]  # "waits" was not admitted again
    assert "can never be admitted" in d.unplaced["waits"]  # and still says why
    log.append(PoolsApplied({"pools": {"/held": {}, "/open": {}}}, 2.0))  # limit lifted
    d = log.step(nodes, NOW + 0.2)
    assert placements(d) == [("waits.w.0", "a", 1)]


def test_a_gang_stays_parked_while_releases_cannot_give_it_all_its_tasks(monkeypatch):
    """A release that leaves room for one task of a gang, but not for all of them across
    the ready nodes, does not make it fit: the gang stays parked."""
    looked = spy_on_placement(monkeypatch)
    log = Log()
    log.occupy("x", "a", cpu="1")
    log.occupy("y", "b", cpu="1")
    log.occupy("z", "c", memory="10Gi")
    log.submit("gang", count=3, memory="10Gi")  # 15 GiB free on a and b, 6 on c: 2 slots
    nodes = cluster(view("a"), view("b"), view("c"))
    t0 = log.state.jobs["gang"].pending_since + 1.0  # young: far from holding the line
    d = log.step(nodes, t0)
    assert placements(d) == [] and "gang" in d.unplaced
    assert looked == [["gang"]]
    log.update("x.w.0", S.SUCCEEDED)  # a: 16 GiB free, room for one task; 2 slots in all
    d = log.step(nodes, t0 + 0.1)
    assert looked == [["gang"]] and "gang" in d.unplaced  # not looked at: cannot fit
    log.update("y.w.0", S.SUCCEEDED)  # b: 16 GiB too; still 2 slots for 3 tasks
    log.step(nodes, t0 + 0.2)
    assert looked == [["gang"]]
    log.update("z.w.0", S.SUCCEEDED)  # c: 16 GiB, a third slot: looked at, placed
    d = log.step(nodes, t0 + 0.3)
    assert looked[-1] == ["gang"] and len(placements(d)) == 3


def test_a_release_on_a_node_without_its_labels_leaves_a_job_parked(monkeypatch):
    looked = spy_on_placement(monkeypatch)
    log = Log()
    log.occupy("x", "plain", cpu="4")
    log.occupy("y", "racked", cpu="4")
    spec = job_spec("picky", count=1, cpu="6")
    spec["placement"] = {"labels": {"rack": "r1"}, "gang": False}  # room alone decides
    log.append(JobSubmitted("picky", "client-picky", spec, 1.0))
    racked = view("racked")
    racked.state = dataclasses.replace(racked.state, labels={"rack": "r1"})
    nodes = cluster(view("plain"), racked)  # 8 cores each, 4 free: 6 fits neither
    t0 = log.state.jobs["picky"].pending_since + 1.0
    d = log.step(nodes, t0)
    assert placements(d) == [] and looked == [["picky"]]
    log.update("x.w.0", S.SUCCEEDED)  # room on "plain", which lacks the label
    d = log.step(nodes, t0 + 0.1)
    assert looked == [["picky"]] and "picky" in d.unplaced
    log.update("y.w.0", S.SUCCEEDED)  # room on "racked": looked at, placed there
    d = log.step(nodes, t0 + 0.2)
    assert placements(d) == [("picky.w.0", "racked", 1)]


def test_a_gang_is_parked_only_until_it_would_hold_the_line(monkeypatch):
    from coordinator.reconcile import IDLE_S
    from coordinator.scheduling import PlacementConfig

    looked = spy_on_placement(monkeypatch)
    config = PlacementConfig(starve_after_s=30.0)
    log = Log()
    log.occupy("old", "c", cpu="3")
    log.submit("gang", count=3, cpu="4")  # 12 of 15 cores free, 2 tasks fit: the gang waits
    nodes = cluster(view("a", cpu=6000), view("b", cpu=6000), view("c", cpu=6000))
    t0 = log.state.jobs["gang"].pending_since
    reconcile(log.state, nodes, t0 + 1.0, config)
    reconcile(log.state, nodes, t0 + 1.1, config)
    reconcile(log.state, nodes, t0 + config.starve_after_s - 0.1, config)
    assert looked == [["gang"]]  # young: parked
    late = t0 + config.starve_after_s
    reconcile(log.state, nodes, late, config)
    reconcile(log.state, nodes, late + IDLE_S, config)  # (a round within IDLE_S is idle)
    assert looked[1:] == [["gang"], ["gang"]]  # holding the line: looked at each round


@settings(max_examples=150, database=None, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_a_job_kept_parked_would_not_fit(seed):
    """Parking is only ever a shortcut: whatever is released, a job it keeps parked is
    one that placement would not place now. Nodes are left with memory in fragments (2
    GiB each) too small for a task of the job, though enough in all to admit it."""
    from coordinator.parking import parked
    from coordinator.scheduling import PlacementConfig, place_jobs, snapshot

    rnd = random.Random(seed)
    log = Log()
    n = rnd.randint(2, 4)
    nodes = cluster(*(view(f"n{i}", cpu=8000, memory=8 * GiB) for i in range(n)))
    small = [f"s{i}" for i in range(2 * n)]
    for i, j in enumerate(small):
        log.occupy(j, f"n{i // 2}", cpu="1", memory="3Gi")
    log.submit("big", count=rnd.randint(1, 2 * n // 3), cpu="1", memory="3Gi")
    if rnd.random() < 0.5:
        job = log.state.jobs["big"]
        job.spec = dataclasses.replace(  # not all at once: any task may go alone
            job.spec, placement=dataclasses.replace(job.spec.placement, gang=False)
        )
    t0 = log.state.jobs["big"].pending_since + 1.0
    d = log.step(nodes, t0)
    assert placements(d) == [] and "fits no node" in d.unplaced["big"]
    for _ in range(4):
        for j in small:  # some small tasks end, giving back what they held
            t = log.state.tasks[f"{j}.w.0"]
            if t.state in HOLDING and rnd.random() < 0.3:
                log.update(t.task_id, S.SUCCEEDED)
        t0 += 0.01
        if "big" in parked(log.state, snapshot(nodes, log.state), t0).why:
            result = place_jobs(log.state, nodes, [log.state.jobs["big"]], t0, PlacementConfig())
            assert not [x for x in result.placed if x.job_id == "big"]
        log.step(nodes, t0)


@settings(max_examples=100, database=None, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_parking_keeps_exactly_the_waiting_jobs_it_does_not_hold(seed):
    """Rounds look at parking's list of jobs, kept from the fold's journal of queue
    moves instead of a walk of the queue: after any mix of submits that fit or not,
    placements, ends, kills, pool trees and gangs reaching the line, it is the waiting
    jobs not being killed and not parked, in queue order, and only waiting jobs stay
    parked; a job parked as never admissible is one admission would not admit."""
    from coordinator.parking import parked
    from coordinator.pooling import admitted_jobs, pool_view
    from coordinator.scheduling import snapshot
    from mesh.schema import PoolsApplied

    rnd = random.Random(seed)
    log = Log()
    nodes = cluster(view("a", cpu=4000), view("b", cpu=4000))
    now = NOW
    for i in range(40):
        roll = rnd.random()
        if roll < 0.4:
            cpu = rnd.choice(["1", "2", "6"])  # 6 cores fit no node
            log.submit(f"j{i}", count=rnd.randint(1, 2), cpu=cpu, priority=rnd.randint(0, 2))
        elif roll < 0.55:
            queued = sorted(log.state.waiting)
            if queued:
                log.append(JobKillRequested(rnd.choice(queued), 2.0, "test"))
        elif roll < 0.75:
            holding = sorted(t for t, r in log.state.tasks.items() if r.state in HOLDING)
            if holding:
                log.update(rnd.choice(holding), rnd.choice([S.RUNNING, S.SUCCEEDED]))
        elif roll < 0.85:  # with child pools, the root admits none of its jobs
            log.append(PoolsApplied(rnd.choice([{"pools": {}}, {"pools": {"/x": {}}}]), 2.0))
        now += rnd.choice([0.01, 0.1, 40.0])  # 40 s: gangs reach the line
        log.step(nodes, now)
        p = parked(log.state, snapshot(nodes, log.state), now)
        waiting = [j.job_id for j in log.state.pending_jobs()]
        assert list(p.looking.values()) == [j for j in waiting if j not in p.why]
        assert set(p.why) <= set(waiting)
        if p.never:
            capacity = Resources(cpu=8000, memory=32 * GiB)
            pools = pool_view(log.state, capacity, now)
            jobs = [log.state.jobs[j] for j in sorted(p.never)]
            assert not admitted_jobs(log.state, pools, jobs)[0]


def test_a_parked_job_that_is_killed_no_longer_says_why_it_waits():
    log = Log()
    log.submit("wide", count=1, cpu="6")
    log.submit("wider", count=1, cpu="7")
    nodes = cluster(view("a", cpu=4000), view("b", cpu=4000))
    d = log.step(nodes)
    assert "fits no node" in d.unplaced["wide"] and "fits no node" in d.unplaced["wider"]
    log.append(JobKillRequested("wide", 2.0, "not needed"))
    d = log.step(nodes, NOW + 0.1)  # its task is killed
    assert updates(d) == [("wide.w.0", S.KILLED)] and "wide" not in d.unplaced
    d = log.step(nodes, NOW + 0.2)
    assert "wide" not in d.unplaced and "fits no node" in d.unplaced["wider"]


def test_a_copy_made_stale_under_an_unchanged_heartbeat_is_still_killed(monkeypatch):
    """Heartbeats that list the same tasks as the last one looked at (the decoder keeps
    the same tuple) are passed over, unless the node's grants moved: then what it lists
    may have become stale, though the list did not change."""
    import coordinator.reconcile as rec

    calls = []
    real = rec._stale_on
    spy = lambda state, v: calls.append(v.node_id) or real(state, v)  # noqa: E731
    monkeypatch.setattr(rec, "_stale_on", spy)
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "n1")
    nodes = cluster(view("n1", tasks=("j.w.0#1",)), view("n2"))
    assert log.decide(nodes).kills == [] and sorted(calls) == ["n1", "n2"]
    listed = nodes.nodes["n1"].state
    nodes.observe(dataclasses.replace(listed, seq=2, ts=1.0), HEARD + 1)  # same tasks
    assert log.decide(nodes, NOW + 1).kills == [] and sorted(calls) == ["n1", "n2"]
    log.update("j.w.0", S.LOST)  # n1 went quiet a while; its task runs again on n2
    log.update("j.w.0", S.PENDING)
    log.run("j.w.0", "n2")
    nodes.observe(dataclasses.replace(listed, seq=3, ts=2.0), HEARD + 2)  # still listed
    d = log.decide(nodes, NOW + 2)
    assert [(k.node_id, k.task_id, k.attempt) for k in d.kills] == [("n1", "j.w.0", 1)]


def test_admission_sees_what_a_job_still_asks_for_after_some_of_it_was_placed():
    """What admission sees of a job is kept between rounds: it must follow the job's
    pending resources as its tasks are placed, not stay as first seen."""
    from coordinator.pooling import PoolView, admitted_jobs

    log = Log()
    log.submit("j", count=2, cpu="1")
    room = Resources(cpu=1500, memory=64 * GiB)
    pools = PoolView(room, {"/": Resources()}, {"/": Resources()}, {}, {"/": room})
    job = log.state.jobs["j"]
    admitted, blocked, _ = admitted_jobs(log.state, pools, [job])
    assert not admitted and "entitlement" in blocked["j"]
    log.place("j.w.0", "a")
    assert admitted_jobs(log.state, pools, [job])[0] == {"j"}


def test_a_job_that_fits_no_node_takes_no_admission_budget_and_the_window_is_placed_once(
    monkeypatch,
):
    """'wide' is admitted (6 of 16 cores, 8 held) but fits no node with 4 cores free: the
    job it would keep out of the pool's entitlement is placed in the same round, with one
    placement pass."""
    calls = spy_on_placement(monkeypatch)
    log = Log()
    log.occupy("x", "a", cpu="4")
    log.occupy("y", "b", cpu="4")
    log.submit("wide", count=1, cpu="6")
    log.submit("s1", count=1, cpu="2")
    log.submit("s2", count=1, cpu="2")  # 8 + 6 + 2 + 2 > 16: admission would hold it back
    d = log.decide(cluster(view("a", cpu=8000), view("b", cpu=8000)))
    assert sorted(t for t, _, _ in placements(d)) == ["s1.w.0", "s2.w.0"]
    assert "fits no node" in d.unplaced["wide"] and "insufficient cpu" in d.unplaced["wide"]
    assert len(calls) == 1 and calls[0] == ["wide", "s1", "s2"]


def test_a_gang_that_stops_fitting_within_the_round_gives_its_budget_back_in_a_second_pass(
    monkeypatch,
):
    """'gang' fits on the snapshot but not after 'x' is placed: only placing tells, so
    the window is admitted and placed again without it, and 'z' still runs."""
    calls = spy_on_placement(monkeypatch)
    log = Log()
    log.submit("x", count=1, cpu="3")
    log.submit("gang", count=2, cpu="3")
    log.submit("z", count=1, cpu="2")  # 3 + 6 + 2 > 10: held back while 'gang' is admitted
    d = log.decide(cluster(view("a", cpu=4000), view("b", cpu=4000), view("c", cpu=2000)))
    assert sorted(t for t, _, _ in placements(d)) == ["x.w.0", "z.w.0"]
    assert "gang of 2: 1 placed" in d.unplaced["gang"]
    assert calls == [["x", "gang"], ["x", "z"]]
