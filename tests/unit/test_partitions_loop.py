"""The leader's partition loop (coordinator/partitions/loop.py) while a break-glass is in
force: the controller is not asked, and its dwell timers are held, so that once it is
asked again it judges only what it saw from then on."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

from coordinator.partitions.loop import PartitionLoop
from coordinator.state import RegionState
from mesh.schema import BreakGlassSet, NodePartitionSet
from tests.unit.test_reconcile import Log


@dataclass
class _Coord:
    cluster: object = None  # not read while a break-glass is in force


@dataclass
class _Leader:
    """What the loop reads of its leader on this path: the fold, and its coordinator."""

    state: RegionState
    coord: _Coord = field(default_factory=_Coord)


async def test_while_a_break_glass_is_in_force_the_controller_is_held_not_asked():
    log = Log()
    log.append(
        BreakGlassSet("stateless", ("n1",), "outage", "alice", 0.0, 10.0),
        NodePartitionSet("n1", "stateless", "break-glass: outage", True, 10.0, "batch"),
    )
    asked: list[float] = []
    held: list[float] = []

    def decide(cfg, facts, now):
        asked.append(now)
        return (), ""

    loop = PartitionLoop(_Leader(log.state), decide=decide, hold=lambda: held.append(1.0))
    await loop.step(20.0)
    await loop.step(21.0)
    assert asked == [] and held == [1.0, 1.0]


async def test_a_new_term_holds_first_and_a_shorter_interval_counts_at_once():
    """The loop's first act is a hold (the last term's dwell timers are stale); a config
    that shortens interval_s is obeyed within a tick, not after the old interval."""

    asked: list[float] = []
    held: list[int] = []
    state = Log().state
    loop = PartitionLoop(_Leader(state), hold=lambda: held.append(1))
    loop.step = _counting(asked)  # what a step does is the other test's
    state.partitions.config = dataclasses.replace(state.partitions.config, interval_s=3600.0)
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(0.05)
    assert held == [1] and asked == []
    state.partitions.config = dataclasses.replace(state.partitions.config, interval_s=0.05)
    await asyncio.sleep(1.5)
    task.cancel()
    assert len(asked) >= 2  # an hour's interval would have asked nothing yet


def _counting(asked):
    async def step(now: float) -> None:
        asked.append(now)

    return step
