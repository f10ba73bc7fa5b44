"""`python -m bench federation`: jobs spilling from an overloaded region, and the global view.

Three regions on this machine as a real NATS supercluster (`mesh.server.supercluster`:
one nats-server per region, joined by gateways; insecure, as the tests' `regions`
fixture runs it), each with one coordinator and a fleet of hollow nodes started in this
process (as tests/integration/conftest.py's Region does: the fleets' own per-run records
stay readable). `eu` is small and saturated by long jobs holding every core; `us` and
`ap` have room. In the same run:

1. A burst of `--jobs` short jobs submitted to eu (one `job.submit_many` batch) naming
   `regions: [eu, us, ap]` and `spill: {after: <--spill-after>}`, and as many in-region
   jobs submitted to us at the same moment (the baseline). Each job has a unique name,
   so it is found in whichever region holds it whatever id it has there.
2. Once every job ran (or `--timeout` passed), each region's view of each job
   (`job.get`: its task's history) says where it RAN: the node of each RUNNING entry
   belongs to one region's fleet. submit -> RUNNING = that entry's timestamp minus the
   wall-clock time just before the submit was sent (one clock: one machine), for spilled
   jobs (ran outside eu) against in-region jobs (the baseline, in us).
   cross-region placements/s = spilled jobs / time from the first moment a job could
   spill (submit + the bound) to the last spilled job RUNNING.
   duplicates = burst or baseline jobs run more than once, counted from the hollow
   agents' own records (their ledgers: every run each node started) and, apart,
   from the regions' job views (distinct (node, attempt) RUNNING entries). lost = jobs
   submitted but never RUNNING or SUCCEEDED anywhere within the timeout.
3. The global view's cost: `job list` through the API of one region (eu), against the
   same through `mesh --region all job list`'s own code (mesh.cli.fedview.run: discovery
   by `region.list`, every region asked at once, merged, printed as JSON to a buffer),
   called in this process so the figure is the fan-out's, not Python's start-up.

Everything shares this process's event loop (the coordinators, the fleets and the
measuring client): both latencies of (2) carry that cost alike, and are compared within
the run. Until a region forwards jobs (the spec fields `regions` and `spill`), no job
spills: the bench says so, reports the spilled figures as null and their targets false,
and measures the rest.

Targets (issue 20): >= 100 cross-region placements/s, spilled p99 <= 2 x in-region p99 +
the spill bound, 0 duplicate runs, 0 lost. A target about spilled jobs is false when no
job spilled. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import io
import time
import uuid
from pathlib import Path

from agent.hollow import GiB, HollowFleet, Inventory
from agent.ledger import Run, count_duplicates
from bench._util import (
    fmt_ms,
    loadavg,
    machine,
    ratio,
    simulated_job,
    summary_ms,
    with_state_dir,
)
from coordinator.service import Coordinator, CoordinatorConfig
from mesh.cli import fedview
from mesh.client import MeshClient
from mesh.connect import close_quietly, connect
from mesh.schema import JobListRequest
from mesh.server import supercluster

HOME, BASE = "eu", "us"
REGIONS = (HOME, BASE, "ap")
RAN = ("RUNNING", "SUCCEEDED")  # a task in one of these has run (or runs) somewhere
EU_NODE = Inventory(8, 32 * GiB)
ROOMY_NODE = Inventory(32, 128 * GiB)
LIST_LIMIT = 10_000  # JobListRequest's maximum: every job of the run


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench federation", description=__doc__.split("\n")[0]
    )
    p.add_argument("--jobs", type=int, default=200, help="burst jobs to eu, and baseline to us")
    p.add_argument("--spill-after", type=float, default=0.5, help="the burst's spill bound, s")
    p.add_argument("--duration", type=float, default=5.0, help="short jobs' simulated length, s")
    p.add_argument("--eu-nodes", type=int, default=2, help="eu's nodes (8 cores, all held)")
    p.add_argument("--nodes", type=int, default=4, help="us's and ap's nodes (32 cores each)")
    p.add_argument("--views", type=int, default=200, help="job list samples, each way")
    p.add_argument("--timeout", type=float, default=60.0, help="s for every job to run")
    p.add_argument("--quick", action="store_true", help="20 jobs, 30 views, 20 s timeout")
    p.add_argument("--state-dir", help="keep the servers' state here (default: a temp dir)")
    args = p.parse_args(argv)
    if args.quick:
        args.jobs, args.views, args.timeout = 20, 30, 20.0
    if args.jobs < 1 or args.views < 1 or args.eu_nodes < 1 or args.nodes < 1:
        p.error("--jobs, --views, --eu-nodes and --nodes must be at least 1")
    return args


def short_job(name: str, duration: float, spill_after: float | None = None) -> dict:
    """A one-task job; with `spill_after`, one that names all three regions and spills."""
    spec = simulated_job(name, duration)
    if spill_after is not None:
        spec["regions"] = list(REGIONS)
        spec["spill"] = {"after": f"{round(spill_after * 1000)}ms"}
    return spec


def filler(name: str) -> dict:
    """A job holding a whole eu node until the end of the run."""
    res = {"cpu": str(EU_NODE.cpus), "memory": "1Gi"}
    tasks = [{"role": "main", "count": 1, "resources": res, "simulate": {"duration": "forever"}}]
    return {"name": name, "tasks": tasks}


def main(argv: list[str]) -> dict:
    args = parse(argv)
    return with_state_dir(
        args.state_dir, "mesh-bench-federation-", lambda d: asyncio.run(_main(args, d))
    )


class Mesh:
    """The supercluster and what runs on it, in this process, so it can all be stopped."""

    def __init__(self, state_dir: Path) -> None:
        self.servers = supercluster(list(REGIONS), state_dir / "supercluster")
        self.ncs: dict[str, object] = {}
        self.clients: dict[str, MeshClient] = {}
        self.coordinators: list[Coordinator] = []
        self.fleets: dict[str, HollowFleet] = {}

    async def start(self, args: argparse.Namespace) -> None:
        await asyncio.gather(*(s.astart() for s in self.servers.values()))
        for r, server in self.servers.items():
            self.ncs[r] = await connect(server.url, name=f"bench-federation-{r}")
            self.clients[r] = MeshClient(self.ncs[r], region=r)
        for r in REGIONS:  # JetStream's meta leader spans the supercluster: wait for it
            await _eventually(lambda r=r: _jetstream_ready(self.ncs[r]), 30, "JetStream")
        for r, server in self.servers.items():
            c = Coordinator(CoordinatorConfig(server.url, region=r, candidate_id=f"{r}-c1"))
            await c.start()
            self.coordinators.append(c)
            inv = [EU_NODE] * args.eu_nodes if r == HOME else [ROOMY_NODE] * args.nodes
            fleet = HollowFleet(server.url, region=r, prefix=f"{r}-n", inventories=inv)
            await fleet.start()
            self.fleets[r] = fleet
        for r in REGIONS:
            want = len(self.fleets[r].nodes)
            await _eventually(lambda r=r, w=want: _ready(self.clients[r], w), 30, f"{r} ready")
        # Steady state, not start-up: every region hears every other's summary, and each
        # leader has led for `suspect_after` (a new leader answers no nomination before it
        # has heard its nodes).
        await _eventually(lambda: _all_fresh(self.clients[HOME]), 30, "summaries fresh")
        settle = max(c.config.suspect_after for c in self.coordinators)
        await asyncio.sleep(settle)

    async def stop(self) -> None:
        for fleet in self.fleets.values():
            with contextlib.suppress(Exception):
                await fleet.stop()
        for c in self.coordinators:
            with contextlib.suppress(Exception):
                await c.stop()
        for nc in self.ncs.values():
            await close_quietly(nc)
        for s in self.servers.values():
            s.stop()

    def region_of_node(self, node_id: str) -> str | None:
        return next((r for r, f in self.fleets.items() if node_id in f.nodes), None)


async def _eventually(pred, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await pred()
        except Exception:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench federation: {what} not reached within {timeout:g}s")
        await asyncio.sleep(interval)


async def _all_fresh(client: MeshClient) -> bool:
    rows = (await client.request("region.list"))["regions"]
    return {r["region"] for r in rows if r["status"] == "fresh"} >= set(REGIONS)


async def _jetstream_ready(nc) -> bool:
    await nc.jetstream().account_info()
    return True


async def _ready(client: MeshClient, nodes: int) -> bool:
    info = await client.cluster_info()
    return bool(info["leader"]) and info["nodes"].get("ready", 0) >= nodes


async def _main(args: argparse.Namespace, state_dir: Path) -> dict:
    load0 = loadavg()
    mesh = Mesh(state_dir)
    try:
        await mesh.start(args)
        print(
            f"supercluster up: {', '.join(REGIONS)}; {HOME}: {args.eu_nodes} x "
            f"{EU_NODE.cpus} cores, the others {args.nodes} x {ROOMY_NODE.cpus} cores"
        )
        fillers = await saturate(mesh, args)
        placed = await spill_phase(mesh, args, fillers)
        view = await global_view(mesh, args)
    finally:
        await mesh.stop()
    return report(args, placed, view, load0)


async def saturate(mesh: Mesh, args: argparse.Namespace) -> list[str]:
    """Every eu core held by a job that runs until the end: nothing more fits there.
    Returns the fillers' names."""
    eu = mesh.clients[HOME]
    names = [f"fill-{i}" for i in range(args.eu_nodes)]
    ids = [await eu.submit(filler(n)) for n in names]

    async def all_running() -> bool:
        return all([(await eu.job(j))["state"] == "RUNNING" for j in ids])

    try:
        await _eventually(all_running, 30, f"{HOME}'s fillers running")
    except RuntimeError as exc:
        why = {j: (await eu.job(j))["state"] for j in ids}
        raise RuntimeError(f"{exc}: {why}") from None
    print(f"{HOME} saturated: {len(ids)} jobs hold all {args.eu_nodes * EU_NODE.cpus} cores")
    return names


