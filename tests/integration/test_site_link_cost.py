"""The site link's resync bound and its idle cost (issue 21, the edge bench's findings):
a window behind a silent hub fails in one ack timeout, not one per message; a site's
heartbeats stay at the site and only what the region acts on crosses (the beat keeps
the nodes alive at the region); the region's leader answers beats, which is the link's
only proof of reachability; a site agent's long poll is kicked when its link is back.

Real nats-servers throughout (a hub with domain `hub` and leafnodes, a site's leaf
dialling it, a coordinator on the hub, a hollow fleet at the site)."""

from __future__ import annotations

import asyncio
import time

from agent.autonomy import Uplink
from agent.hollow import GiB, HollowFleet, Inventory
from edge.leaf import site_server_config
from edge.uplink import SiteLink
from mesh import subjects
from mesh.codec import encode
from mesh.connect import close_quietly, connect
from mesh.edgeschema import SiteUplink
from mesh.pull import PullLoop
from mesh.server import EmbeddedServer, ServerConfig
from mesh.streams import ensure_site_stream

from .conftest import Region, eventually

SITE = "s1"
REGION = "default"
MiB = 1024 * 1024


async def test_a_window_behind_a_silent_hub_costs_one_ack_timeout(nats_server):
    """20 events forwarded to a subject whose acks never come (a subscriber swallows
    them, as a black-holed link does): the window is given up after one ack timeout,
    not 20, and once the hub's stream is there every event goes, in order."""
    nc = await connect(nats_server.url, name="test")
    link = SiteLink(None, REGION, SITE, nc=nc, ack_timeout=0.5)
    try:
        swallowed = []

        async def swallow(msg) -> None:
            swallowed.append(msg)

        sink = await nc.subscribe(subjects.events(REGION, "n1"), cb=swallow)
        js = nc.jetstream()
        await ensure_site_stream(js, REGION, SITE)
        for i in range(20):
            await js.publish(
                subjects.site_events(REGION, SITE, "n1"),
                str(i).encode(),
                headers={"Nats-Msg-Id": f"ev-{i}"},
            )
        t0 = time.monotonic()
        await link.start()
        await eventually(lambda: link.counters.retries >= 1, timeout=15, interval=0.01)
        took = time.monotonic() - t0
        assert len(swallowed) >= 20
        assert took < 4.0, f"the first window took {took:.2f} s to give up (20 x 0.5 s = 10 s)"
        assert link.cursor == 0
        await sink.unsubscribe()
        hub_stream = subjects.events_stream(REGION)
        await js.add_stream(name=hub_stream, subjects=[subjects.events(REGION, "n1")])
        await eventually(lambda: link.cursor == 20, timeout=15, interval=0.02)
        got = [int((await js.get_msg(hub_stream, s)).data) for s in range(1, 21)]
        assert got == list(range(20))
    finally:
        await link.stop()
        await close_quietly(nc)


async def test_an_idle_site_sends_the_region_only_what_it_acts_on(tmp_path):
    hub = EmbeddedServer(
        ServerConfig(store_dir=str(tmp_path / "hub"), domain=subjects.HUB_DOMAIN, leaf_listen=True)
    )
    await hub.astart()
    leaf = EmbeddedServer(
        site_server_config(SITE, [hub.leaf_url], tmp_path / "leaf", store_bytes=64 * MiB)
    )
    region = Region(hub.url, tmp_path, REGION)
    link = fleet = None
    try:
        await leaf.astart()
        client = await region.connect_client()
        await region.coordinator("c1")  # suspect after 3 s, down after 10 s
        link = SiteLink(leaf.url, REGION, SITE, beat_s=1.0)
        await link.start()
        await eventually(lambda: link.reachable, timeout=15)  # the leader answered a beat
        heard: dict[str, int] = {}

        async def at_hub(msg) -> None:
            node = msg.subject.rsplit(".", 1)[-1]
            heard[node] = heard.get(node, 0) + 1

        await region.nc.subscribe(subjects.state_all(REGION), cb=at_hub)
        fleet = HollowFleet(
            leaf.url,
            region=REGION,
            prefix="s1-n",
            inventories=[Inventory(4, 8 * GiB)] * 2,
            heartbeat_s=0.2,
            site=SITE,
        )
        await fleet.start()
        await region.ready(2)
        assert fleet.feed.wait_s == fleet.feed.site_wait_s

        # Heartbeats every 0.2 s for 4 s, past the region's 3 s suspect limit: the
        # nodes stay ready on the beats alone; only their first heartbeat crossed.
        heard.clear()
        await asyncio.sleep(4.0)
        info = await client.cluster_info()
        assert info["nodes"].get("ready", 0) == 2, info["nodes"]
        assert sum(heard.values()) <= 2, heard  # 40 were sent at the site

        # A change the region acts on (the node's task list) crosses at once.
        node = next(iter(fleet.nodes.values()))
        node.owe(("t-1", 1))
        await eventually(lambda: heard.get(node.node_id, 0) >= 1, timeout=5)

        # No leader, no answer: the link says the region is unreachable.
        for c in region.coordinators:
            await c.stop()
        region.coordinators.clear()
        await eventually(lambda: not link.reachable, timeout=10)
    finally:
        if fleet is not None:
            await fleet.stop()
        if link is not None:
            await link.stop()
        await region.close()
        leaf.stop()
        hub.stop()


class CountingSub:
    """A real pull subscription whose fetches are counted (what the loop asked for)."""

    def __init__(self, psub) -> None:
        self.psub = psub
        self.fetches = 0

    async def fetch(self, n, timeout):
        self.fetches += 1
        return await self.psub.fetch(n, timeout=timeout)

    async def unsubscribe(self):
        await self.psub.unsubscribe()


async def test_a_kick_ends_the_long_poll_and_pulls_anew(nc):
    js = nc.jetstream()
    await js.add_stream(name="K", subjects=["k.>"])
    subs: list[CountingSub] = []

    async def subscribe():
        subs.append(CountingSub(await js.pull_subscribe("k.>", durable="d", stream="K")))
        return subs[-1]

    got: list[bytes] = []

    async def handle(msgs) -> None:
        for m in msgs:
            got.append(m.data)
            await m.ack()

    loop = PullLoop("k", subscribe, handle, batch=8, wait_s=30.0, linger_s=0.01)
    await loop.start()
    try:
        await eventually(lambda: subs and subs[0].fetches == 1, timeout=5, interval=0.01)
        loop.kick()
        await eventually(lambda: subs[0].fetches == 2, timeout=2, interval=0.01)
        assert loop.kicks == 1 and len(subs) == 1 and loop.fetch_errors == 0
        await js.publish("k.a", b"after the kick")
        await eventually(lambda: got == [b"after the kick"], timeout=5, interval=0.01)
    finally:
        await loop.stop()


async def test_the_uplink_tells_when_the_region_is_back():
    backs = []
    up = Uplink(on_back=lambda: backs.append(1))

    class Msg:
        def __init__(self, reachable: bool) -> None:
            self.data = encode(SiteUplink(site=SITE, ts=time.time(), reachable=reachable))

    await up._heard(Msg(True))
    assert backs == []  # reachable all along
    await up._heard(Msg(False))
    await up._heard(Msg(False))
    assert backs == [] and not up.reachable
    await up._heard(Msg(True))
    await up._heard(Msg(True))
    assert backs == [1] and up.reachable
