"""The region's side of an edge site, on a real site (tests/integration/edgesite.py): a
hub nats-server, the site's leaf behind a TCP proxy, a hollow fleet of the site's nodes on
the leaf and the real site link beating to the hub. A cut is the proxy's (a reset, or a
black-hole): the link's beats and the nodes' heartbeats stop crossing for real, while the
nodes' runs go on at the site.

What must hold: a cut-off site's tasks are not LOST within its autonomy (never, or a few
seconds) and its nodes show `disconnected`, not `down` (at the coordinator's usual
`down_after`); past the autonomy they are LOST and run elsewhere; when the site comes
back its stale copy is killed and the duplicate logged; a silent node of a beating site
is down as today; a new leader keeps the site's status and its autonomy clock."""

from __future__ import annotations

import asyncio
import time

from agent.ledger import count_duplicates
from tests.integration.conftest import cli_env, eventually, leader_is, run_mesh

from .edgesite import Site

FAST = {"suspect_after": 1.0, "down_after": 3.0, "lease_ttl": 1.0}
HEARTBEATS = {"heartbeat_s": 0.3}
SLACK = 0.2  # the test and the coordinator hear the same beat on the hub, not at one instant


def forever(name: str, where: str = "") -> dict:
    placement = {"placement": {"labels": {"where": where}}} if where else {}
    return {
        **placement,
        "name": name,
        "restart": {"max_retries": 0, "reschedule_on_lost": True},
        "tasks": [
            {
                "role": "w",
                "count": 1,
                "resources": {"cpu": "1", "memory": "1Gi"},
                "simulate": {"duration": "forever"},
            }
        ],
    }


async def task_of(client, job_id: str) -> dict:
    return (await client.job(job_id))["task_list"][0]


async def running_on(client, job_id: str, node: str, attempt: int = 1) -> dict:
    async def check():
        t = await task_of(client, job_id)
        ok = t["state"] == "RUNNING" and t["node_id"] == node and t["attempt"] == attempt
        return t if ok else None

    return await eventually(check, timeout=15)


async def site_row(client, site: str) -> dict | None:
    rows = (await client.request("site.list", {}, retries=5))["sites"]
    return next((r for r in rows if r["site"] == site), None)


async def node_status(client, node: str) -> str:
    return next(n["status"] for n in await client.nodes() if n["node_id"] == node)


def lost_at(task: dict) -> float:
    return next(h["ts"] for h in task["history"] if h["state"] == "LOST")


async def test_past_a_short_autonomy_the_task_runs_elsewhere_and_the_duplicate_is_stopped(
    tmp_path,
):
    site = Site(tmp_path, coordinator=FAST, autonomy_s=3.0, fleet=HEARTBEATS)
    try:
        await site.start(nodes=1)
        c, node = site.region.client, "s1n-0000"
        job = await c.submit(forever("edge"))
        await running_on(c, job, node)
        row = await eventually(lambda: site_row(c, "s1"))
        assert row["status"] == "connected" and row["autonomy_s"] == 3.0
        dc = await site.region.fleet(1, prefix="dc", heartbeat_s=0.3)
        await site.region.ready(2)

        site.proxy.cut()
        await eventually(lambda: _is(c, "s1", "disconnected"), timeout=10)
        assert await node_status(c, node) == "disconnected"
        moved = await running_on(c, job, "dc-0000", attempt=2)
        # LOST only once 3 s passed since the site was last heard (not at 3 s of node
        # silence, nor at down_after): the region's clock on both sides.
        assert lost_at(moved) - site.last_beat >= 3.0 - SLACK
        assert site.fleet.nodes[node].running  # the site's copy kept running meanwhile

        site.proxy.restore()
        await eventually(lambda: _is(c, "s1", "connected"), timeout=10)
        # The stale copy is found from the node's heartbeat listing it, which the site link
        # relays (a request the leader answers) on a change; one relayed into the cut is
        # relayed again (test_a_heartbeat_relayed_into_a_short_cut_...).
        await eventually(lambda: not site.fleet.nodes[node].running, timeout=15)
        detail = await c.job(job)
        (t,) = detail["task_list"]
        assert (t["state"], t["attempt"], t["node_id"]) == ("RUNNING", 2, "dc-0000")
        dups = [h for h in t["history"] if "duplicate run" in h["message"]]
        assert [(h["attempt"], h["node_id"], h["message"]) for h in dups] == [
            (
                1,
                node,
                "duplicate run of attempt 1 stopped: attempt 2 ran after the site's autonomy",
            )
        ]
        # What the nodes ran: the one duplicate autonomy allows (attempt 1 at the site,
        # killed, overlapping attempt 2 in the datacenter), and nothing else.
        runs = site.fleet.ledger() + dc.ledger()
        found = count_duplicates(runs)
        assert [(a.attempt, a.node_id, b.attempt, b.node_id) for a, b in found.overlapping] == [
            (1, node, 2, "dc-0000")
        ]
        assert found.total == 1
        assert [r.outcome for r in site.fleet.ledger()] == ["KILLED"]
    finally:
        await site.close()


