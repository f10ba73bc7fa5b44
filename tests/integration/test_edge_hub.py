"""The region's side of an edge site over a real nats-server: the test plays the site's
link, publishing real `SiteBeat`s on the real subject, and a hollow fleet whose nodes
carry the site stands for the site's agents. A cut is the beats stopping and the fleet's
nodes falling silent while their runs go on (`HollowNode.down`: no heartbeats,
assignments held, runs kept). No leaf server is needed for this part.

What must hold: a cut-off site's tasks are not LOST within its autonomy (never, or a few
seconds) and its nodes show `disconnected`; past the autonomy they are LOST and run
elsewhere; when the site comes back its stale copy is killed and the duplicate logged;
a silent node of a beating site is down as today; a new leader keeps the site's status
and its autonomy clock."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from mesh import subjects
from mesh.codec import encode
from mesh.edgeschema import NEVER, SiteBeat
from tests.integration.conftest import cli_env, eventually, run_mesh

pytestmark = pytest.mark.asyncio

FAST = {"suspect_after": 1.0, "down_after": 3.0, "lease_ttl": 1.0}


class Link:
    """A site link's beats, as `edge/uplink.py` sends them: every 0.3 s while `up`."""

    def __init__(self, nc, region: str, site: str, autonomy: float, nodes: tuple[str, ...]):
        self.nc, self.region, self.site = nc, region, site
        self.autonomy, self.nodes = autonomy, nodes
        self.up = True
        self.last = 0.0  # wall clock of the last beat sent
        self.seq = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            if self.up:
                self.seq += 1
                beat = SiteBeat(
                    self.site, self.region, self.seq, time.time(), self.autonomy, self.nodes
                )
                await self.nc.publish(subjects.site_beat(self.region, self.site), encode(beat))
                await self.nc.flush()
                self.last = time.time()
            await asyncio.sleep(0.3)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def cut(link: Link, fleet) -> None:
    link.up = False
    for node in fleet.nodes.values():
        node.down = True  # silent, its runs kept: a site cut off from its region


def restore(link: Link, fleet) -> None:
    link.up = True
    for node in fleet.nodes.values():
        fleet._wake(node)  # heartbeats again, held assignments delivered


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
    region,
):
    c = region.client
    await region.coordinator("c1", **FAST)
    site = await region.fleet(1, prefix="s1", site="s1", heartbeat_s=0.3)
    link = Link(region.nc, region.name, "s1", 3.0, ("s1-0000",))
    try:
        await region.ready(1)
        job = await c.submit(forever("edge"))
        await running_on(c, job, "s1-0000")
        row = await eventually(lambda: site_row(c, "s1"))
        assert row["status"] == "connected" and row["autonomy_s"] == 3.0
        await region.fleet(1, prefix="dc", heartbeat_s=0.3)
        await region.ready(2)

        cut(link, site)
        await eventually(lambda: _is(c, "s1", "disconnected"), timeout=10)
        assert await node_status(c, "s1-0000") == "disconnected"
        moved = await running_on(c, job, "dc-0000", attempt=2)
        # LOST only once 3 s passed since the site was last heard (not at 3 s of node
        # silence, nor at down_after): the region's clock on both sides.
        assert lost_at(moved) - link.last >= 3.0 - 0.35  # a beat may be lost in flight
        assert site.nodes["s1-0000"].running  # the site's copy kept running meanwhile

        restore(link, site)
        await eventually(lambda: _is(c, "s1", "connected"), timeout=10)
        await eventually(lambda: not site.nodes["s1-0000"].running, timeout=10)
        detail = await c.job(job)
        (t,) = detail["task_list"]
        assert (t["state"], t["attempt"], t["node_id"]) == ("RUNNING", 2, "dc-0000")
        dups = [h for h in t["history"] if "duplicate run" in h["message"]]
        assert [(h["attempt"], h["node_id"], h["message"]) for h in dups] == [
            (
                1,
                "s1-0000",
                "duplicate run of attempt 1 stopped: attempt 2 ran after the site's autonomy",
            )
        ]
    finally:
        await link.stop()


async def _is(client, site: str, status: str) -> bool:
    row = await site_row(client, site)
    return row is not None and row["status"] == status


S1, S2 = {"where": "s1"}, {"where": "s2"}


