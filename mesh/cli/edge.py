"""`mesh edge up`: an edge site's machine, in one process (edge/README.md).

It starts the site's leaf nats-server (its own JetStream domain, dialling out to the
hub: no inbound port at the site; store under `$MESH_HOME/edge/SITE`), the site link
(edge/uplink.py: the site's events forwarded to the region in order, beats) and this
machine's agent in site mode, connected to the leaf. Ctrl-C stops all three; the
agent's running tasks are left to be re-adopted by the next start, as `mesh agent`
leaves them. More machines of the site join with `mesh agent --site SITE --nats LEAF`.

Secure by default, as `mesh agent` is: with --certs DIR (or $MESH_CERTS, the context)
the leaf dials the hub over TLS presenting DIR/site-SITE.crt, which the hub maps to
`site:SITE` (`mesh certs nats-conf --leafnodes ... --site-nodes SITE=NODE`): that
identity's permissions bound everything that crosses the link. The leaf's own client
port is TLS too, with the same certificate as its server certificate, and requires a
client certificate of the region's CA (the agent's `agent-NODE.crt`; the link presents
the site's); the agent verifies assignments with DIR/assignments.pub when it is there.
`--insecure` runs it all in the clear.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from mesh import subjects
from mesh.cli.context import Context, mesh_home
from mesh.cli.exitcodes import EXIT_OK, EXIT_USAGE
from mesh.edgeschema import NEVER
from mesh.server import TlsFiles
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
    from mesh.security.identity import Identity
    from mesh.server import EmbeddedServer

    site, region = args.site, ctx.region
    node_id = args.node_id or default_node_id()
    home = mesh_home() / "edge" / site
    hubs = [u.strip() for u in args.hub.split(",") if u.strip()]
    try:
        secure = _secure_files(ctx, site, node_id)
    except (OSError, ValueError) as exc:
        print(f"mesh edge up: {exc}", file=sys.stderr)
        return EXIT_USAGE
    (home / "nats").mkdir(parents=True, exist_ok=True)
    store = store_bound(shutil.disk_usage(home / "nats").free)
    config = site_server_config(
        site,
        [_tls_url(u) for u in hubs] if secure else hubs,
        home / "nats",
        port=args.port,
        store_bytes=store,
        leaf_tls=secure.leaf if secure else None,
        tls=secure.local if secure else None,
    )
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
            tls=ctx.tls(Identity.site(site)),
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
                tls=ctx.tls(Identity.agent(node_id)),
                verify_key=secure.verify_key if secure else None,
            )
        )
        await _start(agent)
        print(
            f"site {site} of region {region}: leaf at {leaf.url} (JetStream domain "
            f"{subjects.site_domain(site)}) dialling {', '.join(config.leaf_remotes)}"
            f"{' over TLS as site:' + site if secure else ' in the clear'}; agent {node_id}. "
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


@dataclass(frozen=True)
class _SiteFiles:
    """A secure site's TLS: the leaf's remote (the site's certificate, mapped by the hub
    to `site:S`), the leaf's client port (the same certificate as server certificate,
    any client certificate of the CA required), and the agent's verify key."""

    leaf: TlsFiles
    local: TlsFiles
    verify_key: str | None


def _secure_files(ctx: Context, site: str, node_id: str) -> _SiteFiles | None:
    """None on an insecure site; else the files, each checked to exist (the agent's
    certificate too), so a missing one is a clear error before anything starts."""
    from mesh.connect import ClientTls
    from mesh.security.identity import Identity
    from mesh.signing import PUB_FILE

    if not ctx.certs:
        return None
    d = Path(ctx.certs).resolve()
    mine = ClientTls.for_identity(d, Identity.site(site))  # raises when a file is missing
    ClientTls.for_identity(d, Identity.agent(node_id))
    leaf = TlsFiles(mine.ca, mine.cert, mine.key, verify_and_map=False)
    pub = d / PUB_FILE
    return _SiteFiles(leaf, leaf, str(pub) if pub.exists() else None)


def _tls_url(url: str) -> str:
    """A hub URL for a TLS leaf link (nats-leaf:// or nats:// -> tls://)."""
    scheme, sep, rest = url.partition("://")
    return f"tls://{rest}" if sep and scheme in ("nats", "nats-leaf") else url
