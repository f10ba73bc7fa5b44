"""`python -m bench edge`: edge sites cut and restored while jobs run on them.

One hub: a hub nats-server (JetStream domain `hub`, leafnodes listening) and one
coordinator in this process. `--sites` sites of `--nodes` hollow nodes each, all in one
child process (bench/_edge_sites.py): per site a leaf nats-server (its own process; its
remote dials the hub through a TCP proxy from tests/integration/tcpproxy.py), its
SiteLink and a HollowFleet(site=S) on the leaf. The hub's CPU (hub nats-server + this
process: coordinator, submitter and measuring subscriptions) is psutil CPU time over
the run; the sites' links and fleets, in the child, are not in it.

While a steady stream of short batch jobs runs on the sites' nodes, a schedule cuts
sites and restores them, in turn: reset, black-hole, flap, outages of `--outage` s,
one at a time per site, `--cut-every` s apart; and site s00 has one long outage
(`--long-outage`) with a backlog: `--backlog` jobs pinned to it (label `bench-site`)
running when it is cut, ending while it is away.

Figures (reported, never asserted):
- lost: events a site's leaf stream acknowledged (the fleet publisher's acks) that are
  not in the hub's view at the end (the coordinator's task histories through `job.get`:
  (task, attempt, state)); duplicates: from the fleets' ledgers (agent/ledger.py
  `count_duplicates`), and apart, tasks with two RUNNING (node, attempt) entries in the
  hub's histories;
- resync: link restored -> every event the site had acknowledged by then has reached
  the hub (a core subscription on the hub's event subjects, where the link forwards);
- black-hole noticed: cut -> the hub's `site.list` says `disconnected`, and cut -> the
  site's SiteUplink says unreachable (heard on the leaf);
- hub CPU per site: (hub nats-server + this process) CPU seconds / wall / sites, in %;
- edge footprint, one real site of 4 nodes: a `mesh edge up` process (agent + link), its leaf
  nats-server, RSS summed; idle uplink bytes/s per node, from its proxy's byte counters
  over `--idle` s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import random
import sys
import time
from pathlib import Path

import psutil

from bench import _edge_footprint as footprint
from bench._util import loadavg, machine, percentile, simulated_job, summary_ms, with_state_dir
from coordinator.service import Coordinator, CoordinatorConfig
from mesh import subjects
from mesh.client import FINISHED, MeshClient
from mesh.codec import WireError
from mesh.connect import close_quietly, connect
from mesh.schema import decode_task_events
from mesh.server import EmbeddedServer, ServerConfig
from tests.integration.tcpproxy import UNDIALABLE

REGION = "edge"
MODES = ("reset", "blackhole", "flap")
LONG_SITE = "s00"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench edge", description=__doc__.split("\n")[0])
    p.add_argument("--sites", type=int, default=50)
    p.add_argument("--nodes", type=int, default=4, help="hollow nodes per site")
    p.add_argument("--rate", type=float, default=20.0, help="jobs submitted per second")
    p.add_argument("--job-s", type=float, default=8.0, help="a short job's simulated length")
    p.add_argument("--outage", type=float, default=10.0, help="a short cut's length, s")
    p.add_argument("--cut-every", type=float, default=4.0, help="s between short cuts")
    p.add_argument("--long-outage", type=float, default=180.0, help="s00's long cut, s")
    p.add_argument("--backlog", type=int, default=2000, help="jobs ending during the long cut")
    p.add_argument("--flap-s", type=float, default=1.0, help="a flap's half period, s")
    p.add_argument("--idle", type=float, default=60.0, help="idle window of the footprint, s")
    p.add_argument("--drain", type=float, default=120.0, help="s for the last jobs to end")
    p.add_argument("--quick", action="store_true", help="3 sites, short cuts, seconds")
    p.add_argument("--state-dir", help="keep the servers' state here (default: a temp dir)")
    args = p.parse_args(argv)
    if args.quick:
        args.sites, args.rate, args.job_s, args.outage, args.cut_every = 3, 6.0, 3.0, 5.0, 2.0
        args.long_outage, args.backlog, args.idle, args.drain = 12.0, 200, 3.0, 20.0
        args.flap_s = 0.5
    if args.sites < 2 or args.nodes < 1:
        p.error("--sites must be at least 2 (s00 has the long cut) and --nodes at least 1")
    return args


def main(argv: list[str]) -> dict:
    args = parse(argv)
    return with_state_dir(args.state_dir, "mesh-bench-edge-", lambda d: asyncio.run(_main(args, d)))


def short_job(name: str, duration: float, site: str | None = None) -> dict:
    spec = simulated_job(name, duration, memory="16Mi")
    if site is not None:
        spec["placement"] = {"labels": {"bench-site": site}}
    return spec


# ---------------------------------------------------------------- the sites' process


class Sites:
    """The child process holding every site, driven one JSON line at a time."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.ready: dict = {}
        self._ids = itertools.count()
        self._lock = asyncio.Lock()

    async def start(self, args, hub_leaf_port: int, state_dir: Path) -> None:
        log = open(state_dir / "sites.log", "ab")  # noqa: SIM115  (the child's stderr)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench._edge_sites",
            "--hub-leaf-port",
            str(hub_leaf_port),
            "--region",
            REGION,
            "--sites",
            str(args.sites),
            "--nodes",
            str(args.nodes),
            "--state-dir",
            str(state_dir),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            limit=256 * 1024 * 1024,
        )
        log.close()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 300)
        self.ready = json.loads(line) if line else {"ready": False, "error": "exited"}
        if not self.ready.get("ready"):
            tail = (state_dir / "sites.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"bench edge: sites did not start: {self.ready} {tail}")

    async def ask(self, op: str, **kw) -> dict:
        async with self._lock:
            rid = next(self._ids)
            self.proc.stdin.write((json.dumps({"id": rid, "op": op, **kw}) + "\n").encode())
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        reply = json.loads(line)
        if reply.get("id") != rid or "error" in reply:
            raise RuntimeError(f"bench edge: sites answered {reply} to request {rid}")
        return reply

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ask("stop"), 30)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 20)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


