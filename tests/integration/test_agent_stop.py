"""An agent stopped with kill_tasks (as `mesh up` stops its own) leaves no task running,
even one whose start the stop cut short. CI once saw `mesh up` stop cleanly on SIGHUP
and leave its task's `sleep` running: the task ran, but the agent had not yet recorded
it when the stop came (it was still sending the task's RUNNING event)."""

from __future__ import annotations

import asyncio
import os

import psutil

from agent.service import Agent
from mesh.schema import TaskState

from .conftest import eventually


def _sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) == 2 and os.path.basename(cmd[0]) == "sleep" and cmd[1] == marker:
            found.append(p)
    return found


async def test_stop_kills_a_task_whose_start_it_interrupted(region, monkeypatch):
    await region.coordinator()
    stuck = asyncio.Event()
    report = Agent._report

    async def report_but_hang_on_running(self, rec, ev):
        if ev.state == TaskState.RUNNING:
            stuck.set()
            await asyncio.Event().wait()  # the stop comes while RUNNING is on its way
        await report(self, rec, ev)

    monkeypatch.setattr(Agent, "_report", report_but_hang_on_running)
    agent = await region.agent()
    await region.connect_client()
    await region.ready(1)
    marker = "313"  # this test's own sleep: nothing else runs `sleep 313`
    await region.client.submit(
        {"name": "cut-short", "tasks": [{"role": "main", "command": ["sleep", marker]}]}
    )
    await asyncio.wait_for(stuck.wait(), 30)
    (sleeper,) = await eventually(lambda: _sleepers(marker), timeout=10)
    assert not agent.handles  # the window: running, not yet recorded as the agent's

    await asyncio.wait_for(agent.stop(kill_tasks=True), 15)
    region.agents.remove(agent)

    def gone():
        try:
            return sleeper.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    await eventually(gone, timeout=5)
