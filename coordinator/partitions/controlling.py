"""What the leader's partition loop asks each interval: the hotness windows fed from
heartbeats, and the controller's memory between decisions, around the pure `decide`.

Every candidate feeds the windows (`observe`, from its heartbeat subscription), so a
new leader decides on the same minutes of load its predecessor saw. Nothing here
reads a clock or does I/O: time is passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from coordinator.partitions.config import PartitionsConfig
from coordinator.partitions.controller import ControllerState, Move, NodeFacts, decide
from coordinator.partitions.hotness import (
    UNKNOWN,
    NodeHotness,
    NodeWindows,
    PartitionHotness,
    partition_hotness,
)
from coordinator.partitions.sample import sample_from_state
from mesh.schema import NodeState


class Controlling:
    def __init__(self) -> None:
        self.windows = NodeWindows()
        self.state = ControllerState()
        self.hotness: dict[str, PartitionHotness] = {}  # as of the last decision, for views
        self._partition: dict[str, str] = {}  # node -> the partition its window measured

    def observe(self, state: NodeState, now: float, window_s: float, partition: str = "") -> None:
        """Add a heartbeat to its node's window. `partition`: where the node is now;
        when it differs from where its window was filled, the window starts again: a
        node just lent from a busy batch partition would otherwise count as a hot
        stateless node for a whole window (its batch tasks' load, not the services'),
        and the controller would borrow again for heat the services never made."""
        self.windows.window_s = window_s
        self._measuring(state.node_id, partition)
        self.windows.add(state.node_id, sample_from_state(state, now))

    def _measuring(self, node_id: str, partition: str) -> None:
        """The node's window is of `partition` from now: emptied if it was another's
        (a flip is seen by whichever comes first, a heartbeat or a decision)."""
        if self._partition.get(node_id, partition) != partition:
            self.windows.forget(node_id)
        self._partition[node_id] = partition

    def forget(self, node_id: str) -> None:
        self.windows.forget(node_id)
        self._partition.pop(node_id, None)

    def measure(
        self, cfg: PartitionsConfig, facts: Sequence[NodeFacts], now: float
    ) -> tuple[dict[str, NodeHotness], dict[str, PartitionHotness]]:
        """Each node's window read once, and every configured partition summed (an empty
        one is cold): what a decision sees, and what `mesh partition list` shows now.
        Windows of nodes no longer in `facts` (down, or gone) are dropped."""
        live = {n.node_id for n in facts}
        for gone in [n for n in self._partition if n not in live]:
            self.forget(gone)
        for n in facts:
            self._measuring(n.node_id, n.partition)
        per_node = {n.node_id: self.windows.node(n.node_id, now, cfg) for n in facts}
        by_partition: dict[str, list[NodeHotness]] = {p.name: [] for p in cfg.partitions}
        for n in facts:
            by_partition.setdefault(n.partition, []).append(per_node[n.node_id])
        hotness = {
            name: partition_hotness(cfg, name, nodes) for name, nodes in by_partition.items()
        }
        return per_node, hotness

    def hold(self) -> None:
        """The controller is not being asked (a break-glass is in force): what it saw
        before counts for no dwell after. Its hot and cold timers start again when it is
        next asked, as after a freeze; without this, the first decision after a restore
        took `hot_since`/`cold_since` from before the break-glass as if the partition had
        stayed so all along unseen, and borrowed or returned at once, just after the
        restore's own moves. Its recent moves (the hourly rate limit) are kept."""
        self.state = dataclasses.replace(self.state, hot_since=(), cold_since=())

    def __call__(
        self, cfg: PartitionsConfig, facts: Sequence[NodeFacts], now: float
    ) -> tuple[Sequence[Move], str]:
        """`PartitionLoop`'s `Decide`: `measure`, each node's p90 put in its facts, then
        `decide`."""
        per_node, self.hotness = self.measure(cfg, facts, now)
        filled = [
            dataclasses.replace(
                n, p90=None if per_node[n.node_id].state == UNKNOWN else per_node[n.node_id].p90
            )
            for n in facts
        ]
        decision = decide(cfg, filled, self.hotness, self.state, now)
        self.state = decision.state
        return decision.moves, decision.why
