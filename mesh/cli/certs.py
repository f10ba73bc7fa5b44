"""`mesh certs`: a region's CA and certificates.

    mesh certs init DIR [--host NAME ...]       CA, server, coordinator, user admin, signing keys
    mesh certs issue [DIR] --agent NODE         one client certificate (or --user NAME,
                                                --fleet PREFIX, --coordinator, --site S)
    mesh certs list [DIR]                       the identities DIR holds certificates for
    mesh certs bundle [DIR] --agent NODE        one node's identity in one file, for
                                                `mesh agent install --bundle FILE`
    mesh certs nats-conf [DIR] --region R ...   a nats-server config: TLS + per-identity users;
                                                with -o FILE --reload: rewrite it and reload
                                                the server that runs it (via its pid file);
                                                with --gateway R=URL ...: joined to the other
                                                regions by TLS gateways (docs/federation.md);
                                                with --leafnodes HOST:PORT: a hub edge sites'
                                                leaves dial (--site-nodes S=NODE,...)

DIR defaults to --certs / $MESH_CERTS / the `mesh up` context.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mesh import subjects
from mesh.security import bundle, gateways
from mesh.security.identity import Identity, IdentityError
from mesh.security.permissions import server_users
from mesh.server import ServerConfig, ServerError, TlsFiles

DEFAULT_LISTEN = "0.0.0.0:4222"
DEFAULT_GATEWAY_LISTEN = "0.0.0.0:7222"
DEFAULT_CLUSTER_LISTEN = "127.0.0.1:6222"
DEFAULT_STORE_DIR = "/var/lib/nats"
PID_FILE_NAME = "nats-server.pid"


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
    who.add_argument(
        "--site",
        metavar="S",
        help="edge site S's leaf server (its link to the hub, and its own client port: "
        "--host names the site machine)",
    )
    who.add_argument(
        "--gateway",
        action="store_true",
        help="the servers' certificate towards each other (gateways, routes: "
        "gateway.crt); its names are the server certificate's unless --host is given",
    )
    issue.add_argument(
        "--host",
        action="append",
        default=[],
        help="with --gateway: a DNS name the servers' gateways or routes are reached by; "
        "with --site: a name or address the site's leaf is reached by (besides loopback)",
    )
    ls = certs.add_parser("list", help="the identities with certificates in DIR")
    ls.add_argument("dir", nargs="?")
    bun = certs.add_parser(
        "bundle",
        help="one node's identity (certificate, key, CA, assignments.pub) in one file",
    )
    bun.add_argument("dir", nargs="?")
    bun.add_argument("--agent", metavar="NODE", required=True, help="the node to bundle")
    bun.add_argument(
        "-o",
        "--output",
        dest="out_file",
        metavar="FILE",
        help="where to write it (default: ./mesh-agent-NODE.tar.gz); written 0600, never "
        "over an existing file",
    )
    conf = certs.add_parser(
        "nats-conf", help="a nats-server config for this region (stdout, or -o FILE)"
    )
    conf.add_argument("dir", nargs="?")
    # SUPPRESS: absent here, the global `mesh --region R certs ...` (or the context) stands.
    conf.add_argument(
        "--region",
        default=argparse.SUPPRESS,
        help="the region whose subjects the identities may use (default: --region before "
        "the command, $MESH_REGION, the context, or 'default')",
    )
    conf.add_argument(
        "--listen", default=DEFAULT_LISTEN, help=f"client address (default {DEFAULT_LISTEN})"
    )
    conf.add_argument(
        "--store-dir",
        default=DEFAULT_STORE_DIR,
        help=f"JetStream's directory (default {DEFAULT_STORE_DIR}); the server must be able "
        "to write it",
    )
    conf.add_argument(
        "--pid-file",
        help=f"where the server writes its pid (default STORE_DIR/{PID_FILE_NAME}): "
        f"`nats-server --signal reload=PID_FILE` and --reload use it",
    )
    conf.add_argument(
        "--fleet-nodes",
        action="append",
        default=[],
        metavar="PREFIX=N",
        help="fleet PREFIX speaks for nodes PREFIX-0000 .. PREFIX-(N-1)",
    )
    conf.add_argument(
        "--leafnodes",
        metavar="[HOST:]PORT",
        help="accept edge sites' leaf connections here (TLS, each leaf's certificate mapped "
        "to its site:S identity); makes this server's JetStream domain 'hub'",
    )
    conf.add_argument(
        "--site-nodes",
        action="append",
        default=[],
        metavar="S=NODE,NODE",
        help="site S's leaf speaks for these nodes (their heartbeats, events, assignment "
        "consumers); a site not named may only beat",
    )
    conf.add_argument(
        "-o",
        "--output",
        dest="out_file",
        metavar="FILE",
        help="write the config to FILE (atomically: readers never see half a file)",
    )
    conf.add_argument(
        "--reload",
        action="store_true",
        help="with -o: then tell the server running it to reload (SIGHUP to the pid in its "
        "pid file); connections stay up, identities added or removed take effect at once",
    )
    fed = conf.add_argument_group(
        "federation", "join this region to others by gateways, TLS both ways (docs/federation.md)"
    )
    fed.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="REGION=URL",
        help="a region's gateway, e.g. us=nats://nats-us.example.com:7222; give every region, "
        "this one too (the same list serves every server); the host must be a DNS name in "
        "gateway.crt",
    )
    fed.add_argument(
        "--gateway-listen",
        default=DEFAULT_GATEWAY_LISTEN,
        metavar="HOST:PORT",
        help=f"where this server's gateway listens (default {DEFAULT_GATEWAY_LISTEN}); "
        "open it to the other regions' servers",
    )
    fed.add_argument(
        "--cluster-listen",
        default=DEFAULT_CLUSTER_LISTEN,
        metavar="HOST:PORT",
        help=f"where routes within the region listen (default {DEFAULT_CLUSTER_LISTEN}: a "
        "region of one server)",
    )
    fed.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="URL",
        help="another server of this region (repeat); default: none, a region of one server",
    )
    fed.add_argument(
        "--server-name",
        help="this server's name, unique in the federation (default nats-REGION)",
    )


def _identity(args: argparse.Namespace) -> Identity:
    if args.agent is not None:
        return Identity.agent(args.agent)
    if args.user is not None:
        return Identity.user(args.user)
    if args.fleet is not None:
        return Identity.fleet(args.fleet)
    if args.site is not None:
        return Identity.site(args.site)
    return Identity.coordinator()


def site_nodes(items: Sequence[str]) -> dict[str, list[str]]:
    """`--site-nodes S=a,b ...` -> {site: [node, ...]}; a site named twice adds up."""
    out: dict[str, list[str]] = {}
    for item in items:
        site, sep, nodes = item.partition("=")
        names = [n.strip() for n in nodes.split(",") if n.strip()]
        if not sep or not names:
            raise IdentityError(f"--site-nodes {item!r}: expected SITE=NODE[,NODE...]")
        Identity.site(site)
        for n in names:
            Identity.agent(n)  # a node id is a single token
        out.setdefault(site, []).extend(names)
    return out


def leaf_listen(text: str) -> tuple[str, int]:
    """`--leafnodes PORT` or `HOST:PORT` -> (host, port); a port alone listens on every
    interface (leaves dial in from their sites)."""
    if text.isdigit():
        text = f"0.0.0.0:{text}"
    return gateways.host_port(text, "--leafnodes")


def fleet_node_ids(prefix: str, count: int) -> list[str]:
    """The node ids of a hollow fleet (agent.hollow names them so; a test checks it)."""
    return [f"{prefix}-{i:04d}" for i in range(count)]


@dataclass(frozen=True)
class NatsConf:
    """What `nats-conf` writes, and what it tells the operator it wrote."""

    config: ServerConfig
    region: str
    pid_file: str
    identities: tuple[Identity, ...]
    made_gateway_cert: bool = False

    def render(self) -> str:
        return self.config.render()

    def summary(self, where: str) -> str:
        kinds: dict[str, list[str]] = {}
        for ident in self.identities:
            kinds.setdefault(ident.kind, []).append(ident.name or ident.kind)
        who = "; ".join(f"{k}: {', '.join(names)}" for k, names in kinds.items())
        text = (
            f"nats-conf: wrote {where}: region {self.region}, listen "
            f"{self.config.host}:{self.config.port}, store_dir {self.config.store_dir}, "
            f"pid_file {self.pid_file}; {len(self.identities)} identities ({who})"
        )
        c = self.config
        if c.gateway_name:
            others = [r for r in c.gateways if r != c.gateway_name]
            text += (
                f"; gateway {c.gateway_name} on {c.gateway_host}:{c.gateway_port} (TLS) to "
                f"{', '.join(others) or 'no other region yet'}"
            )
            if self.made_gateway_cert:
                text += "; made gateway.crt (copy it and gateway.key to every server)"
        if c.leaf_listen:
            text += f"; leafnodes on {c.leaf_host}:{c.leaf_port} (TLS, JetStream domain {c.domain})"
        return text


def nats_conf(
    certs_dir: str | Path,
    region: str,
    *,
    listen: str = DEFAULT_LISTEN,
    store_dir: str = DEFAULT_STORE_DIR,
    pid_file: str | None = None,
    fleet_nodes: Sequence[str] = (),
    federation: Federation | None = None,
    leafnodes: str | None = None,
    sites: Sequence[str] = (),
) -> NatsConf:
    """The region's server config from the certificate directory: one user per identity
    with a certificate there (so issuing a certificate and regenerating adds it). With
    `federation`, the server joins the others by gateway (see `_join`)."""
    fleets = {}
    for item in fleet_nodes:
        prefix, sep, n = item.partition("=")
        if not sep or not n.isdigit():
            raise IdentityError(f"--fleet-nodes {item!r}: expected PREFIX=N")
        fleets[prefix] = fleet_node_ids(prefix, int(n))
    from mesh.security import pki  # cryptography: only where certificates are handled

    host, port = gateways.host_port(listen, "--listen")
    ca, cert, key = pki.server_files(certs_dir)
    store = str(Path(store_dir).absolute())
    pid = str(Path(pid_file).absolute()) if pid_file else str(Path(store) / PID_FILE_NAME)
    idents = tuple(pki.identities(certs_dir))
    cfg = ServerConfig(
        host=host,
        port=port,
        store_dir=store,
        tls=TlsFiles(str(Path(ca).resolve()), str(Path(cert).resolve()), str(Path(key).resolve())),
        users=server_users(region, idents, fleets=fleets, sites=site_nodes(sites)),
        extra_conf=f"pid_file: {_quote(pid)}",
    )
    if leafnodes is not None:
        cfg.leaf_listen = True
        cfg.leaf_host, cfg.leaf_port = leaf_listen(leafnodes)
        cfg.domain = subjects.HUB_DOMAIN
    made = federation is not None and _join(cfg, certs_dir, region, federation)
    return NatsConf(cfg, region, pid, idents, made)


@dataclass(frozen=True)
class Federation:
    """What `nats-conf` needs to join a region to the others (its CLI flags)."""

    gateways: tuple[str, ...]  # REGION=URL, every region's
    gateway_listen: str = DEFAULT_GATEWAY_LISTEN
    cluster_listen: str = DEFAULT_CLUSTER_LISTEN
    routes: tuple[str, ...] = ()
    server_name: str | None = None


def _join(cfg: ServerConfig, certs_dir: str | Path, region: str, fed: Federation) -> bool:
    """Add the gateway and the cluster (JetStream in a supercluster runs clustered: a
    region of one server routes to itself) to `cfg`, both with TLS from gateway.crt,
    made here on first use. Returns whether it was made."""
    from mesh.security import pki

    subjects.region_token(region)
    peers = gateways.parse_gateways(fed.gateways)
    routes = [gateways.parse_url(r, "--route") for r in fed.routes]
    gw_host, gw_port = gateways.host_port(fed.gateway_listen, "--gateway-listen")
    cl_host, cl_port = gateways.host_port(fed.cluster_listen, "--cluster-listen")
    d = Path(certs_dir)
    made = not (d / pki.GATEWAY_CERT).exists()
    pki.ensure_gateway(d)
    gateways.check_names(
        [*peers.values(), *routes], pki.gateway_hosts(d), str(d / pki.GATEWAY_CERT)
    )
    ca, crt, key = (str(p.resolve()) for p in pki.gateway_files(d))
    cfg.server_name = fed.server_name or f"nats-{region}"
    cfg.cluster_name = region
    cfg.cluster_host, cfg.cluster_port = cl_host, cl_port
    cfg.cluster_routes = [r.url for r in routes] or [f"nats://localhost:{cl_port}"]
    cfg.gateway_name = region
    cfg.gateway_host, cfg.gateway_port = gw_host, gw_port
    cfg.gateways = {name: p.url for name, p in peers.items()}
    cfg.peer_tls = TlsFiles(ca, crt, key)
    return made


def _quote(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid nats-server config string


def write_atomically(path: str | Path, text: str, mode: int = 0o644) -> Path:
    """Write `text` to `path` through a temporary file renamed over it, so a server
    reloading at that moment reads the old file or the new one, never half of one."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        tmp.replace(p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def reload_server(pid_file: str | Path) -> int:
    """SIGHUP (nats-server's reload signal) to the pid in `pid_file`, after checking that
    the process is a nats-server: a stale pid file must not signal whoever reused the pid.
    This is what `nats-server --signal reload=PID_FILE` does, without needing the binary."""
    p = Path(pid_file)
    try:
        pid = int(p.read_text().strip())
    except FileNotFoundError:
        raise ServerError(
            f"{p}: no pid file (is the nats-server with this config running?)"
        ) from None
    except ValueError:
        raise ServerError(f"{p}: not a pid file") from None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        raise ServerError(f"{p}: pid {pid} is not running (a stale pid file?)") from None
    except OSError:
        comm = "nats-server"  # no /proc to ask: trust the pid file
    if not comm.startswith("nats-server"):
        raise ServerError(f"{p}: pid {pid} is {comm!r}, not a nats-server: not signalled")
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise ServerError(f"{p}: pid {pid} is not running (a stale pid file?)") from None
    except PermissionError:
        raise ServerError(f"{p}: may not signal pid {pid} (run as the server's user)") from None
    return pid


