"""Two regions configured as docs/federation.md says, on real nats-servers: each runs
the config `mesh certs nats-conf --gateway ...` wrote, the two join by gateway over TLS
(both ends verified against the one CA), the coordinators' federation subjects cross,
each region's stream lives in its own cluster, and a certificate from the same CA that
is not the servers' (an agent's) cannot join as a gateway."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import nats.errors
import pytest

from mesh import subjects
from mesh.connect import ClientTls, close_quietly, connect
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.server import find_server_binary, free_port
from tests.integration.conftest import eventually, run_mesh

REGIONS = ("eu", "us")


class Region:
    """One region's server, from the config nats-conf wrote (`nats-server -c FILE`)."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.name = name
        self.port, self.gateway_port, self.cluster_port = free_port(), free_port(), free_port()
        self.conf = tmp / f"{name}.conf"
        self.store = tmp / f"{name}-js"
        self.log = tmp / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.store.mkdir(exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [find_server_binary(), "-c", str(self.conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    if s.recv(16).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nats-server not ready: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def federation(tmp_path):
    certs = tmp_path / "certs"
    pki.init(certs)
    pki.issue(certs, Identity.agent("node-1"))
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home")}
    regions = {name: Region(tmp_path, name) for name in REGIONS}
    gateways = []
    for r in regions.values():
        gateways += ["--gateway", f"{r.name}=nats://localhost:{r.gateway_port}"]
    for r in regions.values():
        argv = ["certs", "nats-conf", str(certs), "--region", r.name, "-o", str(r.conf)]
        argv += ["--listen", f"127.0.0.1:{r.port}", "--store-dir", str(r.store)]
        argv += ["--gateway-listen", f"127.0.0.1:{r.gateway_port}"]
        argv += ["--cluster-listen", f"127.0.0.1:{r.cluster_port}", *gateways]
        done = run_mesh(*argv, env=env)
        assert done.returncode == 0, done.stderr
        other = next(o for o in REGIONS if o != r.name)
        assert f"gateway {r.name} on 127.0.0.1:{r.gateway_port} (TLS) to {other}" in done.stderr
    try:
        for r in regions.values():
            r.start()
        yield certs, regions
    finally:
        for r in regions.values():
            r.stop()


async def _connect(region: Region, certs: Path, ident: Identity):
    return await connect(
        region.url, name=f"t-{region.name}", tls=ClientTls.for_identity(certs, ident)
    )


async def test_two_regions_join_by_tls_gateway_and_keep_their_streams(federation):
    certs, regions = federation
    conf = regions["eu"].conf.read_text()
    assert "gateway {" in conf and "verify_cert_and_check_known_urls: true" in conf
    eu = await _connect(regions["eu"], certs, Identity.coordinator())
    us = await _connect(regions["us"], certs, Identity.coordinator())
    try:
        got: asyncio.Queue = asyncio.Queue()

        async def on_msg(msg):
            await got.put(msg.data)

        await eu.subscribe(subjects.fed_all(), cb=on_msg)
        await eu.flush()

        async def crossed() -> bool:
            await us.publish("mesh.fed.summary.us", b"hello from us")
            try:
                return await asyncio.wait_for(got.get(), 0.3) == b"hello from us"
            except TimeoutError:
                return False

        await eventually(crossed, timeout=20)  # the gateway connects within seconds

        # JetStream across the supercluster: each region's stream in its own cluster.
        async def streams_made() -> bool:
            try:
                for nc, name in ((eu, "eu"), (us, "us")):
                    await nc.jetstream(timeout=2).add_stream(
                        name=subjects.log_stream(name), subjects=[subjects.job_log(name)]
                    )
                return True
            except (nats.errors.Error, TimeoutError, Exception):
                return False

        await eventually(streams_made, timeout=20)
        for nc, name in ((eu, "eu"), (us, "us")):
            info = await nc.jetstream().stream_info(subjects.log_stream(name))
            assert info.cluster.name == name
    finally:
        await close_quietly(eu)
        await close_quietly(us)


async def test_an_agent_certificate_cannot_join_as_a_gateway(federation, tmp_path):
    """A rogue server presenting an agent's certificate (same CA, no host name) dials
    eu's gateway: eu refuses it, so it never sees eu's traffic."""
    certs, regions = federation
    eu = regions["eu"]
    agent = Identity.agent("node-1")
    rogue_store = tmp_path / "rogue-js"
    rogue_conf = tmp_path / "rogue.conf"
    port, gw = free_port(), free_port()
    rogue_conf.write_text(
        f'listen: "127.0.0.1:{port}"\nserver_name: "rogue"\n'
        f'gateway {{\n  name: "rogue"\n  listen: "127.0.0.1:{gw}"\n'
        f'  gateways: [{{name: "eu", url: "nats://localhost:{eu.gateway_port}"}}]\n'
        f'  tls {{\n    cert_file: "{agent.cert_path(certs)}"\n'
        f'    key_file: "{agent.key_path(certs)}"\n    ca_file: "{certs / "ca.crt"}"\n'
        f"    verify: true\n  }}\n}}\n"
    )
    rogue_store.mkdir()
    log = tmp_path / "rogue.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [find_server_binary(), "-c", str(rogue_conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        async def refused() -> bool:
            return "Authorization Violation" in log.read_text()

        await eventually(refused, timeout=20)
        assert "Authentication Failure" in eu.log.read_text()
        assert 'connection from "rogue"' not in eu.log.read_text()
    finally:
        proc.terminate()
        proc.wait(10)
