"""The `mesh` CLI end to end: `mesh up` in one process, commands in others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from .conftest import run_mesh


@pytest.fixture
def mesh_up(tmp_path):
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    env.pop("MESH_NATS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mesh.cli.main", "up", "--port", "0", "--sim-nodes", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("mesh is up"), line + proc.stdout.read() if proc.poll() else line
    yield env, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def _descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_up_then_commands_from_another_terminal(mesh_up, tmp_path):
    env, up = mesh_up
    ctx = json.loads((tmp_path / "home" / "context.json").read_text())
    assert ctx["url"].startswith("tls://127.0.0.1:") and ctx["certs"]  # secure by default

    ok = tmp_path / "ok.yaml"
    ok.write_text("name: cli-ok\ntasks:\n  - role: main\n    command: echo from-cli\n")
    r = run_mesh("job", "run", str(ok), "--wait", env=env)
    assert r.returncode == 0, r.stderr
    assert "SUCCEEDED" in r.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: cli-bad\ntasks:\n  - role: main\n    command: exit 4\n")
    r = run_mesh("--json", "job", "run", str(bad), "--wait", env=env)
    assert r.returncode == 1
    job = json.loads(r.stdout)
    assert job["state"] == "FAILED" and job["task_list"][0]["exit_code"] == 4

    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("name: x\ntasks:\n  - role: main\n    count: -1\n    command: true\n")
    r = run_mesh("job", "run", str(invalid), env=env)
    assert r.returncode == 2 and "tasks[0].count" in r.stderr

    r = run_mesh("--json", "job", "list", env=env)
    assert r.returncode == 0
    names = sorted(j["name"] for j in json.loads(r.stdout))
    assert names == ["cli-bad", "cli-ok"]

    ok_id = next(j["job_id"] for j in json.loads(r.stdout) if j["name"] == "cli-ok")
    r = run_mesh("job", "logs", ok_id, env=env)
    assert r.returncode == 0 and r.stdout == "from-cli\n"
    r = run_mesh("job", "status", ok_id, env=env)
    assert r.returncode == 0 and ok_id in r.stdout and "SUCCEEDED" in r.stdout

    r = run_mesh("--json", "node", "list", env=env)
    nodes = json.loads(r.stdout)
    assert len(nodes) == 3 and sum(n["simulated"] for n in nodes) == 2
    r = run_mesh("node", "list", env=env)
    assert "STATUS" in r.stdout and "hollow-0000" in r.stdout

    r = run_mesh("--json", "cluster", "info", env=env)
    info = json.loads(r.stdout)
    assert info["leader"].startswith("coordinator-") and info["jobs"] == {
        "SUCCEEDED": 1,
        "FAILED": 1,
    }
    r = run_mesh("job", "status", "nope", env=env)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr

    # SIGINT stops everything `mesh up` started.
    children = _descendants(up.pid)
    assert len(children) >= 5  # nats-server, 2 coordinators, agent, hollow fleet
    up.send_signal(signal.SIGINT)
    assert up.wait(30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in children):
        time.sleep(0.1)
    assert not [p for p in children if psutil.pid_exists(p)]


def test_unreachable_mesh_exits_3(tmp_path):
    env = {**os.environ, "MESH_HOME": str(tmp_path / "none")}
    r = run_mesh("--nats", "nats://127.0.0.1:1", "job", "list", env=env)
    assert r.returncode == 3 and "cannot reach NATS" in r.stderr
