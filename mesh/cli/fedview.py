"""The global view (docs/federation.md, "Summaries and the global view"): `mesh region
list`, `mesh --region all job list | node list | pool list | cluster info`, and `mesh
job status ID` finding a job in whichever region holds it.

Regions are found from `region.list` (the summaries a region's coordinators heard)
plus the local region; each is asked concurrently, each within `REGION_TIMEOUT_S`, so a
region that is gone costs that timeout at most, once, and is named (a line on stderr,
and in `--json`). Exit 0 when every region answered, 3 when one did not (what the
others said is printed all the same).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mesh import subjects
from mesh.cli import output, render
from mesh.cli.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from mesh.client import MeshClient
from mesh.refusals import Refused
from mesh.schema import ApiError, ErrorCode, JobListRequest, JobRef

ALL = "all"  # `--region all`: every region known
REGION_TIMEOUT_S = 2.0
GLOBAL = {("job", "list"), ("node", "list"), ("pool", "list"), ("cluster", "info")}


def add_parser(sub: argparse._SubParsersAction) -> None:
    region = sub.add_parser("region", help="regions of the mesh").add_subparsers(
        dest="region_cmd", required=True
    )
    region.add_parser(
        "list", help="regions known, their summaries (capacity, free, queues), age and status"
    )


def command(args: argparse.Namespace) -> tuple[str, str | None]:
    return args.cmd, getattr(args, f"{args.cmd}_cmd", None)


def serves(args: argparse.Namespace) -> bool:
    """Whether this module answers the command (the others stay with commands.py)."""
    kind = command(args)
    return (
        args.cmd == "region"
        or kind == ("job", "status")
        or (getattr(args, "all_regions", False) and kind in GLOBAL)
    )


def usage_problem(args: argparse.Namespace) -> str | None:
    """`--region all` on a command that has no global view: said before connecting."""
    if getattr(args, "all_regions", False) and command(args) not in GLOBAL | {
        ("job", "status"),
        ("region", "list"),
    }:
        return (
            "--region all is for job list, node list, pool list, cluster info, job status "
            "and region list; name one region for this command"
        )
    return None


@dataclass
class Part:
    """One region's answer, or why there is none."""

    region: str
    reply: dict | None = None
    error: str = ""
    took_s: float = 0.0
    summary: dict | None = None  # its row of region.list, where known

    def to_dict(self) -> dict:
        s = self.summary or {}
        return {
            "region": self.region,
            "ok": self.reply is not None,
            "error": self.error or None,
            "answered_in_s": round(self.took_s, 3) if self.reply is not None else None,
            "summary": s.get("status", "unknown"),
            "summary_age_s": s.get("age_s"),
        }


async def ask(nc, region: str, endpoint: str, payload: Any = None) -> Part:
    started = time.monotonic()
    client = MeshClient(nc, region, timeout=REGION_TIMEOUT_S)
    try:
        reply = await asyncio.wait_for(client.request(endpoint, payload), REGION_TIMEOUT_S)
    except TimeoutError:
        return Part(region, error=f"no answer in {REGION_TIMEOUT_S:g}s")
    except ApiError as exc:
        return Part(region, error=f"{exc.code}: {exc.message}")
    except Refused as exc:  # this identity may not ask that region
        return Part(region, error=exc.message)
    return Part(region, reply, took_s=time.monotonic() - started)


def _connected_region(nc) -> str | None:
    """The cluster of the server this connection reached: in a supercluster, a region."""
    name = (getattr(nc, "_server_info", None) or {}).get("cluster")
    return name if subjects.is_token(name) else None


async def discover(nc, local: str | None) -> tuple[str | None, dict[str, dict]]:
    """The local region (the first of the context's and the connected server's that
    answers `region.list`) and the regions it knows, by name, as it lists them."""
    candidates = list(dict.fromkeys(r for r in (local, _connected_region(nc)) if r))
    parts = await asyncio.gather(*(ask(nc, r, "region.list") for r in candidates))
    for part in parts:
        if part.reply is not None:
            rows = {row["region"]: row for row in part.reply.get("regions", [])}
            return part.region, rows
    return None, {}


