"""Placement by partition and the drain of moving nodes, over states folded from real
log events (RegionState.apply) and hand-made node views: a job goes only to nodes of
its partition, a moving node takes no new work, oversubscribed cpu is offered under a
busy limit, and a move preempts batch tasks (never a non-preemptible one), which are
requeued elsewhere, then converges."""

from __future__ import annotations

from coordinator.cluster import READY, NodeView
from coordinator.placement import GangRequest, NodeInfo, Shape, Snapshot, TaskRequest, place
from coordinator.reports import agent_event
from mesh.schema import (
    JobSubmitted,
    NodePartitionChanged,
    NodePartitionSet,
    NodeState,
    PartitionsConfigSet,
    TaskEvent,
    TaskPreemptRequested,
)
from tests.unit.test_reconcile import Log, cluster, job_spec, placements, updates
from workloads.lifecycle import TaskState
from workloads.resources import Resources

S = TaskState
GiB = 2**30


def node(node_id: str, *, cpu: int = 4000, busy: float = 0.0, **labels: str) -> NodeView:
    state = NodeState(
        node_id=node_id,
        region="r",
        seq=1,
        ts=0.0,
        capacity=Resources(cpu=cpu, memory=16 * GiB),
        labels=dict(labels),
        cpu_percent=busy * 100,
    )
    return NodeView(state, last_seen=0.0, status=READY)


def pinned(log: Log, job_id: str, node_id: str) -> None:
    """A non-preemptible one-task job RUNNING on `node_id`: a move waits for it."""
    spec = {**job_spec(job_id, count=1), "preemptible": False}
    log.append(JobSubmitted(job_id, f"client-{job_id}", spec, 1.0))
    log.run(f"{job_id}.w.0", node_id)


def reported_killed(log: Log, tid: str) -> None:
    """The agent reports the attempt killed; logged as the leader logs it."""
    t = log.state.tasks[tid]
    ev = TaskEvent(t.node_id, t.job_id, tid, t.attempt, S.KILLED, 4.0)
    log.append(agent_event(log.state, ev))


def nodes_of(d) -> set[str]:
    return {n for _, n, _ in placements(d)}


def test_batch_jobs_go_only_to_batch_nodes():
    log = Log()
    log.submit("j", count=4)
    d = log.decide(cluster(node("b1"), node("s1", partition="stateless")))
    assert nodes_of(d) == {"b1"} and len(placements(d)) == 4


def test_a_batch_job_with_no_batch_node_says_why():
    log = Log()
    log.submit("j", count=1)
    d = log.decide(cluster(node("s1", partition="stateless")))
    assert not placements(d)
    assert "partition stateless≠batch" in d.unplaced["j"]


def test_a_shape_naming_a_partition_takes_only_its_nodes_not_its_children():
    snap = Snapshot(
        [
            NodeInfo("b", Resources(cpu=4000), partition="batch"),
            NodeInfo("c", Resources(cpu=4000), partition="batch/critical"),
            NodeInfo("s", Resources(cpu=4000), partition="stateless"),
        ]
    )
    where = {}
    for part in ("batch", "batch/critical", "stateless"):
        shape = Shape((1000, 0, 0, 0, 0), partition=part)
        tasks = tuple(TaskRequest(f"{part}.{i}", shape) for i in range(3))
        result = place(snap, [GangRequest(part, tasks, gang=0)])
        where[part] = {p.node_id for p in result.placed}
    assert where == {"batch": {"b"}, "batch/critical": {"c"}, "stateless": {"s"}}


def test_a_moving_node_takes_no_new_work():
    log = Log()
    pinned(log, "np", "b1")
    log.append(NodePartitionSet("b1", "stateless", "drill", False, 1.0, "batch"))
    log.submit("j", count=2)
    region = cluster(node("b1"), node("b2"))
    d = log.decide(region)
    assert nodes_of(d) == {"b2"}
    log.submit("k", count=1)
    alone = log.decide(cluster(node("b1")))
    assert "draining (moving between partitions)" in alone.unplaced["k"]


def test_oversubscribed_cpu_is_offered_under_the_busy_limit():
    log = Log()
    log.submit("j", count=6)  # a gang of 6 x 1 cpu on a 4-cpu node
    assert "can never fit" in log.decide(cluster(node("b1"))).unplaced["j"]
    log.append(PartitionsConfigSet("partitions: {stateless: {}, batch: {oversubscribe: 1.5}}"))
    assert len(placements(log.decide(cluster(node("b1"))))) == 6
    # measured busy at the busy line (0.7): it takes nothing more, and says so
    d = log.decide(cluster(node("b1", busy=0.75)))
    assert not placements(d) and "busy" in d.unplaced["j"]