def _nats_conf(args: argparse.Namespace, d: str, region: str) -> int:
    if args.reload and not args.out_file:
        print("mesh certs nats-conf: --reload needs -o FILE (the server's config)", file=sys.stderr)
        return 2
    conf = nats_conf(
        d,
        region,
        listen=args.listen,
        store_dir=args.store_dir,
        pid_file=args.pid_file,
        fleet_nodes=args.fleet_nodes,
        federation=_federation(args),
        leafnodes=args.leafnodes,
        sites=args.site_nodes,
    )
    _say_missing_dirs(conf)
    if args.out_file:
        write_atomically(args.out_file, conf.render())
        print(conf.summary(str(Path(args.out_file).absolute())), file=sys.stderr)
    else:
        sys.stdout.write(conf.render())
        print(conf.summary("stdout"), file=sys.stderr)
    if args.reload:
        pid = reload_server(conf.pid_file)
        print(f"nats-conf: reload signalled to nats-server pid {pid}", file=sys.stderr)
    return 0


def _federation(args: argparse.Namespace) -> Federation | None:
    """The federation flags, or None when no --gateway is given (a region alone);
    the other flags alone are a mistake, not ignored."""
    if not args.gateway:
        if args.route or args.server_name:
            raise gateways.GatewayError("--route and --server-name need --gateway REGION=URL")
        return None
    return Federation(
        gateways=tuple(args.gateway),
        gateway_listen=args.gateway_listen,
        cluster_listen=args.cluster_listen,
        routes=tuple(args.route),
        server_name=args.server_name,
    )


