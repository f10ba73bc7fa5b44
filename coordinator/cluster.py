"""The leader's view of the nodes, from their heartbeats.

A node that misses heartbeats is first `suspect` (no new placements), then `down`
(its tasks are declared LOST). Time comes in as an argument so tests need no sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.schema import NodeState

READY, SUSPECT, DOWN = "ready", "suspect", "down"


@dataclass(slots=True)
class NodeView:
    state: NodeState
    last_seen: float  # receiver's monotonic clock: senders' clocks are not trusted
    status: str = READY

    @property
    def node_id(self) -> str:
        return self.state.node_id

    @property
    def live_tasks(self) -> frozenset[str]:
        return frozenset(self.state.tasks)


class ClusterView:
    def __init__(self, region: str, suspect_after: float = 3.0, down_after: float = 10.0) -> None:
        self.region = region
        self.suspect_after = suspect_after
        self.down_after = down_after
        self.nodes: dict[str, NodeView] = {}
        self.rejected = 0

    def observe(self, state: NodeState, now: float) -> bool:
        """Record a heartbeat; True if the node is new or came back (worth a reconcile)."""
        if state.region != self.region:
            self.rejected += 1
            return False
        view = self.nodes.get(state.node_id)
        if view is None:
            self.nodes[state.node_id] = NodeView(state, now)
            return True
        came_back = view.status != READY
        view.state, view.last_seen, view.status = state, now, READY
        return came_back

    def sweep(self, now: float) -> list[str]:
        """Update statuses from heartbeat age; returns nodes whose status changed."""
        changed = []
        for view in self.nodes.values():
            age = now - view.last_seen
            status = (
                DOWN if age >= self.down_after else SUSPECT if age >= self.suspect_after else READY
            )
            if status != view.status:
                view.status = status
                changed.append(view.node_id)
        return changed

    def ready(self) -> list[NodeView]:
        return [v for v in self.nodes.values() if v.status == READY]
