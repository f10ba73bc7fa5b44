"""The site link's decisions, pure: where its cursor goes after a window of forwards,
which nodes a beat names, whether the region is reachable, and whether a node's
heartbeat goes on to the region.

The cursor is the last site-stream sequence the hub's events stream acknowledged with
every sequence before it acknowledged too. A window is sent pipelined (all at once,
acks awaited after), so acks come back for any subset; only the contiguous acked prefix
moves the cursor, and the rest is sent again from there. What is sent again is the
same message with the same `Nats-Msg-Id`, and the hub's fold ignores a transition of
(task, attempt, state) it already has, so a second copy changes nothing even past the
stream's de-duplication window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgpack

# What the region acts on in a heartbeat (placement, LOST, verification, the node's
# site): a change in any of these is relayed at once; the rest (load, usage, ts) waits.
ACTED_ON = ("tasks", "refusing", "capacity", "labels", "verify_key", "note", "site")


@dataclass(frozen=True, slots=True)
class Advance:
    """`cursor`: the new cursor; `forwarded`: how many of the window it moved over;
    `complete`: every message of the window was acknowledged (else: resend from cursor)."""

    cursor: int
    forwarded: int
    complete: bool


def advance(cursor: int, results: Iterable[tuple[int, bool]]) -> Advance:
    """`results`: (stream sequence, acknowledged by the hub) for a window sent in order
    from `cursor + 1`. Sequences may skip (a purged or deleted message is not sent):
    the cursor moves over each acknowledged one until the first that was not."""
    moved = 0
    complete = True
    for seq, ok in results:
        if seq <= cursor:
            continue  # already behind the cursor (a window read before it moved)
        if not ok:
            complete = False
            break
        cursor = seq
        moved += 1
    return Advance(cursor, moved, complete)


def heard_nodes(last_heard: Mapping[str, float], now: float, window_s: float) -> tuple[str, ...]:
    """The nodes heard within `window_s` before `now`, sorted (a beat's `nodes`)."""
    return tuple(sorted(n for n, t in last_heard.items() if now - t <= window_s))


def reachable(last_answer: float | None, now: float, within_s: float) -> bool:
    """The region is reachable while the hub answered (a forward's ack, a JetStream API
    call) within `within_s`; never answered: not reachable."""
    return last_answer is not None and now - last_answer <= within_s


def acted_on(state: Mapping) -> bytes:
    """The part of a heartbeat (its wire dict) the region acts on, comparable."""
    return msgpack.packb([state.get(f) for f in ACTED_ON])


def relay_due(last: tuple[float, bytes] | None, what: bytes, now: float, every_s: float) -> bool:
    """Whether a node's heartbeat goes on to the region: its first, one that changed in
    what the region acts on since the last relayed (`last`: when, `acted_on` of it), or
    `every_s` after the last relayed."""
    return last is None or last[1] != what or now - last[0] >= every_s