async def run(args: argparse.Namespace, client: MeshClient) -> int:
    kind = command(args)
    local = None if getattr(args, "all_regions", False) else client.region
    if kind == ("region", "list"):
        return await _region_list(args, client.nc, local or client.region)
    if kind == ("job", "status"):
        return await _job_status(args, client)
    return await _global(args, client.nc, local or client.region)


async def _region_list(args: argparse.Namespace, nc, local: str) -> int:
    found, rows = await discover(nc, local)
    if found is None:
        print(f"mesh region list: region {local} does not answer", file=sys.stderr)
        return EXIT_UNREACHABLE
    listed = sorted(rows.values(), key=lambda r: r["region"])
    output.emit(args, {"region": found, "regions": listed}, _regions_table(listed, found))
    return EXIT_OK


def _regions_table(rows: list[dict], local: str) -> str:
    if not rows:
        return f"no region summaries heard yet (asked {local})"
    out = []
    for r in rows:
        free, cap = r["free"], r["capacity"]
        biggest = r["largest_free"][0] if r["largest_free"] else {}
        out.append(
            [
                r["region"] + (" *" if r["region"] == local else ""),
                r["status"],
                f"{r['age_s']:.1f}s",
                r["leader"] or "-",
                r["health"],
                ", ".join(f"{k} {v}" for k, v in sorted(r["nodes"].items())) or "-",
                f"{render.resources(free)} of {render.resources(cap)}",
                render.resources(biggest) if biggest else "-",
                r["queued"],
            ]
        )
    headers = ["REGION", "STATUS", "AGE", "LEADER", "HEALTH", "NODES", "FREE", "LARGEST FREE"]
    return render.table(out, [*headers, "QUEUED"])


# ---------------------------------------------------------------- --region all


_ENDPOINTS: dict[tuple[str, str], tuple[str, str]] = {  # command -> endpoint, rows key
    ("job", "list"): ("job.list", "jobs"),
    ("node", "list"): ("node.list", "nodes"),
    ("pool", "list"): ("pool.list", "pools"),
    ("cluster", "info"): ("cluster.info", ""),
}


def _cluster_table(rows: list[dict], *, wide: bool = False, width: int | None = None) -> str:
    def counts(d: dict) -> str:
        return ", ".join(f"{k.lower()} {v}" for k, v in sorted(d.items())) or "none"

    table = [
        [r.get("leader") or "-", r.get("term", "-"), r.get("log_seq", "-")]
        + [counts(r.get("nodes", {})), counts(r.get("jobs", {}))]
        for r in rows
    ]
    return render.table(table, ["LEADER", "TERM", "LOG SEQ", "NODES", "JOBS"], width)


_TABLES: dict[str, Callable[..., str]] = {
    "jobs": render.jobs_table,
    "nodes": render.nodes_table,
    "pools": render.pools_table,
    "": _cluster_table,
}


async def _global(args: argparse.Namespace, nc, local: str) -> int:
    kind = command(args)
    endpoint, key = _ENDPOINTS[kind]
    found, known = await discover(nc, local)
    # Not answering region.list, the local region is asked again below, to be named
    # unreachable with its reason.
    names = list(dict.fromkeys([found, *sorted(known)])) if found else [local]
    payload = JobListRequest(args.state, args.pool, args.limit) if kind == ("job", "list") else None
    parts = await asyncio.gather(*(ask(nc, r, endpoint, payload) for r in names))
    for p in parts:
        p.summary = known.get(p.region)
    rows = []
    for p in parts:
        if p.reply is None:
            continue
        got = p.reply.get(key, []) if key else [{**p.reply, "ok": None}]
        rows.append((p.region, [{**row, "region": p.region} for row in got]))
    if kind == ("job", "list"):  # newest first, across regions, as a region lists them
        merged = sorted(
            ((r, j) for r, js in rows for j in js), key=lambda x: -(x[1]["submitted_at"] or 0)
        )[: args.limit]
        rows = [(r, [j for rr, j in merged if rr == r]) for r, _ in rows]
    missing = [p for p in parts if p.reply is None]
    for p in missing:
        print(f"mesh: region {p.region} unreachable: {p.error}", file=sys.stderr)
    flat = [row for _, part in rows for row in part]
    for row in flat:
        row.pop("ok", None)
    data = {
        "regions": [p.to_dict() for p in parts],
        key or "clusters": flat,
        "unreachable": [p.region for p in missing],
    }
    fn = _TABLES[key]
    human = _tagged(fn, rows, wide=False) + "\n" + _footer(parts)
    wide = _tagged(fn, rows, wide=True) + "\n" + _footer(parts)
    output.emit(args, data, human, wide)
    return EXIT_UNREACHABLE if missing else EXIT_OK