async def spill_phase(mesh: Mesh, args: argparse.Namespace, fillers: list[str]) -> dict:
    run = uuid.uuid4().hex[:6]
    burst = [f"sp-{run}-{i:04d}" for i in range(args.jobs)]
    base = [f"in-{run}-{i:04d}" for i in range(args.jobs)]
    burst_specs = [short_job(n, args.duration, args.spill_after) for n in burst]
    base_specs = [short_job(n, args.duration) for n in base]

    async def submit(region: str, specs: list[dict]) -> tuple[float, list[dict]]:
        t = time.time()
        return t, await mesh.clients[region].submit_many(specs)

    (t_burst, burst_res), (t_base, base_res) = await asyncio.gather(
        submit(HOME, burst_specs), submit(BASE, base_specs)
    )
    refused = [r["error"] for r in burst_res if "error" in r]
    burst_ok = [n for n, r in zip(burst, burst_res, strict=True) if "error" not in r]
    base_ok = [n for n, r in zip(base, base_res, strict=True) if "error" not in r]
    if refused:
        print(
            f"{len(refused)} of {len(burst)} burst jobs refused by {HOME}: "
            f"{refused[0]['code']}: {refused[0]['message'][:300]}"
        )
    if len(base_ok) < len(base):
        print(f"{len(base) - len(base_ok)} baseline jobs refused by {BASE}")
    submitted = {**dict.fromkeys(burst_ok, t_burst), **dict.fromkeys(base_ok, t_base)}
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.timeout:
        if not await _not_yet_run(mesh, submitted):
            break
        await asyncio.sleep(0.2)
    waited = time.monotonic() - t0
    runs = await _runs_in_views(mesh, {*submitted, *fillers})
    return {
        "burst": burst_ok,
        "base": base_ok,
        "submitted": submitted,
        "refused": refused,
        "waited_s": waited,
        "runs": runs,
        "agent_runs": _runs_in_agents(mesh, runs),
    }


