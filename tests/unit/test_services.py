"""Service jobs' pure lifecycle (coordinator/services.py and the fold): replicas restarted
for good with backoff, replaced before they are stopped (drain, update), never stopped
below `count - max_unavailable` available, killed for good."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.reconcile import reconcile
from coordinator.reports import agent_event
from coordinator.services import available, restart_delay
from coordinator.state import RegionState
from mesh.schema import (
    JobKillRequested,
    JobSubmitted,
    JobUpdated,
    ReplicaAdded,
    TaskEvent,
    TaskPlaced,
    TaskStopRequested,
    TaskUpdated,
)
from tests.unit.test_reconcile import Log, cluster, view
from workloads.lifecycle import FINAL, JobState, TaskState
from workloads.spec import parse_job_spec

S = TaskState


def service(name="web", count=3, *, surge=1, unavailable=0, health=False, cmd="serve", **kw):
    spec = {
        "name": name,
        "kind": "service",
        "restart": {"backoff": "1s", "max_backoff": "8s"},
        "update": {"max_surge": surge, "max_unavailable": unavailable},
        "tasks": [
            {
                "role": "web",
                "count": count,
                "command": cmd,
                "resources": {"cpu": 1, "memory": "1Gi"},
            }
        ],
        **kw,
    }
    if health:
        spec["health"] = {"command": "check", "interval": "1s"}
    return spec


class Region:
    """A log and its nodes, driven round by round as the leader's shell does, with the
    agents' reports applied by hand."""

    def __init__(self, *nodes: str, spec=None) -> None:
        self.log = Log()
        self.nodes = cluster(*(view(n) for n in nodes))
        self.now = 1000.0
        self.draining: frozenset[str] = frozenset()
        self.log.append(JobSubmitted("s", "c-s", spec or service(), self.now))

    @property
    def state(self) -> RegionState:
        return self.log.state

    def round(self) -> list:
        """Reconcile until it decides nothing more; returns the events appended."""
        out = []
        for _ in range(50):
            d = reconcile(self.state, self.nodes, self.now, draining=self.draining)
            self.kills = d.kills
            if not d.events:
                return out
            self.log.append(*d.events)
            out.extend(d.events)
        raise AssertionError("reconcile did not settle")

    def report(self, tid: str, state: TaskState, **kw) -> None:
        t = self.state.tasks[tid]
        ev = TaskEvent(t.node_id, t.job_id, tid, t.attempt, state, self.now, **kw)
        out = agent_event(self.state, ev)
        if isinstance(out, TaskUpdated):
            self.log.append(out)

    def start_placed(self, **kw) -> None:
        for t in list(self.state.tasks.values()):
            if t.state == S.PLACED:
                self.report(t.task_id, S.RUNNING, **kw)

    def kill_what_was_asked(self) -> None:
        for k in self.kills:
            t = self.state.tasks[k.task_id]
            if t.attempt == k.attempt and t.state in (S.PLACED, S.STARTING, S.RUNNING):
                self.report(k.task_id, S.KILLED)

    def live(self):
        return sorted(
            (t.task_id, str(t.state), t.node_id)
            for t in self.state.jobs["s"].tasks.values()
            if t.state not in FINAL
        )

    def up(self) -> int:
        return sum(available(t) for t in self.state.jobs["s"].tasks.values())


def running_region(*nodes: str, spec=None) -> Region:
    r = Region(*nodes, spec=spec)
    r.round()
    r.start_placed()
    r.round()
    return r


def test_replicas_are_placed_one_by_one_and_the_service_runs():
    r = Region("n1", "n2", "n3")
    placed = [e for e in r.round() if isinstance(e, TaskPlaced)]
    assert len(placed) == 3
    assert r.state.jobs["s"].state == JobState.RUNNING
    r.start_placed()
    assert r.up() == 3


def test_a_replica_that_exits_is_restarted_after_its_backoff_for_good():
    r = running_region("n1", "n2")
    job = r.state.jobs["s"]
    for n in range(1, 6):
        r.report("s.web.0", S.SUCCEEDED, exit_code=0)  # a service's exit 0 is a failure too
        t = r.state.tasks["s.web.0"]
        assert t.state == S.FAILED and "exited with code 0" in t.message
        assert job.state == JobState.RUNNING  # for good, never FAILED
        delay = restart_delay(job, t)
        assert delay == min(2 ** (n - 1), 8.0)  # doubled per quick restart, capped
        r.now += delay - 0.1
        r.round()
        assert r.state.tasks["s.web.0"].state == S.FAILED  # still waiting out its backoff
        r.now += 0.2
        r.round()
        t = r.state.tasks["s.web.0"]
        assert t.state == S.PLACED and t.attempt == n + 1  # a new attempt, no retry limit
        r.report("s.web.0", S.RUNNING)
    # A replica that ran a long while restarts after the first backoff again.
    r.now += 120
    r.report("s.web.0", S.FAILED, exit_code=3)
    assert restart_delay(job, r.state.tasks["s.web.0"]) == 1.0


