"""`mesh partition`: list, get, apply, move, break-glass, restore (docs/partitions.md).

Talks only to the request API (`partition.*`). A break-glass and a manual move are
recorded with who asked (`--user`, the context's user) and why (`--reason`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mesh.cli import output
from mesh.cli.exitcodes import EXIT_OK
from mesh.cli.render import ago, table
from mesh.client import MeshClient
from mesh.schema import (
    BreakGlassRequest,
    PartitionApplyRequest,
    PartitionMoveRequest,
    PartitionRef,
    RestoreRequest,
)
from workloads.quantity import SpecError, format_bytes, format_cpu, parse_duration


def add_parser(sub: argparse._SubParsersAction) -> None:
    part = sub.add_parser(
        "partition", help="node partitions: stateless, batch, moves"
    ).add_subparsers(dest="partition_cmd", required=True)
    part.add_parser(
        "list",
        help="partitions: nodes, capacity, allocatable, allocation, busy, moves, break-glass",
    )
    pg = part.add_parser("get", help="one partition and its nodes")
    pg.add_argument("name")
    pa = part.add_parser("apply", help="set the partitions config from a YAML file")
    pa.add_argument("file", help="config file, or - for stdin")
    mv = part.add_parser("move", help="move nodes to a partition (drained first)")
    mv.add_argument("nodes", nargs="+", metavar="NODE")
    mv.add_argument("--to", required=True, metavar="PARTITION")
    mv.add_argument("--reason", default="")
    bg = part.add_parser(
        "break-glass", help="move batch nodes to a partition now (batch preempted at once)"
    )
    bg.add_argument("--to", required=True, metavar="PARTITION")
    which = bg.add_mutually_exclusive_group(required=True)
    which.add_argument("--nodes", type=int, metavar="N", help="this many nodes")
    which.add_argument("--all", action="store_true", help="every movable node")
    bg.add_argument("--ttl", default="30m", help="ends by itself after this (0: never)")
    bg.add_argument("--reason", required=True, help="why (recorded with who)")
    rs = part.add_parser("restore", help="end the break-glass: its nodes go back")
    rs.add_argument("--reason", default="")


def check(args: argparse.Namespace) -> str | None:
    """A usage problem found before connecting, or None."""
    if args.partition_cmd == "break-glass":
        try:
            args.ttl_s = parse_duration(args.ttl, "--ttl")
        except SpecError as exc:
            return str(exc)
        if args.nodes is not None and args.nodes < 1:
            return "--nodes: must be at least 1"
        if not args.reason.strip():
            return "--reason: say why (it is recorded)"
    return None


def _fmt(kind: str, amounts: dict) -> str:
    v = amounts.get(kind, 0)
    return format_cpu(v) if kind == "cpu" else format_bytes(v)


def _hot(h: dict | None) -> str:
    """The controller's view of a partition: its state, the share of its known nodes
    hot, and its p90 busy over the window (e.g. `hot 100% p90 0.95`)."""
    if not h:
        return "-"
    if h["state"] == "unknown":
        return "unknown"
    return f"{h['state']} {h['hot_fraction']:.0%} p90 {h['p90']:.2f}"


def partitions_table(reply: dict, width: int | None = None) -> str:
    rows = []
    for p in reply["partitions"]:
        rows.append(
            [
                p["name"] + (" (protected)" if p["protected"] else ""),
                p["nodes"],
                p["draining"],
                p["incoming"],
                f"{_fmt('cpu', p['capacity'])}/{_fmt('cpu', p['allocatable'])}",
                _fmt("cpu", p["allocation"]),
                "-" if p["busy"] is None else f"{p['busy']:.0%}",
                _hot(p.get("hotness")),
                "-" if p["trend"] is None else f"{p['trend']:+.4f}/s",
                p["moves_last_hour"],
            ]
        )
    headers = ["PARTITION", "NODES", "DRAINING", "INCOMING", "CPU CAP/ALLOC", "ALLOCATED"]
    text = table(rows, [*headers, "BUSY", "HOTNESS", "TREND", "MOVES/1H"], width)
    g = reply.get("break_glass")
    if g:
        until = f", until {ago(g['until'])}" if g.get("until") else ", until restored"
        text += (
            f"\nbreak-glass to {g['to']}: {len(g['nodes'])} nodes, by {g['by']} "
            f"{ago(g['since'])}{until}: {g['reason']}"
        )
    else:
        text += "\nbreak-glass: none"
    return text


def _moves(moves: list[dict]) -> str:
    if not moves:
        return "no node moves"
    return "\n".join(f"{m['node_id']}: {m['from']} -> {m['to']} ({m['reason']})" for m in moves)


async def run(args: argparse.Namespace, client: MeshClient, texts: list) -> int:
    cmd, width = args.partition_cmd, output.terminal_width()
    by = getattr(args, "acting_user", "") or ""
    if cmd == "list":
        reply = await client.request("partition.list", {}, retries=5)
        reply.pop("ok", None)
        output.emit(args, reply, partitions_table(reply, width))
    elif cmd == "get":
        p = (await client.request("partition.get", PartitionRef(args.name), retries=5))["partition"]
        nodes = [
            [n["node_id"], n["status"], n["desired_partition"], n["drain"], n["move_reason"] or "-"]
            for n in p["node_list"]
        ]
        human = partitions_table({"partitions": [p]}, width).rsplit("\n", 1)[0]
        human += "\n\n" + table(nodes, ["NODE", "STATUS", "DESIRED", "DRAIN", "WHY"], width)
        output.emit(args, p, human)
    elif cmd == "apply":
        ((_, text),) = texts
        reply = await client.request("partition.apply", PartitionApplyRequest(text), retries=5)
        output.emit(args, reply["partitions"], f"applied: {', '.join(reply['partitions'])}")
    elif cmd == "move":
        req = PartitionMoveRequest(tuple(args.nodes), args.to, args.reason, by)
        reply = await client.request("partition.move", req, retries=5)
        human = _moves(reply["moves"])
        if reply["unchanged"]:
            human += f"\nalready in {args.to}: {', '.join(reply['unchanged'])}"
        output.emit(args, _clean(reply), human)
    elif cmd == "break-glass":
        count = None if args.all else args.nodes
        req = BreakGlassRequest(args.to, count, args.ttl_s, args.reason, by)
        reply = await client.request("partition.break_glass", req, retries=5)
        if not reply["moves"]:
            print("break-glass: no node could be moved", file=sys.stderr)
        output.emit(args, _clean(reply), _moves(reply["moves"]))
    else:
        reply = await client.request(
            "partition.restore", RestoreRequest(args.reason, by), retries=5
        )
        output.emit(args, _clean(reply), "break-glass ended\n" + _moves(reply["moves"]))
    return EXIT_OK


def _clean(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reply.items() if k != "ok"}