# ---------------------------------------------------------------- the hub's view


class HubView:
    """Every task event that reached the hub (core subscription on the hub's event
    subjects, where the site links forward), with when it first arrived."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int, str], float] = {}
        self.bad = 0

    async def start(self, nc) -> None:
        await nc.subscribe(subjects.events_all(REGION), cb=self._on_msg)

    async def _on_msg(self, msg) -> None:
        try:
            _node, evs = decode_task_events(msg.data)
        except WireError:
            self.bad += 1
            return
        now = time.time()
        for ev in evs:
            self.seen.setdefault((ev.task_id, ev.attempt, str(ev.state)), now)


async def _eventually(pred, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if value := await pred():
                return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench edge: {what} not reached within {timeout:g}s")
        await asyncio.sleep(interval)


async def site_status(client: MeshClient) -> dict[str, str] | None:
    """The hub's word on each site (`site.list`), or None where the API has none."""
    try:
        rows = (await client.request("site.list"))["sites"]
    except Exception:
        return None
    return {r["site"]: r["status"] for r in rows}


def hub_tracks_sites() -> bool:
    """Whether the coordinator has the edge sites' rules (edge/sites.py, in parallel)."""
    try:
        import edge.sites  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- the run


async def _main(args: argparse.Namespace, state_dir: Path) -> dict:
    load0 = loadavg()
    hub = EmbeddedServer(
        ServerConfig(
            store_dir=str(state_dir / "hub"),
            domain=subjects.HUB_DOMAIN,
            leaf_listen=True,
            leaf_advertise=UNDIALABLE,  # else a leaf learns the hub's URL and dials around
            ping_interval="1s",
            ping_max=3,
        )
    )
    await hub.astart()
    tracks = hub_tracks_sites()
    # Without the hub's site rules a silent site's nodes go down and their tasks LOST:
    # the down deadline is then set past the longest outage, and the JSON says so.
    down_after = 10.0 if tracks else args.long_outage + 60.0
    coord = Coordinator(
        CoordinatorConfig(hub.url, region=REGION, candidate_id="hub-c1", down_after=down_after)
    )
    sites = Sites()
    nc = None
    try:
        await coord.start()
        nc = await connect(hub.url, name="bench-edge")
        client = MeshClient(nc, region=REGION)
        view = HubView()
        await view.start(nc)
        # The footprint first, the real site alone on the hub: its idle link carries its
        # own traffic only (a site hears every heartbeat of the region it subscribes to).
        fp = await footprint.measure(hub, REGION, client, args.idle, state_dir)
        print(f"edge footprint: {fp}")
        await sites.start(args, hub.config.leaf_port, state_dir)
        nodes = {s: ns for s, ns in sites.ready["sites"].items()}
        want = sum(len(ns) for ns in nodes.values())

        async def ready() -> bool:
            info = await client.cluster_info()
            return bool(info["leader"]) and info["nodes"].get("ready", 0) >= want

        await _eventually(ready, 120, f"{want} site nodes ready at the hub")
        print(f"hub up; {len(nodes)} sites x {args.nodes} hollow nodes ready ({want})")
        cpu0 = (_cpu(hub.proc.pid), _cpu(None), time.monotonic())
        run = await schedule(args, client, sites, view, nodes)
        hub_cpu = _cpu(hub.proc.pid) - cpu0[0]
        own_cpu = _cpu(None) - cpu0[1]
        wall = time.monotonic() - cpu0[2]
        final = await sites.ask("report")
        histories = await hub_histories(client, run["job_ids"])
    finally:
        await sites.stop()
        with contextlib.suppress(Exception):
            await coord.stop()
        if nc is not None:
            await close_quietly(nc)
        hub.stop()
    cpu = {"hub_nats_s": hub_cpu, "hub_process_s": own_cpu, "wall_s": wall}
    return report(args, run, final, histories, view, cpu, fp, tracks, down_after, load0)


