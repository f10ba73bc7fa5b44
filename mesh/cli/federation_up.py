"""`mesh up --regions a,b,c`: a federation on one machine, as real processes.

One nats-server per region, each its own cluster named after the region, joined by
gateways into one supercluster (`mesh.server.supercluster_configs`); per region,
coordinator candidates and a process of hollow nodes, each region a `LocalMesh` of its
own (state under `<state-dir>/regions/<region>`), so each child is started exactly as
`mesh up` starts it. There is no real agent: one machine cannot be a node of several
regions under one node id.

Secure by default, as `mesh up` is: one CA for every region (`<state-dir>/certs`), the
client ports with TLS and per-identity permissions (each region's server maps an
identity to that region's subjects, plus `mesh.fed.>` for the coordinators), and the
gateways and routes with TLS of their own (`gateway.crt`, verified both ways against
the same CA, the peer's certificate checked against the configured URLs' names).
`--insecure` runs it all without TLS. See docs/federation.md.

Every region's server starts before any region's streams are made: JetStream's meta
group spans the whole supercluster and needs a quorum of its servers to answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mesh import subjects
from mesh.cli.context import DEFAULT_USER, LOCAL, Context, mesh_home, save_context
from mesh.cli.exitcodes import EXIT_OK, EXIT_USAGE
from mesh.cli.launcher import FLEET_PREFIX, LocalMesh, LocalMeshConfig
from mesh.cli.tether import UP_STOP_SIGNALS
from mesh.security import pki
from mesh.server import ServerConfig, TlsFiles, supercluster_configs

RESERVED_REGIONS = ("all",)  # `mesh --region all ...` means every region (the global view)


class RegionsError(ValueError):
    """A --regions list that cannot be a federation."""


def parse_regions(text: str) -> list[str]:
    """`a,b,c` -> ["a", "b", "c"]: tokens, distinct, neither `fed` (the federation's
    subjects) nor `all` (the global view's name)."""
    regions = [r.strip() for r in text.split(",")]
    if not text.strip() or any(not r for r in regions):
        raise RegionsError(f"--regions {text!r}: expected names separated by commas, e.g. a,b,c")
    for r in regions:
        try:
            subjects.region_token(r)
        except subjects.SubjectError as exc:
            raise RegionsError(f"--regions: {exc}") from None
        if r in RESERVED_REGIONS:
            raise RegionsError(
                f"--regions: {r!r} is reserved (`mesh --region all` is every region)"
            )
    if len(set(regions)) != len(regions):
        raise RegionsError(f"--regions {text!r}: a region is named twice")
    return regions


@dataclass
class LocalFederationConfig:
    state_dir: Path
    regions: list[str]
    candidates: int = 2
    sim_nodes: int = 2  # hollow nodes per region
    port: int = 0  # the first region's client port, the next ones after it (0: any free)
    lease_ttl: float = 2.0
    log_level: str = "warning"
    extra_env: dict[str, str] = field(default_factory=dict)
    secure: bool = True
    user: str = DEFAULT_USER


class RegionMesh(LocalMesh):
    """One region of a local federation: a `LocalMesh` whose one server is the region's
    member of the supercluster (the config made for it, with TLS and users added)."""

    def __init__(self, config: LocalMeshConfig, server_config: ServerConfig) -> None:
        super().__init__(config)
        self.server_config = server_config

    def _server_configs(self) -> list[ServerConfig]:
        tls, users = self._tls_and_users()
        self.server_config.tls = tls
        self.server_config.users = users
        return [self.server_config]


def fleet_prefix(region: str) -> str:
    """Each region's hollow nodes are named apart (`hollow-a-0000`), so a node id says
    which region it is in wherever it is shown."""
    return f"{FLEET_PREFIX}-{region}"


class LocalFederation:
    def __init__(self, config: LocalFederationConfig) -> None:
        self.config = config
        c = config
        self.certs_dir: Path | None = c.state_dir / "certs" if c.secure else None
        peer_tls = None
        if self.certs_dir is not None:
            d = self.certs_dir
            peer_tls = TlsFiles(
                str(d / pki.CA_CERT), str(d / pki.GATEWAY_CERT), str(d / pki.GATEWAY_KEY)
            )
        ports = {r: (c.port + i if c.port else 0) for i, r in enumerate(c.regions)}
        configs = supercluster_configs(
            c.regions, c.state_dir / "nats", peer_tls=peer_tls, ports=ports
        )
        self.meshes: dict[str, RegionMesh] = {}
        for r in c.regions:
            mesh_config = LocalMeshConfig(
                state_dir=c.state_dir / "regions" / r,
                region=r,
                candidates=c.candidates,
                real_agent=False,
                sim_nodes=c.sim_nodes,
                lease_ttl=c.lease_ttl,
                log_level=c.log_level,
                extra_env=c.extra_env,
                secure=c.secure,
                user=c.user,
                fleet_prefix=fleet_prefix(r),
                certs_dir=self.certs_dir,
            )
            self.meshes[r] = RegionMesh(mesh_config, configs[r])

    def _prepare_certs(self) -> None:
        """The one CA (made on first start, kept after) and the servers' peer
        certificate; each region then issues its children's certificates from it."""
        d = self.certs_dir
        if d is None:
            return
        if not pki.has_ca(d):
            pki.init(d)
        pki.ensure_gateway(d)

    def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_certs()
        try:
            for m in self.meshes.values():
                m.start_servers()
            for m in self.meshes.values():
                m.start_processes()
        except BaseException:
            self.stop()
            raise

    async def wait_ready(self, timeout: float = 60.0) -> dict[str, dict]:
        """Each region's cluster info once its leader answers and its nodes are ready."""
        infos = await asyncio.gather(*(m.wait_ready(timeout) for m in self.meshes.values()))
        return dict(zip(self.meshes, infos, strict=True))

    def check_children(self) -> None:
        for m in self.meshes.values():
            m.check_children()

    def contexts(self) -> dict[str, Context]:
        """What the CLI needs to reach each region (saved as `local-<region>`)."""
        return {r: m.context() for r, m in self.meshes.items()}

    def stop(self, timeout: float = 10.0) -> None:
        """Every region's children first, then every server: a coordinator whose
        server went first would log errors while it stops."""
        for m in self.meshes.values():
            m.stop_processes(timeout)
        for m in self.meshes.values():
            m.stop_servers()


def context_name(region: str) -> str:
    return f"{LOCAL}-{region}"


def describe(fed: LocalFederation, infos: dict[str, dict], names: dict[str, str]) -> list[str]:
    """What `mesh up --regions` prints: one line per region with the command line that
    reaches it."""
    certs = fed.certs_dir
    security = f"--certs {certs.resolve()}" if certs else "--insecure"
    mode = f"TLS, certificates in {certs}" if certs else "INSECURE"
    lines = [f"mesh is up: {len(fed.meshes)} regions, {', '.join(fed.meshes)} ({mode})"]
    for r, m in fed.meshes.items():
        info = infos[r]
        lines.append(
            f"  region {r}: leader {info['leader']}, {info['nodes'].get('ready', 0)} nodes; "
            f"mesh --nats {m.url} --region {r} {security} job list  "
            f"(or mesh --context {names[r]} ...)"
        )
    return lines


def up_regions(args: argparse.Namespace, ctx: Context) -> int:
    """`mesh up --regions a,b,c` until Ctrl-C, SIGTERM or a hangup (as `mesh up`)."""
    try:
        regions = parse_regions(args.regions)
    except RegionsError as exc:
        print(f"mesh up: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.nats_cluster != 1 or args.inference_workers:
        print(
            "mesh up --regions: one server per region, no inference workers "
            "(--nats-cluster and --inference-workers are for one region)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    sim_nodes = 2 if args.sim_nodes is None else args.sim_nodes
    if sim_nodes < 0 or args.candidates < 1:
        print("mesh up: --sim-nodes must be 0 or more, --candidates 1 or more", file=sys.stderr)
        return EXIT_USAGE
    state_dir = Path(args.state_dir) if args.state_dir else mesh_home() / "up-regions"
    fed = LocalFederation(
        LocalFederationConfig(
            state_dir=state_dir,
            regions=regions,
            candidates=args.candidates,
            sim_nodes=sim_nodes,
            port=args.port,
            log_level=args.log_level,
            secure=not (args.insecure or args.up_insecure),
            user=ctx.user,
        )
    )
    stop = asyncio.Event()

    async def run() -> int:
        loop = asyncio.get_running_loop()
        for sig in UP_STOP_SIGNALS:
            loop.add_signal_handler(sig, stop.set)
        fed.start()
        infos = await fed.wait_ready()
        names = {}
        for r, c in fed.contexts().items():
            names[r] = context_name(r)
            save_context(c, names[r])
        path = save_context(fed.contexts()[regions[0]])  # `local`, current: the first
        print("\n".join(describe(fed, infos, names)))
        print(
            f"contexts written to {path} ({LOCAL} = region {regions[0]}); "
            f"logs in {state_dir / 'regions'}/REGION/logs; Ctrl-C stops it all",
            flush=True,
        )
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                fed.check_children()
        return EXIT_OK

    try:
        return asyncio.run(run())
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        fed.stop()
        with contextlib.suppress(OSError):
            print("mesh stopped", file=sys.stderr)
