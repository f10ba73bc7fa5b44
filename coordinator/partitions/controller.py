"""The partition controller: config, node facts, partition hotness and the clock in; moves out.

Pure and deterministic: the same inputs give the same moves in the same order (ties are
broken by node id), and nothing is read from a clock or a random source. The shell keeps
:class:`ControllerState` between calls and writes each :class:`Move` to the job log.

The rules (README.md beside this file has them with their anchors):

- ``stateless`` borrows from the lenders (``batch`` and its unprotected virtual
  partitions) when it has been hot for ``borrow_after_s``: more than ``hot_fraction`` of
  its known nodes above the busy line, or, with ``forecast``, expected to be one interval
  ahead; at once, past the dwell and the rate limits, when more than ``spike_fraction`` of
  its nodes are hot now (a spike). When it has been cold (below ``cold_fraction``, and not
  forecast otherwise) for ``return_after_s`` it gives nodes back: borrowed ones (``home``
  set) home first, then its own to ``batch``, down to its minimum. In the dead band
  between, nothing moves. After each borrow the dwell starts again (borrowing repeats
  every ``borrow_after_s`` at most); giving back, once cold for ``return_after_s``,
  goes on each interval while it stays cold (borrow fast, return slowly).
- It moves only as many nodes as bring the hot fraction to the middle of the dead band
  (borrowing counts the nodes already on their way; returning also keeps the partition's
  p90, spread over the nodes left, at or below the busy line), and never more than the
  rate limits allow: ``nodes_per_move`` per decision, ``moves_per_hour`` over the last hour,
  ``max_draining`` and ``max_draining_per_zone`` counting nodes already in flight.
- A node is never moved while a move of it is in flight, within ``cooldown_s`` of its
  last move, while it runs non-preemptible work, or while its hotness is unknown; a
  partition never drops below its ``min_nodes`` (counting nodes by their desired
  partition); protected virtual partitions never lend.
- Any configured partition without hotness, or "unknown", freezes the controller.
"""

from __future__ import annotations

import copy
import heapq
import math
import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.partitions.config import BATCH, STATELESS, PartitionsConfig
from coordinator.partitions.hotness import COLD, HOT, UNKNOWN, PartitionHotness
from workloads.quantity import SpecError

__all__ = [
    "HOUR_S",
    "ControllerState",
    "Decision",
    "Move",
    "NodeFacts",
    "break_glass",
    "decide",
]

HOUR_S = 3600.0
"""How long a move stays in ``ControllerState.recent_moves`` (the moves-per-hour window)."""

