"""The request API's partition endpoints (docs/api.md, docs/partitions.md): list, get,
apply the config, move named nodes, break-glass and restore. Served by `api.Api`, whose
writing path (`_append`: fenced, through the leader's log writer) every write takes."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from coordinator.partitions.config import parse_partitions_config
from coordinator.partitions.moves import (
    glass_events,
    manual_moves,
    move_events,
    node_facts,
    restore_events,
)
from coordinator.partitions.views import glass_dict, node_partition, partition_rows
from mesh.schema import (
    ApiError,
    BreakGlassRequest,
    ErrorCode,
    NodePartitionSet,
    PartitionApplyRequest,
    PartitionMoveRequest,
    PartitionRef,
    PartitionsConfigSet,
    RestoreRequest,
    ok,
)
from workloads.quantity import SpecError

if TYPE_CHECKING:
    from coordinator.api import Api

ENDPOINTS = (
    "partition.list",
    "partition.get",
    "partition.apply",
    "partition.move",
    "partition.break_glass",
    "partition.restore",
)
WRITES = frozenset(
    {"partition.apply", "partition.move", "partition.break_glass", "partition.restore"}
)


def handlers(
    api: Api, decode: Callable[[type, bytes], Any]
) -> dict[str, Callable[[bytes], Awaitable[bytes]]]:
    """`decode`: the API's request decoder (a bad request is BAD_REQUEST, by field)."""
    p = PartitionApi(api, decode)
    return {
        "partition.list": p.list,
        "partition.get": p.get,
        "partition.apply": p.apply,
        "partition.move": p.move,
        "partition.break_glass": p.break_glass,
        "partition.restore": p.restore,
    }


class PartitionApi:
    def __init__(self, api: Api, decode: Callable[[type, bytes], Any]) -> None:
        self.api = api
        self.decode = decode

    @property
    def state(self):
        return self.api.coord.state

    def _rows(self, now: float) -> list[dict]:
        """The partition rows, with each partition's hotness read from this candidate's
        windows now (every candidate feeds them, so a follower answers as the leader
        would; kept only in a divided region)."""
        c = self.api.coord
        m = c.state.partitions
        hot = None
        if m.divided:
            _, hot = c.controlling.measure(m.config, node_facts(c.state, c.cluster), now)
        return partition_rows(c.state, c.cluster, now, hot)

    async def list(self, data: bytes) -> bytes:
        c = self.api.coord
        rows = self._rows(time.time())
        m = c.state.partitions
        return ok(
            partitions=rows,
            break_glass=glass_dict(m),
            default_partition=m.config.default_partition,
        )

    async def get(self, data: bytes) -> bytes:
        req = self.decode(PartitionRef, data)
        c = self.api.coord
        rows = {r["name"]: r for r in self._rows(time.time())}
        if req.name not in rows:
            raise ApiError(ErrorCode.NOT_FOUND, f"no partition {req.name!r}")
        row = rows[req.name]
        nodes = [
            {"node_id": n, "status": c.cluster.nodes[n].status}
            | node_partition(c.state.partitions, c.cluster.nodes[n])
            for n in row["node_ids"]
        ]
        return ok(partition={**row, "node_list": nodes})

    async def apply(self, data: bytes) -> bytes:
        req = self.decode(PartitionApplyRequest, data)
        try:
            cfg = parse_partitions_config(req.source)
        except SpecError as exc:
            raise ApiError(ErrorCode.INVALID_SPEC, str(exc)) from None
        names = {p.name for p in cfg.partitions}
        m, c = self.state.partitions, self.api.coord
        held = {m.partition_of(n, v.state.labels) for n, v in c.cluster.nodes.items()}
        stranded = sorted((held | {r.desired for r in m.nodes.values()}) - names)
        if stranded:
            raise ApiError(
                ErrorCode.CONFLICT,
                f"nodes are in (or moving to) {', '.join(stranded)}, which this config "
                "drops; move them first (`mesh partition move`)",
            )
        leader = self.api._leader()
        await self.api._append(leader, [PartitionsConfigSet(req.source, time.time())])
        leader.wake()
        return ok(partitions=[p.name for p in cfg.partitions])

    def _to(self, to: str) -> str:
        names = self.state.partitions.names()
        if to not in names:
            raise ApiError(
                ErrorCode.BAD_REQUEST, f"to: no partition {to!r}; known: {', '.join(sorted(names))}"
            )
        return to

    async def move(self, data: bytes) -> bytes:
        req = self.decode(PartitionMoveRequest, data)
        to = self._to(req.to)
        if not req.nodes:
            raise ApiError(ErrorCode.BAD_REQUEST, "nodes: name at least one node")
        c = self.api.coord
        unknown = [n for n in req.nodes if n not in c.cluster.nodes]
        if unknown:
            raise ApiError(ErrorCode.NOT_FOUND, f"no node {unknown[0]!r}")
        now = time.time()
        events, refused = move_events(
            c.state, c.cluster, manual_moves(req.nodes, to, req.reason, req.by or "unknown"), now
        )
        moving = {r: why for r, why in refused.items() if not why.startswith("already in")}
        if moving:
            raise ApiError(
                ErrorCode.CONFLICT, "; ".join(f"{n}: {why}" for n, why in sorted(moving.items()))
            )
        if events:
            leader = self.api._leader()
            await self.api._append(leader, events)
            leader.wake()
        return ok(moves=_moves(events), unchanged=sorted(refused))

    async def break_glass(self, data: bytes) -> bytes:
        req = self.decode(BreakGlassRequest, data)
        to = self._to(req.to)
        if not req.reason.strip():
            raise ApiError(ErrorCode.BAD_REQUEST, "reason: say why (it is recorded)")
        m, c = self.state.partitions, self.api.coord
        if m.glass is not None:
            raise ApiError(
                ErrorCode.CONFLICT,
                f"a break-glass to {m.glass.to} is in force (by {m.glass.by}: {m.glass.reason}); "
                "`mesh partition restore` ends it",
            )
        now = time.time()
        by = req.by or "unknown"
        events = glass_events(c.state, c.cluster, to, req.count, req.ttl_s, req.reason, by, now)
        if events:
            leader = self.api._leader()
            await self.api._append(leader, events)
            leader.wake()
        moves = [e for e in events if isinstance(e, NodePartitionSet)]
        return ok(moves=_moves(moves), break_glass=glass_dict(m))

    async def restore(self, data: bytes) -> bytes:
        req = self.decode(RestoreRequest, data or b"\x80")
        if self.state.partitions.glass is None:
            raise ApiError(ErrorCode.CONFLICT, "no break-glass is in force")
        by = req.by or "unknown"
        why = f"restored by {by}" + (f": {req.reason}" if req.reason else "")
        events = restore_events(self.state, why, time.time())
        leader = self.api._leader()
        await self.api._append(leader, events)
        leader.wake()
        return ok(moves=_moves([e for e in events if isinstance(e, NodePartitionSet)]))


def _moves(events: list[NodePartitionSet]) -> list[dict]:
    return [
        {"node_id": e.node_id, "from": e.source, "to": e.desired, "reason": e.reason}
        for e in events
    ]
