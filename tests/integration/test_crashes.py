"""Crashes of real processes: an agent and a leader killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agent.store import read_ledger

from .conftest import eventually


async def test_agent_sigkilled_and_restarted_readopts_its_running_task(region, procs, tmp_path):
    await region.coordinator()
    data = str(tmp_path / "agent-data")
    root = ("--allow-root",) if os.geteuid() == 0 else ()  # as the operator would say
    args = ("agent", "--node-id", "crashy", "--data-dir", data, *root)
    agent = procs(region.url, *args, name="agent1")
    await region.ready(1)
    runs = tmp_path / "runs"
    go = tmp_path / "go"
    cmd = f"echo run >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done; echo finished"
    job_id = await region.client.submit(
        {"name": "survivor", "tasks": [{"role": "main", "command": cmd}]}
    )

    async def running():
        job = await region.client.job(job_id)
        return job["task_list"][0]["state"] == "RUNNING"

    await eventually(running)
    agent.kill9()  # the task lives on in its own session
    await asyncio.sleep(0.5)
    procs(region.url, *args, name="agent2")  # same node id, same data dir
    await asyncio.sleep(1.5)  # let it re-adopt before the task may finish
    go.touch()
    job = await region.client.wait(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED", job
    (task,) = job["task_list"]
    assert task["attempt"] == 1 and task["exit_code"] == 0
    assert runs.read_text() == "run\n"  # ran exactly once
    states = [h["state"] for h in task["history"]]
    assert states.count("RUNNING") == 1 and states.count("SUCCEEDED") == 1, states
    logs = await region.client.logs(job_id)
    assert logs["data"] == b"finished\n"
    # the ledger: one run, opened by the first agent, closed by the one that re-adopted it
    (run,) = read_ledger(Path(data) / "agent.db")
    assert (run.task_id, run.attempt, run.run, run.node_id) == (task["task_id"], 1, 1, "crashy")
    assert run.outcome == "SUCCEEDED" and run.end >= run.start


async def test_leader_sigkilled_follower_takes_over_with_every_acknowledged_job(region, procs):
    c1 = procs(region.url, "coordinator", "--id", "cand-1", name="cand-1")
    await region.fleet(2)

    async def leader():
        info = await region.client.cluster_info()
        return info["leader"] or None

    first = await eventually(leader)
    assert first == "cand-1"
    procs(region.url, "coordinator", "--id", "cand-2", name="cand-2")
    await asyncio.sleep(1.0)  # the follower is up and following
    acked = []
    for i in range(20):
        acked.append(
            await region.client.submit(
                {
                    "name": f"job{i}",
                    "tasks": [{"role": "w", "count": 2, "simulate": {"duration": "0.1s"}}],
                }
            )
        )
    before = {j: (await region.client.job(j))["task_list"] for j in acked[:3]}
    c1.kill9()
    new_job = await region.client.submit(
        {"name": "after", "tasks": [{"role": "w", "simulate": {"duration": "0.1s"}}]}
    )
    info = await region.client.cluster_info()
    assert info["leader"] == "cand-2" and info["term"] > 1
    # How long that took is measured by `python -m bench failover`, not asserted here.
    for job_id in acked + [new_job]:
        job = await region.client.wait(job_id, timeout=30)
        assert job["state"] == "SUCCEEDED", job
    for job_id, tasks in before.items():
        after = (await region.client.job(job_id))["task_list"]
        for old, new in zip(tasks, after, strict=False):
            # history from before the kill is still there, as it was
            assert new["history"][: len(old["history"])] == old["history"]
