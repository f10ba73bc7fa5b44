"""Resource pools on a real local mesh: Peloton's elastic sharing, end to end."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent.hollow import GiB, Inventory
from mesh.schema import ApiError, ErrorCode

from .conftest import eventually

POOLS = """
pools:
  /a: {cpu: {reservation: 20, limit: 100}}
  /b: {cpu: {reservation: 20, limit: 100}}
  /c: {cpu: {reservation: 20, limit: 100}}
"""


def sim_job(name: str, pool: str, seconds: float) -> dict:
    return {"name": name, "pool": pool, "tasks": [
        {"role": "w", "simulate": {"duration": f"{seconds}s"}, "resources": {"cpu": 5}}]}


async def running_cpu(client) -> dict[str, int]:
    """Cores held by RUNNING tasks, per pool."""
    out = {"/a": 0, "/b": 0, "/c": 0}
    for job in await client.jobs(limit=1000):
        out[job["pool"]] += 5 * job["task_states"].get("RUNNING", 0)
    return out


async def test_idle_pool_reclaims_its_entitlement_by_preemption(region):
    await region.coordinator(preempt_every_s=0.25, preempt_cycles=2)
    await region.fleet(10, inventories=[Inventory(10, 64 * GiB)] * 10)  # 100 cores
    await region.ready(10)
    client = region.client
    # (and /default, where jobs that name no pool go: docs/pools.md)
    assert await client.pool_apply(POOLS) == ["/", "/a", "/b", "/c", "/default"]

    # /a idle: /b and /c borrow everything (50 cores each).
    borrowers = [await client.submit(sim_job(f"{p}{i}", f"/{p}", 3.0))
                 for p in "bc" for i in range(14)]
    await eventually(lambda: _held(client, {"/b": 50, "/c": 50}), timeout=20)

    # /a wants 50: its entitlement becomes ~33 and /b, /c are preempted down to theirs.
    t0 = time.monotonic()
    claims = [await client.submit(sim_job(f"a{i}", "/a", 3.0)) for i in range(10)]
    held = await eventually(lambda: _held(client, {"/a": 30}), timeout=15)
    took = time.monotonic() - t0
    assert took < 10.0, took
    assert held["/b"] <= 35 and held["/c"] <= 35, held

    rows = {r["path"]: r for r in await client.pools()}
    for pool in ("/a", "/b", "/c"):  # Peloton's example: a third each, to the millicore
        assert rows[pool]["kinds"]["cpu"]["entitlement"] in ("33334m", "33333m"), rows[pool]

    # Nothing is lost: every preempted task was requeued and every job ends SUCCEEDED.
    # (/b, submitted first, may also have lent to /c before /a came: that is elastic too.)
    for_a = 0
    for job_id in borrowers + claims:
        job = await client.wait(job_id, timeout=60)
        assert job["state"] == "SUCCEEDED", job
        for h in job["task_list"][0]["history"]:
            if h["state"] == "PREEMPTED":
                assert h["message"].startswith("preempted: stop "), h
                for_a += "for /a, which is below its entitlement" in h["message"]
    assert for_a >= 4  # /a was owed at least 20 cores, taken back 5 at a time


async def _held(client, want: dict[str, int]):
    held = await running_cpu(client)
    return held if all(held[p] >= v for p, v in want.items()) else None


async def test_pool_validation_and_submit_to_unknown_pool(region):
    await region.coordinator()
    await region.ready(0)
    client = region.client
    with pytest.raises(ApiError) as err:
        await client.pool_apply("pools:\n  /x: {cpu: {reservation: 20, limit: 10}}\n")
    assert err.value.code == ErrorCode.INVALID_SPEC
    assert "/x: cpu limit 10 is below its reservation 20" in err.value.message
    with pytest.raises(ApiError) as err:
        await client.submit(sim_job("lost", "/nowhere", 1))
    assert err.value.code == ErrorCode.INVALID_SPEC and "/nowhere is not defined" in str(err.value)
    await client.pool_apply("pools:\n  /ml: {}\n  /ml/vision: {}\n")
    with pytest.raises(ApiError) as err:
        await client.submit(sim_job("mid", "/ml", 1))
    assert "has child pools" in err.value.message
    job = await client.submit(sim_job("ok", "/ml/vision", 1))
    # A pool with live jobs cannot stop being a leaf.
    with pytest.raises(ApiError) as err:
        await client.pool_apply("pools:\n  /ml: {}\n")
    assert err.value.code == ErrorCode.CONFLICT and "/ml/vision" in err.value.message
    pool = await client.pool("/ml/vision")
    assert pool["jobs"] == {"PENDING": 1}
    await client.kill(job)
    await asyncio.sleep(0)


async def test_elastic_job_shrinks_to_its_minimum_before_anything_is_killed(region):
    await region.coordinator(preempt_every_s=0.25, preempt_cycles=2)
    await region.fleet(10, inventories=[Inventory(10, 64 * GiB)] * 10)  # 100 cores
    await region.ready(10)
    client = region.client
    await client.pool_apply("pools:\n  /a: {cpu: {reservation: 50}}\n"
                            "  /b: {cpu: {reservation: 50}}\n")
    elastic = await client.submit({"name": "elastic", "pool": "/b", "min_tasks": 4, "tasks": [
        {"role": "w", "count": 10, "simulate": {"duration": "4s"}, "resources": {"cpu": 10}}]})

    async def running(job_id, n):
        job = await client.job(job_id)
        return job if job["task_states"].get("RUNNING", 0) == n else None

    await eventually(lambda: running(elastic, 10))
    gang = await client.submit({"name": "gang", "pool": "/a", "tasks": [
        {"role": "w", "count": 5, "simulate": {"duration": "1s"}, "resources": {"cpu": 10}}]})
    await eventually(lambda: running(gang, 5), timeout=15)
    job = await client.job(elastic)
    assert job["state"] == "RUNNING" and job["task_states"].get("RUNNING") == 5, job
    shrunk = [t for t in job["task_list"] if any(h["state"] == "PREEMPTED" for h in t["history"])]
    assert len(shrunk) == 5
    assert all("shrink" in h["message"] for t in shrunk for h in t["history"]
               if h["state"] == "PREEMPTED")
    assert (await client.wait(gang, timeout=30))["state"] == "SUCCEEDED"
    assert (await client.wait(elastic, timeout=60))["state"] == "SUCCEEDED"
