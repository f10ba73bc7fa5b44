"""Placement: a pipeline of filter and score plugins over an immutable snapshot
(`snapshot`, `plugins`), gangs placed all or nothing by the core (`core`), and plans
committed against the live view (`planner`). See docs/placement.md."""

from coordinator.placement.core import (
    GangRequest,
    Placement,
    PlacementResult,
    Placer,
    TaskRequest,
    describe,
    place,
)
from coordinator.placement.planner import commit
from coordinator.placement.plugins import PROFILES, Profile, Shape
from coordinator.placement.snapshot import ISOLATION_LEVEL, GpuSlot, NodeInfo, Snapshot

__all__ = [
    "ISOLATION_LEVEL",
    "PROFILES",
    "GangRequest",
    "GpuSlot",
    "NodeInfo",
    "Placement",
    "PlacementResult",
    "Placer",
    "Profile",
    "Shape",
    "Snapshot",
    "TaskRequest",
    "commit",
    "describe",
    "place",
]
