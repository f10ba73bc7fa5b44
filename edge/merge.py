"""A window of a site's stored events, merged into fewer messages for the region. Pure.

Every message the region's events stream stores is written and, with `sync_interval:
always`, fsync'd before it is acknowledged: forwarding a backlog of 2,000 one-event
messages one by one took 12.5 s in the edge bench, the hub's disk doing one sync each.
Merged, one node's events of a window travel as a few `TaskEventBatch`es (up to
`MAX_EVENT_BATCH` each), the same messages an agent sends when several events are ready
together.

What the merge keeps:
- per node, the events in the site's order (a node's messages become its batches in
  order, published in order on one connection);
- the rule a batch keeps for the region's leader: no two events of one task attempt in
  one batch (RUNNING and SUCCEEDED of one attempt go in two batches, in order);
- a message that does not decode goes as it is, alone (the region counts it as bad, as
  it would have without the link), and one message that is its own unit keeps its bytes
  and its `Nats-Msg-Id`.

A merged batch's message id is made from the ids it merges, so a window sent again
whole is de-duplicated by the region's stream. Correctness does not rest on that: a
window may be cut differently when resent, and the region's fold drops a (task, attempt,
state) it already has.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

from mesh import subjects
from mesh.codec import WireError, encode
from mesh.schema import MAX_EVENT_BATCH, TaskEvent, TaskEventBatch, decode_task_events


class Stored(NamedTuple):
    """One message of the site stream, as the link read it."""

    seq: int
    subject: str
    data: bytes
    msg_id: str | None


class Unit(NamedTuple):
    """What the link publishes once: the site-stream sequences it carries, the node
    (None: not a site events subject, skipped), the payload and its headers."""

    seqs: tuple[int, ...]
    node: str | None
    data: bytes
    headers: dict[str, str] | None


@dataclass
class _Open:
    node: str
    seqs: list[int] = field(default_factory=list)
    events: list[TaskEvent] = field(default_factory=list)
    attempts: set[tuple[str, int]] = field(default_factory=set)
    ids: list[str] = field(default_factory=list)
    raw: Stored | None = None  # the one message it holds, while it holds one

    def takes(self, events: tuple[TaskEvent, ...]) -> bool:
        if len(self.events) + len(events) > MAX_EVENT_BATCH:
            return False
        return not any((ev.task_id, ev.attempt) in self.attempts for ev in events)

    def add(self, msg: Stored, events: tuple[TaskEvent, ...]) -> None:
        self.raw = msg if not self.seqs else None
        self.seqs.append(msg.seq)
        self.events.extend(events)
        self.attempts.update((ev.task_id, ev.attempt) for ev in events)
        self.ids.append(msg.msg_id or f"seq:{msg.seq}")

    def unit(self) -> Unit:
        if self.raw is not None:  # as the agent sent it
            headers = {"Nats-Msg-Id": self.raw.msg_id} if self.raw.msg_id else None
            return Unit((self.raw.seq,), self.node, self.raw.data, headers)
        digest = hashlib.sha256("\n".join(self.ids).encode()).hexdigest()[:32]
        data = encode(TaskEventBatch(self.node, tuple(self.events)))
        return Unit(tuple(self.seqs), self.node, data, {"Nats-Msg-Id": f"site-merge:{digest}"})


def merge_window(region: str, site: str, window: list[Stored]) -> list[Unit]:
    """The window's messages as units to publish, in the order of their first message
    (so a node's units keep its order)."""
    units: list[_Open | Unit] = []
    open_by_node: dict[str, _Open] = {}
    for msg in window:
        node = subjects.site_events_node(region, site, msg.subject)
        if node is None:
            units.append(Unit((msg.seq,), None, msg.data, None))
            continue
        try:
            speaker, events = decode_task_events(msg.data)
        except WireError:
            speaker, events = "", ()
        if speaker != node or not events:
            # Not what an agent of this node sends: as it is, alone, for the region to
            # judge (and its place in the node's order kept: what follows starts anew).
            open_by_node.pop(node, None)
            headers = {"Nats-Msg-Id": msg.msg_id} if msg.msg_id else None
            units.append(Unit((msg.seq,), node, msg.data, headers))
            continue
        cur = open_by_node.get(node)
        if cur is None or not cur.takes(events):
            cur = open_by_node[node] = _Open(node)
            units.append(cur)
        cur.add(msg, events)
    return [u.unit() if isinstance(u, _Open) else u for u in units]
