"""Gang placement on a real local mesh: a coordinator and hollow nodes over a real
nats-server, jobs submitted through the API, placements read back from job status."""

from __future__ import annotations

from collections import Counter

from agent.hollow import GiB, Inventory

from .conftest import eventually


def gang_spec(name: str, count: int, cpu: int, duration: float = 30.0, **placement) -> dict:
    spec = {
        "name": name,
        "tasks": [
            {
                "role": "w",
                "count": count,
                "resources": {"cpu": cpu, "memory": "1Gi"},
                "simulate": {"duration": duration},
            }
        ],
    }
    if placement:
        spec["placement"] = placement
    return spec


async def job_nodes(client, job_id: str, want: int) -> Counter:
    """Once all `want` tasks of the job run, how many sit on each node."""

    async def running():
        job = await client.job(job_id)
        tasks = job["task_list"]
        if sum(t["state"] == "RUNNING" for t in tasks) == want:
            return Counter(t["node_id"] for t in tasks)
        return None

    return await eventually(running, timeout=20)


async def pending_reason(client, job_id: str) -> str:
    async def reason():
        job = await client.job(job_id)
        return job["state"] == "PENDING" and job["pending_reason"]

    return await eventually(reason, timeout=15)


async def test_a_16_task_gang_packs_onto_the_fewest_nodes(region):
    # Two 16-core nodes and six 4-core ones: 16 two-core tasks fit on two nodes only
    # when packed onto the big ones, 8 each; best fit alone would start on small nodes.
    invs = [Inventory(16, 64 * GiB)] * 2 + [Inventory(4, 16 * GiB)] * 6
    await region.coordinator()
    await region.fleet(inventories=invs, heartbeat_s=0.2)
    await region.ready(8)
    job_id = await region.client.submit(gang_spec("ring", 16, 2, strategy="pack"))
    nodes = await job_nodes(region.client, job_id, 16)
    assert sorted(nodes.values()) == [8, 8]
    assert set(nodes) == {"hollow-0000", "hollow-0001"}


async def test_a_gang_that_cannot_fit_reserves_nothing_and_small_jobs_still_run(region):
    await region.coordinator()
    await region.fleet(inventories=[Inventory(4, 16 * GiB)] * 2, heartbeat_s=0.2)
    await region.ready(2)
    # 7.5 of the region's 8 cores, but a node holds only one 2.5-core task.
    big = await region.client.submit(gang_spec("big", 3, 2.5))
    why = await pending_reason(region.client, big)
    assert why.startswith("can never fit the region as it is: a gang of 3 tasks"), why
    assert "the 2 nodes that can take one hold 2 at most" in why
    # Nothing is held for it: two 4-core jobs submitted after it both run.
    small = [await region.client.submit(gang_spec(f"small{i}", 1, 4)) for i in range(2)]
    for job_id in small:
        await job_nodes(region.client, job_id, 1)
    assert (await region.client.job(big))["state"] == "PENDING"


async def test_an_unplaceable_job_says_why_per_reason(region):
    invs = [Inventory(8, 32 * GiB, zone="zone-a")] * 3 + [Inventory(8, 32 * GiB, zone="zone-b")]
    await region.coordinator()
    await region.fleet(inventories=invs, heartbeat_s=0.2)
    await region.ready(4)
    job_id = await region.client.submit(gang_spec("picky", 1, 6, labels={"zone": "zone-b"}))
    await job_nodes(region.client, job_id, 1)
    # zone-b is now short of cores; zone-a nodes fail the label.
    second = await region.client.submit(gang_spec("picky2", 1, 6, labels={"zone": "zone-b"}))
    why = await pending_reason(region.client, second)
    assert "fits no node: 3 nodes: label zone≠zone-b; 1 node: insufficient cpu" in why


async def test_spread_puts_a_gang_across_zones(region):
    invs = [Inventory(16, 64 * GiB, zone=z) for z in ("zone-a", "zone-b", "zone-c") for _ in (0, 1)]
    await region.coordinator()
    await region.fleet(inventories=invs, heartbeat_s=0.2)
    await region.ready(6)
    job_id = await region.client.submit(gang_spec("wide", 6, 1, strategy="spread"))
    nodes = await job_nodes(region.client, job_id, 6)
    zone_of = {f"hollow-{i:04d}": inv.zone for i, inv in enumerate(invs)}
    assert Counter(zone_of[n] for n in nodes.elements()) == {
        "zone-a": 2,
        "zone-b": 2,
        "zone-c": 2,
    }


async def test_a_fractional_gpu_task_lands_on_the_gpu_measured_to_have_room(region):
    # One node, two idle-by-allocation GPUs; GPU 0 is 90 % busy with work Mesh did not
    # place (its agent measures it), GPU 1 20 %. A quarter-GPU task must go to GPU 1.
    inv = Inventory(16, 64 * GiB, "A100", 2, 80 * GiB, enforcement="mps")
    await region.coordinator()
    fleet = await region.fleet(inventories=[inv], heartbeat_s=0.2)
    node = fleet.nodes["hollow-0000"]
    busy, idle = node.gpu_uuid(0), node.gpu_uuid(1)
    fleet.set_gpu_background(busy, 90)
    fleet.set_gpu_background(idle, 20)
    await region.ready(1)

    async def measured():
        gpus = (await region.client.node("hollow-0000"))["gpus"]
        return {g["uuid"]: g["utilization"] for g in gpus} == {busy: 90, idle: 20}

    await eventually(measured)
    spec = gang_spec("frac", 1, 1)
    spec["tasks"][0]["resources"].update({"gpu": 0.25, "gpu_memory": "10Gi"})
    spec["placement"] = {"gpu_isolation": "mps"}
    job_id = await region.client.submit(spec)
    await job_nodes(region.client, job_id, 1)
    task = (await region.client.job(job_id))["task_list"][0]
    assert task["gpu_uuids"] == [idle]
    # Swap the load: the next quarter goes to the GPU that is now quiet, although the
    # other already holds a quarter (packing fractions would otherwise pick it).
    fleet.set_gpu_background(busy, 5)
    fleet.set_gpu_background(idle, 95)

    async def swapped():
        gpus = (await region.client.node("hollow-0000"))["gpus"]
        return {g["uuid"]: g["utilization"] for g in gpus}[busy] == 5

    await eventually(swapped)
    second = await region.client.submit({**spec, "name": "frac2"})
    await job_nodes(region.client, second, 1)
    assert (await region.client.job(second))["task_list"][0]["gpu_uuids"] == [busy]
