"""Mistakes fail fast and say what to do; processes log what an operator needs.

A real region as an operator deploys it: certificates from `mesh certs`, a nats-server
run on the config `mesh certs nats-conf` writes, and every `mesh` command a child
process. Each mistake must end within 15 s (it used to take 63-229 s, or for ever) with
a message naming what was refused, who was refused, and the fix; a mistake made while
running (an identity removed from the server config) is logged and recovered from.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mesh.security import pki
from mesh.security.identity import Identity
from mesh.server import find_server_binary, free_port
from tests.integration.conftest import run_mesh

REGION = "default"
MISTAKE_S = 15.0  # how long a mistake may take to be reported (the issue's bound)
ROOT = ["--allow-root"] if os.geteuid() == 0 else []  # tests may run as root in containers
JOB = "name: t\ntasks:\n  - role: t\n    simulate: {duration: 0.1s}\n    resources: {cpu: 1}\n"


class SecureNats:
    """nats-server on the config `mesh certs nats-conf` generates for the certificates
    in `certs` (regenerated and reloaded by `configure`)."""

    def __init__(self, tmp: Path, certs: Path, env: dict) -> None:
        self.tmp, self.certs, self.env = tmp, certs, env
        self.port = free_port()
        self.url = f"tls://127.0.0.1:{self.port}"
        self.conf = tmp / "nats.conf"
        self.log = tmp / "nats.log"
        self.proc: subprocess.Popen | None = None

    def configure(self, without: Identity | None = None) -> None:
        """Write the server config for every identity in `certs` except `without`."""
        hidden = []
        if without is not None:  # nats-conf lists what the directory holds
            for f in (without.cert_path(self.certs), without.key_path(self.certs)):
                hidden.append((f, f.rename(self.tmp / f.name)))
        try:
            out = run_mesh(
                "--region",
                REGION,
                "certs",
                "nats-conf",
                str(self.certs),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--store-dir",
                str(self.tmp / "store"),
                env=self.env,
            )
        finally:
            for original, moved in hidden:
                moved.rename(original)
        assert out.returncode == 0, out.stderr
        self.conf.write_text(out.stdout)

    def start(self) -> SecureNats:
        self.configure()
        (self.tmp / "store").mkdir(exist_ok=True)  # where the config's pid file goes
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [find_server_binary(), "-c", str(self.conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: "Server is ready" in self.log.read_text(), 10.0)
        return self

    def reload(self) -> None:
        """What `nats-server --signal reload` does, addressed to this server's pid."""
        assert self.proc is not None
        before = self.log.read_text().count("Reloaded server configuration")
        self.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: self.log.read_text().count("Reloaded server configuration") > before)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def wait_for(pred, timeout: float = 20.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@pytest.fixture
def stopped_deployment(tmp_path):
    """Certificates and a server config; the server not started yet."""
    certs = tmp_path / "certs"
    pki.init(certs)
    for node in ("node-a", "node-b"):
        pki.issue(certs, Identity.agent(node))
    env = {
        **os.environ,
        "MESH_HOME": str(tmp_path / "home"),
        "MESH_CERTS": str(certs),
        "PYTHONUNBUFFERED": "1",
    }
    for var in ("MESH_REGION", "MESH_INSECURE", "MESH_USER"):
        env.pop(var, None)
    server = SecureNats(tmp_path, certs, env)
    env["MESH_NATS_URL"] = server.url
    yield server, env
    server.stop()


@pytest.fixture
def deployment(stopped_deployment):
    server, env = stopped_deployment
    server.start()
    return server, env


class Child:
    """A long-running `mesh` command (at its default log level) with its log in a file."""

    def __init__(self, args: list[str], env: dict, log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mesh.cli.main", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def children():
    started: list[Child] = []

    def spawn(*args: str, env: dict, log: Path) -> Child:
        c = Child(list(args), env, log)
        started.append(c)
        return c

    yield spawn
    for c in started:
        c.stop()


def mesh_exit(*args: str, env: dict) -> subprocess.CompletedProcess:
    """A command that must end by itself within MISTAKE_S (TimeoutExpired fails the test)."""
    return run_mesh(*args, env=env, timeout=MISTAKE_S)


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---------------------------------------------------------------- the CLI


def test_cli_with_a_wrong_region_says_which_subject_and_fix(deployment, tmp_path):
    _, env = deployment
    listed = mesh_exit("--region", "eu", "job", "list", env=env)
    assert listed.returncode == 2, listed.stderr
    msg = one_line(listed.stderr)
    assert '"mesh.eu.api.job.list"' in msg
    assert "user:admin" in msg and "CN=user:admin" in msg
    assert "--region" in msg and "mesh certs nats-conf DIR --region R" in msg
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB)
    ran = mesh_exit("--region", "eu", "job", "run", str(spec), "--wait", env=env)
    assert ran.returncode == 2, ran.stderr
    assert '"mesh.eu.api.job.submit"' in one_line(ran.stderr)


def test_cli_without_certs_on_a_tls_region_points_at_certs(deployment):
    _, env = deployment
    env = {k: v for k, v in env.items() if k != "MESH_CERTS"}
    out = mesh_exit("node", "list", env=env)
    assert out.returncode == 2, out.stderr
    msg = one_line(out.stderr)
    assert "--certs DIR" in msg and "MESH_CERTS" in msg and "mesh context" in msg
    assert "is `mesh up` running" not in msg


def test_an_invalid_region_is_a_usage_error(tmp_path):
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home")}
    for region in ("a.b", "eu*", ">"):
        out = mesh_exit("--region", region, "job", "list", env=env)
        assert out.returncode == 2, out.stderr
        assert f"region {region!r}" in one_line(out.stderr)
    out = mesh_exit("--region", "a.b", "agent", "--node-id", "n1", env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr


# ---------------------------------------------------------------- agents and coordinators


def test_agent_with_a_wrong_region_exits_with_one_line(deployment, tmp_path):
    _, env = deployment
    out = mesh_exit(
        "--region",
        "eu",
        "agent",
        "--node-id",
        "node-a",
        "--data-dir",
        str(tmp_path / "agent"),
        *ROOT,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    msg = one_line(out.stderr)
    assert msg.startswith("mesh agent: permission denied")
    assert "agent:node-a" in msg and "MESH_ASSIGN_eu" in msg and "--region" in msg


def test_agent_missing_from_the_server_config_exits_naming_it(deployment, tmp_path):
    server, env = deployment
    pki.issue(server.certs, Identity.agent("ghost"))  # signed by the CA, not in the config
    out = mesh_exit(
        "agent", "--node-id", "ghost", "--data-dir", str(tmp_path / "agent"), *ROOT, env=env
    )
    assert out.returncode == 2, out.stderr
    msg = one_line(out.stderr)
    assert "authorization refused" in msg and "CN=agent:ghost" in msg
    assert "mesh certs nats-conf" in msg


def test_coordinator_with_a_wrong_region_exits_with_one_line(deployment):
    _, env = deployment
    out = mesh_exit("--region", "eu", "coordinator", "--id", "c1", env=env)
    assert out.returncode == 2, out.stderr
    msg = one_line(out.stderr)
    assert msg.startswith("mesh coordinator: permission denied")
    assert "CN=coordinator" in msg and '"mesh.eu.' in msg


def test_leadership_changes_are_in_the_default_log(deployment, tmp_path, children):
    server, env = deployment
    c1 = children("coordinator", "--id", "c1", env=env, log=tmp_path / "c1.log")
    wait_for(lambda: "c1 leads region default" in c1.text())
    c2 = children("coordinator", "--id", "c2", env=env, log=tmp_path / "c2.log")
    wait_for(lambda: "c2 follows c1" in c2.text())
    c1.stop()
    wait_for(lambda: "c2 leads region default" in c2.text())
    first = c1.text()
    assert "level=debug" not in first  # the default level, not a chatty one
    assert f"connected to {server.url} as coordinator (server user CN=coordinator)" in first
    assert "process=coordinator region=default" in first
    assert "event=leader term=" in first and "c1 stepped down" in first
    assert "event=following leader=c1" in c2.text()
    for line in (first + c2.text()).splitlines():
        assert line.startswith("ts="), line  # one event per line, nothing else


def test_agent_whose_identity_is_removed_logs_once_and_recovers(deployment, tmp_path, children):
    server, env = deployment
    children("coordinator", "--id", "c1", env=env, log=tmp_path / "c1.log")
    agent = children(
        "agent",
        "--node-id",
        "node-b",
        "--data-dir",
        str(tmp_path / "agent"),
        *ROOT,
        env=env,
        log=tmp_path / "agent.log",
    )
    wait_for(lambda: "agent node-b started" in agent.text())
    assert f"connected to {server.url} as agent:node-b" in agent.text()
    assert "identity=agent:node-b" in agent.text()

    server.configure(without=Identity.agent("node-b"))
    server.reload()
    wait_for(lambda: "authorization refused" in agent.text())
    refused_at = server.log.read_text().count("authentication error")
    time.sleep(8.0)
    assert agent.proc.poll() is None, agent.text()  # it waits for the fix, as systemd would
    log = agent.text()
    assert log.count("authorization refused") == 1, log  # one line, not one per attempt
    assert "CN=agent:node-b" in log and "Traceback" not in log
    attempts = server.log.read_text().count("authentication error") - refused_at
    assert attempts <= 6, attempts  # backing off: it was 4 a second, for ever

    server.configure()
    server.reload()
    wait_for(lambda: "nats reconnected (agent:node-b)" in agent.text(), 30.0)
    wait_for(lambda: node_status(env, "node-b") == "ready", 30.0, 0.5)


def node_status(env: dict, node: str) -> str | None:
    out = run_mesh("--json", "node", "list", env=env, timeout=30.0)
    if out.returncode != 0:
        return None
    return next((n["status"] for n in json.loads(out.stdout) if n["node_id"] == node), None)


def test_agent_started_before_its_server_says_so_and_starts_when_it_comes(
    stopped_deployment, tmp_path, children
):
    server, env = stopped_deployment
    agent = children(
        "agent",
        "--node-id",
        "node-a",
        "--data-dir",
        str(tmp_path / "agent"),
        *ROOT,
        env=env,
        log=tmp_path / "agent.log",
    )
    wait_for(lambda: "cannot reach NATS at" in agent.text())
    time.sleep(3.0)
    assert agent.text().count("cannot reach NATS at") == 1, agent.text()  # not one per try
    assert agent.proc.poll() is None
    server.start()
    wait_for(lambda: "agent node-a started" in agent.text())
    assert "Traceback" not in agent.text()