_P90_BUCKET = 20  # returns group p90 in 0.05-wide buckets, then prefer fewest services


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the controller knows of one node, built by the shell."""

    node_id: str
    zone: str
    partition: str  # current
    desired: str  # desired (== partition unless a move is in flight)
    draining: bool
    last_moved: float  # when its last move converged (0: never)
    home: str  # the partition it belonged to before it was lent ("" = never lent)
    tasks: int  # live tasks on it
    priority_sum: int
    non_preemptible: bool  # any live task that may not be preempted
    services: int  # live service replicas on it
    p90: float | None = None  # NodeWindows.node(...).p90; None when the node is "unknown"


@dataclass(frozen=True, slots=True)
class Move:
    node_id: str
    source: str
    target: str
    reason: str
    break_glass: bool = False


@dataclass(frozen=True, slots=True)
class ControllerState:
    """What decide() remembers between calls (kept by the shell; also in the log)."""

    hot_since: tuple[tuple[str, float], ...] = ()  # partition -> since when hot
    cold_since: tuple[tuple[str, float], ...] = ()
    recent_moves: tuple[tuple[str, float], ...] = ()  # (node_id, ts) in the last hour


@dataclass(frozen=True, slots=True)
class Decision:
    moves: tuple[Move, ...]
    state: ControllerState
    why: str  # one line; "frozen: ..." when data is missing


def _is_hot(cfg: PartitionsConfig, ph: PartitionHotness) -> bool:
    return ph.state == HOT or (cfg.forecast and ph.forecast_fraction > cfg.hot_fraction)


def _is_spike(cfg: PartitionsConfig, ph: PartitionHotness) -> bool:
    """Nearly every node hot *now* (measured, not forecast): the load outran the
    rate-limited moves, a spike; services burn their objective while a dwell waits."""
    return ph.hot_fraction > cfg.spike_fraction


def _is_cold(cfg: PartitionsConfig, ph: PartitionHotness) -> bool:
    return ph.state == COLD and (not cfg.forecast or ph.forecast_fraction < cfg.cold_fraction)


def _seen(ph: PartitionHotness, cfg: PartitionsConfig) -> str:
    text = f"{ph.hot}/{ph.known} nodes above busy {cfg.busy_line:.2f} ({ph.hot_fraction:.0%}"
    if cfg.forecast:
        text += f", forecast {ph.forecast_fraction:.0%}"
    return text + ")"


def _detail(n: NodeFacts) -> str:
    if n.tasks == 0:
        return "empty node"
    return f"{n.tasks} task{'s' if n.tasks != 1 else ''}, priority {n.priority_sum}"


class _Limits:
    """The room left this decision: per decision, per hour, drains at once, drains per
    zone, and per-partition minimums, with what stopped a node when one did."""

    def __init__(
        self,
        cfg: PartitionsConfig,
        nodes: Sequence[NodeFacts],
        recent: tuple[tuple[str, float], ...],
    ) -> None:
        self.cfg = cfg
        self.desired: dict[str, int] = Counter([n.desired for n in nodes])
        flying = [n for n in nodes if n.desired != n.partition or n.draining]
        self.in_flight = len(flying)
        self.in_flight_into: dict[str, int] = {}
        self.zone_draining: dict[str, int] = {}
        for n in flying:
            self.zone_draining[n.zone] = self.zone_draining.get(n.zone, 0) + 1
            if n.desired != n.partition:
                self.in_flight_into[n.desired] = self.in_flight_into.get(n.desired, 0) + 1
        self.minimum = {p.name: p.min_nodes for p in cfg.partitions}
        self.hour_left = cfg.moves_per_hour - len(recent)
        self.drain_left = cfg.max_draining - self.in_flight
        self.room = min(cfg.nodes_per_move, self.hour_left, self.drain_left)
        self.per_zone = cfg.max_draining_per_zone

    def lift(self, nodes: int) -> None:
        """A spike's room: every rate limit off (the minimums stay)."""
        self.room = self.per_zone = nodes

    def copy(self) -> _Limits:
        other = copy.copy(self)
        other.desired, other.zone_draining = dict(self.desired), dict(self.zone_draining)
        return other

    def why_no_room(self) -> str:
        cfg = self.cfg
        if self.hour_left <= 0:
            return f"rate limit: {cfg.moves_per_hour} moves in the last hour (moves_per_hour)"
        return f"rate limit: {self.in_flight} nodes draining (max_draining {cfg.max_draining})"

    def above_minimum(self, partition: str) -> bool:
        return self.desired.get(partition, 0) > self.minimum.get(partition, 0)

    def zone_ok(self, zone: str) -> bool:
        return self.zone_draining.get(zone, 0) < self.per_zone

    def take(self, n: NodeFacts, target: str) -> None:
        self.desired[n.partition] -= 1
        self.desired[target] = self.desired.get(target, 0) + 1
        self.zone_draining[n.zone] = self.zone_draining.get(n.zone, 0) + 1
        self.room -= 1


def _last_moves(recent: tuple[tuple[str, float], ...]) -> dict[str, float]:
    last: dict[str, float] = {}
    for node_id, ts in recent:
        if ts > last.get(node_id, -math.inf):
            last[node_id] = ts
    return last


