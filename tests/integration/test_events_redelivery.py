"""A task's start that the events stream hands the leader after its end (issue 21).

The leaders share one durable consumer of the region's task events. A message a leader
fetched and never acknowledged (it died with the hub, or could not log it) comes again
only after the consumer's ack_wait, and the node's later messages come first: seen after
a hub restart, where a task's RUNNING reached the new leader behind its SUCCEEDED and the
attempt's history lost its start. Here a node made by hand (its heartbeats and events are
the real wire messages) reports both, and the test itself plays the dying leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from agent.hollow import GiB, Inventory
from mesh import subjects
from mesh.codec import encode
from mesh.schema import NodeState, TaskEvent, TaskEventBatch
from workloads.lifecycle import TaskState

from .conftest import eventually

NODE = "hand-1"
PATIENT = {"suspect_after": 600.0, "down_after": 600.0}


async def _beats(nc, region: str, live: list[str]) -> None:
    seq = 0
    while True:
        seq += 1
        state = NodeState(
            NODE, region, seq, time.time(), Inventory(4, 8 * GiB).capacity(),
            simulated=True, tasks=tuple(live),
        )  # fmt: skip
        await nc.publish(subjects.state(region, NODE), encode(state))
        await asyncio.sleep(0.3)


async def _report(js, region: str, ev: TaskEvent) -> None:
    await js.publish(
        subjects.events(region, NODE),
        encode(TaskEventBatch(NODE, (ev,))),
        stream=subjects.events_stream(region),
        headers={"Nats-Msg-Id": f"{ev.task_id}#{ev.attempt}:{ev.state}"},
    )


async def test_a_start_redelivered_after_its_end_is_in_the_history_once(region):
    r = region.name
    c1 = await region.coordinator("c1", **PATIENT)
    live: list[str] = []
    beats = asyncio.create_task(_beats(region.nc, r, live))
    try:
        await region.ready(1)
        job = await region.client.submit(
            {"name": "late", "tasks": [{"role": "w", "resources": {"cpu": "0.1"},
                                        "simulate": {"duration": "30s"}}]}
        )  # fmt: skip

        async def placed():
            (t,) = (await region.client.job(job))["task_list"]
            return t if t["state"] == "PLACED" else None

        task = await eventually(placed)
        tid, attempt = task["task_id"], task["attempt"]
        live.append(f"{tid}#{attempt}")
        await c1.stop()  # no leader reads the events now

        js = region.nc.jetstream()
        now = time.time()
        await _report(js, r, TaskEvent(NODE, job, tid, attempt, TaskState.RUNNING, now))
        # A leader fetches the RUNNING and dies before it acknowledges it.
        dying = await js.pull_subscribe(
            subjects.events_all(r),
            durable=subjects.events_consumer(),
            stream=subjects.events_stream(r),
        )
        (fetched,) = await dying.fetch(1, timeout=5)
        assert fetched.metadata.num_delivered == 1
        with contextlib.suppress(Exception):
            await dying.unsubscribe()
        live.clear()
        done = TaskEvent(NODE, job, tid, attempt, TaskState.SUCCEEDED, now + 1.0, exit_code=0)
        await _report(js, r, done)

        await region.coordinator("c2", **PATIENT)  # gets the SUCCEEDED first
        assert (await region.client.wait(job, timeout=20))["state"] == "SUCCEEDED"

        async def started():
            (t,) = (await region.client.job(job))["task_list"]
            return t if any(h["state"] == "RUNNING" for h in t["history"]) else None

        # The RUNNING comes back after ack_wait (3 s), and is logged as a late start.
        t = await eventually(started, timeout=15)
        assert [(h["state"], h["attempt"]) for h in t["history"]] == [
            ("PLACED", attempt),
            ("RUNNING", attempt),
            ("SUCCEEDED", attempt),
        ]
        assert t["state"] == "SUCCEEDED" and t["started_at"] == now
        info = await js.consumer_info(subjects.events_stream(r), subjects.events_consumer())
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
