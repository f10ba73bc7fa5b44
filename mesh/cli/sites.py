"""`mesh site list`: the region's edge sites as its leader sees them (docs/edge.md).

Talks only to the request API (`site.list`).
"""

from __future__ import annotations

import argparse

from mesh.cli import output
from mesh.cli.exitcodes import EXIT_OK
from mesh.cli.render import ago, table
from mesh.client import MeshClient


def add_parser(sub: argparse._SubParsersAction) -> None:
    site = sub.add_parser("site", help="edge sites").add_subparsers(dest="site_cmd", required=True)
    site.add_parser(
        "list", help="edge sites: connected or disconnected, since, last heard, autonomy"
    )


def sites_table(sites: list[dict], width: int | None = None) -> str:
    rows = [
        [
            s["site"],
            s["status"],
            ago(s["since"]),
            f"{s['last_heard_age_s']:.1f}s ago",
            "never" if s["autonomy_s"] is None else f"{s['autonomy_s']:g}s",
            s["backlog"],
            len(s["nodes"]),
        ]
        for s in sites
    ]
    headers = ["SITE", "STATUS", "SINCE", "LAST HEARD", "AUTONOMY", "BACKLOG", "NODES"]
    return table(rows, headers, width) if rows else "no edge sites"


async def run(args: argparse.Namespace, client: MeshClient) -> int:
    sites = (await client.request("site.list", {}, retries=5))["sites"]
    output.emit(args, sites, sites_table(sites, output.terminal_width()))
    return EXIT_OK