async def _not_yet_run(mesh: Mesh, names) -> set[str]:
    """The names no region shows a task of RUNNING or SUCCEEDED yet (a job is RUNNING
    from its placement on, before its task is)."""
    left = set(names)
    for client in mesh.clients.values():
        for row in await client.jobs(limit=LIST_LIMIT):
            if any(row["task_states"].get(s) for s in RAN):
                left.discard(row["name"])
    return left


async def _runs_in_views(mesh: Mesh, names: set[str]) -> dict[str, dict]:
    """Per job name: its job id in each region holding it (`ids`), the distinct
    (node, attempt) RUNNING entries of its task histories across every region's view
    (`entries`: a home that mirrors the holder's state shows the same entry), each with
    its earliest timestamp, and where its nodes are (`ran_in`)."""
    out: dict[str, dict] = {n: {"ids": {}, "entries": {}, "ran_in": set()} for n in names}
    for region, client in mesh.clients.items():
        rows = [r for r in await client.jobs(limit=LIST_LIMIT) if r["name"] in names]
        details = await asyncio.gather(*(client.job(r["job_id"]) for r in rows))
        for job in details:
            rec = out[job["name"]]
            rec["ids"][region] = job["job_id"]
            for task in job["task_list"]:
                for h in task["history"]:
                    if h["state"] != "RUNNING" or not h["node_id"]:
                        continue
                    key = (h["node_id"], h["attempt"])
                    rec["entries"][key] = min(h["ts"], rec["entries"].get(key, h["ts"]))
                    rec["ran_in"].add(mesh.region_of_node(h["node_id"]) or "?")
                rec.setdefault("task_ids", {}).setdefault(region, set()).add(task["task_id"])
    return out