async def _is(client, site: str, status: str) -> bool:
    row = await site_row(client, site)
    return row is not None and row["status"] == status


S1, S2 = {"where": "s1"}, {"where": "s2"}


async def test_never_means_never_and_a_silent_node_of_a_beating_site_is_down(tmp_path):
    # The coordinator's usual down_after (10 s): a cut-off site's node is not down at it.
    first = Site(tmp_path, coordinator={}, fleet={**HEARTBEATS, "labels": S1})
    # s2's link names the nodes it heard in the last second only (default 10 s): a
    # beat naming a node keeps it alive at the hub, so its silence shows a second later.
    second = Site(
        tmp_path, "s2", hub=first, link={"node_window_s": 1.0}, fleet={**HEARTBEATS, "labels": S2}
    )
    try:
        await first.start(nodes=1)
        await second.start(nodes=1)
        c = first.region.client
        jobs = [await c.submit(forever(f"j{i}", f"s{i + 1}")) for i in range(2)]
        await eventually(lambda: _all_running(c, jobs), timeout=15)
        on = {(await task_of(c, j))["node_id"]: j for j in jobs}
        assert set(on) == {"s1n-0000", "s2n-0000"}
        first.proxy.cut()
        for node in second.fleet.nodes.values():
            node.down = True  # silent while its site beats on
        t0 = time.monotonic()
        await eventually(lambda: _state_of(c, on["s2n-0000"], "LOST", "PENDING"), timeout=20)
        assert await node_status(c, "s2n-0000") == "down"
        await asyncio.sleep(max(0.0, 12.0 - (time.monotonic() - t0)))  # past down_after
        t = await task_of(c, on["s1n-0000"])
        assert (t["state"], t["attempt"], t["node_id"]) == ("RUNNING", 1, "s1n-0000")
        assert await node_status(c, "s1n-0000") == "disconnected"
        row = await site_row(c, "s1")
        assert row["status"] == "disconnected" and row["autonomy_s"] is None
        assert first.fleet.nodes["s1n-0000"].running  # at the site, it runs on
        # As an operator sees it: `mesh site list`, `mesh node list`.
        env = {**cli_env(tmp_path), "MESH_NATS_URL": first.hub.url, "MESH_INSECURE": "1"}
        sites_out = await asyncio.to_thread(run_mesh, "site", "list", env=env)
        assert sites_out.returncode == 0, sites_out.stderr
        by_site = {ln.split()[0]: ln.split() for ln in sites_out.stdout.splitlines()[1:]}
        assert by_site["s1"][1] == "disconnected" and "never" in by_site["s1"]
        assert by_site["s2"][1] == "connected"
        nodes_out = await asyncio.to_thread(run_mesh, "node", "list", env=env)
        by_node = {ln.split()[0]: ln.split()[1] for ln in nodes_out.stdout.splitlines()[1:]}
        assert by_node["s1n-0000"] == "disconnected" and by_node["s2n-0000"] == "down"
    finally:
        await second.close()
        await first.close()


