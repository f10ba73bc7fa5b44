"""`mesh edge up`: an edge site's machine, in one process (edge/README.md).

It starts the site's leaf nats-server (its own JetStream domain, dialling out to the
hub: no inbound port at the site; store under `$MESH_HOME/edge/SITE`), the site link
(edge/uplink.py: the site's events forwarded to the region in order, beats) and this
machine's agent in site mode, connected to the leaf. Ctrl-C stops all three; the
agent's running tasks are left to be re-adopted by the next start, as `mesh agent`
leaves them. More machines of the site join with `mesh agent --site SITE --nats LEAF`.

Insecure only for now: a secure site needs the hub's leafnodes block to map each leaf's
certificate to an identity with a site's permissions, which the hub's config does not
have yet; with --certs it refuses to start, rather than run a site in the clear.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys

from mesh import subjects
from mesh.cli.context import Context, mesh_home
from mesh.cli.exitcodes import EXIT_OK, EXIT_USAGE
from mesh.edgeschema import NEVER
from workloads.quantity import SpecError, parse_duration

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    edge = sub.add_parser("edge", help="an edge site: its leaf NATS server, link and agent")
    esub = edge.add_subparsers(dest="edge_cmd", required=True)
    up = esub.add_parser(
        "up",
        help="run this machine as an edge site until interrupted",
        description="Start the site's leaf nats-server (dialling out to --hub), the site "
        "link (events forwarded to the region in order, beats) and this machine's agent.",
    )
    up.add_argument("--site", required=True, help="the site's name (letters, digits, _ or -)")
    up.add_argument(
        "--hub",
        required=True,
        metavar="URL",
        help="the region's leafnode URL(s), comma-separated (e.g. nats-leaf://hub:7422)",
    )
    up.add_argument(
        "--autonomy",
        metavar="DURATION",
        help="how long the region waits, once the site is cut off, before it declares the "
        "site's tasks lost and runs them elsewhere (default: never)",
    )
    up.add_argument("--port", type=int, default=4222, help="the leaf's client port (0: free)")
    up.add_argument("--node-id", help="this machine's node id (default: the host name)")


def _problem(args: argparse.Namespace, ctx: Context) -> str | None:
    if not subjects.is_token(args.site):
        return f"--site {args.site!r}: expected 1-64 letters, digits, '_' or '-'"
    if not [u for u in args.hub.split(",") if u.strip()]:
        return "--hub: at least one URL"
    if args.node_id and not subjects.is_token(args.node_id):
        return f"--node-id {args.node_id!r}: expected 1-64 letters, digits, '_' or '-'"
    if not 0 <= args.port <= 65535:
        return f"--port {args.port}: expected 0-65535"
    if ctx.certs:
        return "a secure site (--certs) is not supported yet: run it with --insecure"
    return None


def run(args: argparse.Namespace, ctx: Context) -> int:
    problem = _problem(args, ctx)
    autonomy = NEVER
    if problem is None and args.autonomy:
        try:
            autonomy = parse_duration(args.autonomy, "--autonomy")
        except SpecError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"mesh edge up: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_up(args, ctx, autonomy))


async def _up(args: argparse.Namespace, ctx: Context, autonomy_s: float) -> int:
    from agent.service import Agent, AgentConfig, default_node_id
    from edge.leaf import site_server_config, store_bound, stream_bound
    from edge.uplink import SiteLink
    from mesh.cli.servers import _start, _until_signal
    from mesh.cli.tether import death_signal_preexec
    from mesh.server import EmbeddedServer

    site, region = args.site, ctx.region
    node_id = args.node_id or default_node_id()
    home = mesh_home() / "edge" / site
    hubs = [u.strip() for u in args.hub.split(",") if u.strip()]
    (home / "nats").mkdir(parents=True, exist_ok=True)
    store = store_bound(shutil.disk_usage(home / "nats").free)
    config = site_server_config(site, hubs, home / "nats", port=args.port, store_bytes=store)
    leaf = EmbeddedServer(config, preexec_fn=death_signal_preexec())  # ends with us
    await leaf.astart()
    link = agent = None
    try:
        link = SiteLink(
            leaf.url,
            region,
            site,
            autonomy_s=autonomy_s,
            stream_bytes=stream_bound(store),
        )
        await _start(link)
        agent = Agent(
            AgentConfig(
                nats_url=leaf.url,
                region=region,
                node_id=node_id,
                data_dir=str(home / "agent" / node_id),
                allow_root=os.geteuid() == 0,
                site=site,
            )
        )
        await _start(agent)
        print(
            f"site {site} of region {region}: leaf at {leaf.url} (JetStream domain "
            f"{subjects.site_domain(site)}) dialling {', '.join(hubs)}; agent {node_id}. "
            "Ctrl-C stops.",
            flush=True,
        )
        await _until_signal()
    finally:
        if agent is not None:
            with contextlib.suppress(Exception):
                await agent.stop()
        if link is not None:
            with contextlib.suppress(Exception):
                await link.stop()
        leaf.stop()
    return EXIT_OK
