"""A site agent cut off from its region restarts a failing batch task in place, under
its restart policy; while the region is reachable the region decides retries as before.

Real nats-server, real coordinator, real `Agent` with `site` set; the site link's word
(`SiteUplink`) is published on its real subject by the test, as `SiteLink` would."""

from __future__ import annotations

import asyncio
import time

from agent.ledger import count_duplicates
from agent.store import read_ledger
from mesh import subjects
from mesh.codec import encode
from mesh.edgeschema import SiteUplink

from .conftest import eventually

SITE = "s1"


def _job(name: str, counter, retries: int) -> dict:
    # fails twice, then succeeds: the counter file lives outside the task's work dir,
    # which each run starts afresh
    cmd = f"echo x >> {counter}; [ $(wc -l < {counter}) -ge 3 ]"
    return {
        "name": name,
        "tasks": [{"role": "main", "command": cmd}],
        "restart": {"max_retries": retries},
    }


async def _say(region, reachable: bool, stop: asyncio.Event) -> None:
    """The site link's uplink, every 0.2 s (it says it every second) until stopped."""
    subject = subjects.site_uplink(region.name, SITE)
    while not stop.is_set():
        msg = SiteUplink(SITE, time.time(), reachable, 0.0 if reachable else time.time())
        await region.nc.publish(subject, encode(msg))
        await asyncio.sleep(0.2)


async def _site_agent(region):
    await region.coordinator()
    agent = await region.agent(site=SITE)
    await region.ready(1)
    return agent


async def test_cut_off_agent_restarts_in_place_and_reports_one_outcome(region, tmp_path):
    agent = await _site_agent(region)
    stop = asyncio.Event()
    talker = asyncio.create_task(_say(region, False, stop))
    try:
        await eventually(lambda: not agent.runs.uplink.reachable)
        counter = tmp_path / "count"
        job_id = await region.client.submit(_job("cut", counter, 3))
        job = await region.client.wait(job_id, timeout=30)
    finally:
        stop.set()
        await talker
    assert job["state"] == "SUCCEEDED"
    (task,) = job["task_list"]
    assert task["attempt"] == 1  # the region saw one attempt, not three
    assert "restarted in place 2 times while cut off" in task["message"]
    states = [h["state"] for h in task["history"]]
    assert states.count("SUCCEEDED") == 1 and "FAILED" not in states
    assert counter.read_text().count("x") == 3
    runs = [r for r in read_ledger(agent.data_dir / "agent.db") if r.task_id == task["task_id"]]
    assert [(r.attempt, r.run, r.outcome) for r in runs] == [
        (1, 1, "FAILED"),
        (1, 2, "FAILED"),
        (1, 3, "SUCCEEDED"),
    ]
    assert all(r.node_id == "node-1" and r.end is not None for r in runs)
    assert count_duplicates(runs).total == 0


async def test_cut_off_restarts_stop_at_the_restart_policy(region, tmp_path):
    agent = await _site_agent(region)
    stop = asyncio.Event()
    talker = asyncio.create_task(_say(region, False, stop))
    try:
        await eventually(lambda: not agent.runs.uplink.reachable)
        spec = {**_job("spent", tmp_path / "c", 1), "tasks": [{"role": "m", "command": "exit 4"}]}
        job = await region.client.wait(await region.client.submit(spec), timeout=30)
    finally:
        stop.set()
        await talker
    assert job["state"] == "FAILED"
    (task,) = job["task_list"]
    # max_retries 1: attempt 1 restarted once in place, which spends the retry it had;
    # the region then runs attempt 2 (it counts attempts, see the report), with none left
    runs = read_ledger(agent.data_dir / "agent.db")
    assert [(r.attempt, r.run, r.outcome) for r in runs] == [
        (1, 1, "FAILED"),
        (1, 2, "FAILED"),
        (2, 1, "FAILED"),
    ]
    assert task["attempt"] == 2


async def test_reachable_region_decides_retries(region, tmp_path):
    agent = await _site_agent(region)
    stop = asyncio.Event()
    talker = asyncio.create_task(_say(region, True, stop))
    try:
        await asyncio.sleep(0.5)
        assert agent.runs.uplink.reachable
        counter = tmp_path / "count"
        job_id = await region.client.submit(_job("up", counter, 3))
        job = await region.client.wait(job_id, timeout=30)
    finally:
        stop.set()
        await talker
    assert job["state"] == "SUCCEEDED"
    (task,) = job["task_list"]
    assert task["attempt"] == 3  # the region retried, as without a site
    runs = read_ledger(agent.data_dir / "agent.db")
    assert [(r.attempt, r.run, r.outcome) for r in runs] == [
        (1, 1, "FAILED"),
        (2, 1, "FAILED"),
        (3, 1, "SUCCEEDED"),
    ]