def _runs_in_agents(mesh: Mesh, runs: dict[str, dict]) -> dict:
    """Runs per job name from the hollow nodes' own records (each fleet's ledger,
    agent/ledger.py: every run a node started), with the jobs' task ids mapped per
    region; how many recorded runs belong to none of them; and the ledgers' own
    duplicate count (`count_duplicates`, task ids qualified by region)."""
    owner: dict[tuple[str, str], str] = {}
    for name, rec in runs.items():
        for region, tids in rec.get("task_ids", {}).items():
            for tid in tids:
                owner[(region, tid)] = name
    per_name: dict[str, int] = {}
    unattributed = 0
    ledger: list[Run] = []
    for region, fleet in mesh.fleets.items():
        for run in fleet.ledger():
            ledger.append(dataclasses.replace(run, task_id=f"{region}/{run.task_id}"))
            name = owner.get((region, run.task_id))
            if name is not None:
                per_name[name] = per_name.get(name, 0) + 1
            else:
                unattributed += 1
    return {
        "per_name": per_name,
        "unattributed": unattributed,
        "total": len(ledger),
        "ledger_duplicates": count_duplicates(ledger).summary(),
    }


async def global_view(mesh: Mesh, args: argparse.Namespace) -> dict:
    """`job list` in one region against `--region all job list` (fedview's fan-out)."""
    eu = mesh.clients[HOME]

    async def all_known():
        rows = (await eu.request("region.list"))["regions"]
        return {r["region"] for r in rows} >= set(REGIONS)

    await _eventually(all_known, 30, f"{HOME} hearing every region's summary")
    ns = argparse.Namespace(
        cmd="job",
        job_cmd="list",
        all_regions=True,
        state=None,
        pool=None,
        limit=100,
        output="json",
        json=True,
    )
    one, every, rcs = [], [], set()
    rows_one = rows_all = 0
    for _ in range(args.views):
        t = time.perf_counter()
        reply = await eu.request("job.list", JobListRequest(None, None, ns.limit))
        one.append(time.perf_counter() - t)
        rows_one = len(reply["jobs"])
        buf = io.StringIO()
        t = time.perf_counter()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            rcs.add(await fedview.run(ns, eu))
        every.append(time.perf_counter() - t)
        rows_all = buf.getvalue().count('"job_id"')
    return {"one": one, "every": every, "rcs": rcs, "rows_one": rows_one, "rows_all": rows_all}