async def test_never_means_never_and_a_silent_node_of_a_beating_site_is_down(region, tmp_path):
    c = region.client
    await region.coordinator("c1", **FAST)
    cut_site = await region.fleet(1, prefix="s1", site="s1", heartbeat_s=0.3, labels=S1)
    beating = await region.fleet(1, prefix="s2", site="s2", heartbeat_s=0.3, labels=S2)
    link1 = Link(region.nc, region.name, "s1", NEVER, ("s1-0000",))
    link2 = Link(region.nc, region.name, "s2", NEVER, ())  # it hears no node of its own
    try:
        await region.ready(2)
        jobs = [await c.submit(forever(f"j{i}", f"s{i + 1}")) for i in range(2)]
        await eventually(lambda: _all_running(c, jobs), timeout=15)
        on = {(await task_of(c, j))["node_id"]: j for j in jobs}
        assert set(on) == {"s1-0000", "s2-0000"}
        cut(link1, cut_site)
        for node in beating.nodes.values():
            node.down = True  # silent while its site beats on
        t0 = time.monotonic()
        await eventually(lambda: _state_of(c, on["s2-0000"], "LOST", "PENDING"), timeout=10)
        assert await node_status(c, "s2-0000") == "down"
        await asyncio.sleep(max(0.0, 6.0 - (time.monotonic() - t0)))  # twice down_after
        t = await task_of(c, on["s1-0000"])
        assert (t["state"], t["attempt"], t["node_id"]) == ("RUNNING", 1, "s1-0000")
        assert await node_status(c, "s1-0000") == "disconnected"
        row = await site_row(c, "s1")
        assert row["status"] == "disconnected" and row["autonomy_s"] is None
        # As an operator sees it: `mesh site list`, `mesh node list`.
        env = {**cli_env(tmp_path), "MESH_NATS_URL": region.url, "MESH_INSECURE": "1"}
        sites_out = await asyncio.to_thread(run_mesh, "site", "list", env=env)
        assert sites_out.returncode == 0, sites_out.stderr
        by_site = {ln.split()[0]: ln.split() for ln in sites_out.stdout.splitlines()[1:]}
        assert by_site["s1"][1] == "disconnected" and "never" in by_site["s1"]
        assert by_site["s2"][1] == "connected"
        nodes_out = await asyncio.to_thread(run_mesh, "node", "list", env=env)
        by_node = {ln.split()[0]: ln.split()[1] for ln in nodes_out.stdout.splitlines()[1:]}
        assert by_node["s1-0000"] == "disconnected" and by_node["s2-0000"] == "down"
    finally:
        await link1.stop()
        await link2.stop()


async def _all_running(client, jobs: list[str]) -> bool:
    states = [(await task_of(client, j))["state"] for j in jobs]
    return states == ["RUNNING"] * len(jobs)


async def _state_of(client, job: str, *states: str) -> bool:
    t = await task_of(client, job)
    return t["state"] in states or t["attempt"] > 1


async def test_a_new_leader_keeps_the_sites_status_and_autonomy_clock(region):
    """The new leader is a fresh candidate started after the cut: it never heard the
    site nor its node, and still knows both from the log."""
    c = region.client
    first = await region.coordinator("c1", **FAST)
    site = await region.fleet(1, prefix="s1", site="s1", heartbeat_s=0.3)
    link = Link(region.nc, region.name, "s1", 8.0, ("s1-0000",))
    try:
        await region.ready(1)
        job = await c.submit(forever("edge"))
        await running_on(c, job, "s1-0000")
        await region.fleet(1, prefix="dc", heartbeat_s=0.3)
        await region.ready(2)
        cut(link, site)
        await eventually(lambda: _is(c, "s1", "disconnected"), timeout=10)
        before = await site_row(c, "s1")
        await first.stop()
        region.coordinators.remove(first)
        await region.coordinator("c2", **FAST)
        await eventually(lambda: _leader(c, "c2"), timeout=10)
        after = await eventually(lambda: site_row(c, "s1"), timeout=5)
        assert after["status"] == "disconnected" and after["since"] == before["since"]
        if time.time() - link.last < 8.0 - 0.5:  # still within its autonomy
            t = await task_of(c, job)
            assert (t["state"], t["attempt"]) == ("RUNNING", 1)
            assert await node_status(c, "s1-0000") == "disconnected"
        moved = await running_on(c, job, "dc-0000", attempt=2)
        # From the log's last_heard: 8 s after the last beat, not 8 s after c2 took over.
        assert 8.0 - 0.35 <= lost_at(moved) - link.last < 8.0 + 2.0
    finally:
        await link.stop()


async def _leader(client, cid: str) -> bool:
    try:
        return (await client.cluster_info())["leader"] == cid
    except Exception:
        return False