class _Skips:
    """Why nodes were passed over, counted, for a one-line why."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, why: str) -> None:
        self.counts[why] = self.counts.get(why, 0) + 1

    def __str__(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())) or "none there"


def _movable(
    n: NodeFacts, now: float, cfg: PartitionsConfig, last: dict[str, float], skips: _Skips
) -> bool:
    """Whether the controller may move this node now, whatever the direction."""
    if n.desired != n.partition or n.draining:
        skips.add("in flight")
        return False
    if n.non_preemptible:
        skips.add("non-preemptible work")
        return False
    if n.p90 is None:
        skips.add("hotness unknown")
        return False
    moved = max(n.last_moved if n.last_moved > 0 else -math.inf, last.get(n.node_id, -math.inf))
    if now - moved < cfg.cooldown_s:
        skips.add("cooling down")
        return False
    return True


def decide(
    cfg: PartitionsConfig,
    nodes: Sequence[NodeFacts],
    hotness: Mapping[str, PartitionHotness],
    state: ControllerState,
    now: float,
) -> Decision:
    """This interval's moves (often none), the state to pass next time, and why."""
    recent = tuple((n, t) for n, t in state.recent_moves if t > now - HOUR_S)
    for name in cfg.names:
        ph = hotness.get(name)
        if ph is None or ph.state == UNKNOWN:
            if ph is None:
                why = f"frozen: no hotness for partition {name}"
            else:
                why = (
                    f"frozen: partition {name} unknown "
                    f"({ph.nodes - ph.known} of {ph.nodes} nodes without fresh reports)"
                )
            return Decision((), ControllerState((), (), recent), why)

    old_hot, old_cold = dict(state.hot_since), dict(state.cold_since)
    hot_since: dict[str, float] = {}
    cold_since: dict[str, float] = {}
    for name in cfg.names:
        ph = hotness[name]
        if _is_hot(cfg, ph):
            hot_since[name] = min(old_hot.get(name, now), now)
        elif _is_cold(cfg, ph):
            cold_since[name] = min(old_cold.get(name, now), now)

    ph = hotness[STATELESS]
    seen = _seen(ph, cfg)
    moves: tuple[Move, ...] = ()
    if STATELESS in hot_since:
        hot_for = now - hot_since[STATELESS]
        spike = _is_spike(cfg, ph)
        if hot_for < cfg.borrow_after_s and not spike:
            why = f"stateless hot: {seen} for {hot_for:.0f} s of {cfg.borrow_after_s:.0f} s"
        else:
            seen = f"{seen} for {hot_for:.0f} s"
            moves, why = _borrow(cfg, nodes, ph, recent, now, seen, spike)
            if moves:
                hot_since[STATELESS] = now  # the next borrow waits a dwell again
    elif STATELESS in cold_since:
        cold_for = now - cold_since[STATELESS]
        if cold_for < cfg.return_after_s:
            why = f"stateless cold: {seen} for {cold_for:.0f} s of {cfg.return_after_s:.0f} s"
        else:
            moves, why = _return(cfg, nodes, ph, recent, now, f"{seen} for {cold_for:.0f} s")
    else:
        why = (
            f"stateless {ph.state}: {seen}, in the dead band "
            f"{cfg.cold_fraction:.0%}..{cfg.hot_fraction:.0%}: no move"
        )

    recent += tuple((m.node_id, now) for m in moves)
    new_state = ControllerState(
        tuple(sorted(hot_since.items())), tuple(sorted(cold_since.items())), recent
    )
    return Decision(moves, new_state, why)


def _target_fraction(cfg: PartitionsConfig) -> float:
    """Where a move aims the hot fraction: the middle of the dead band, so that the
    partition lands neither hot nor cold."""
    return (cfg.hot_fraction + cfg.cold_fraction) / 2


def _borrow(
    cfg: PartitionsConfig,
    nodes: Sequence[NodeFacts],
    ph: PartitionHotness,
    recent: tuple[tuple[str, float], ...],
    now: float,
    seen: str,
    spike: bool = False,
) -> tuple[tuple[Move, ...], str]:
    head = f"stateless hot: {seen}"
    limits = _Limits(cfg, nodes, recent)
    if spike:
        # When (nearly) all are hot, the hot share says nothing of how far past the line
        # the load is; the windows' p90 still holds the minutes before. Size from the
        # load now (each node's newest score), as if it spread over more nodes: enough
        # to bring its mean to the busy line. Later decisions top up (nodes on their way
        # count); a busy clipped at 1.0 understates, and the next decision sees more.
        need = max(1, math.ceil(ph.known * ph.last / cfg.busy_line - ph.known - 1e-9))
        head += (
            f"; spike ({ph.hot_fraction:.0%} hot > spike_fraction {cfg.spike_fraction:.0%}, "
            f"busy now {ph.last:.2f}): dwell and rate limits skipped"
        )
        limits.lift(len(nodes))
    else:
        hot = max(ph.hot, ph.forecast_fraction * ph.known if cfg.forecast else 0.0)
        # m cold nodes more bring hot / (known + m) down to the target fraction.
        need = max(1, math.ceil(hot / _target_fraction(cfg) - ph.known - 1e-9))
    coming = limits.in_flight_into.get(STATELESS, 0)
    if need <= coming:
        return (), f"{head}; {coming} nodes already on their way, {need} needed"
    if limits.room <= 0:
        return (), f"{head}; {limits.why_no_room()}"
    want = min(need - coming, limits.room)

    lenders = set(cfg.lenders())
    cd = cfg.cooldown_s
    cooling = {node_id for node_id, t in recent if now - t < cd}
    # _movable's rules, inlined: this runs over every lender node of a large region.
    candidates = [
        n
        for n in nodes
        if n.partition in lenders
        and n.desired == n.partition
        and not n.draining
        and not n.non_preemptible
        and n.p90 is not None
        and (n.last_moved <= 0 or now - n.last_moved >= cd)
        and n.node_id not in cooling
    ]
    # The few first in disruption order are nearly always enough; all of them, sorted,
    # only when minimums or zone limits passed over too many.
    few = 4 * want + 16
    ordered = (
        heapq.nsmallest(few, candidates, key=_disruption)
        if 10 * few < len(candidates)
        else _first_by_tasks(candidates, few)
    )
    moves, skips = _lend(ordered, want, limits.copy(), head)
    if len(moves) < want and len(ordered) < len(candidates):
        moves, skips = _lend(sorted(candidates, key=_disruption), want, limits, head)
    if len(moves) < want:  # say what stood in the way (counted only when something did)
        last = _last_moves(recent)
        for n in nodes:
            if n.partition in lenders:
                _movable(n, now, cfg, last, skips)
    if not moves:
        return (), f"{head}; no node can be lent (passed over: {skips})"
    more = f"; passed over: {skips}" if skips.counts else ""
    return tuple(moves), f"{head}; borrow {len(moves)} of {need - coming} needed{more}"


