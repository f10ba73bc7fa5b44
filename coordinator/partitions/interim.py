"""INTERIM (pmoves): `NodeFacts`, `Move` and `break_glass` as agreed with pcontroller
(briefs/partitions-interface.md), until its `controller.py` lands. At merge, imports of
this module point at `coordinator.partitions.controller` and this file goes.

`break_glass` here is a simple disruption-ordered pick: every node not already in (or
moving to) `to`, not in a protected partition, without non-preemptible work; empty
nodes first, then fewest tasks, lowest priority sum, node id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.partitions.config import PartitionsConfig


@dataclass(frozen=True)
class NodeFacts:
    node_id: str
    zone: str
    partition: str
    desired: str
    draining: bool
    last_moved: float
    home: str
    tasks: int
    priority_sum: int
    non_preemptible: bool
    services: int


@dataclass(frozen=True)
class Move:
    node_id: str
    source: str
    target: str
    reason: str
    break_glass: bool = False


def break_glass(
    cfg: PartitionsConfig,
    nodes: Sequence[NodeFacts],
    to: str,
    count: int | None,
    now: float,
    reason: str,
) -> tuple[Move, ...]:
    protected = {p.name for p in cfg.partitions if p.protected}
    movable = [
        n
        for n in nodes
        if n.partition != to
        and n.desired != to
        and not n.draining
        and n.partition not in protected
        and not n.non_preemptible
    ]
    movable.sort(key=lambda n: (n.tasks > 0, n.tasks, n.priority_sum, n.node_id))
    picked = movable if count is None else movable[:count]
    return tuple(
        Move(n.node_id, n.partition, to, f"break-glass: {reason}", break_glass=True) for n in picked
    )