def test_a_lost_replica_is_started_again_elsewhere():
    r = running_region("n1", "n2", "n3")
    gone = r.state.tasks["s.web.0"].node_id
    on_it = [t for t in r.state.tasks.values() if t.node_id == gone]
    r.nodes = cluster(*(view(n, "down" if n == gone else "ready") for n in ("n1", "n2", "n3")))
    r.round()
    assert all(t.state == S.LOST for t in on_it)
    r.now += 1.1
    r.round()
    for t in on_it:
        assert t.state == S.PLACED and t.node_id != gone
    assert r.state.jobs["s"].state == JobState.RUNNING


def test_kill_stops_every_replica_and_the_service_ends_killed():
    r = running_region("n1", "n2")
    r.report("s.web.1", S.FAILED, exit_code=1)  # one waits in its backoff meanwhile
    r.log.append(JobKillRequested("s", r.now, "done"))
    r.round()
    r.kill_what_was_asked()
    r.round()
    job = r.state.jobs["s"]
    assert all(t.state == S.KILLED for t in job.tasks.values())
    assert job.state == JobState.KILLED
    r.now += 100
    assert r.round() == []  # nothing restarts


def test_drain_starts_the_replacement_first_and_stops_the_old_once_it_runs():
    r = running_region("n1", "n2", "n3", "n4")
    node = r.state.tasks["s.web.0"].node_id
    old = sorted(t.task_id for t in r.state.tasks.values() if t.node_id == node)
    r.draining = frozenset({node})
    events = r.round()
    added = [e for e in events if isinstance(e, ReplicaAdded)]
    assert len(added) == 1 and not any(isinstance(e, TaskStopRequested) for e in events)
    new = r.state.tasks[added[0].task_id]
    assert new.state == S.PLACED and new.node_id != node  # nothing new on a draining node
    assert r.state.tasks[old[0]].state == S.RUNNING  # the old one serves meanwhile
    assert r.up() == 3
    moved = []
    for _ in range(10):  # the rest, one at a time: never below 3 available, at most 4
        r.start_placed()
        events = r.round()
        stops = [e.task_id for e in events if isinstance(e, TaskStopRequested)]
        assert len(stops) <= 1 and r.up() >= 3
        moved += stops
        r.kill_what_was_asked()
        r.round()
        live = [t for t in r.state.tasks.values() if t.state not in FINAL]
        assert len(live) <= 4
    assert sorted(moved) == old
    assert r.up() == 3
    assert not [t for t in r.state.tasks.values() if t.node_id == node and t.state not in FINAL]


def test_drain_without_room_elsewhere_keeps_the_old_replica_running():
    r = running_region("n1", "n2", "n3", spec=service(count=3))
    r.nodes = cluster(*(view(n, cpu=1000, memory=2**30) for n in ("n1", "n2", "n3")))
    r.draining = frozenset({"n1"})
    r.round()
    assert r.up() == 3  # max_unavailable 0: the replacement waits, the old one serves
    assert not any(t.stop_reason for t in r.state.tasks.values())


def test_max_unavailable_lets_the_old_replica_go_first_when_there_is_no_room():
    r = running_region("n1", "n2", "n3", spec=service(count=3, unavailable=1, surge=0))
    node = r.state.tasks["s.web.0"].node_id
    r.draining = frozenset({node})
    events = r.round()
    stops = [e for e in events if isinstance(e, TaskStopRequested)]
    assert len(stops) == 1 and r.state.tasks[stops[0].task_id].node_id == node
    assert r.up() == 2  # count - max_unavailable
    # Its replacement is added with the stop (a replica being stopped no longer counts).
    added = [e for e in events if isinstance(e, ReplicaAdded)]
    assert len(added) == 1 and r.state.tasks[added[0].task_id].node_id != node


def test_rolling_update_replaces_replicas_one_by_one_on_the_new_spec():
    r = running_region("n1", "n2", "n3", "n4")
    new_spec = parse_job_spec(service(cmd="serve --v2")).to_dict()
    r.log.append(JobUpdated("s", new_spec, r.now))
    job = r.state.jobs["s"]
    assert job.generation == 1
    order = []
    for _ in range(10):
        r.round()
        assert r.up() >= 3  # never below count - max_unavailable
        live = [t for t in job.tasks.values() if t.state not in FINAL and not t.stop_reason]
        assert len(live) <= 4  # count + max_surge
        r.start_placed()
        r.round()
        order += [k.task_id for k in r.kills if k.task_id not in order]
        r.kill_what_was_asked()
    live = [t for t in job.tasks.values() if t.state not in FINAL]
    assert len(live) == 3
    assert all(t.group.command[-1] == "serve --v2" and t.generation == 1 for t in live)
    assert order == ["s.web.0", "s.web.1", "s.web.2"]  # one at a time, oldest first


def test_an_update_that_changes_only_the_count_replaces_nothing():
    r = running_region("n1", "n2", "n3", "n4")
    r.log.append(JobUpdated("s", parse_job_spec(service(count=4)).to_dict(), r.now))
    events = r.round()
    assert not any(isinstance(e, TaskStopRequested) for e in events)
    assert sum(isinstance(e, ReplicaAdded) for e in events) == 1
    r.log.append(JobUpdated("s", parse_job_spec(service(count=2)).to_dict(), r.now))
    r.start_placed()
    events = r.round()
    assert sum(isinstance(e, TaskStopRequested) for e in events) == 2


