"""`mesh up` and `mesh demo`: a whole region on one machine, as real processes.

An embedded nats-server, coordinator candidates, one real agent for this machine and
optionally a process of hollow nodes, each a child process started the way an
operator would start it (`mesh coordinator`, `mesh agent`). `stop()` ends them all,
children first, and leaves no process behind. Should this process die without
`stop()` (SIGKILL, a crash), the children end too, running tasks included
(`mesh.cli.tether`: a death signal from the kernel and a reaper process).

Secure by default: on first start it makes a CA and certificates under
`<state-dir>/certs` (`mesh certs init`), issues one for each child's identity, and
runs NATS with TLS, verified client certificates and per-identity permissions; the
coordinators sign assignments with the region's key and the agents verify them.
`secure=False` (`mesh up --insecure`) runs all of it without TLS or permissions.
`nats_servers=3` clusters three servers on loopback, with streams of three replicas.

`inference_workers=N` adds an inference router process beside the coordinators (identity
`router:main`) and, once the region is ready, deploys the numpy model as an ordinary job
of N CPU worker replicas, pinned to this machine's agent: the coordinator places them
and the agent runs them as tasks. The agent holds a worker identity (`worker:NODE`,
copied into `<state-dir>/task-identity`, with no other key beside it) and hands its files
to the tasks that ask for it. See docs/inference_deploy.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.service import default_node_id
from mesh import subjects, tls_env
from mesh.cli import infer
from mesh.cli.certs import fleet_node_ids, site_nodes
from mesh.cli.context import DEFAULT_USER, Context
from mesh.cli.tether import Reaper, death_signal_preexec
from mesh.client import MeshClient
from mesh.connect import ClientTls, close_quietly, connect
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.security.permissions import server_users
from mesh.server import EmbeddedServer, ServerConfig, TlsFiles, UserPermission, free_port
from mesh.streams import ensure_streams

FLEET_PREFIX = "hollow"
ROUTER_NAME = "main"
TASK_IDENTITY_DIR = "task-identity"


@dataclass
class LocalMeshConfig:
    state_dir: Path
    region: str = "default"
    candidates: int = 2
    real_agent: bool = True
    sim_nodes: int = 0
    port: int = 0
    lease_ttl: float = 2.0
    log_level: str = "warning"
    extra_env: dict[str, str] = field(default_factory=dict)
    secure: bool = True  # TLS, client certificates, permissions, signed assignments
    nats_servers: int = 1  # 3: a cluster on loopback, streams with 3 replicas
    user: str = DEFAULT_USER  # the identity the CLI (and `wait_ready`) acts as
    inference_workers: int = 0  # > 0: a router, and the numpy model on N local workers
    # False: sim_nodes are admitted (identity, permissions) but only `start_hollow()`
    # starts them, e.g. after a measurement on the plain region
    start_sim_nodes: bool = True
    fleet_prefix: str = FLEET_PREFIX  # the hollow nodes are PREFIX-0000, ...
    certs_dir: Path | None = None  # secure: where the CA is (default state_dir/certs)
    # Edge sites (edge/README.md): the first server accepts leaf connections on this
    # port (0: free; None: none) and every server's JetStream is the domain "hub";
    # `site_nodes` ("S=NODE,NODE") names each site's nodes, and each site named gets its
    # `site:S` certificate (`mesh edge up --certs` presents it).
    leaf_port: int | None = None
    site_nodes: tuple[str, ...] = ()


class LocalMesh:
    def __init__(self, config: LocalMeshConfig) -> None:
        self.config = config
        self.servers: list[EmbeddedServer] = []
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.reaper: Reaper | None = None
        self.node_id = default_node_id()
        self.certs_dir: Path | None = None
        if config.secure:
            self.certs_dir = config.certs_dir or config.state_dir / "certs"

    @property
    def server(self) -> EmbeddedServer | None:
        return self.servers[0] if self.servers else None

    @property
    def url(self) -> str:
        assert self.servers
        return ",".join(s.url for s in self.servers)

    @property
    def replicas(self) -> int:
        return 3 if self.config.nats_servers >= 3 else 1

    @property
    def agent_allows_root(self) -> bool:
        """Whether this machine's agent gets `--allow-root`: run by root, it runs tasks as
        root, as whoever ran `mesh up`, who can submit them anyway (the CA and the user
        certificate are theirs): no privilege is crossed, but `mesh up` says so."""
        return self.config.real_agent and os.geteuid() == 0

    def context(self) -> Context:
        """What later CLI commands need to reach this region (saved by `mesh up`)."""
        certs = str(self.certs_dir.resolve()) if self.certs_dir else None
        return Context(self.url, self.config.region, certs, self.config.user)

    def tls(self, identity: Identity) -> ClientTls | None:
        return ClientTls.for_identity(self.certs_dir, identity) if self.certs_dir else None

    def client_options(self) -> dict:
        """`connect` keyword arguments for the region's user (TLS on a secure mesh)."""
        tls = self.tls(Identity.user(self.config.user))
        return {"tls": tls} if tls is not None else {}

    def _identities(self) -> list[Identity]:
        c = self.config
        wanted = [Identity.coordinator(), Identity.user(c.user), Identity.router(ROUTER_NAME)]
        if c.real_agent:
            # The worker identity is issued whether or not this run serves a model, so a
            # later `mesh model deploy` finds an agent that can hand it to its workers.
            wanted += [Identity.agent(self.node_id), Identity.worker(self.node_id)]
        if c.sim_nodes:
            wanted.append(Identity.fleet(c.fleet_prefix))
        wanted += [Identity.site(s) for s in site_nodes(c.site_nodes)]
        return wanted

    def _prepare_certs(self) -> TlsFiles:
        """The CA (made on first start, kept after) and a certificate per child."""
        d = self.certs_dir
        assert d is not None
        if not pki.has_ca(d):
            pki.init(d)
        for ident in self._identities():
            pki.ensure(d, ident)
        ca, cert, key = pki.server_files(d)
        return TlsFiles(str(ca), str(cert), str(key))

    def _task_identity_dir(self) -> Path:
        """The worker identity's files, apart from every other key in the certificate
        directory: what an operator would ship to a node (and make readable by its
        `--run-as` user). Refreshed on every start."""
        assert self.certs_dir is not None
        ident = Identity.worker(self.node_id)
        d = self.config.state_dir / TASK_IDENTITY_DIR
        d.mkdir(mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
        for src, mode in (
            (self.certs_dir / "ca.crt", 0o644),
            (ident.cert_path(self.certs_dir), 0o644),
            (ident.key_path(self.certs_dir), 0o600),
        ):
            dst = d / src.name
            tmp = dst.with_suffix(dst.suffix + ".tmp")
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as out:
                out.write(src.read_bytes())
            tmp.replace(dst)
        return d

    def _tls_and_users(self) -> tuple[TlsFiles | None, list[UserPermission]]:
        """The servers' TLS and per-identity users on a secure mesh (certificates made
        first), (None, []) on an insecure one."""
        c = self.config
        if self.certs_dir is None:
            return None, []
        tls = self._prepare_certs()
        fleets = {c.fleet_prefix: fleet_node_ids(c.fleet_prefix, c.sim_nodes)}
        return tls, server_users(
            c.region, pki.identities(self.certs_dir), fleets=fleets, sites=site_nodes(c.site_nodes)
        )

    def _server_configs(self) -> list[ServerConfig]:
        configs = self._region_configs()
        if self.config.leaf_port is not None:
            for cfg in configs:
                cfg.domain = subjects.HUB_DOMAIN
            configs[0].leaf_listen = True
            configs[0].leaf_port = self.config.leaf_port
        return configs

    @property
    def leaf_url(self) -> str | None:
        """Where edge sites' leaves dial (once started with `leaf_port`)."""
        if not self.servers or not self.servers[0].config.leaf_listen:
            return None
        return self.servers[0].leaf_url

    def _region_configs(self) -> list[ServerConfig]:
        c = self.config
        tls, users = self._tls_and_users()
        n = c.nats_servers
        if n <= 1:
            return [
                ServerConfig(
                    port=c.port, store_dir=str(c.state_dir / "nats"), tls=tls, users=users or []
                )
            ]
        routes = [free_port() for _ in range(n)]
        return [
            ServerConfig(
                port=c.port if i == 0 else 0,
                store_dir=str(c.state_dir / f"nats-{i + 1}"),
                server_name=f"mesh-{i + 1}",
                cluster_name=f"mesh-{c.region}",
                cluster_port=routes[i],
                cluster_routes=[
                    f"nats-route://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i
                ],
                tls=tls,
                users=users or [],
            )
            for i in range(n)
        ]

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        security = ["--certs", str(self.certs_dir)] if self.certs_dir else ["--insecure"]
        cmd = [
            sys.executable,
            "-m",
            "mesh.cli.main",
            "--nats",
            self.url,
            "--region",
            self.config.region,
            "--log-level",
            self.config.log_level,
            *security,
            *args,
        ]
        return self._spawn_command(name, cmd)

    def _spawn_command(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        logs = self.config.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.config.extra_env}
        # The flags say how to connect; a stray variable must not (the inference
        # processes read MESH_TLS_* and MESH_INBOX_PREFIX when a flag is absent, the
        # CLI when it has no certificate directory: mesh.tls_env).
        for var in ("MESH_INSECURE", *tls_env.ENV_VARS):
            env.pop(var, None)
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                preexec_fn=death_signal_preexec(),
            )
        self.children[name] = proc
        self._watch(name, proc.pid)
        return proc

    def _watch(self, name: str, pid: int) -> None:
        if self.reaper is None:
            self.reaper = Reaper()
        self.reaper.watch(name, pid)

    def start(self) -> None:
        self.start_servers()
        self.start_processes()

    def start_servers(self) -> None:
        """The region's nats-server(s) only: a federation starts every region's before
        any region's streams (JetStream's meta group spans them all)."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        for i, cfg in enumerate(self._server_configs()):
            server = EmbeddedServer(cfg, preexec_fn=death_signal_preexec())
            self.servers.append(server)
            try:
                server.start()
            finally:
                if server.proc is not None:
                    self._watch(f"nats-server-{i + 1}", server.proc.pid)

    def start_processes(self) -> None:
        """The streams, then the coordinators, agents and router (after `start_servers`)."""
        c = self.config
        if self.certs_dir is not None or len(self.servers) > 1:
            self._create_streams()
        verify = []
        task_identity: list[str] = []
        if self.certs_dir is not None:
            verify = ["--verify-key", str(pki.verify_key_path(self.certs_dir))]
            if c.real_agent:
                task_identity = ["--task-identity", str(self._task_identity_dir().resolve())]
        for i in range(1, c.candidates + 1):
            self.start_coordinator(f"coordinator-{i}")
        if c.inference_workers:
            self.start_router()
        if c.real_agent:
            self._spawn(
                "agent",
                [
                    "agent",
                    "--node-id",
                    self.node_id,
                    "--data-dir",
                    str(c.state_dir / "agent"),
                    "--kill-tasks-on-exit",
                    # `mesh model deploy` and --inference-workers pin work to this node.
                    "--label",
                    f"{infer.NODE_LABEL}={self.node_id}",
                    *verify,
                    *task_identity,
                    *(["--allow-root"] if self.agent_allows_root else []),
                ],
            )
        if c.sim_nodes and c.start_sim_nodes:
            self.start_hollow()

    def start_hollow(self) -> subprocess.Popen[bytes]:
        """The process of `sim_nodes` hollow nodes (started by `start()` unless
        `start_sim_nodes` is False)."""
        verify = []
        if self.certs_dir is not None:
            verify = ["--verify-key", str(pki.verify_key_path(self.certs_dir))]
        c = self.config
        args = ["agent", "--simulate", str(c.sim_nodes), "--prefix", c.fleet_prefix]
        return self._spawn("hollow", [*args, *verify])

    def _create_streams(self, timeout: float = 30.0) -> None:
        """The region's streams, made with the coordinator's identity before any agent
        starts: an agent may only create them as they are declared, and never first
        (see docs/security.md). A new cluster needs a few seconds to elect its
        JetStream meta leader: until then creation is retried."""

        async def create() -> None:
            opts = {}
            if self.certs_dir is not None:
                opts["tls"] = self.tls(Identity.coordinator())
            nc = await connect(self.url, name="mesh-up", **opts)
            try:
                deadline = time.monotonic() + timeout
                probe = nc.jetstream(timeout=0.5)  # a request before it is ready is dropped
                while True:
                    try:
                        await probe.account_info()
                        await ensure_streams(
                            nc.jetstream(timeout=5.0), self.config.region, self.replicas
                        )
                        return
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.1)
            finally:
                await close_quietly(nc)

        # start() may be called from inside a running loop (`mesh up`): a thread of its own
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, create()).result()

    def start_router(self) -> subprocess.Popen[bytes]:
        """The inference router, a process of its own beside the coordinators. It answers
        the clients itself (`--answers router`): a worker then only replies to the
        router's batches, which is all the worker identity may do (see
        docs/inference_deploy.md)."""
        cmd = [sys.executable, "-m", "inference.router", "--nats", self.url]
        cmd += ["--region", self.config.region, "--name", ROUTER_NAME, "--answers", "router"]
        tls = self.tls(Identity.router(ROUTER_NAME))
        if tls is not None:
            cmd += ["--tls-ca", tls.ca, "--tls-cert", tls.cert, "--tls-key", tls.key]
            cmd += ["--inbox-prefix", tls.inbox_prefix]
        return self._spawn_command("router", cmd)

    async def deploy_inference(self, timeout: float = 90.0) -> str:
        """Serve the numpy model on this machine's agent with `inference_workers`
        replicas; returns once a request is answered (see `infer.deploy_local_pool`)."""
        spec = infer.local_pool_spec(self.config.inference_workers, self.node_id)
        nc = await connect(self.url, name="mesh-up", **self.client_options())
        try:
            client = MeshClient(nc, self.config.region, timeout=5.0)
            return await infer.deploy_local_pool(
                client, nc, spec, timeout=timeout, check=self.check_children
            )
        finally:
            await close_quietly(nc)

    def start_coordinator(self, name: str) -> subprocess.Popen[bytes]:
        args = ["coordinator", "--id", name, "--lease-ttl", str(self.config.lease_ttl)]
        args += ["--replicas", str(self.replicas)]
        if self.certs_dir is not None:
            args += ["--signing-key", str(pki.signing_key_path(self.certs_dir))]
        return self._spawn(name, args)

    async def wait_ready(self, timeout: float = 30.0) -> dict:
        """Until a leader answers and every expected node reports ready."""
        c = self.config
        want = (1 if c.real_agent else 0) + (c.sim_nodes if "hollow" in self.children else 0)
        nc = await connect(self.url, name="mesh-up", **self.client_options())
        client = MeshClient(nc, self.config.region, timeout=2.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                self.check_children()
                try:
                    info = await client.cluster_info()
                    if info.get("leader") and info["nodes"].get("ready", 0) >= want:
                        return info
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"mesh not ready after {timeout}s; logs in {self.config.state_dir / 'logs'}"
                    )
                await asyncio.sleep(0.1)
        finally:
            await close_quietly(nc)

    def check_children(self) -> None:
        for name, proc in self.children.items():
            if proc.poll() is not None:
                log = self.config.state_dir / "logs" / f"{name}.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_processes(timeout)
        self.stop_servers()

    def stop_processes(self, timeout: float = 10.0) -> None:
        """The children: agents first (they stop their tasks), then coordinators."""
        order = sorted(self.children, key=lambda n: (not n.startswith(("agent", "hollow")), n))
        for name in order:
            proc = self.children[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in order:
            proc = self.children[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.children.clear()

    def stop_servers(self) -> None:
        """The servers, and the reaper (nothing left for it to end)."""
        for server in self.servers:
            server.stop()
        self.servers = []
        if self.reaper is not None:
            self.reaper.release()
            self.reaper = None