def _cpu(pid: int | None) -> float:
    with contextlib.suppress(psutil.Error):
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    return 0.0


async def schedule(args, client: MeshClient, sites: Sites, view: HubView, nodes) -> dict:
    """The steady job stream, the long cut with its backlog and the short cuts; then
    every site restored and the jobs drained."""
    rng = random.Random(1)
    job_ids: list[str] = []
    stop = asyncio.Event()
    outages: list[dict] = []

    names = sorted(nodes)

    async def stream() -> None:
        """Short jobs, pinned to the sites in turn (label `bench-site`): every site has
        work running when it is cut, and none goes to the footprint's site."""
        n = 0
        period = 0.5
        while not stop.is_set():
            k = max(1, round(args.rate * period))
            specs = [
                short_job(f"j{n + i:06d}", args.job_s, names[(n + i) % len(names)])
                for i in range(k)
            ]
            n += k
            for r in await client.submit_many(specs):
                if "job_id" in r:
                    job_ids.append(r["job_id"])
            await asyncio.sleep(period)

    async def outage(site: str, mode: str, length: float) -> None:
        t_cut = (await sites.ask("cut", site=site, mode=mode, flap_s=args.flap_s))["t"]
        disconnected = None
        deadline = time.monotonic() + length
        while time.monotonic() < deadline:
            if disconnected is None and (await site_status(client) or {}).get(site) == (
                "disconnected"
            ):
                disconnected = time.time() - t_cut
            await asyncio.sleep(0.25)
        restored = await sites.ask("restore", site=site)
        keys = [tuple(k) for k in restored["acked"]]
        behind = sum(1 for k in keys if k not in view.seen)
        resync = await resync_time(view, keys, restored["t"], 60.0)
        outages.append(
            {
                "site": site,
                "mode": mode,
                "length_s": length,
                "resync_s": resync,
                "events": len(keys),
                "behind": behind,
                "t_cut": t_cut,
                "hub_noticed_s": disconnected,
            }
        )

    feeder = asyncio.create_task(stream())
    try:
        backlog = await fill_backlog(args, client, view, nodes[LONG_SITE])
        job_ids.extend(backlog)
        long_cut = asyncio.create_task(outage(LONG_SITE, "reset", args.long_outage))
        others = sorted(s for s in nodes if s != LONG_SITE)
        cuts, t_end = [], time.monotonic() + args.long_outage
        busy: set[str] = set()
        while True:
            if time.monotonic() >= t_end - args.outage and cuts:
                break
            free = [s for s in others if s not in busy]
            if free:
                site = rng.choice(free)
                busy.add(site)
                task = asyncio.create_task(outage(site, MODES[len(cuts) % len(MODES)], args.outage))
                task.add_done_callback(lambda _t, s=site: busy.discard(s))
                cuts.append(task)
            await asyncio.sleep(args.cut_every)
        await asyncio.gather(long_cut, *cuts)
    finally:
        stop.set()
        await feeder
    unfinished = await drain(client, job_ids, args.drain)
    return {
        "job_ids": job_ids,
        "outages": outages,
        "backlog_jobs": len(backlog),
        "unfinished": unfinished,
    }


