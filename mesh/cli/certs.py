"""`mesh certs`: a region's CA and certificates.

    mesh certs init DIR [--host NAME ...]       CA, server, coordinator, user admin, signing keys
    mesh certs issue [DIR] --agent NODE         one client certificate (or --user NAME,
                                                --fleet PREFIX, --coordinator)
    mesh certs list [DIR]                       the identities DIR holds certificates for
    mesh certs nats-conf [DIR] --region R ...   a nats-server config: TLS + per-identity users

DIR defaults to --certs / $MESH_CERTS / the `mesh up` context.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mesh.security import pki
from mesh.security.identity import Identity, IdentityError
from mesh.security.permissions import server_users
from mesh.server import ServerConfig, ServerError, TlsFiles


def add_parser(sub: Any) -> None:
    certs = sub.add_parser("certs", help="make the region's CA and certificates").add_subparsers(
        dest="certs_cmd", required=True
    )
    init = certs.add_parser("init", help="a new CA, server and first client certificates")
    init.add_argument("dir")
    init.add_argument(
        "--host",
        action="append",
        default=[],
        help="a name or address the NATS server is reached by (besides 127.0.0.1, localhost)",
    )
    issue = certs.add_parser("issue", help="one client certificate")
    issue.add_argument("dir", nargs="?")
    who = issue.add_mutually_exclusive_group(required=True)
    who.add_argument("--agent", metavar="NODE", help="the agent of node NODE")
    who.add_argument("--user", metavar="NAME", help="a user of the request API")
    who.add_argument("--fleet", metavar="PREFIX", help="a hollow fleet (nodes PREFIX-NNNN)")
    who.add_argument("--coordinator", action="store_true", help="the coordinators")
    ls = certs.add_parser("list", help="the identities with certificates in DIR")
    ls.add_argument("dir", nargs="?")
    conf = certs.add_parser("nats-conf", help="print a nats-server config for this region")
    conf.add_argument("dir", nargs="?")
    conf.add_argument("--listen", default="0.0.0.0:4222")
    conf.add_argument("--store-dir", default="/var/lib/nats")
    conf.add_argument(
        "--fleet-nodes",
        action="append",
        default=[],
        metavar="PREFIX=N",
        help="fleet PREFIX speaks for nodes PREFIX-0000 .. PREFIX-(N-1)",
    )


def _identity(args: argparse.Namespace) -> Identity:
    if args.agent is not None:
        return Identity.agent(args.agent)
    if args.user is not None:
        return Identity.user(args.user)
    if args.fleet is not None:
        return Identity.fleet(args.fleet)
    return Identity.coordinator()


def fleet_node_ids(prefix: str, count: int) -> list[str]:
    """The node ids of a hollow fleet (agent.hollow names them so; a test checks it)."""
    return [f"{prefix}-{i:04d}" for i in range(count)]


def run(args: argparse.Namespace, certs_flag: str | None, region: str) -> int:
    """Exit 0 on success, 2 on a usage error (bad name, missing or existing CA)."""
    d = getattr(args, "dir", None) or certs_flag
    if not d:
        print("mesh certs: no directory (give DIR, --certs or MESH_CERTS)", file=sys.stderr)
        return 2
    try:
        if args.certs_cmd == "init":
            written = pki.init(d, args.host)
            print(f"created {len(written)} files in {d}:")
            for f in written:
                print(f"  {Path(f).name}")
            return 0
        if args.certs_cmd == "issue":
            ident = _identity(args)
            crt = pki.issue(d, ident)
            print(f"{crt} (and {ident.key_path(d).name}): {ident}")
            return 0
        if args.certs_cmd == "list":
            if not pki.has_ca(d):
                raise pki.CertError(f"{d} holds no CA: run `mesh certs init {d}`")
            for ident in pki.identities(d):
                print(ident)
            return 0
        fleets = {}
        for item in args.fleet_nodes:
            prefix, sep, n = item.partition("=")
            if not sep or not n.isdigit():
                raise IdentityError(f"--fleet-nodes {item!r}: expected PREFIX=N")
            fleets[prefix] = fleet_node_ids(prefix, int(n))
        ca, cert, key = pki.server_files(d)
        host, _, port = args.listen.rpartition(":")
        cfg = ServerConfig(
            host=host or "0.0.0.0",
            port=int(port),
            store_dir=args.store_dir,
            tls=TlsFiles(
                str(Path(ca).resolve()), str(Path(cert).resolve()), str(Path(key).resolve())
            ),
            users=server_users(region, pki.identities(d), fleets=fleets),
        )
        sys.stdout.write(cfg.render())
        return 0
    except (pki.CertError, IdentityError, ServerError, ValueError) as exc:
        print(f"mesh certs: {exc}", file=sys.stderr)
        return 2