def report(args: argparse.Namespace, placed: dict, view: dict, load0: float) -> dict:
    runs, submitted = placed["runs"], placed["submitted"]

    def latencies(names: list[str]) -> list[float]:
        return [
            min(runs[n]["entries"].values()) - submitted[n] for n in names if runs[n]["entries"]
        ]

    spilled = [n for n in placed["burst"] if runs[n]["ran_in"] - {HOME}]
    spilled_to = {r: sum(1 for n in spilled if r in runs[n]["ran_in"]) for r in REGIONS[1:]}
    in_region = [n for n in placed["base"] if runs[n]["ran_in"] == {BASE}]
    lost = sorted(n for n in submitted if not runs[n]["entries"])
    dup_views = sorted(n for n in submitted if len(runs[n]["entries"]) > 1)
    agent = placed["agent_runs"]
    dup_agents = sorted(n for n in submitted if agent["per_name"].get(n, 0) > 1)
    in_ms = summary_ms(latencies(in_region))
    sp_s = latencies(spilled)
    sp_ms = summary_ms(sp_s) if sp_s else None
    bound_ms = round(2 * in_ms["p99"] + args.spill_after * 1000.0, 2) if in_ms["n"] else None
    rate = window = None
    if spilled:
        last = max(min(runs[n]["entries"].values()) for n in spilled)
        window = last - (min(submitted[n] for n in spilled) + args.spill_after)
        rate = round(len(spilled) / window, 2) if window > 0 else None
    one, every = summary_ms(view["one"]), summary_ms(view["every"])

    print(f"in-region ({BASE}) submit->RUNNING: {fmt_ms(in_ms)}")
    if spilled:
        print(f"spilled submit->RUNNING: {fmt_ms(sp_ms)}; to {spilled_to}")
        print(f"cross-region placements: {rate}/s over {window:.3f} s")
    else:
        why = (
            f"{HOME} refused the spec's federation fields"
            if placed["refused"]
            else f"none ran outside {HOME} within {args.timeout:g} s"
        )
        print(f"no job spilled: {why}; spilled figures are null, their targets false")
    print(f"duplicates: agents {len(dup_agents)}, views {len(dup_views)}; lost {len(lost)}")
    print(f"job list, one region: {fmt_ms(one)} ({view['rows_one']} rows)")
    print(f"job list, --region all: {fmt_ms(every)} ({view['rows_all']} rows)")

    burst_ran = bool(placed["burst"]) and bool(spilled)
    targets = {
        "cross_region_placements_per_s>=100": rate is not None and rate >= 100,
        "spilled_p99<=2x_in_region_p99+bound": (
            sp_ms is not None and bound_ms is not None and sp_ms["p99"] <= bound_ms
        ),
        "zero_duplicates": burst_ran and not dup_agents and not dup_views,
        "zero_lost": burst_ran and not lost,
    }
    return {
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": load0,
        "loadavg_end": loadavg(),
        "config": {
            "regions": list(REGIONS),
            "home": HOME,
            "baseline_region": BASE,
            "eu_nodes": f"{args.eu_nodes} x {EU_NODE.cpus} cores (saturated)",
            "other_nodes": f"{args.nodes} x {ROOMY_NODE.cpus} cores",
            "jobs": args.jobs,
            "spill_after_s": args.spill_after,
            "job_duration_s": args.duration,
            "timeout_s": args.timeout,
            "secure": False,
            "in_process": True,
        },
        "federation_fields": (
            "accepted"
            if not placed["refused"]
            else f"refused: {placed['refused'][0]['message'][:200]}"
        ),
        "burst_submitted": len(placed["burst"]),
        "baseline_submitted": len(placed["base"]),
        "waited_s": round(placed["waited_s"], 2),
        "spilled": len(spilled),
        "spilled_to": spilled_to,
        "spilled_holder_keeps_home_id": (
            sum(1 for n in spilled if len(set(runs[n]["ids"].values())) == 1) if spilled else None
        ),
        "cross_region_placements_per_s": rate,
        "placement_window_s": round(window, 3) if window is not None else None,
        "spilled_submit_to_running_ms": sp_ms,
        "in_region_submit_to_running_ms": in_ms,
        "spilled_p99_bound_ms": bound_ms,
        "spilled_p99_over_in_region_p99": ratio(sp_ms["p99"], in_ms.get("p99")) if sp_ms else None,
        "duplicates_agents": len(dup_agents),
        "duplicates_views": len(dup_views),
        "agent_runs_total": agent["total"],
        "agent_runs_unattributed": agent["unattributed"],
        "ledger_duplicates": agent["ledger_duplicates"],
        "lost": len(lost),
        "lost_examples": lost[:5],
        "job_list_one_region_ms": one,
        "job_list_all_regions_ms": every,
        "job_list_rows": {"one_region": view["rows_one"], "all_regions": view["rows_all"]},
        "job_list_all_exit_codes": sorted(view["rcs"]),
        "job_list_all_over_one_p50": ratio(every.get("p50"), one.get("p50")),
        "job_list_all_over_one_p99": ratio(every.get("p99"), one.get("p99")),
        "targets": targets,
    }