def _tagged(fn: Callable[..., str], parts: list[tuple[str, list[dict]]], *, wide: bool) -> str:
    """One table over every region's rows, a REGION column in front. A row may take
    several lines (a pool: one per kind), so each region's share of lines is counted
    from its rows alone (no width: nothing wraps)."""
    every = [row for _, rows in parts for row in rows]
    lines = fn(every, wide=wide).splitlines()
    tags = []
    for region, rows in parts:
        tags += [region] * (len(fn(rows, wide=wide).splitlines()) - 1) if rows else []
    if len(tags) != len(lines) - 1:  # cannot happen with the tables above; stay honest
        return "\n".join(f"== {r} ==\n{fn(rows, wide=wide)}" for r, rows in parts)
    width = max([len("REGION"), *map(len, tags)])
    head = f"{'REGION'.ljust(width)}  {lines[0]}"
    return "\n".join(
        [head] + [f"{t.ljust(width)}  {ln}" for t, ln in zip(tags, lines[1:], strict=True)]
    )


def _footer(parts: list[Part]) -> str:
    """Each region's part with its age: how long its answer took, how old its summary."""
    out = []
    for p in parts:
        s = p.summary
        seen = f"summary {s['status']}, {s['age_s']:.1f}s old" if s else "no summary heard"
        if p.reply is None:
            out.append(f"{p.region}: UNREACHABLE ({p.error}); {seen}")
        else:
            out.append(f"{p.region}: answered in {p.took_s * 1000:.0f}ms; {seen}")
    return "\n".join(out)


# ---------------------------------------------------------------- job status, anywhere


async def _job_status(args: argparse.Namespace, client: MeshClient) -> int:
    """The job in the local region if it is there; else in whichever other regions hold
    a job of that id (ids are unique within a region only: every match is named)."""
    local = None if getattr(args, "all_regions", False) else client.region
    matches: list[tuple[str, dict]] = []
    missing: list[Part] = []
    not_here: ApiError | None = None
    if local is not None:
        try:
            matches.append((local, await client.job(args.job_id)))
        except ApiError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
            not_here = exc
    if not matches:
        found, known = await discover(client.nc, local or client.region)
        others = [r for r in dict.fromkeys([found, *sorted(known)]) if r and r != local]
        parts = await asyncio.gather(
            *(ask(client.nc, r, "job.get", JobRef(args.job_id)) for r in others)
        )
        for p in parts:
            if p.reply is not None:
                matches.append((p.region, p.reply["job"]))
            elif not p.error.startswith(f"{ErrorCode.NOT_FOUND}:"):
                missing.append(p)
    for p in missing:
        print(f"mesh: region {p.region} unreachable: {p.error}", file=sys.stderr)
    if not matches:
        where = "" if not missing else " (some regions did not answer)"
        message = not_here.message if not_here else f"no job {args.job_id!r} in any region"
        print(f"error: {ErrorCode.NOT_FOUND}: {message}{where}", file=sys.stderr)
        return EXIT_UNREACHABLE if missing else EXIT_FAILED
    region, job = matches[0]
    if len(matches) > 1:
        also = ", ".join(r for r, _ in matches[1:])
        print(
            f"note: a job {args.job_id} is also in region(s) {also} (job ids are unique "
            f"within a region only; ask there with --region R)",
            file=sys.stderr,
        )
    width = output.terminal_width()
    head = f"region   {region}\n"
    human = head + render.job_detail(job, width=width)
    wide = head + render.job_detail(job, wide=True, width=width)
    data = {**job, "region": region}
    if len(matches) > 1:
        data["also_in"] = [r for r, _ in matches[1:]]
    output.emit(args, data, human, wide)
    return EXIT_OK