def _first_by_tasks(candidates: list[NodeFacts], few: int) -> list[NodeFacts]:
    """At least ``few`` of them (all, if fewer) first in disruption order: grouped by
    task count (a small number), only the groups needed sorted. A spike borrows hundreds
    at once; sorting thousands of lender nodes by (tasks, priority, id) was most of its
    decision's time."""
    by_tasks: dict[int, list[NodeFacts]] = {}
    for n in candidates:
        by_tasks.setdefault(n.tasks, []).append(n)
    out: list[NodeFacts] = []
    for tasks in sorted(by_tasks):
        out += sorted(by_tasks[tasks], key=_disruption)
        if len(out) >= few:
            break
    return out


_disruption = operator.attrgetter("tasks", "priority_sum", "node_id")
"""Peloton's batch host order: empty nodes first (no task count is below 0), then fewest
tasks, lowest priority sum; node id breaks ties. In C: a spike sorts every lender node."""


def _lend(
    ordered: list[NodeFacts], want: int, limits: _Limits, head: str
) -> tuple[list[Move], _Skips]:
    moves: list[Move] = []
    skips = _Skips()
    for n in ordered:
        if len(moves) == want:
            break
        if not limits.above_minimum(n.partition):
            skips.add(f"{n.partition} at min_nodes")
            continue
        if not limits.zone_ok(n.zone):
            skips.add("zone drain limit")
            continue
        limits.take(n, STATELESS)
        reason = f"{head}; borrow from {n.partition} ({_detail(n)})"
        moves.append(Move(n.node_id, n.partition, STATELESS, reason))
    return moves, skips


def _lent(n: NodeFacts) -> bool:
    """Whether a stateless node was borrowed from a lender (and so has a home to go to)."""
    return n.home not in ("", STATELESS)


def _home(cfg: PartitionsConfig, n: NodeFacts) -> str:
    """Where a node given back goes: its home, or batch if it has none or that is gone
    (stateless's own nodes are lent to batch, the default lender)."""
    return n.home if _lent(n) and cfg.spec(n.home) is not None else BATCH


def _return(
    cfg: PartitionsConfig,
    nodes: Sequence[NodeFacts],
    ph: PartitionHotness,
    recent: tuple[tuple[str, float], ...],
    now: float,
    seen: str,
) -> tuple[tuple[Move, ...], str]:
    head = f"stateless cold: {seen}"
    serving = [n for n in nodes if n.partition == STATELESS]
    if not serving:
        return (), f"{head}; no stateless node to give back"
    # Giving back m nodes leaves hot / (known - m): keep it at or below the target. And
    # if the load spreads over the nodes left, their p90 grows by known / (known - m):
    # keep that at or below the busy line too, or the return would make it hot again.
    excess = math.floor(ph.known - ph.hot / _target_fraction(cfg) + 1e-9)
    excess = min(excess, math.floor(ph.known * (1.0 - ph.p90 / cfg.busy_line) + 1e-9))
    if excess <= 0:
        return (), f"{head}; returning any would make it hot again"
    limits = _Limits(cfg, nodes, recent)
    if limits.room <= 0:
        return (), f"{head}; {limits.why_no_room()}"
    want = min(excess, limits.room)

    last = _last_moves(recent)
    skips = _Skips()
    lent: list[NodeFacts] = []
    own: list[NodeFacts] = []
    for n in serving:
        if _movable(n, now, cfg, last, skips):
            (lent if _lent(n) else own).append(n)
    # Borrowed nodes go home before stateless lends its own; each group round the zones.
    moves: list[Move] = []
    for group in (lent, own):
        if not _give_back(cfg, group, want, limits, skips, moves, head):
            break
    if not moves:
        return (), f"{head}; no stateless node can be given back (passed over: {skips})"
    more = f"; passed over: {skips}" if skips.counts else ""
    borrowed = sum(1 for n in serving if _lent(n))
    return tuple(moves), f"{head}; give back {len(moves)} ({borrowed} borrowed){more}"


