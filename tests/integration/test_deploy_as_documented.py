"""A secure region deployed exactly as docs/install.md says, on real processes.

The page's shell blocks are read and run in order, with the host's names mapped onto
one machine (the server's paths and the node's install root under a temporary
directory, `nats.example.org:4222` onto a free loopback port, the task user `mesh-task`
onto `nobody`). `systemctl` is replaced by running the installed unit's `ExecStart=`
with its `EnvironmentFile=`, as systemd would. Then, beyond the page: a second agent
as a plain process with `--run-as`, jobs to SUCCEEDED, the leading coordinator
SIGKILLed, an agent SIGKILLed and restarted mid-task, and everything stopped and
started again with every job still there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mesh.cli.unit import SYSTEMD_PATH, parse_env, parse_exec_start
from mesh.server import find_server_binary, free_port

ROOT = Path(__file__).resolve().parents[2]
MESH = [sys.executable, "-m", "mesh.cli.main"]
TASK_USER = "nobody"


def sections(path: Path) -> dict[str, list[str]]:
    """The page's shell blocks under each `## ` heading, in order."""
    out: dict[str, list[str]] = {}
    for part in re.split(r"^## ", path.read_text(), flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        out[heading.strip()] = re.findall(r"```sh\n(.*?)```", body, re.S)
    return out


def commands(block: str) -> list[str]:
    """A block's commands, a heredoc kept whole with its command."""
    out: list[str] = []
    lines = iter(block.splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.search(r"<<'(\w+)'$", line)
        if m:
            body = []
            for more in lines:
                if more == m.group(1):
                    break
                body.append(more)
            line = line + "\n" + "\n".join(body)
        out.append(line)
    return out


class Deployment:
    """The two machines of docs/install.md on this one: the server's files and the
    node's install root under `base`, every process a real child process."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.server_dir = base / "server"  # the operator's working directory
        self.node_dir = base / "node"  # the node's home (where scp puts the bundle)
        self.node_root = base / "node-root"  # `mesh agent install --root`
        for d in (self.server_dir, self.node_dir):
            d.mkdir(parents=True)
        self.port = free_port()
        self.url = f"tls://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "MESH_HOME": str(base / "operator-home"),
            "PYTHONUNBUFFERED": "1",
        }
        for key in ("MESH_NATS_URL", "MESH_REGION", "MESH_CERTS", "MESH_CONTEXT"):
            self.env.pop(key, None)
        self.procs: dict[str, subprocess.Popen] = {}
        self.argvs: dict[str, tuple[list[str], dict, Path]] = {}
        self.ran: list[str] = []

    # ---------------------------------------------------------------- the page's names

    def mapped(self, text: str) -> str:
        for doc, here in (
            ("tls://nats.example.org:4222", self.url),
            ("0.0.0.0:4222", f"127.0.0.1:{self.port}"),
            ("/etc/mesh/certs", str(self.base / "etc-mesh-certs")),
            ("/etc/nats", str(self.base / "etc-nats")),
            ("/var/lib/nats", str(self.base / "var-lib-nats")),
            ("mesh-task", TASK_USER),
        ):
            text = text.replace(doc, here)
        return text

    @property
    def certs(self) -> Path:
        return self.base / "etc-mesh-certs"

    # ---------------------------------------------------------------- processes

    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> None:
        env = env or self.env
        log = self.base / f"{name}.log"
        self.argvs[name] = (argv, env, log)
        with open(log, "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.server_dir,
                start_new_session=True,
            )

    def respawn(self, name: str) -> None:
        argv, env, _ = self.argvs[name]
        self.spawn(name, argv, env)

    def log(self, name: str) -> str:
        return (self.base / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str, sig: int = signal.SIGTERM) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)

    def mesh(self, *args: str, cwd: Path | None = None, check: bool = True):
        r = subprocess.run(
            [*MESH, *args],
            env=self.env,
            cwd=cwd or self.server_dir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r

    def mesh_json(self, *args: str):
        return json.loads(self.mesh(*args, "-o", "json").stdout)

    def until(self, what: str, pred: Callable[[], object], timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while True:
            got = pred()
            if got:
                return got
            if time.monotonic() > deadline:
                logs = {n: self.log(n)[-3000:] for n in self.procs}
                raise AssertionError(f"{what}: not within {timeout}s; logs: {logs}")
            time.sleep(0.2)

    def server_listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                return s.recv(4).startswith(b"INFO")
        except OSError:
            return False

    # ---------------------------------------------------------------- the page's steps

    def run_line(self, line: str) -> None:
        """One command of docs/install.md, as the page means it."""
        self.ran.append(line)
        first = line.split()[0]
        if line.startswith(("python3 -m venv", "/opt/mesh/bin/pip", "export PATH=")):
            return  # step 1: this checkout is installed already (`make test`)
        if first == "useradd":
            return  # the task user: `nobody` stands in for it
        if first == "export":
            for item in shlex.split(self.mapped(line))[1:]:
                key, _, value = item.partition("=")
                self.env[key] = value
            return
        if first == "cat":  # cat > FILE <<'EOF' ... EOF
            head, _, body = line.partition("\n")
            target = shlex.split(head)[2]
            (self.server_dir / target).write_text(body + "\n")
            return
        if first == "scp":
            src = shlex.split(line)[1]
            shutil.copy(self.server_dir / src, self.node_dir / src)
            return
        argv = shlex.split(self.mapped(line))
        if first in ("mkdir", "rm"):
            subprocess.run(argv, check=True)
            return
        if first == "nats-server":
            self.spawn("nats-server", [find_server_binary(), *argv[1:]])
            self.until("nats-server listening", self.server_listening, 15)
            return
        assert first == "mesh", f"docs/install.md runs {first!r}: teach this test what it means"
        if "coordinator" in argv:
            cid = argv[argv.index("--id") + 1]
            self.spawn(cid, [*MESH, *argv[1:]])
            return
        if argv[1:3] == ["agent", "install"] or argv[1:3] == ["agent", "uninstall"]:
            self.mesh(*argv[1:], "--root", str(self.node_root), cwd=self.node_dir)
            if argv[2] == "install":
                self.start_installed_agent()
            else:  # `systemctl stop`, which uninstall runs where systemd is PID 1
                self.stop("gpu-07")
            return
        if argv[1:3] == ["cluster", "info"]:  # right after the coordinators start
            self.until("a leader", lambda: self.mesh(*argv[1:], check=False).returncode == 0)
            return
        if argv[1:3] == ["job", "run"]:
            r = self.mesh(*argv[1:], "-o", "json")
            assert json.loads(r.stdout)["state"] == "SUCCEEDED", r.stdout
            return
        self.mesh(*argv[1:])

    def start_installed_agent(self) -> None:
        """`systemctl restart mesh-agent.service`: ExecStart= with EnvironmentFile= over
        systemd's bare environment."""
        unit = (self.node_root / "etc/systemd/system/mesh-agent.service").read_text()
        env_file = self.node_root / "etc/mesh/agent.env"
        assert f"EnvironmentFile={env_file}" in unit
        env = {"PATH": SYSTEMD_PATH, **parse_env(env_file.read_text())}
        self.spawn("gpu-07", parse_exec_start(unit), env)

    def node_status(self, node_id: str) -> str | None:
        r = self.mesh("node", "list", "-o", "json", check=False)
        if r.returncode != 0:
            return None
        return next((n["status"] for n in json.loads(r.stdout) if n["node_id"] == node_id), None)

    def leader(self) -> str | None:
        r = self.mesh("cluster", "info", "-o", "json", check=False)
        return json.loads(r.stdout).get("leader") if r.returncode == 0 else None


@pytest.fixture
def deployment():
    # Not pytest's tmp_path: it sits under a 0700 directory the task user cannot pass.
    base = Path(tempfile.mkdtemp(prefix="mesh-deploy-"))
    base.chmod(0o711)
    d = Deployment(base)
    yield d
    d.stop_all()
    shutil.rmtree(base, ignore_errors=True)


def spec(name: str, command: str, count: int, cpu: str) -> str:
    task = {"role": "main", "count": count, "command": command,
            "resources": {"cpu": cpu, "memory": "32Mi"}}  # fmt: skip
    return json.dumps({"name": name, "tasks": [task]})


def submit(d: Deployment, name: str, command: str, count: int = 1, cpu: str = "100m") -> str:
    path = d.server_dir / f"{name}.json"
    path.write_text(spec(name, command, count, cpu))
    return d.mesh("job", "run", str(path)).stdout.strip()


def job(d: Deployment, job_id: str) -> dict:
    return d.mesh_json("job", "status", job_id)


@pytest.mark.slow
def test_region_deployed_as_install_md_says(deployment):
    d = deployment
    page = sections(ROOT / "docs" / "install.md")
    removal = page.pop("8. Remove a node")  # runs last, below
    assert removal and len(page) >= 6, list(page)
    for blocks in page.values():
        for block in blocks:
            for line in commands(block):
                d.run_line(line)
    # The page's own checks ran: hello.yaml SUCCEEDED on the installed agent.
    assert any(line.startswith("mesh job run hello.yaml") for line in d.ran)
    assert d.node_status("gpu-07") == "ready"

    # A second node: the page's step 5 for another name, its agent a plain process.
    d.mesh("certs", "issue", str(d.certs), "--agent", "cpu-01")
    join = [line for b in page["5. Join the node"] for line in commands(b)]
    d.run_line(next(line for line in join if "--reload" in line))
    data = d.base / "cpu-01-data"
    d.spawn(
        "cpu-01",
        [*MESH, "--nats", d.url, "--region", "eu", "--certs", str(d.certs), "--log-level",
         "info", "agent", "--node-id", "cpu-01", "--data-dir", str(data),
         "--verify-key", str(d.certs / "assignments.pub"), "--run-as", TASK_USER],
    )  # fmt: skip
    d.until("cpu-01 ready", lambda: d.node_status("cpu-01") == "ready")

    # Jobs on both nodes, as the task user: each gang's two tasks need more than half of
    # a node (both "nodes" are this machine), so one lands on each.
    cores = os.cpu_count() or 1
    first = [submit(d, f"who-{i}", "id -un", 2, f"{cores * 600}m") for i in range(3)]
    for jid in first:
        done = d.until(
            f"{jid} done",
            lambda jid=jid: job(d, jid)["state"] in ("SUCCEEDED", "FAILED", "KILLED"),
            60,
        )
        assert done
        assert job(d, jid)["state"] == "SUCCEEDED", job(d, jid)
    nodes_used = {t["node_id"] for jid in first for t in job(d, jid)["task_list"]}
    assert nodes_used == {"gpu-07", "cpu-01"}, nodes_used
    task = job(d, first[0])["task_list"][0]["task_id"]
    out = d.mesh("job", "logs", first[0], "--task", task).stdout
    assert out.strip() == TASK_USER

    # The leader is SIGKILLed: the other coordinator takes over, jobs still run.
    leader = d.until("a leader", d.leader)
    assert leader in ("c1", "c2")
    d.stop(leader, signal.SIGKILL)
    d.until("the other leads", lambda: d.leader() not in (None, leader), 30)
    after = submit(d, "after-failover", "true")
    d.until("after-failover done", lambda: job(d, after)["state"] == "SUCCEEDED", 60)
    d.respawn(leader)

    # An agent is SIGKILLed mid-task and restarted: the task is re-adopted, SUCCEEDED.
    slow = submit(d, "slow", "sleep 4")
    d.until("slow running", lambda: job(d, slow)["state"] == "RUNNING", 30)
    node = job(d, slow)["task_list"][0]["node_id"]
    d.stop(node, signal.SIGKILL)
    time.sleep(1.0)
    d.respawn(node)
    d.until("slow done", lambda: job(d, slow)["state"] not in ("PENDING", "RUNNING"), 60)
    done = job(d, slow)
    assert done["state"] == "SUCCEEDED", done
    assert max(t["attempt"] for t in done["task_list"]) == 1, done[
        "task_list"
    ]  # re-adopted, not rerun

    # Everything stops and starts again: every job is found, in its final state.
    every = {*first, after, slow}
    d.stop_all()
    for name in list(d.procs):
        d.respawn(name)
        if name == "nats-server":
            d.until("nats-server listening", d.server_listening, 15)
    d.until("a leader again", d.leader, 30)
    listed = {j["job_id"]: j["state"] for j in d.mesh_json("job", "list", "--limit", "100")}
    assert every <= set(listed), (every, listed)
    assert {listed[j] for j in every} == {"SUCCEEDED"}, listed
    d.until("gpu-07 ready again", lambda: d.node_status("gpu-07") == "ready")

    # Step 8: the node is removed and its identity revoked.
    for block in removal:
        for line in commands(block):
            d.run_line(line)
    assert not (d.node_root / "etc/systemd/system/mesh-agent.service").exists()
    assert (d.node_root / "var/lib/mesh/agent").exists()  # data kept without --purge
    conf = (d.base / "etc-nats" / "mesh-eu.conf").read_text()
    assert "agent:cpu-01" in conf and "agent:gpu-07" not in conf
    d.until("gpu-07 gone", lambda: d.node_status("gpu-07") in (None, "suspect", "down"))