async def _all_running(client, jobs: list[str]) -> bool:
    states = [(await task_of(client, j))["state"] for j in jobs]
    return states == ["RUNNING"] * len(jobs)


async def _state_of(client, job: str, *states: str) -> bool:
    t = await task_of(client, job)
    return t["state"] in states or t["attempt"] > 1


async def test_a_new_leader_keeps_the_sites_status_and_autonomy_clock(tmp_path):
    """The new leader is a fresh candidate started after the cut (a black-hole): it
    never heard the site nor its node, and still knows both from the log."""
    site = Site(tmp_path, coordinator=FAST, autonomy_s=8.0, fleet=HEARTBEATS)
    try:
        await site.start(nodes=1)
        region, c = site.region, site.region.client
        (first,) = region.coordinators
        job = await c.submit(forever("edge"))
        await running_on(c, job, "s1n-0000")
        await region.fleet(1, prefix="dc", heartbeat_s=0.3)
        await region.ready(2)
        site.proxy.black_hole()
        await eventually(lambda: _is(c, "s1", "disconnected"), timeout=10)
        before = await site_row(c, "s1")
        await first.stop()
        region.coordinators.remove(first)
        await region.coordinator("c2", **FAST)
        await eventually(lambda: leader_is(c, "c2"), timeout=10)
        after = await eventually(lambda: site_row(c, "s1"), timeout=5)
        assert after["status"] == "disconnected" and after["since"] == before["since"]
        if time.time() - site.last_beat < 8.0 - 0.5:  # still within its autonomy
            t = await task_of(c, job)
            assert (t["state"], t["attempt"]) == ("RUNNING", 1), t["history"]
            assert await node_status(c, "s1n-0000") == "disconnected"
        moved = await running_on(c, job, "dc-0000", attempt=2)
        # From the log's last_heard: 8 s after the last beat, not 8 s after c2 took over.
        assert 8.0 - SLACK <= lost_at(moved) - site.last_beat < 8.0 + 2.0
    finally:
        await site.close()


async def test_a_heartbeat_relayed_into_a_short_cut_reaches_the_region_once_it_is_back(
    tmp_path,
):
    """A node's heartbeat that changed (its task ended) while the link was cut for less
    than the link takes to call the region unreachable: a relay published into the cut
    was lost without a trace, and the node, unchanged since, waited the 30 s relay
    interval to be seen again (the region kept it running a task it had ended, and
    found a stale copy 25 s late). A relay counts once the region answered it."""
    site = Site(tmp_path, coordinator=FAST, fleet=HEARTBEATS)
    try:
        await site.start(nodes=1)
        c, node = site.region.client, "s1n-0000"
        view = site.region.coordinators[0].cluster.nodes
        job = await c.submit(
            {
                "name": "short",
                "tasks": [
                    {
                        "role": "w",
                        "resources": {"cpu": "1", "memory": "1Gi"},
                        "simulate": {"duration": "1.5s"},
                    }
                ],
            }
        )
        await running_on(c, job, node)
        await eventually(lambda: view[node].state.tasks, timeout=5)  # heard running it
        site.proxy.cut()
        cut_at = time.monotonic()
        await eventually(lambda: not site.fleet.nodes[node].running, timeout=5)
        await asyncio.sleep(0.5)  # a few heartbeats relayed into the cut
        assert view[node].state.tasks  # the region has not heard it ended
        assert time.monotonic() - cut_at < site.link.reachable_s  # a cut the link missed
        site.proxy.restore()
        back_at = time.monotonic()
        await eventually(lambda: not view[node].state.tasks, timeout=5)
        assert time.monotonic() - back_at < 5 < site.link.relay_every_s
        assert (await c.wait(job, timeout=10))["state"] == "SUCCEEDED"
    finally:
        await site.close()
