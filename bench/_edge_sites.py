"""The edge bench's sites, in one child process (`python -m bench._edge_sites`).

Per site: a TCP proxy (tests/integration/tcpproxy.py: the link a schedule cuts), a leaf
nats-server (its own process, its remote dialling the hub through the proxy), the
site's `SiteLink` and a `HollowFleet(site=S)` on the leaf. All of the sites' links and
fleets run here, apart from the bench's main process, so that the hub's CPU (the hub
nats-server plus the main process's coordinator) is measured without them.

The main process drives it over stdin/stdout, one JSON object a line each way: a
request `{"id", "op", ...}` is answered `{"id", ...}` (ops: `cut`, `restore`, `report`,
`stop`); the first line out is `{"ready": ...}` once every site is up. What this
process records, per site: every task event its leaf stream acknowledged (the fleet's
publisher's acks, with their wall-clock time) and every change of the site's
`SiteUplink` (reachable or not) as the site's agents hear it.

Glue for parts being written in parallel is kept here (see `bench/edge.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.hollow import GiB, HollowFleet, Inventory
from agent.ledger import count_duplicates
from edge.leaf import site_server_config
from edge.uplink import SiteLink
from mesh import subjects
from mesh.edgeschema import WireError, decode_uplink
from mesh.server import EmbeddedServer, ServerConfig
from tests.integration.tcpproxy import TcpProxy

NODE = Inventory(64, 256 * GiB)  # room for a backlog of thousands of 100m tasks on 4 nodes
LEAF_STORE = 1024**3  # above the site stream's 256 MiB: ENOSPC disables JetStream


def site_name(i: int) -> str:
    return f"s{i:02d}"


def node_prefix(site: str) -> str:
    return f"{site}-n"


def leaf_config(site: str, remote: str, store_dir: Path) -> ServerConfig:
    """The site leaf's server (edge/leaf.py): its domain, its remote to the hub through
    the proxy, short pings, a bounded store."""
    return site_server_config(site, [remote], store_dir, store_bytes=LEAF_STORE)


# ---------------------------------------------------------------- link cuts


def cut(proxy: TcpProxy, mode: str, flap_s: float) -> None:
    """Cut a site's link with the proxy's modes: `reset` (connections closed, new ones
    refused), `blackhole` (sockets kept, nothing forwarded), `flap` (reset and restored
    every `flap_s`); `proxy.restore()` ends each."""
    if mode == "reset":
        proxy.cut()
    elif mode == "blackhole":
        proxy.black_hole()
    elif mode == "flap":
        proxy.flap(flap_s)
    else:
        raise ValueError(f"unknown cut mode {mode!r}")


# ---------------------------------------------------------------- one site


@dataclass
class Site:
    name: str
    proxy: TcpProxy
    leaf: EmbeddedServer
    fleet: HollowFleet | None = None
    link: object = None
    acked: dict[tuple[str, int, str], float] = field(default_factory=dict)
    uplink: list[tuple[float, bool]] = field(default_factory=list)  # changes heard
    cuts: int = 0

    def heard_uplink(self, msg) -> None:
        try:
            up = decode_uplink(msg.data)
        except WireError:
            return
        if not self.uplink or self.uplink[-1][1] != up.reachable:
            self.uplink.append((time.time(), up.reachable))


def watch_acks(site: Site, fleet: HollowFleet) -> None:
    """Note every event the leaf stream acknowledged (the fleet's publisher calls the
    fleet's `_reported` with each acknowledged event; wrapped before `start`)."""
    inner = fleet._reported

    def reported(ev) -> None:
        site.acked.setdefault((ev.task_id, ev.attempt, str(ev.state)), time.time())
        inner(ev)

    fleet._reported = reported


async def start_site(args: argparse.Namespace, i: int, state_dir: Path) -> Site:
    name = site_name(i)
    proxy = await TcpProxy(target_port=args.hub_leaf_port).start()
    leaf = EmbeddedServer(leaf_config(name, proxy.url, state_dir / "leaf" / name))
    await leaf.astart()
    site = Site(name, proxy, leaf)
    site.link = SiteLink(leaf.url, args.region, name)
    await site.link.start()
    fleet = HollowFleet(
        leaf.url,
        region=args.region,
        prefix=node_prefix(name),
        inventories=[NODE] * args.nodes,
        labels={"bench-site": name},
        site=name,
    )
    watch_acks(site, fleet)
    await fleet.start()
    site.fleet = fleet
    await fleet.nc.subscribe(subjects.site_uplink(args.region, name), cb=_cb(site))
    return site


def _cb(site: Site):
    async def on_msg(msg) -> None:
        site.heard_uplink(msg)

    return on_msg


async def stop_site(site: Site) -> None:
    for part in (site.fleet, site.link):
        if part is not None:
            with contextlib.suppress(Exception):
                await part.stop()
    with contextlib.suppress(Exception):
        await site.proxy.close()
    site.leaf.stop()


# ---------------------------------------------------------------- the ledger


def ledger_report(sites: list[Site]) -> dict:
    """Runs and duplicates from the fleets' own ledgers (agent/ledger.py), where the
    hollow fleet keeps one (`fleet.ledger()`)."""
    if not all(hasattr(s.fleet, "ledger") for s in sites):
        return {"ledger": False}
    runs = [r for s in sites for r in s.fleet.ledger()]
    dup = count_duplicates(runs)
    return {"ledger": True, "runs": len(runs), "duplicates": dup.total, "detail": dup.summary()}


def link_counters(site: Site) -> dict:
    return dataclasses.asdict(site.link.counters)


# ---------------------------------------------------------------- the control loop


async def serve(args: argparse.Namespace) -> None:
    state_dir = Path(args.state_dir)
    sites: list[Site] = []
    out = sys.stdout

    def say(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        for group in range(0, args.sites, 10):  # ten at a time: a shared machine's CPUs
            batch = range(group, min(args.sites, group + 10))
            sites.extend(await asyncio.gather(*(start_site(args, i, state_dir) for i in batch)))
    except Exception as exc:
        say({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        for s in sites:
            await stop_site(s)
        return
    by_name = {s.name: s for s in sites}
    say(
        {
            "ready": True,
            "sites": {s.name: sorted(s.fleet.nodes) for s in sites},
        }
    )
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            req = json.loads(line)
            try:
                reply = await handle(req, by_name, sites, args)
            except Exception as exc:  # told to the bench, which stops
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            say({"id": req.get("id"), **reply})
            if req["op"] == "stop":
                break
    finally:
        for s in sites:
            await stop_site(s)


async def handle(req: dict, by_name: dict[str, Site], sites: list[Site], args) -> dict:
    op = req["op"]
    if op == "cut":
        site = by_name[req["site"]]
        site.cuts += 1
        cut(site.proxy, req["mode"], req.get("flap_s", 1.0))
        return {"t": time.time()}
    if op == "restore":
        site = by_name[req["site"]]
        site.proxy.restore()
        t = time.time()
        return {"t": t, "acked": [list(k) for k in site.acked]}
    if op == "report":
        return {
            "acked": {s.name: [[*k, t] for k, t in s.acked.items()] for s in sites},
            "uplink": {s.name: s.uplink for s in sites},
            "ledger": ledger_report(sites),
            "links": {s.name: link_counters(s) for s in sites},
            "proxy_bytes": {
                s.name: [s.proxy.stats.bytes_up, s.proxy.stats.bytes_down] for s in sites
            },
        }
    if op == "stop":
        return {}
    return {"error": f"unknown op {op!r}"}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench._edge_sites")
    p.add_argument("--hub-leaf-port", type=int, required=True)
    p.add_argument("--region", required=True)
    p.add_argument("--sites", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--state-dir", required=True)
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
