"""A task that ends while its outcome cannot be stored (the events stream is away, as
when the NATS server holding it dies) is still the node's to answer for: its heartbeats,
which go on over core NATS, keep listing it until the outcome is stored. Had they not,
the coordinator would declare the task LOST and run it a second time."""

from __future__ import annotations

import asyncio

import pytest

import coordinator.reconcile as reconcile_module
from coordinator.leader import Leader
from mesh import subjects
from mesh.codec import decode
from mesh.schema import NodeState, TaskPlaced, TaskState
from mesh.streams import ensure_streams

from .conftest import eventually
from .test_fencing import read_log

FORGOTTEN_S = 1.5  # the coordinator's "forgot it" deadline, shortened for the test


@pytest.mark.parametrize("kind", ["agent", "hollow"])
async def test_a_task_ending_while_events_cannot_be_stored_is_not_lost(
    region, monkeypatch, kind
):
    monkeypatch.setattr(reconcile_module, "FORGOTTEN_AFTER_S", FORGOTTEN_S)
    await region.coordinator()
    if kind == "agent":
        agent = await region.agent()
        node_id, task = agent.node_id, {"role": "w", "command": "sleep 1.5"}
    else:
        fleet = await region.fleet(1)
        (node_id,) = fleet.nodes
        task = {"role": "w", "simulate": {"duration": "1.5s"}}
    await region.ready(1)
    js = region.nc.jetstream()
    beats: list[NodeState] = []

    async def on_beat(msg):
        beats.append(decode(NodeState, msg.data))

    sub = await region.nc.subscribe(subjects.state("default", node_id), cb=on_beat)
    job_id = await region.client.submit({"name": "owed", "tasks": [task]})

    async def running():
        job = await region.client.job(job_id)
        return job["task_list"][0]["state"] == "RUNNING"

    await eventually(running, timeout=20)
    await js.delete_stream(subjects.events_stream("default"))
    key = f"{job_id}.w.0#1"

    def ended_on_node() -> bool:
        if kind == "agent":
            return not agent.handles
        return not fleet.nodes[node_id].running

    await eventually(ended_on_node, timeout=20)
    # Heartbeats for several of the coordinator's deadlines: the task is listed in each.
    n = len(beats)
    await asyncio.sleep(3 * FORGOTTEN_S)
    later = beats[n:]
    assert len(later) >= 2, "no heartbeats while the events stream was away"
    assert all(key in b.tasks for b in later), [b.tasks for b in later]
    job = await region.client.job(job_id)
    assert job["task_list"][0]["state"] == "RUNNING", job["task_list"][0]
    # The stream back: the outcome is stored, and the node stops listing the task.
    await ensure_streams(js, "default")
    done = await region.client.wait(job_id, timeout=30)
    assert done["state"] == "SUCCEEDED"
    (t,) = done["task_list"]
    assert t["attempt"] == 1, t
    n = len(beats)
    await eventually(lambda: any(key not in b.tasks for b in beats[n:]), timeout=10)
    log = await read_log(js)
    placed = [ev for _, e in log for ev in e.events if isinstance(ev, TaskPlaced)]
    assert [ev.task_id for ev in placed] == [f"{job_id}.w.0"]
    await sub.unsubscribe()


async def test_an_outcome_stored_but_not_yet_logged_keeps_its_task_from_being_lost(
    region, monkeypatch
):
    """The outcome is in the events stream, so the node stops listing the task, but the
    leader cannot log it (as while the server holding the log's stream is replaced, or
    after a failover, until the consumer redelivers): declared LOST meanwhile, the task
    ran a second time after it had succeeded."""
    monkeypatch.setattr(reconcile_module, "FORGOTTEN_AFTER_S", FORGOTTEN_S)
    held = {"on": True, "naks": 0}
    log_reports = Leader._log_reports

    async def failing_for_ends(self, chunk):
        ended = any(ev.state == TaskState.SUCCEEDED for _, evs in chunk for ev in evs)
        if ended and held["on"]:
            held["naks"] += 1
            for msg, _ in chunk:
                await msg.nak(delay=0.2)  # what the leader does when an append fails
            return False
        return await log_reports(self, chunk)

    monkeypatch.setattr(Leader, "_log_reports", failing_for_ends)
    await region.coordinator()
    fleet = await region.fleet(1)
    (node_id,) = fleet.nodes
    await region.ready(1)
    beats: list[NodeState] = []

    async def on_beat(msg):
        beats.append(decode(NodeState, msg.data))

    sub = await region.nc.subscribe(subjects.state("default", node_id), cb=on_beat)
    task = {"role": "w", "simulate": {"duration": "1s"}}
    job_id = await region.client.submit({"name": "unlogged", "tasks": [task]})
    key = f"{job_id}.w.0#1"
    await eventually(lambda: held["naks"] > 0, timeout=20)  # ended, stored, not logged
    n = len(beats)
    await eventually(lambda: any(key not in b.tasks for b in beats[n:]), timeout=10)
    # Several of the coordinator's deadlines with the node no longer listing it.
    await asyncio.sleep(3 * FORGOTTEN_S + 2)
    job = await region.client.job(job_id)
    (t,) = job["task_list"]
    assert (t["state"], t["attempt"]) == ("RUNNING", 1), t
    held["on"] = False
    done = await region.client.wait(job_id, timeout=30)
    assert done["state"] == "SUCCEEDED"
    assert done["task_list"][0]["attempt"] == 1, done["task_list"][0]
    log = await read_log(region.nc.jetstream())
    placed = [ev for _, e in log for ev in e.events if isinstance(ev, TaskPlaced)]
    assert [ev.task_id for ev in placed] == [f"{job_id}.w.0"]
    await sub.unsubscribe()
