"""Named ports: picked by the coordinator in the placement decision (coordinator/ports.py),
kept per node by the fold, never given twice on one address, never on a node without a
range; runs built by the framework adapter from the job's peers (coordinator/peers.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.cluster import READY, ClusterView
from coordinator.peers import AddressUnknown, context, launchable, launched_spec, peers_of
from coordinator.ports import NoPorts, assign, describe, pick, used_by_address
from coordinator.reconcile import reconcile
from coordinator.state import RegionState
from mesh.schema import (
    JobSubmitted,
    LeaderElected,
    LogEntry,
    NodeState,
    TaskPlaced,
    TaskUpdated,
)
from workloads import frameworks
from workloads.lifecycle import TaskState
from workloads.resources import Resources
from workloads.spec import parse_job_spec

S = TaskState
GiB = 2**30
NOW = 1000.0
RANGE = (20000, 32000)

# --------------------------------------------------------------------------- pick


@settings(max_examples=300, deadline=None)
@given(
    lo=st.integers(1, 60000),
    size=st.integers(1, 64),
    used=st.sets(st.integers(0, 65535), max_size=80),
    n=st.integers(1, 8),
    key=st.text(max_size=20),
)
def test_pick_gives_distinct_free_ports_in_range_the_same_each_time(lo, size, used, n, key):
    rng = (lo, lo + size - 1)
    names = [f"p{k}" for k in range(n)]
    free = {p for p in range(lo, lo + size) if p not in used}
    if len(free) < n:
        with pytest.raises(NoPorts, match=f"no free ports in {lo}-{lo + size - 1}"):
            pick(names, rng, used, key)
        return
    got = pick(names, rng, used, key)
    assert list(got) == names
    ports = list(got.values())
    assert len(set(ports)) == n
    assert all(p in free for p in ports)  # in range, never a used one
    assert pick(names, rng, set(used), key) == got  # deterministic


def test_pick_starts_at_an_offset_hashed_from_the_key():
    firsts = {pick(["a"], RANGE, set(), f"j.w.0:{attempt}")["a"] for attempt in range(1, 20)}
    assert len(firsts) > 10  # a retry tries other ports
    assert pick(["a"], RANGE, set(), "k") == pick(["a"], RANGE, set(), "k")


def test_pick_probes_past_used_ports_and_wraps():
    start = pick(["a"], (100, 109), set(), "k")["a"]
    used = {100 + (start - 100 + k) % 10 for k in range(9)}  # all but the one before start
    (left,) = set(range(100, 110)) - used
    assert pick(["a"], (100, 109), used, "k") == {"a": left}


def test_a_node_without_a_range_gives_no_ports():
    with pytest.raises(NoPorts, match="offers no ports"):
        pick(["a"], (0, 0), set(), "k")
    assert pick([], (0, 0), set(), "k") == {}
    assert describe((0, 0)) == "offers no ports"
    with pytest.raises(ValueError, match="repeat"):
        pick(["a", "a"], RANGE, set(), "k")


def test_ports_are_used_per_address_and_unknown_nodes_count_everywhere():
    held = {"n1": {"t1": (20001,)}, "n2": {"t2": (20002, 20003)}, "n3": {"t3": (20009,)}}
    by, anywhere = used_by_address(held, {"n1": "10.0.0.1", "n2": "10.0.0.1"})
    assert by == {"10.0.0.1": {20001, 20002, 20003}}
    assert anywhere == {20009}  # n3 not heard yet: its ports are nobody's to give


# --------------------------------------------------------------------------- the log


def spec_dict(name="job", count=2, cpu="1", gang=True):
    return {
        "name": name,
        "placement": {"gang": gang},
        "restart": {"max_retries": 0},
        "tasks": [
            {"role": "w", "count": count, "command": ["true"], "resources": {"cpu": cpu}},
        ],
    }


class Log:
    def __init__(self) -> None:
        self.state = RegionState()
        self.seq = 0
        self.entries: list[LogEntry] = []
        self.append(LeaderElected(1, "c1"))

    def append(self, *events) -> None:
        self.seq += 1
        entry = LogEntry(1, "c1", tuple(events))
        self.entries.append(entry)
        assert self.state.apply(self.seq, entry)

    def submit(self, job_id, ports=(), **kw):
        """A job whose group asks for `ports` (handed to the fold parsed, as the API does)."""
        d = spec_dict(**kw)
        spec = parse_job_spec(d)
        spec = dataclasses.replace(
            spec, tasks=tuple(dataclasses.replace(g, ports=tuple(ports)) for g in spec.tasks)
        )
        self.state.parsed[job_id] = spec
        self.append(JobSubmitted(job_id, f"client-{job_id}", d, 1.0))

    def update(self, tid, state, **kw):
        t = self.state.tasks[tid]
        self.append(TaskUpdated(t.job_id, tid, t.attempt, state, t.node_id, 3.0, **kw))

    def step(self, nodes, now=NOW):
        d = reconcile(self.state, nodes, now)
        if d.events:
            self.append(*d.events)
        return d

    def replay(self) -> RegionState:
        """What a new leader folds from the same log (specs parsed afresh, the ports
        asked for handed over as the API handed them)."""
        s = RegionState()
        for seq, entry in enumerate(self.entries, 1):
            for ev in entry.events:
                if isinstance(ev, JobSubmitted):
                    s.parsed[ev.job_id] = self.state.jobs[ev.job_id].spec
            s.apply(seq, entry)
        return s


def node(node_id, address="10.0.0.1", port_range=RANGE, cpu=8000) -> NodeState:
    return NodeState(
        node_id=node_id,
        region="r",
        seq=1,
        ts=0.0,
        capacity=Resources(cpu=cpu, memory=16 * GiB),
        address=address,
        port_range=port_range,
    )


def cluster(*states: NodeState) -> ClusterView:
    cv = ClusterView("r", suspect_after=3.0, down_after=10.0)
    for s in states:
        cv.observe(s, 100.0)
    cv.sweep(100.0)
    assert all(v.status == READY for v in cv.nodes.values())
    return cv


def placed(d) -> dict[str, TaskPlaced]:
    return {e.task_id: e for e in d.events if isinstance(e, TaskPlaced)}


def test_placement_gives_each_task_its_ports_and_the_fold_keeps_them():
    log = Log()
    log.submit("j", ports=("rdzv", "metrics"), count=3)
    d = log.step(cluster(node("n1")))
    evs = placed(d)
    assert len(evs) == 3
    all_ports = [p for e in evs.values() for p in e.ports.values()]
    assert len(set(all_ports)) == 6  # one address: none given twice
    assert all(RANGE[0] <= p <= RANGE[1] for p in all_ports)
    for tid, e in evs.items():
        assert set(e.ports) == {"rdzv", "metrics"}
        t = log.state.tasks[tid]
        assert t.ports == e.ports
        assert t.to_dict()["ports"] == e.ports
    assert log.state.node_ports == {"n1": {tid: tuple(e.ports.values()) for tid, e in evs.items()}}
    # Leaving HOLDING frees them; a task that asks for none holds none.
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.SUCCEEDED, exit_code=0)
    assert "j.w.0" not in log.state.node_ports["n1"]
    assert log.state.tasks["j.w.0"].ports == evs["j.w.0"].ports  # still shown in status
    log.submit("plain")
    assert all(not e.ports for e in placed(log.step(cluster(node("n1")))).values())


def test_a_job_asking_ports_is_never_placed_on_a_node_without_them():
    log = Log()
    log.submit("j", ports=("p",), count=1)
    d = log.step(cluster(node("n1", port_range=(0, 0)), node("n2", port_range=(0, 0))))
    assert not placed(d)
    assert "offers no ports" in d.unplaced["j"]
    d = log.step(cluster(node("n1", port_range=(0, 0)), node("n2", port_range=(30000, 30000))))
    assert [e.node_id for e in placed(d).values()] == ["n2"]
    assert placed(d)["j.w.0"].ports == {"p": 30000}
    # The one port is held: another task asking for one does not go there.
    log.submit("k", ports=("p",), count=1)
    d = log.step(cluster(node("n1", port_range=(0, 0)), node("n2", port_range=(30000, 30000))))
    assert not placed(d)
    assert "no free ports in 30000-30000" in d.unplaced["k"]
    # A job asking for none still goes anywhere.
    log.submit("plain", count=1)
    d = log.step(cluster(node("n1", port_range=(0, 0))))
    assert [e.node_id for e in placed(d).values()] == ["n1"]


def test_agents_on_one_host_never_share_a_port():
    """Two nodes at one address with one range of 3 ports: tasks placed on either take
    ports the other's hold are not using, and a node whose address's ports are all
    held takes none."""
    rng = (40000, 40002)
    nodes = cluster(node("a", port_range=rng, cpu=1000), node("b", port_range=rng, cpu=3000))
    log = Log()
    log.submit("j1", ports=("p",), count=2, cpu="1")
    evs = placed(log.step(nodes))
    log.submit("j2", ports=("p",), count=1, cpu="1")
    evs |= placed(log.step(nodes))
    assert len(evs) == 3 and {e.node_id for e in evs.values()} == {"a", "b"}
    ports = [e.ports["p"] for e in evs.values()]
    assert sorted(ports) == [40000, 40001, 40002]
    log.submit("j3", ports=("p",), count=1, cpu="1")
    d = log.step(nodes)
    assert not placed(d) and "no free ports in 40000-40002" in d.unplaced["j3"]


def test_a_new_leader_never_gives_out_a_port_a_running_task_holds():
    """Two agents of one host with one port: a new leader that has heard only the
    other one (the first is a placeholder it `expect`s) still counts the held port."""
    rng = (40000, 40000)
    nodes = cluster(node("a", port_range=rng), node("b", port_range=rng))
    log = Log()
    log.submit("j1", ports=("p",), count=1)
    (first,) = placed(log.step(nodes)).values()
    log.update(first.task_id, S.RUNNING)
    new = log.replay()
    assert new.node_ports == log.state.node_ports
    log.state = new
    log.submit("j2", ports=("p",), count=1)
    other = "b" if first.node_id == "a" else "a"
    heard = cluster(node(other, port_range=rng))
    heard.expect(first.node_id, 100.0)  # as a new leader does: a placeholder, no address
    d = log.step(heard)
    assert not placed(d) and f"node {other} no free ports in 40000-40000" in d.unplaced["j2"]
    with pytest.raises(AddressUnknown, match="not heard yet"):
        peers_of(log.state.jobs["j1"], heard.nodes)
    # Once both are heard, the port is held on their one address all the same.
    d = log.step(nodes)
    assert not placed(d) and "no free ports in 40000-40000" in d.unplaced["j2"]
    log.update(first.task_id, S.SUCCEEDED, exit_code=0)
    (second,) = placed(log.step(nodes)).values()
    assert second.ports == {"p": 40000}


def test_assign_drops_a_job_whose_node_ran_out_of_ports_on_its_address():
    log = Log()
    log.submit("j", ports=("p", "q"), count=1)
    nodes = cluster(node("a", port_range=(40000, 40001)), node("b", port_range=(40000, 40001)))
    log.state.node_ports["b"] = {"x": (40000,)}  # held by another agent of the host
    from coordinator.placement import Placement

    ports, failed = assign(log.state, nodes, [Placement("j", "j.w.0", "a")])
    assert ports == {} and "no free ports in 40000-40001" in failed["j"]


# --------------------------------------------------------------------------- peers


def test_peers_and_the_run_built_by_the_adapter():
    log = Log()
    log.submit("j", ports=("rdzv",), count=3)
    nodes = cluster(node("n1", address="10.0.0.1"), node("n2", address="10.0.0.2", cpu=1000))
    evs = placed(log.step(nodes))
    job = log.state.jobs["j"]
    peers = peers_of(job, nodes.nodes)
    assert [(p.role, p.index) for p in peers] == [("w", 0), ("w", 1), ("w", 2)]
    for p in peers:
        t = log.state.tasks[f"j.w.{p.index}"]
        assert p.host == nodes.nodes[t.node_id].state.address
        assert p.ports == (("rdzv", evs[t.task_id].ports["rdzv"]),)
    t1 = log.state.tasks["j.w.1"]
    ctx = context(job, t1, nodes.nodes)
    assert (ctx.role, ctx.index, ctx.generation) == ("w", 1, job.generation)
    spec = launched_spec(job, t1, nodes.nodes)
    assert spec.ports == t1.ports
    assert spec.argv == ("true",)
    assert spec.env["MESH_PORT_RDZV"] == str(t1.ports["rdzv"])
    assert spec.env["MESH_W_HOSTS"] == ",".join(p.host for p in peers)
    assert spec.env["MESH_W_NUM"] == "3"
    assert spec.env["MESH_TASK_INDEX"] == "1" and spec.env["MESH_JOB_ID"] == "j"


def test_runs_wait_while_a_peer_address_is_unknown():
    log = Log()
    log.submit("j", ports=("p",), count=2)
    log.submit("plain", count=1)
    nodes = cluster(node("n1"), node("n2", cpu=1000))
    log.step(nodes)
    tasks = [log.state.tasks[t] for t in ("j.w.0", "j.w.1", "plain.w.0")]
    out, waiting = launchable(log.state, [tasks], nodes.nodes)
    assert out == [tasks] and not waiting
    gone = next(t.node_id for t in tasks[:2])
    heard = cluster(*(v.state for n, v in nodes.nodes.items() if n != gone))
    with pytest.raises(AddressUnknown, match="not heard yet"):
        peers_of(log.state.jobs["j"], heard.nodes)
    out, waiting = launchable(log.state, [tasks], heard.nodes)
    assert set(waiting) == {("j.w.0", 1), ("j.w.1", 1)}
    assert [[t.task_id for t in b] for b in out] == [["plain.w.0"]]


# --------------------------------------------------------------------------- primary task


@pytest.fixture
def primary_is_task_0(monkeypatch):
    monkeypatch.setattr(
        frameworks, "primary_task", lambda spec: ("w", 0) if spec.name == "prim" else None
    )


@pytest.mark.parametrize("outcome", [S.SUCCEEDED, S.FAILED])
def test_a_job_ends_with_its_primary_task(primary_is_task_0, outcome):
    log = Log()
    log.submit("j", name="prim", count=4, cpu="2")
    nodes = cluster(node("n1", cpu=8000))
    log.step(nodes)
    job = log.state.jobs["j"]
    assert job.primary == "j.w.0"
    for t in job.tasks.values():
        log.update(t.task_id, S.RUNNING)
    log.update("j.w.3", S.PREEMPTED)
    log.step(nodes)  # requeued: it waits
    assert log.state.tasks["j.w.3"].state == S.PENDING
    running = ["j.w.0", "j.w.1", "j.w.2"]
    log.update("j.w.0", outcome, exit_code=0 if outcome == S.SUCCEEDED else 1)
    d = log.step(nodes)
    (kill,) = [e for e in d.events if type(e).__name__ == "JobKillRequested"]
    assert kill.reason == f"primary task j.w.0 {str(outcome).lower()}: the job ends with it"
    d = log.step(nodes)
    others = [t for t in running if t != "j.w.0"]
    assert sorted(k.task_id for k in d.kills) == others  # the holding ones are stopped
    waiting = next(t for t in job.tasks.values() if t.task_id not in running)
    assert waiting.state == S.KILLED  # the waiting one cancelled
    assert str(job.state) == "RUNNING"  # its others still stop
    for tid in others:
        log.update(tid, S.KILLED)
    assert str(job.state) == str(outcome)  # the primary's outcome, not KILLED
    assert not log.state.primary_ended and not log.step(nodes).events
    assert str(log.replay().jobs["j"].state) == str(outcome)


def test_a_primary_with_retries_left_is_rerun_not_the_end(primary_is_task_0):
    log = Log()
    d = spec_dict(name="prim", count=2)
    d["restart"] = {"max_retries": 1}
    log.state.parsed["j"] = parse_job_spec(d)
    log.append(JobSubmitted("j", "client-j", d, 1.0))
    nodes = cluster(node("n1"))
    log.step(nodes)
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.FAILED, exit_code=1)
    d1 = log.step(nodes)
    assert not any(type(e).__name__ == "JobKillRequested" for e in d1.events)
    assert log.state.tasks["j.w.0"].state == S.PENDING
    assert "j" not in log.state.primary_ended
    assert str(log.state.jobs["j"].state) == "RUNNING"


def test_a_job_without_a_primary_is_not_ended_by_one_task(primary_is_task_0):
    log = Log()
    log.submit("j", name="other", count=2)
    nodes = cluster(node("n1"))
    log.step(nodes)
    log.update("j.w.0", S.RUNNING)
    log.update("j.w.0", S.SUCCEEDED, exit_code=0)
    assert log.state.jobs["j"].primary == "" and not log.state.primary_ended
    assert not log.step(nodes).events
