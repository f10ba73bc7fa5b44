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


def _spec(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return str(path)


def test_cli_habits_against_a_real_region(mesh_up, tmp_path):
    """Flags after the subcommand, -o, bulk submit and kill, --task, waiting reasons,
    logs of a task that never started, readable output and contexts: all through real
    `mesh` processes against `mesh up`."""
    import yaml

    env, _ = mesh_up
    two = _spec(tmp_path, "two", "tasks:\n  - role: main\n    count: 2\n    command: echo hi\n")
    one = _spec(tmp_path, "one", "tasks:\n  - role: main\n    command: echo one\n")
    r = run_mesh("job", "run", two, one, "--wait", "--timeout", "60", "--json", env=env)
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert [j["state"] for j in done] == ["SUCCEEDED", "SUCCEEDED"]
    two_id = done[0]["job_id"]

    r = run_mesh("job", "list", "--json", env=env)  # refused before: flag after subcommand
    assert r.returncode == 0 and {j["name"] for j in json.loads(r.stdout)} == {"two", "one"}
    r = run_mesh("job", "status", two_id, "-o", "yaml", env=env)
    assert yaml.safe_load(r.stdout)["job_id"] == two_id
    r = run_mesh("job", "list", "-o", "wide", env=env)
    assert r.stdout.splitlines()[0].split()[:2] == ["JOB", "NAME"]

    r = run_mesh("job", "logs", two_id, "--task", "main.1", env=env)
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
    r = run_mesh("job", "logs", two_id, "--task", "main", env=env)
    assert r.returncode == 2 and "matches 2 tasks by role" in r.stderr

    # A job no node can take: --wait says why it waits, logs say it never started.
    nowhere = _spec(
        tmp_path,
        "nowhere",
        "placement:\n  labels: {zone: nowhere}\ntasks:\n  - role: main\n    command: echo x\n",
    )
    r = run_mesh("job", "run", nowhere, "--wait", "--timeout", "2", env=env)
    assert r.returncode == 1
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("timed out")]
    prefix = "timed out after 2s: job nowhere-"
    assert line.startswith(prefix) and " is still PENDING: " in line, r.stderr
    reason = line.split(" is still PENDING: ", 1)[1]
    assert reason and reason != "no reason given"
    waiting = line[len("timed out after 2s: job ") :].split()[0]
    r = run_mesh("job", "logs", waiting, env=env)
    assert r.returncode == 1 and f"task {waiting}.main.0 never started" in r.stderr

    # Bulk kill: by ids, and by a selector.
    sleeper = "tasks:\n  - role: main\n    command: sleep 60\n    resources: {cpu: 10m}\n"
    files = [_spec(tmp_path, f"sleep{i}", sleeper) for i in range(3)]
    r = run_mesh("job", "run", *files, env=env)
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split()
    assert len(ids) == 3
    r = run_mesh("job", "kill", *ids, "--reason", "bulk", env=env)
    assert r.returncode == 0 and "kill requested for 3 jobs" in r.stdout, r.stderr
    r = run_mesh("job", "kill", "--state", "PENDING", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["kill_requested"] == [waiting]
    r = run_mesh("job", "run", one, "-", env=env, stdin="x")
    assert r.returncode == 2 and "-:" in r.stderr  # one bad spec: nothing submitted
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = json.loads(run_mesh("job", "list", "--json", env=env).stdout)
        states = {j["job_id"]: j["state"] for j in listed}
        if all(states[j] == "KILLED" for j in [*ids, waiting]):
            break
        time.sleep(0.5)
    assert all(states[j] == "KILLED" for j in [*ids, waiting]), states
    r = run_mesh("job", "kill", "nope-123", env=env)
    assert r.returncode == 1 and "nope-123: NOT_FOUND" in r.stderr

    r = run_mesh("cluster", "info", env=env)
    assert r.returncode == 0 and "{" not in r.stdout and "killed 4" in r.stdout
    r = run_mesh("pool", "list", env=env)
    assert r.returncode == 0 and "Ki " not in r.stdout + " " and "Gi" in r.stdout

    r = run_mesh("load", "--jobs", "3", "--pool", "/nope", env=env)
    assert r.returncode == 1 and "--rate" not in r.stdout
    assert "error INVALID_SPEC x3, e.g.: pool: /nope is not defined" in r.stdout

    # Contexts: `mesh up` wrote `local`; another context is picked per command or made
    # current, and flags still win over it.
    r = run_mesh("context", "list", env=env)
    assert r.stdout.splitlines()[1].startswith("*  local ")
    r = run_mesh("context", "add", "elsewhere", "--nats", "nats://127.0.0.1:1", env=env)
    assert r.returncode == 0
    assert run_mesh("--context", "elsewhere", "job", "list", env=env).returncode == 3
    assert run_mesh("context", "use", "elsewhere", env=env).returncode == 0
    assert run_mesh("job", "list", env=env).returncode == 3
    assert run_mesh("job", "list", "--context", "local", env=env).returncode == 0
    r = run_mesh("job", "list", env={**env, "MESH_CONTEXT": "local"})
    assert r.returncode == 0
