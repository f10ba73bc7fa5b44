"""The leader's partition loop: every controller interval, end a break-glass whose TTL
ran out, else ask the controller for moves and log them. The I/O shell around the pure
parts (`moves.py`, the controller's `decide`); the drain itself runs in every
reconcile round (`drain.py`).

`decide` is passed in (`Decide`: config, node facts, clock -> moves and a line saying
why): the leader passes its coordinator's `Controlling` (hotness windows and the
controller's memory around the pure `controller.decide`). The controller is asked only
in a region split into partitions (`Membership.divided`), and not while a break-glass
is in force: the operator's word stands until restore or the TTL, and `hold` (the
`Controlling`'s) is called each interval meanwhile, so the controller's dwell timers
start again once it is asked after the break-glass ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from coordinator.joblog import Fenced, Unavailable
from coordinator.partitions.config import PartitionsConfig
from coordinator.partitions.controller import Move, NodeFacts
from coordinator.partitions.moves import move_events, node_facts, restore_events
from mesh.schema import NodePartitionSet

if TYPE_CHECKING:
    from coordinator.leader import Leader

log = logging.getLogger("mesh.partitions")

TICK_S = 1.0
"""The longest the loop sleeps before it looks at the config's interval again."""

Decide = Callable[[PartitionsConfig, Sequence[NodeFacts], float], tuple[Sequence[Move], str]]


class PartitionLoop:
    def __init__(
        self,
        leader: Leader,
        decide: Decide | None = None,
        hold: Callable[[], None] | None = None,
    ) -> None:
        self.leader = leader
        self.decide = decide
        self.hold = hold
        self.last_why = ""

    async def run(self) -> None:
        # A new term: what the controller remembers of hot and cold is from the last time
        # this candidate led, minutes or days ago; the windows (fed all along) are current.
        if self.hold is not None:
            self.hold()
        last = time.monotonic()
        while True:
            # Ticks of at most a second, so a newly applied interval_s counts at once
            # rather than after the old interval has run out.
            interval = self.leader.state.partitions.config.interval_s
            await asyncio.sleep(max(0.0, min(TICK_S, last + interval - time.monotonic())))
            interval = self.leader.state.partitions.config.interval_s
            if time.monotonic() - last < interval:
                continue
            last = time.monotonic()
            try:
                await self.step(time.time())
            except (Fenced, Unavailable) as exc:
                log.warning("partition loop: %s", exc)
            except Exception:
                log.exception("partition loop round failed")

    async def step(self, now: float) -> None:
        state, cluster = self.leader.state, self.leader.coord.cluster
        m = state.partitions
        events = []
        if m.glass is not None:
            if self.hold is not None:
                self.hold()
            if m.glass.until_ts and now >= m.glass.until_ts:
                events = restore_events(state, "its TTL ran out", now)
                log.info("break-glass to %s ended: its TTL ran out", m.glass.to)
        elif self.decide is not None and m.divided:
            moves, self.last_why = self.decide(m.config, node_facts(state, cluster), now)
            events, refused = move_events(state, cluster, moves, now)
            if events:
                log.info("partition controller: %s", self.last_why)
            for node_id, why in refused.items():
                log.warning("partition controller's move of %s left out: %s", node_id, why)
        if events:
            await self.leader.writer.append(events)
            self.leader.wake()
            for e in events:  # one line per move, once it is in the log
                if isinstance(e, NodePartitionSet):
                    log.info("node %s moves %s -> %s: %s", e.node_id, e.source, e.desired, e.reason)