def test_updates_that_change_name_or_kind_are_ignored_by_the_fold():
    r = running_region("n1")
    before = r.state.ignored
    r.log.append(JobUpdated("s", parse_job_spec(service(name="other")).to_dict(), r.now))
    batch = {"name": "web", "tasks": [{"role": "web", "command": "x"}]}
    r.log.append(JobUpdated("s", parse_job_spec(batch).to_dict(), r.now))
    assert r.state.ignored == before + 2 and r.state.jobs["s"].generation == 0


def test_only_healthy_replicas_count_as_available():
    r = Region("n1", "n2", "n3", "n4", spec=service(health=True))
    r.round()
    r.start_placed()
    assert r.up() == 0  # running, no verdict yet
    for tid in ("s.web.0", "s.web.1", "s.web.2"):
        r.report(tid, S.RUNNING, health="healthy", health_seq=1)
    assert r.up() == 3
    r.report("s.web.1", S.RUNNING, health="unhealthy", health_seq=2)
    assert r.state.tasks["s.web.1"].health == "unhealthy" and r.up() == 2
    # A drain: the unhealthy replica may go at once (it serves nothing), the healthy
    # ones only as healthy replacements come; RUNNING is not enough.
    node = r.state.tasks["s.web.0"].node_id
    assert all(r.state.tasks[f"s.web.{i}"].node_id == node for i in range(3))
    r.draining = frozenset({node})
    stops = [e.task_id for e in r.round() if isinstance(e, TaskStopRequested)]
    assert stops == ["s.web.1"]
    r.start_placed()
    assert not any(isinstance(e, TaskStopRequested) for e in r.round())
    new = sorted(t.task_id for t in r.state.tasks.values() if t.index >= 3)
    r.report(new[0], S.RUNNING, health="healthy", health_seq=1)
    assert not any(isinstance(e, TaskStopRequested) for e in r.round())  # 3 healthy: floor
    r.report(new[1], S.RUNNING, health="healthy", health_seq=1)
    stops = [e.task_id for e in r.round() if isinstance(e, TaskStopRequested)]
    assert stops == ["s.web.0"] and r.up() == 3


# --------------------------------------------------------------------------- property


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["exit", "lose", "drain", "undrain", "update", "start", "wait", "kill"]),
        st.integers(0, 20),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS, st.integers(1, 4), st.integers(0, 2), st.integers(1, 2))
def test_decisions_never_take_a_service_below_its_floor_and_lose_no_replica(
    actions, count, unavailable, surge
):
    """Random exits, losses, drains and updates: every stop the leader decides keeps at
    least count - max_unavailable replicas available (counted before the agents act),
    and once things settle every replica is back, on the latest spec."""
    nodes = [f"n{i}" for i in range(8)]
    r = running_region(*nodes, spec=service(count=count, unavailable=unavailable, surge=surge))
    floor = count - unavailable
    version = 0
    for what, k in actions:
        job = r.state.jobs["s"]
        live = sorted(t.task_id for t in job.tasks.values() if t.state not in FINAL)
        pick = live[k % len(live)] if live else None
        if what == "exit" and pick and r.state.tasks[pick].state == S.RUNNING:
            r.report(pick, S.FAILED, exit_code=1)
        elif what == "lose" and pick and r.state.tasks[pick].state in (S.PLACED, S.RUNNING):
            t = r.state.tasks[pick]
            r.log.append(TaskUpdated("s", pick, t.attempt, S.LOST, t.node_id, r.now))
        elif what == "drain":
            r.draining = r.draining | {nodes[k % len(nodes)]}
            if len(r.draining) > 4:
                r.draining = frozenset({nodes[k % len(nodes)]})
        elif what == "undrain":
            r.draining = frozenset()
        elif what == "update":
            version += 1
            spec = service(count=count, unavailable=unavailable, surge=surge, cmd=f"v{version}")
            r.log.append(JobUpdated("s", parse_job_spec(spec).to_dict(), r.now))
        elif what == "start":
            r.start_placed()
        elif what == "wait":
            r.now += 10
        before = r.up()
        events = r.round()
        stops = [e for e in events if isinstance(e, TaskStopRequested)]
        stopped_up = sum(1 for e in stops if r.state.tasks[e.task_id].state == S.RUNNING)
        if stopped_up:
            assert before - stopped_up >= floor, (before, stopped_up, floor)
        if what == "kill":
            r.kill_what_was_asked()
    # Settle: no drains, agents start and stop what they are told.
    r.draining = frozenset()
    for _ in range(3 * count + 6):
        r.now += 10
        r.round()
        r.start_placed()
        r.round()
        r.kill_what_was_asked()
    job = r.state.jobs["s"]
    live = [t for t in job.tasks.values() if t.state not in FINAL]
    assert len(live) == count
    assert all(t.state == S.RUNNING and t.generation == job.generation for t in live)
    assert job.state == JobState.RUNNING
