"""The drain of nodes whose partition move is in flight: what the leader logs each
round. Pure: the fold's state in, log events out (`reconcile` calls it).

A moving node is cordoned (placement skips it: `membership.placing`). Its batch tasks
are preempted through the pools' path (`TaskPreemptRequested`: killed with the kill's
grace period, logged PREEMPTED when the agent reports them stopped, then requeued), so
none is lost and none runs twice. A non-preemptible task is waited for, never stopped.
Service replicas are left to the services' surge, which replaces them elsewhere first:
it reads `vacating`. When nothing holds the node any more, the move converges.
"""

from __future__ import annotations

from coordinator.state import RegionState
from mesh.schema import LogEvent, NodePartitionChanged, TaskPreemptRequested


def vacating(state: RegionState) -> frozenset[str]:
    """Nodes to be emptied of service replicas (surge elsewhere first): the hook the
    services' reconcile reads."""
    return frozenset(state.partitions.moving)


def preempt_reason(node_id: str, source: str, target: str, why: str) -> str:
    """What `mesh job status` shows of a task stopped by a move."""
    return f"preempted: node {node_id} moves from {source} to {target}: {why or 'no reason given'}"


def drain_moves(state: RegionState, now: float) -> list[LogEvent]:
    """Preempt the batch tasks on moving nodes; converge the moves of empty ones."""
    m = state.partitions
    events: list[LogEvent] = []
    for node_id in sorted(m.moving):
        rec = m.nodes[node_id]
        held = state.node_tasks.get(node_id)
        if not held:
            events.append(NodePartitionChanged(node_id, rec.desired, now))
            continue
        reason = preempt_reason(node_id, rec.partition, rec.desired, rec.reason)
        for tid in sorted(held):
            t = state.tasks[tid]
            spec = state.jobs[t.job_id].spec
            if t.preempt_reason or spec.is_service or not spec.preemptible:
                continue  # being stopped already; the surge's; or waited for
            events.append(TaskPreemptRequested(t.job_id, tid, t.attempt, reason, now))
    return events
