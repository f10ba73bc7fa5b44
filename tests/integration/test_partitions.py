"""Partition moves on a real local mesh (nats-server, coordinators, hollow fleets): a
manual move preempts the node's batch tasks, requeues them elsewhere, none lost, none
run twice, and the node flips; a new leader finishes a move its dead predecessor
started; break-glass and restore through the `mesh` CLI."""

from __future__ import annotations

import asyncio
import json

from agent.hollow import GiB, Inventory
from mesh.cli.render import job_detail
from mesh.schema import PartitionMoveRequest

from .conftest import cli_env, eventually, leader_is, run_mesh

ONE_NODE = [Inventory(4, 8 * GiB)]


def batch_job(name: str, count: int, seconds: float, **extra) -> dict:
    task = {"role": "w", "count": count, "simulate": {"duration": f"{seconds}s"}}
    return {"name": name, "tasks": [{**task, "resources": {"cpu": 1}}], **extra}


async def node_row(client, node_id: str) -> dict:
    return await client.node(node_id)


async def running_on(client, job_id: str, node_id: str, n: int) -> bool:
    job = await client.job(job_id)
    on = [t for t in job["task_list"] if t["state"] == "RUNNING" and t["node_id"] == node_id]
    return len(on) == n


def assert_ran_once_each(job: dict, moved: str) -> None:
    """Every task SUCCEEDED once, elsewhere than the moved node; the attempt there ended
    PREEMPTED (stopped, reported) before the next attempt was placed; never two at once."""
    assert job["state"] == "SUCCEEDED", job
    for t in job["task_list"]:
        assert t["state"] == "SUCCEEDED" and t["node_id"] != moved, t
        states = [(h["attempt"], h["state"]) for h in t["history"]]
        assert states.count((t["attempt"], "SUCCEEDED")) == 1
        preempted = [h for h in t["history"] if h["state"] == "PREEMPTED"]
        assert len(preempted) == 1 and preempted[0]["node_id"] == moved, t["history"]
        assert preempted[0]["message"].startswith(f"preempted: node {moved} moves from batch to ")
        hist = t["history"]
        k = hist.index(preempted[0])
        assert all(h["attempt"] <= preempted[0]["attempt"] for h in hist[:k]), hist


async def test_a_manual_move_preempts_requeues_and_flips(region):
    await region.coordinator()
    await region.fleet(1, inventories=ONE_NODE)
    await region.ready(1)
    client = region.client
    # 10 s each: long enough to be running when the move comes, short to run again
    job_id = await client.submit(batch_job("mv", 3, 10.0))
    await eventually(lambda: running_on(client, job_id, "hollow-0000", 3), timeout=20)
    await region.fleet(1, prefix="spare", inventories=ONE_NODE)
    await region.ready(2)

    req = PartitionMoveRequest(("hollow-0000",), "stateless", "drill", "tester")
    reply = await client.request("partition.move", req)
    assert reply["moves"][0]["from"] == "batch" and reply["moves"][0]["to"] == "stateless"
    row = await node_row(client, "hollow-0000")
    assert row["desired_partition"] == "stateless"

    async def flipped():
        n = await node_row(client, "hollow-0000")
        return n["partition"] == "stateless" and n["drain"] == "none" and n["tasks"] == 0

    await eventually(flipped, timeout=20)
    await eventually(lambda: running_on(client, job_id, "spare-0000", 3), timeout=20)
    job = await client.wait(job_id, timeout=60)
    assert_ran_once_each(job, "hollow-0000")
    shown = job_detail(job)
    assert "preempted: node hollow-0000 moves from batch to stateless: manual move by tester" in (
        shown
    )
    rows = {p["name"]: p for p in (await client.request("partition.list"))["partitions"]}
    assert rows["stateless"]["nodes"] == 1 and rows["stateless"]["moves_last_hour"] == 1


