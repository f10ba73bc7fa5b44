"""Moves as log events: from the controller's `Move`s, a manual move, a break-glass and
its restore. Pure: the fold's state and the cluster view in, events out; the leader's
loop (`loop.py`) and the API (`coordinator/api.py`) append them.

A move is refused (left out, with why) when the node is already moving: no new move of
a node until its last converged. A move to where the node already is does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from coordinator.cluster import DOWN, ClusterView
from coordinator.partitions.controller import Move, NodeFacts, break_glass
from coordinator.state import RegionState
from mesh.schema import BreakGlassEnded, BreakGlassSet, LogEvent, NodePartitionSet


def node_facts(state: RegionState, cluster: ClusterView) -> list[NodeFacts]:
    """What the controller knows of each node the cluster view holds that is not down."""
    m = state.partitions
    out = []
    for node_id in sorted(cluster.nodes):
        view = cluster.nodes[node_id]
        if view.status == DOWN:
            continue
        labels = view.state.labels
        rec = m.nodes.get(node_id)
        tasks = [state.tasks[t] for t in state.node_tasks.get(node_id, ())]
        specs = [state.jobs[t.job_id].spec for t in tasks]
        out.append(
            NodeFacts(
                node_id,
                view.state.zone,
                m.partition_of(node_id, labels),
                m.desired_of(node_id, labels),
                m.draining(node_id),
                rec.last_moved if rec is not None else 0.0,
                rec.home if rec is not None else "",
                len(tasks),
                sum(s.priority for s in specs),
                any(not s.preemptible for s in specs),
                sum(s.is_service for s in specs),
            )
        )
    return out


def move_events(
    state: RegionState, cluster: ClusterView, moves: Iterable[Move], now: float
) -> tuple[list[NodePartitionSet], dict[str, str]]:
    """The `NodePartitionSet`s for `moves`, and per node left out, why."""
    m = state.partitions
    events, refused = [], {}
    for mv in moves:
        view = cluster.nodes.get(mv.node_id)
        labels = view.state.labels if view is not None else {}
        current = m.partition_of(mv.node_id, labels)
        if mv.target not in m.names():
            refused[mv.node_id] = f"no partition {mv.target!r}"
        elif m.draining(mv.node_id):
            rec = m.nodes[mv.node_id]
            refused[mv.node_id] = (
                f"already moving from {rec.partition} to {rec.desired}: "
                "a node moves again only once its last move converged"
            )
        elif current == mv.target:
            refused[mv.node_id] = f"already in {current}"
        else:
            events.append(
                NodePartitionSet(mv.node_id, mv.target, mv.reason, mv.break_glass, now, current)
            )
    return events, refused


def manual_moves(nodes: Sequence[str], to: str, reason: str, by: str) -> list[Move]:
    why = f"manual move by {by}: {reason}" if reason else f"manual move by {by}"
    return [Move(n, "", to, why) for n in nodes]


def glass_events(
    state: RegionState,
    cluster: ClusterView,
    to: str,
    count: int | None,
    ttl_s: float,
    reason: str,
    by: str,
    now: float,
) -> list[LogEvent]:
    """Break-glass: `BreakGlassSet` (first: the fold keeps where each node came from),
    then a move per node picked in disruption order (none: nothing to move)."""
    facts = node_facts(state, cluster)
    picked = break_glass(state.partitions.config, facts, to, count, now, reason)
    moves, _ = move_events(state, cluster, picked, now)
    if not moves:
        return []
    until = now + ttl_s if ttl_s > 0 else 0.0
    head = BreakGlassSet(to, tuple(e.node_id for e in moves), reason, by, until, now)
    return [head, *moves]


def restore_events(state: RegionState, reason: str, now: float) -> list[LogEvent]:
    """End the break-glass in force: each node it moved that is still bound where it
    sent it goes back to where it came from (one still draining is called back)."""
    m = state.partitions
    glass = m.glass
    if glass is None:
        return []
    events: list[LogEvent] = [BreakGlassEnded(reason, now)]
    for node_id in sorted(glass.origins):
        rec = m.nodes.get(node_id)
        origin = glass.origins[node_id]
        if rec is None or rec.desired != glass.to or origin == rec.desired:
            continue
        if rec.draining and rec.partition == origin:
            why = f"break-glass ended ({reason}): called back"
        else:
            why = f"break-glass ended ({reason}): back to {origin}"
        events.append(NodePartitionSet(node_id, origin, why, False, now, rec.partition))
    return events