def test_a_move_preempts_batch_tasks_requeues_them_and_converges():
    log = Log()
    log.occupy("a", "b1")
    log.occupy("b", "b1")
    log.append(
        NodePartitionSet("b1", "stateless", "manual move by ops: drill", False, 5.0, "batch")
    )
    region = cluster(node("b1"), node("b2"))
    d = log.step(region)
    preempts = [e for e in d.events if isinstance(e, TaskPreemptRequested)]
    assert sorted(e.task_id for e in preempts) == ["a.w.0", "b.w.0"]
    assert preempts[0].reason == (
        "preempted: node b1 moves from batch to stateless: manual move by ops: drill"
    )
    d = log.step(region)  # kills are sent (and resent) until the agent reports them
    assert sorted(k.task_id for k in d.kills) == ["a.w.0", "b.w.0"]
    assert not any(isinstance(e, TaskPreemptRequested) for e in d.events)  # once
    for tid in ("a.w.0", "b.w.0"):
        reported_killed(log, tid)
        assert log.state.tasks[tid].state == S.PREEMPTED  # then requeued, never lost
    for _ in range(4):
        d = log.step(region)
    assert all(log.state.tasks[t].node_id == "b2" for t in ("a.w.0", "b.w.0"))
    assert log.state.partitions.partition_of("b1") == "stateless"
    assert not log.state.partitions.draining("b1")


def test_a_move_converges_at_once_on_an_empty_node():
    log = Log()
    log.append(NodePartitionSet("b1", "stateless", "", False, 5.0, "batch"))
    d = log.decide(cluster(node("b1")))
    assert [e for e in d.events if isinstance(e, NodePartitionChanged)] == [
        NodePartitionChanged("b1", "stateless", 1000.0)
    ]


def test_a_non_preemptible_task_is_waited_for_never_preempted():
    log = Log()
    pinned(log, "np", "b1")
    log.append(NodePartitionSet("b1", "stateless", "", False, 5.0, "batch"))
    d = log.decide(cluster(node("b1"), node("b2")))
    assert not any(isinstance(e, TaskPreemptRequested | NodePartitionChanged) for e in d.events)
    assert not updates(d)
    reported = TaskEvent("b1", "np", "np.w.0", 1, S.SUCCEEDED, 9.0)
    log.append(agent_event(log.state, reported))
    d = log.decide(cluster(node("b1"), node("b2")))
    assert NodePartitionChanged("b1", "stateless", 1000.0) in d.events


def _service(log: Log, job_id: str) -> None:
    spec = {**job_spec(job_id, count=1), "kind": "service"}
    spec["restart"] = {"max_retries": 0}
    log.append(JobSubmitted(job_id, f"client-{job_id}", spec, 1.0))


def test_an_undivided_region_runs_services_and_batch_on_any_node():
    """Before any partitions config or move, unlabelled nodes take every job: a region
    with no stateless node still runs services (it did before partitions existed)."""
    log = Log()
    _service(log, "svc")
    log.submit("j", count=1)
    d = log.decide(cluster(node("n1"), node("n2")))
    assert {task.split(".")[0] for task, _, _ in placements(d)} == {"svc", "j"}


def test_once_divided_unlabelled_nodes_are_batch_and_services_wait_for_stateless():
    log = Log()
    log.append(PartitionsConfigSet("partitions: {stateless: {}, batch: {}}\n", 0.5))
    _service(log, "svc")
    d = log.decide(cluster(node("n1")))
    assert not placements(d)
    assert "partition batch≠stateless" in d.unplaced["svc"]


def test_a_moving_nodes_service_replica_is_replaced_elsewhere_first():
    """A partition move vacates its node's service replicas with surge: the leader gets
    a new replica to place elsewhere before the old one is stopped (drain.vacating)."""
    from mesh.schema import ReplicaAdded, TaskStopRequested

    log = Log()
    log.append(PartitionsConfigSet("partitions: {stateless: {}, batch: {}}\n", 0.5))
    _service(log, "svc")
    log.run("svc.w.0", "s1")
    log.append(NodePartitionSet("s1", "batch", "test move", False, 3.0, "stateless"))
    d = log.decide(cluster(node("s1", partition="stateless"), node("s2", partition="stateless")))
    assert [type(e) for e in d.events] == [ReplicaAdded], d.events
    assert not any(isinstance(e, TaskStopRequested) for e in d.events)  # not yet: surge first