def _coldest(n: NodeFacts) -> tuple:
    """Return order: p90 in 0.05-wide buckets, then fewest services, then p90, then id."""
    p90 = n.p90 or 0.0
    return (int(p90 * _P90_BUCKET), n.services, p90, n.node_id)


def _give_back(
    cfg: PartitionsConfig,
    group: list[NodeFacts],
    want: int,
    limits: _Limits,
    skips: _Skips,
    moves: list[Move],
    head: str,
) -> bool:
    """Append moves out of stateless from ``group``, one zone's coldest at a time, the
    coldest zone first, until ``want`` in all; False once stateless is at its minimum."""
    by_zone: dict[str, list[NodeFacts]] = {}
    for n in group:
        by_zone.setdefault(n.zone, []).append(n)
    for queue in by_zone.values():
        queue.sort(key=_coldest, reverse=True)  # coldest last: pop() takes it
    while len(moves) < want and by_zone:
        for zone in sorted(by_zone, key=lambda z: _coldest(by_zone[z][-1])):
            if len(moves) == want:
                break
            queue = by_zone[zone]
            if not limits.zone_ok(zone):
                skips.add("zone drain limit")
                del by_zone[zone]
                continue
            if not limits.above_minimum(STATELESS):
                skips.add("stateless at min_nodes")
                return False
            n = queue.pop()
            home = _home(cfg, n)
            limits.take(n, home)
            verb = "return to" if _lent(n) else "lend to"
            reason = (
                f"{head}; {verb} {home} (p90 {n.p90:.2f}, {n.services} service"
                f"{'s' if n.services != 1 else ''}, zone {zone})"
            )
            moves.append(Move(n.node_id, STATELESS, home, reason))
            if not queue:
                del by_zone[zone]
    return True


def break_glass(
    cfg: PartitionsConfig,
    nodes: Sequence[NodeFacts],
    to: str,
    count: int | None,
    now: float,
    reason: str,
) -> tuple[Move, ...]:
    """Hand lender nodes to ``to`` at once: ``count`` of them, or all movable when None.

    Skips the dwell, the cool-down and every rate limit, but keeps the disruption order
    (empty nodes first, then fewest tasks, lowest priority sum) and the invariants no
    emergency should break: protected partitions are never taken, a node with
    non-preemptible work is never drained, a node already in flight is left to finish,
    and no partition goes below its ``min_nodes`` (that minimum *is* the reserve an
    operator keeps for batch; with the default of 0, ``--all`` takes every node).
    ``now`` is not consulted: nothing here waits."""
    spec = cfg.spec(to)
    if spec is None:
        raise SpecError("to", f"names no configured partition, got {to!r}")
    lenders = cfg.lenders()
    if to in lenders or spec.parent == BATCH or to == BATCH:
        raise SpecError("to", f"break-glass moves batch nodes away from batch, not to {to!r}")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise SpecError("count", f"expected a whole number of nodes >= 1, got {count!r}")
    if not isinstance(reason, str) or not reason.strip():
        raise SpecError("reason", "say why (it is recorded with the moves)")

    desired: dict[str, int] = {}
    for n in nodes:
        desired[n.desired] = desired.get(n.desired, 0) + 1
    minimum = {p.name: p.min_nodes for p in cfg.partitions}
    candidates = sorted(
        (
            n
            for n in nodes
            if n.partition in lenders
            and n.desired == n.partition
            and not n.draining
            and not n.non_preemptible
        ),
        key=_disruption,
    )
    moves = []
    for n in candidates:
        if count is not None and len(moves) == count:
            break
        if desired[n.partition] <= minimum.get(n.partition, 0):
            continue
        desired[n.partition] -= 1
        why = f"break-glass to {to}: {reason.strip()} ({_detail(n)})"
        moves.append(Move(n.node_id, n.partition, to, why, break_glass=True))
    return tuple(moves)
