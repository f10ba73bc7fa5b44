"""Services over real NATS: in-process coordinator, a real agent running real processes,
a hollow fleet; replicas restarted after their process is killed, a rolling update
through the `mesh` CLI, and a failing health check shown."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from .conftest import eventually, run_mesh

SLEEPER = """
name: sleeper
kind: service
restart: {backoff: 200ms, max_backoff: 1s}
tasks:
  - role: web
    count: 3
    command: sleep 300
"""


def _live(job: dict) -> list[dict]:
    return [t for t in job["task_list"] if t["state"] not in ("KILLED", "SUCCEEDED")]


async def test_a_replica_whose_process_is_killed_is_started_again(region):
    await region.coordinator()
    agent = await region.agent()
    await region.ready(1)
    c = region.client
    job_id = await c.submit(SLEEPER)

    async def running():
        job = await c.job(job_id)
        up = [t for t in job["task_list"] if t["state"] == "RUNNING"]
        return job if len(up) == 3 else None

    job = await eventually(running, timeout=30)
    assert job["state"] == "RUNNING" and job["kind"] == "service"
    victim = job["task_list"][1]["task_id"]
    handle = agent.handles[(victim, 1)]
    os.killpg(handle.pid, signal.SIGKILL)  # the replica's process dies under it

    async def restarted():
        t = next(t for t in (await c.job(job_id))["task_list"] if t["task_id"] == victim)
        return t if t["attempt"] == 2 and t["state"] == "RUNNING" else None

    t = await eventually(restarted, timeout=30)
    assert any(h["state"] == "FAILED" for h in t["history"])
    assert (await c.job(job_id))["state"] == "RUNNING"  # a service never ends by itself
    assert (victim, 2) in agent.handles

    await c.kill(job_id, "test over")

    async def killed():
        job = await c.job(job_id)
        return job if job["state"] == "KILLED" else None

    job = await eventually(killed, timeout=30)
    assert all(t["state"] == "KILLED" for t in job["task_list"])
    await eventually(lambda: not agent.handles, timeout=15)


SIM = """
name: websim
kind: service
update: {max_surge: 1, max_unavailable: 0}
tasks:
  - role: web
    count: 3
    env: {VERSION: "{version}"}
    simulate: {duration: 600s}
"""


async def test_a_rolling_update_through_the_cli_replaces_replicas_one_by_one(region, tmp_path):
    await region.coordinator()
    await region.fleet(4)
    await region.ready(4)
    c = region.client
    job_id = await c.submit(SIM.replace("{version}", "1"))

    async def settled(generation):
        job = await c.job(job_id)
        live = _live(job)
        ok = len(live) == 3 and all(
            t["state"] == "RUNNING" and t["generation"] == generation for t in live
        )
        return job if ok else None

    await eventually(lambda: settled(0), timeout=30)
    spec = tmp_path / "v2.yaml"
    spec.write_text(SIM.replace("{version}", "2"))
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home")}
    cli = ("--nats", region.url)

    # Sample the service while the CLI's update rolls: never fewer than 3 serving.
    lows: list[int] = []
    done = asyncio.Event()

    async def watch():
        while not done.is_set():
            job = await c.job(job_id)
            lows.append(sum(1 for t in job["task_list"] if t["state"] == "RUNNING"))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    r = await asyncio.to_thread(run_mesh, *cli, "job", "update", str(spec), env=env)
    assert r.returncode == 0, r.stderr
    assert f"update of {job_id} requested" in r.stdout
    job = await eventually(lambda: settled(1), timeout=60)
    done.set()
    await watcher
    assert min(lows) >= 3
    old = [t for t in job["task_list"] if t["generation"] == 0]
    assert sorted(t["task_id"] for t in old) == [f"{job_id}.web.{i}" for i in range(3)]
    assert all(t["state"] == "KILLED" for t in old)
    assert len(job["task_list"]) == 6  # three replaced, one at a time: none lost
    assert job["generation"] == 1

    # The same spec again changes nothing; a batch job cannot be updated (CONFLICT).
    r = await asyncio.to_thread(run_mesh, *cli, "job", "update", str(spec), env=env)
    assert r.returncode == 0 and "nothing to update" in r.stdout, r.stderr
    batch = tmp_path / "batch.yaml"
    batch.write_text("name: b\ntasks:\n  - role: a\n    simulate: {duration: 60s}\n")
    batch_id = await c.submit(batch.read_text())
    r = await asyncio.to_thread(
        run_mesh, *cli, "job", "update", str(batch), "--job", batch_id, env=env
    )
    assert r.returncode != 0 and "CONFLICT" in r.stderr and "batch job" in r.stderr
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text(SIM.replace("{version}", "3").replace("name: websim", "name: other"))
    r = await asyncio.to_thread(
        run_mesh, *cli, "job", "update", str(renamed), "--job", job_id, env=env
    )
    assert r.returncode != 0 and "name: an update cannot change it" in r.stderr


CHECKED = """
name: checked
kind: service
health: {command: "test -e ready", interval: 200ms, timeout: 200ms, unhealthy_after: 2}
tasks:
  - role: web
    count: 1
    command: sleep 300
"""


@pytest.mark.parametrize("passing", [False, True])
async def test_a_health_checked_replica_is_shown_healthy_or_not(region, tmp_path, passing):
    await region.coordinator()
    agent = await region.agent()
    await region.ready(1)
    c = region.client
    spec = CHECKED if not passing else CHECKED.replace("sleep 300", "touch ready; sleep 300")
    job_id = await c.submit(spec)
    want = "healthy" if passing else "unhealthy"

    async def verdict():
        (t,) = (await c.job(job_id))["task_list"]
        return t if t["state"] == "RUNNING" and t["health"] == want else None

    t = await eventually(verdict, timeout=30)
    assert any(f"health check: {want}" in h["message"] for h in t["history"])
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home")}
    r = await asyncio.to_thread(run_mesh, "--nats", region.url, "job", "status", job_id, env=env)
    assert r.returncode == 0, r.stderr
    assert "HEALTH" in r.stdout and f" {want} " in r.stdout
    r = await asyncio.to_thread(
        run_mesh, "--nats", region.url, "--json", "job", "status", job_id, env=env
    )
    assert json.loads(r.stdout)["task_list"][0]["health"] == want
    assert agent.handles  # an unhealthy replica is shown, not killed
