"""The agent on a real host as root: who tasks run as, and where their exit status lives.

These run as root (as the suite does in CI containers) and use the existing unprivileged
user ``nobody`` as the task user: no user is created.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import eventually, run_mesh

ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not ROOT, reason="the root and --run-as rules apply to root")


@pytest.fixture
def open_dir():
    """A directory any user can traverse (pytest's tmp_path lies under a 0700 dir)."""
    d = Path(tempfile.mkdtemp(prefix="mesh-host-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_root_agent_without_run_as_offers_no_capacity(region, open_dir):
    await region.coordinator()
    agent = await region.agent(allow_root=False)  # root, no --run-as, no --allow-root

    async def refusing():
        info = await region.client.cluster_info()
        return info["nodes"].get("refusing") == 1 and info["nodes"].get("ready", 0) == 0

    await eventually(refusing)
    node = await region.client.node("node-1")
    assert node["status"] == "refusing"
    assert node["refusing"] == "tasks would run as root: use --run-as USER or --allow-root"
    assert node["capacity"]["cpu"] > 0  # what it has is still shown; it is just not offered

    out = open_dir / "out"
    out.mkdir()
    out.chmod(0o777)  # for nobody to write its answer in
    marker = out / "uid"
    job_id = await region.client.submit(
        {"name": "as-root", "tasks": [{"role": "main", "command": f"id -u > {marker}"}]}
    )

    async def waiting():
        job = await region.client.job(job_id)
        return job if job["state"] == "PENDING" and job.get("pending_reason") else None

    job = await eventually(waiting)
    assert job["pending_reason"] == (
        "no node to place on: node node-1 takes no tasks: "
        "tasks would run as root: use --run-as USER or --allow-root"
    )
    (task,) = job["task_list"]
    assert task["state"] == "PENDING" and task["attempt"] == 0  # never placed, never failed
    assert not marker.exists()

    # The operator restarts it with --run-as nobody: the waiting job runs, as nobody.
    await agent.stop(kill_tasks=True)
    region.agents.remove(agent)
    await region.agent(run_as="nobody", data_dir=str(open_dir / "agent"))
    job = await region.client.wait(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED", job["task_list"]
    assert marker.read_text().strip() == str(pwd.getpwnam("nobody").pw_uid)


def test_agent_refuses_a_data_dir_the_task_user_cannot_traverse(nats_server, tmp_path):
    private = tmp_path / "private"  # root's, 0700: like /root holding the default ~/.mesh
    private.mkdir(mode=0o700)
    data = private / "agent"
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home")}
    started = time.monotonic()
    r = run_mesh(
        "--nats",
        nats_server.url,
        "agent",
        "--node-id",
        "walled",
        "--run-as",
        "nobody",
        "--data-dir",
        str(data),
        env=env,
        timeout=30,
    )
    assert time.monotonic() - started < 15
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "data dir" in x]
    # pytest's own tmp dirs sit under a 0700 dir too: the first one nobody cannot pass
    # is named, whichever it is.
    assert line.startswith(f"mesh agent: data dir {data}: task user 'nobody' cannot traverse")
    assert "--data-dir" in line
    blocked = line.split("cannot traverse or write ", 1)[1].split(";", 1)[0]
    assert str(data).startswith(blocked) and os.stat(blocked).st_mode & 0o001 == 0


async def test_run_as_task_succeeds_across_an_agent_sigkill(region, procs, open_dir):
    """The agent is SIGKILLed while its --run-as task runs and restarted after the task
    exited 0: the exit file the task user wrote says SUCCEEDED. Started with umask 077,
    as a hardened root is, the agent must still make its data dir one the user can
    traverse (before, every such task came back FAILED after the restart)."""
    await region.coordinator()
    data = open_dir / "data" / "agent"
    shared = open_dir / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    go, done = shared / "go", shared / "done"
    args = ("agent", "--node-id", "hosty", "--data-dir", str(data), "--run-as", "nobody")
    old = os.umask(0o077)
    try:
        agent = procs(region.url, *args, name="agent1")
    finally:
        os.umask(old)
    await region.ready(1)
    cmd = f"while [ ! -e {go} ]; do sleep 0.05; done; echo finished; touch {done}"
    job_id = await region.client.submit(
        {"name": "survivor", "tasks": [{"role": "main", "command": cmd}]}
    )

    async def running():
        job = await region.client.job(job_id)
        return job["task_list"][0]["state"] == "RUNNING"

    await eventually(running)
    agent.kill9()  # the task lives on in its own session
    go.touch()
    await eventually(done.exists)
    await asyncio.sleep(0.2)  # its wrapper records the status and exits
    procs(region.url, *args, name="agent2")  # same node id, same data dir
    job = await region.client.wait(job_id, timeout=30)
    (task,) = job["task_list"]
    assert job["state"] == "SUCCEEDED", task
    assert task["attempt"] == 1 and task["exit_code"] == 0
    logs = await region.client.logs(job_id)
    assert logs["data"] == b"finished\n"