def _say_missing_dirs(conf: NatsConf) -> None:
    """nats-server stops at start (`Could not write pidfile`) when the pid file's folder
    is missing; the config is often made on the host that runs it, so say so now."""
    for d in dict.fromkeys((Path(conf.config.store_dir), Path(conf.pid_file).parent)):
        if not d.is_dir():
            print(
                f"nats-conf: note: {d} does not exist here; nats-server needs it before it "
                f"starts (mkdir -p {d})",
                file=sys.stderr,
            )


def _bundle(args: argparse.Namespace, d: str) -> int:
    b = bundle.collect(d, args.agent)
    out = bundle.write(b, args.out_file or f"mesh-agent-{args.agent}.tar.gz")
    print(f"{out}: agent {args.agent} ({', '.join(n for n in b.names() if n != bundle.MANIFEST)})")
    print(f"  on the node: mesh agent install --bundle {out.name} --nats URL --region R ...")
    return 0


def run(args: argparse.Namespace, certs_flag: str | None, region: str) -> int:
    """Exit 0 on success, 2 on a usage error (bad name, missing or existing CA)."""
    from mesh.security import pki

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
            if args.gateway:
                if (Path(d) / pki.GATEWAY_CERT).exists():
                    raise pki.CertError(
                        f"{Path(d) / pki.GATEWAY_CERT} already exists: remove it (and "
                        f"{pki.GATEWAY_KEY}) first to reissue it"
                    )
                crt = pki.ensure_gateway(d, args.host)
                print(f"{crt} (and {pki.GATEWAY_KEY}): the servers' gateways and routes")
                return 0
            ident = _identity(args)
            crt = pki.issue(d, ident, args.host)
            print(f"{crt} (and {ident.key_path(d).name}): {ident}")
            return 0
        if args.certs_cmd == "list":
            if not pki.has_ca(d):
                raise pki.CertError(f"{d} holds no CA: run `mesh certs init {d}`")
            for ident in pki.identities(d):
                print(ident)
            return 0
        if args.certs_cmd == "bundle":
            return _bundle(args, d)
        return _nats_conf(args, d, region)
    except (pki.CertError, IdentityError, ServerError, bundle.BundleError, ValueError) as exc:
        print(f"mesh certs: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mesh certs: {exc}", file=sys.stderr)
        return 2
