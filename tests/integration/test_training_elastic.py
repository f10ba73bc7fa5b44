"""An elastic training job over a real nats-server, an in-process coordinator and a
hollow fleet: placed at min, grown to its target once capacity frees but not sooner
than resize_every_s after its last membership change, scaled down by `job.scale`
(highest index stopped, task 0 kept), its hosts and status fields as users see them."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from agent.hollow import GiB, Inventory
from mesh.cli import render
from mesh.schema import ApiError, ErrorCode, JobSubmitted
from workloads.spec import parse_job_spec

from .conftest import eventually

RESIZE_EVERY_S = 2.0


def elastic_spec(lo: int, hi: int):
    """What the training parser makes of `framework: pytorch-elastic` and `workers:
    {min, max}` (built directly: parsing them is another part of issue 22's work)."""
    spec = parse_job_spec(
        {
            "name": "tiny",
            "min_tasks": lo,
            "tasks": [
                {
                    "role": "worker",
                    "count": hi,
                    "simulate": {"duration": "10m"},
                    "resources": {"cpu": 1, "memory": "1Gi"},
                }
            ],
        }
    )
    return dataclasses.replace(spec, framework="pytorch-elastic", workers_min=lo, workers_max=hi)


async def submit_parsed(coord, job_id: str, spec) -> None:
    """As the leader's API submits a spec it parsed: handed to the fold, then logged."""
    leader = coord.leader
    coord.state.parsed[job_id] = spec
    await leader.writer.append(
        [JobSubmitted(job_id, f"client-{job_id}", spec.to_dict(), time.time())]
    )
    leader.wake()


def by_index(job: dict) -> dict[int, dict]:
    return {t["index"]: t for t in job["task_list"]}


HOLDING = ("PLACED", "STARTING", "RUNNING")


async def test_elastic_job_grows_after_resize_every_s_and_scales_down_keeping_task_0(region):
    coord = await region.coordinator(resize_every_s=RESIZE_EVERY_S)
    await region.fleet(3, inventories=[Inventory(1, 4 * GiB)] * 3)
    await region.ready(3)
    client = region.client
    blocker = await client.submit(
        {
            "name": "blocker",
            "tasks": [
                {
                    "role": "w",
                    "simulate": {"duration": "10m"},
                    "resources": {"cpu": 1, "memory": "1Gi"},
                }
            ],
        }
    )

    async def running(job_id, n):
        job = await client.job(job_id)
        return job if sum(t["state"] == "RUNNING" for t in job["task_list"]) >= n else None

    await eventually(lambda: running(blocker, 1))
    await submit_parsed(coord, "tiny-1", elastic_spec(2, 3))
    job = await eventually(lambda: running("tiny-1", 2))
    tasks = by_index(job)
    assert [tasks[i]["state"] for i in (0, 1)] == ["RUNNING", "RUNNING"]
    assert tasks[2]["state"] == "PENDING"
    tr = job["training"]
    assert (tr["framework"], tr["size"], tr["target"], tr["min"], tr["max"]) == (
        "pytorch-elastic",
        2,
        3,
        2,
        3,
    )
    assert (tr["generation"], tr["resizes"], tr["restarts"]) == (1, 0, 0)
    first = max(tasks[i]["placed_at"] for i in (0, 1))

    # Capacity frees at once; the grow waits out resize_every_s from the first placement.
    await client.kill(blocker)
    job = await eventually(lambda: running("tiny-1", 3), timeout=20)
    grown = by_index(job)[2]["placed_at"]
    assert grown - first >= RESIZE_EVERY_S, (first, grown)
    assert job["training"]["size"] == 3 and job["training"]["resizes"] == 1

    # Out of bounds, or not elastic: refused, naming why.
    with pytest.raises(ApiError) as bad:
        await client.scale("tiny-1", 4)
    assert bad.value.code == ErrorCode.BAD_REQUEST and "[2, 3]" in bad.value.message
    with pytest.raises(ApiError) as fixed:
        await client.scale(blocker, 1)
    assert fixed.value.code in (ErrorCode.BAD_REQUEST, ErrorCode.CONFLICT)

    reply = await client.scale("tiny-1", 2, by="test")
    assert (reply["workers"], reply["was"]) == (2, 3)

    async def shrunk():
        job = await client.job("tiny-1")
        t = by_index(job)
        done = t[2]["state"] == "PENDING" and all(t[i]["state"] == "RUNNING" for i in (0, 1))
        return job if done else None

    job = await eventually(shrunk, timeout=20)
    t2 = by_index(job)[2]
    assert t2["attempt"] == 1  # the attempt that grew the job was stopped: it waits again
    assert any(h["message"] == "resize to 2" for h in t2["history"]), t2["history"]
    assert all(by_index(job)[i]["attempt"] == 1 for i in (0, 1))  # task 0 and 1 untouched
    tr = job["training"]
    assert (tr["size"], tr["target"]) == (2, 2)
    assert tr["generation"] >= 3 and tr["resizes"] >= 2

    # Hollow nodes all advertise 127.0.0.1: one line for the host, its tasks' slots summed.
    assert await client.hosts("tiny-1", "horovod") == ["127.0.0.1:2"]
    assert await client.hosts("tiny-1", "mpi") == ["127.0.0.1 slots=2"]
    assert await client.hosts("tiny-1", "plain") == ["127.0.0.1"]

    text = render.job_detail(job)
    assert "training pytorch-elastic" in text
    assert "target 2 (min 2, max 3)" in text and "restarts 0/3" in text
    assert "PROGRESS" in text

    # Nothing grows back past the target, however long it waits.
    await asyncio.sleep(RESIZE_EVERY_S + 1.0)
    job = await client.job("tiny-1")
    assert by_index(job)[2]["state"] == "PENDING"