async def test_a_new_leader_finishes_a_move_the_dead_one_started(region, procs):
    p1 = procs(region.url, "coordinator", "--id", "p1", name="p1")
    client = region.client
    await eventually(lambda: leader_is(client, "p1"), timeout=20)
    procs(region.url, "coordinator", "--id", "p2", name="p2")
    await region.fleet(1, inventories=ONE_NODE)
    await region.ready(1)
    # a non-preemptible task the move must wait for (within its pool's reservation, as
    # a non-preemptible job must be: docs/pools.md), and preemptible ones it stops
    await client.pool_apply(
        "pools:\n  /default:\n    cpu: {reservation: 2}\n    memory: {reservation: 1Gi}\n"
    )
    pinned = await client.submit(batch_job("pin", 1, 6.0, preemptible=False), retries=60)
    # 15 s each: still running through the leader change, and run once more on the spare
    batch = await client.submit(batch_job("bat", 3, 15.0), retries=60)
    await eventually(lambda: running_on(client, pinned, "hollow-0000", 1), timeout=20)
    await eventually(lambda: running_on(client, batch, "hollow-0000", 3), timeout=20)
    await region.fleet(1, prefix="spare", inventories=ONE_NODE)
    await region.ready(2)

    req = PartitionMoveRequest(("hollow-0000",), "stateless", "leader drill", "tester")
    await client.request("partition.move", req, retries=20)
    p1.kill9()  # the move is in the log; its drain waits for the pinned task
    await eventually(lambda: leader_is(client, "p2"), timeout=30)

    async def flipped():
        n = await node_row(client, "hollow-0000")
        return n["partition"] == "stateless" and n["drain"] == "none"

    await eventually(flipped, timeout=40)
    assert (await client.wait(pinned, timeout=30))["state"] == "SUCCEEDED"
    assert_ran_once_each(await client.wait(batch, timeout=90), "hollow-0000")


async def test_break_glass_and_restore_through_the_cli(region, tmp_path):
    await region.coordinator()
    await region.fleet(3, inventories=ONE_NODE * 3)
    await region.ready(3)
    client = region.client
    job_id = await client.submit(batch_job("bg", 2, 8.0))
    await eventually(lambda: _running(client, job_id, 2), timeout=20)
    env = cli_env(tmp_path)
    cli = ("--nats", region.url, "--insecure", "--user", "oncall")

    async def mesh(*args: str):  # off the loop: the coordinator answering it runs on it
        return await asyncio.to_thread(lambda: run_mesh(*cli, *args, env=env))

    r = await mesh("partition", "break-glass", "--to", "stateless", "--reason", "x")
    assert r.returncode == 2, r.stderr  # --nodes N or --all: one is required
    glass = ("break-glass", "--to", "stateless", "--all", "--ttl", "10m")
    r = await mesh("--json", "partition", *glass, "--reason", "checkout is down")
    assert r.returncode == 0, r.stderr
    moved = json.loads(r.stdout)
    assert {m["node_id"] for m in moved["moves"]} == {f"hollow-000{i}" for i in range(3)}
    assert moved["break_glass"]["by"] == "oncall"
    assert moved["break_glass"]["reason"] == "checkout is down"
    order = [m["node_id"] for m in moved["moves"]]
    busy = {t["node_id"] for t in (await client.job(job_id))["task_list"]}
    assert set(order[: 3 - len(busy)]).isdisjoint(busy)  # empty nodes first

    async def all_stateless():
        rows = {p["name"]: p for p in (await client.request("partition.list"))["partitions"]}
        return rows["stateless"]["nodes"] == 3 and rows["stateless"]["draining"] == 0

    await eventually(all_stateless, timeout=20)
    r = await mesh("partition", "list")
    assert r.returncode == 0 and "break-glass to stateless: 3 nodes, by oncall" in r.stdout
    r = await mesh("partition", *glass, "--reason", "again")
    assert r.returncode == 1 and "CONFLICT" in r.stderr  # one at a time

    r = await mesh("partition", "restore", "--reason", "fixed")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("stateless -> batch") == 3

    async def all_batch():
        rows = {p["name"]: p for p in (await client.request("partition.list"))["partitions"]}
        return rows["batch"]["nodes"] == 3 and rows["batch"]["draining"] == 0

    await eventually(all_batch, timeout=20)
    job = await client.wait(job_id, timeout=90)  # preempted, requeued, ran again
    assert job["state"] == "SUCCEEDED"
    assert all(any(h["state"] == "PREEMPTED" for h in t["history"]) for t in job["task_list"])
    r = await mesh("partition", "restore")
    assert r.returncode == 1 and "no break-glass is in force" in r.stderr


async def _running(client, job_id: str, n: int) -> bool:
    job = await client.job(job_id)
    return sum(t["state"] == "RUNNING" for t in job["task_list"]) == n