async def fill_backlog(args, client: MeshClient, view: HubView, site_nodes) -> list[str]:
    """`--backlog` jobs pinned to the long-cut site, running there when it is cut, long
    enough to end only while it is away: thousands of events wait in its stream."""
    specs = [
        short_job(f"b{i:05d}", args.long_outage * (0.3 + 0.4 * i / max(1, args.backlog)), LONG_SITE)
        for i in range(args.backlog)
    ]
    ids = []
    for at in range(0, len(specs), 500):
        ids += [
            r["job_id"] for r in await client.submit_many(specs[at : at + 500]) if "job_id" in r
        ]

    async def running() -> bool:
        infos = await asyncio.gather(*(client.job(j) for j in ids[-20:]))
        return all(t["state"] == "RUNNING" for i in infos for t in i["task_list"])

    await _eventually(running, 120, "the backlog jobs running on the long-cut site", 0.5)
    await asyncio.sleep(1.0)  # their RUNNING events forwarded
    return ids


async def resync_time(view: HubView, keys, t_restore: float, timeout: float) -> float | None:
    """Link restored -> the last of `keys` (the site's acknowledged events) at the hub."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [k for k in keys if k not in view.seen]
        if not missing:
            last = max((view.seen[k] for k in keys), default=t_restore)
            return max(0.0, last - t_restore)
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.05)


async def drain(client: MeshClient, job_ids: list[str], timeout: float) -> int:
    """Waits for every job to finish; returns how many did not within `timeout`."""
    left = set(job_ids)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        rows = await client.jobs(limit=10_000)
        left -= {r["job_id"] for r in rows if r["state"] in FINISHED}
        await asyncio.sleep(1.0)
    return len(left)


async def hub_histories(client: MeshClient, job_ids: list[str]) -> dict:
    """The hub's view of every task: (state, attempt, node) entries of its history."""
    out: dict[str, list[tuple[str, int, str]]] = {}
    for at in range(0, len(job_ids), 100):
        jobs = await asyncio.gather(*(client.job(j) for j in job_ids[at : at + 100]))
        for job in jobs:
            for task in job["task_list"]:
                out[task["task_id"]] = [
                    (h["state"], h["attempt"], h["node_id"]) for h in task["history"]
                ]
    return out


# ---------------------------------------------------------------- the report


def report(args, run, final, histories, view, cpu, fp, tracks, down_after, load0) -> dict:
    acked = {tuple(k[:3]): k[3] for rows in final["acked"].values() for k in rows}
    in_view = {(t, a, s) for t, hs in histories.items() for s, a, _n in hs}
    lost = sorted(k for k in acked if k not in in_view and k[0] in histories)
    unknown_tasks = sorted({k[0] for k in acked if k[0] not in histories})
    dup_views = sorted(
        t for t, hs in histories.items() if len({(n, a) for s, a, n in hs if s == "RUNNING"}) > 1
    )
    outages = run["outages"]
    short = [o for o in outages if o["site"] != LONG_SITE]
    # An outage with nothing behind at link-up is in sync at once: not a resync sample.
    resyncs = [o["resync_s"] for o in outages if o["behind"] and o["resync_s"] is not None]
    unresynced = sum(1 for o in outages if o["resync_s"] is None)
    long_o = next((o for o in outages if o["site"] == LONG_SITE), None)
    bh = [o for o in short if o["mode"] == "blackhole"]
    uplink_s = [_uplink_noticed(final["uplink"].get(o["site"], []), o["t_cut"]) for o in bh]
    hub_s = [o["hub_noticed_s"] for o in bh]
    ledger = final["ledger"]
    sites = args.sites
    hub_pct = 100.0 * (cpu["hub_nats_s"] + cpu["hub_process_s"]) / cpu["wall_s"] / sites
    resync_ms = summary_ms(resyncs)
    noticed_max = max((x for x in [*uplink_s, *hub_s] if x is not None), default=None)
    dups = ledger.get("duplicates")
    targets = {
        "zero_lost": not lost and not unknown_tasks and not run["unfinished"],
        "zero_duplicates": dups == 0 and not dup_views,
        "resync_p99<=2s": bool(resyncs) and not unresynced and resync_ms["p99"] <= 2000.0,
        "blackhole_noticed<=10s": bool(bh)
        and all(x is not None for x in [*uplink_s, *hub_s])
        and noticed_max <= 10.0,
        "site_rss<=70MB": fp.get("site_rss_mb") is not None and fp["site_rss_mb"] <= 70.0,
        "idle_uplink<=0.5kbit/s/node": fp.get("idle_uplink_kbit_s_per_node") is not None
        and fp["idle_uplink_kbit_s_per_node"] <= 0.5,
    }
    print(f"events acknowledged by sites: {len(acked)}; lost {len(lost)}; duplicates {dups}")
    print(f"resync over {len(resyncs)} outages: {resync_ms}; not resynced: {unresynced}")
    print(f"black-hole noticed: uplink {uplink_s}, hub {hub_s}")
    print(f"hub CPU per site: {hub_pct:.3f} %")
    return {
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": load0,
        "loadavg_end": loadavg(),
        "config": {
            "sites": sites,
            "nodes_per_site": args.nodes,
            "rate_jobs_per_s": args.rate,
            "job_s": args.job_s,
            "outage_s": args.outage,
            "cut_every_s": args.cut_every,
            "long_outage_s": args.long_outage,
            "backlog_jobs": args.backlog,
            "flap_half_period_s": args.flap_s,
            "idle_s": args.idle,
            "hub_site_tracking": tracks,
            "coordinator_down_after_s": down_after,
            "quick": args.quick,
        },
        "jobs": len(run["job_ids"]),
        "jobs_unfinished": run["unfinished"],
        "events_acked": len(acked),
        "events_at_hub": len(view.seen),
        "lost": len(lost),
        "lost_examples": [list(k) for k in lost[:5]],
        "acked_of_unknown_tasks": len(unknown_tasks),
        "duplicates": dups,
        "duplicates_detail": ledger.get("detail"),
        "ledger": ledger.get("ledger", False),
        "ledger_runs": ledger.get("runs"),
        "duplicates_views": len(dup_views),
        "outages": len(outages),
        "outages_by_mode": {m: sum(1 for o in short if o["mode"] == m) for m in MODES},
        "resync_ms": resync_ms,
        "resync_p50_s": round(percentile(resyncs, 50), 3) if resyncs else None,
        "resync_p99_s": round(percentile(resyncs, 99), 3) if resyncs else None,
        "not_resynced": unresynced,
        "outage_list": [  # [site, mode, length s, events behind at link-up, resync s]
            [o["site"], o["mode"], o["length_s"], o["behind"], _r3(o["resync_s"])] for o in outages
        ],
        "long_outage": (
            {k: long_o[k] for k in ("events", "behind", "resync_s")} if long_o else None
        ),
        "blackhole_noticed_uplink_s": uplink_s,
        "blackhole_noticed_hub_s": [_r3(x) for x in hub_s],
        "hub_cpu_percent_per_site": round(hub_pct, 4),
        "hub_cpu": {k: round(v, 2) for k, v in cpu.items()},
        "links": final["links"].get(LONG_SITE),
        "footprint": fp,
        "targets": targets,
    }


def _r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _uplink_noticed(changes, t_cut: float) -> float | None:
    """Cut -> the first `reachable=False` the site's agents heard after it."""
    for t, reachable in changes:
        if t >= t_cut and not reachable:
            return round(t - t_cut, 3)
    return None
