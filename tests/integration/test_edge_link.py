"""An edge site's link to its region cut for real (issue 21): a hub nats-server (domain
hub, leafnodes), a site's leaf whose remote goes through a TCP proxy
(tests/integration/tcpproxy.py), a coordinator on the hub, a hollow fleet of the site's
nodes on the leaf and the site link (edge/uplink.py) beside it. For each kind of cut
(reset, black-hole, flap, the leaf server killed and restarted, the hub server killed
and restarted): jobs submitted before and during the cut run once, every event the
leaf's stream acknowledged reaches the hub's job history exactly once, and no task runs
twice (the fleet's ledger, agent/ledger.py). The harness is edgesite.py.

The coordinator's `down_after` is large: what the hub does with a cut-off site's nodes
is the hub's site rules (edge/sites.py), not the link's; here the link must only lose
nothing and duplicate nothing."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from agent.ledger import count_duplicates
from edge.leaf import site_server_config
from edge.uplink import SiteLink
from mesh import subjects
from mesh.connect import close_quietly, connect
from mesh.edgeschema import decode_beat
from mesh.server import EmbeddedServer, ServerConfig, free_port
from mesh.streams import ensure_site_stream, ensure_streams

from .conftest import Region, cli_env, eventually
from .edgesite import REGION, SITE, Site, started_tasks
from .tcpproxy import TcpProxy

# What each cut took to resync (printed; never asserted): link-up until the hub's job
# view has every event the site stored, and until the link forwarded all of them.
RESYNC: dict[str, float] = {}
FORWARDED: dict[str, float] = {}


@pytest.fixture
async def site(tmp_path):
    s = Site(tmp_path)
    try:
        yield await s.start()
    finally:
        await s.close()


async def _hub_restart(site: Site) -> None:
    site.hub.kill()
    await asyncio.sleep(2.0)
    await site.hub.astart()


async def _leaf_restart(site: Site) -> None:
    site.leaf.kill()
    await asyncio.sleep(2.0)
    await site.leaf.astart()


CUTS = {
    "reset": (lambda s: s.proxy.cut(), lambda s: s.proxy.restore()),
    "black-hole": (lambda s: s.proxy.black_hole(), lambda s: s.proxy.restore()),
    "flap": (lambda s: s.proxy.flap(0.7), lambda s: s.proxy.restore()),
}


@pytest.mark.parametrize("kind", ["reset", "black-hole", "flap", "leaf-restart", "hub-restart"])
async def test_a_cut_site_loses_nothing_and_runs_nothing_twice(site, kind):
    before = await site.submit(4, 1.5, "before")
    await eventually(
        lambda: len(site.fleet.ledger()) >= 4 and site.link.counters.backlog == 0,
        timeout=15,
    )
    cut_at = time.monotonic()
    if kind in CUTS:
        CUTS[kind][0](site)
    if kind == "black-hole":
        # The site notices a dead link by its pings, and tells its agents.
        await eventually(
            lambda: any(t > cut_at and not u.reachable for t, u in site.uplinks), timeout=10
        )
        await eventually(lambda: site.unlinked(), timeout=10)
    elif kind in CUTS:
        await eventually(lambda: site.unlinked(), timeout=10)
    # Submitted while the site is cut off: the hub places them; their assignments wait in
    # the region's stream until the link is back.
    during = await site.submit(3, 1.0, "during")
    if kind == "leaf-restart":
        await _leaf_restart(site)
    elif kind == "hub-restart":
        await _hub_restart(site)
    else:
        await asyncio.sleep(2.0)  # the tasks started before end while cut off
        CUTS[kind][1](site)
    up_at = time.monotonic()
    stored = set(site.fleet.acked)  # acknowledged at the site by link-up
    jobs = before + during
    held = stored - set(await site.hub_history(jobs))
    print(f"{kind}: {len(held)} events held at the site at link-up")
    info = await site.leaf_nc.jetstream().stream_info(site.link.stream)
    last = info.state.last_seq
    await eventually(lambda: site.link.cursor >= last, timeout=20, interval=0.01)
    FORWARDED[kind] = time.monotonic() - up_at
    print(f"{kind}: link-up -> site stream forwarded in {FORWARDED[kind]:.2f} s")

    async def caught_up() -> bool:
        return stored <= set(await site.hub_history(jobs))

    # (After the hub's own server is killed its coordinator leads again only once its log
    # follower has caught up: coordinator.joblog resubscribes a follower that went quiet.
    # A RUNNING its leader fetched as the hub died comes again only after ack_wait, behind
    # the task's SUCCEEDED: logged as a late start, lifecycle.is_late_start.) A failure
    # says which events are missing and where the coordinator and its consumer stood.
    try:
        await eventually(caught_up, timeout=20, interval=0.02)
    except AssertionError:
        c = site.region.coordinators[0]
        lease = c.lease.term if c.lease is not None else None
        missing = stored - set(await site.hub_history(jobs))
        views = {}
        for j in jobs:
            for t in (await site.region.client.job(j))["task_list"]:
                if any(m[0] == t["task_id"] for m in missing):
                    views[t["task_id"]] = (t["state"], t.get("attempt"), t["history"])
        hub_js = site.region.nc.jetstream()
        ev_stream = subjects.events_stream(REGION)
        ev = (await hub_js.stream_info(ev_stream)).state
        con = await hub_js.consumer_info(ev_stream, subjects.events_consumer())
        raise AssertionError(
            f"{kind}: {len(missing)} events not in the hub's histories: {sorted(missing)}; "
            f"coordinator leading: {c.leader is not None}, lease term {lease}; "
            f"events stream {ev.messages} msgs {ev.first_seq}..{ev.last_seq}, consumer "
            f"delivered {con.delivered.stream_seq} ack floor {con.ack_floor.stream_seq} "
            f"pending {con.num_pending} ack pending {con.num_ack_pending}; tasks {views}"
        ) from None
    RESYNC[kind] = time.monotonic() - up_at
    print(f"{kind}: link-up -> hub caught up in {RESYNC[kind]:.2f} s ({len(stored)} events)")
    await eventually(lambda: site.all_succeeded(jobs), timeout=30)
    await eventually(lambda: site.link.counters.backlog == 0, timeout=10)

    history = await site.hub_history(jobs)
    acked = collections.Counter(site.fleet.acked)
    assert set(acked) <= set(history), (
        f"acknowledged at the site, missing at the hub: {set(acked) - set(history)}"
    )
    assert all(n == 1 for n in history.values()), (
        f"logged twice: {[k for k, n in history.items() if n > 1]}"
    )
    runs = site.fleet.ledger()
    tasks = started_tasks(runs)
    assert len(tasks) == len(jobs) and all(n == 1 for n in tasks.values()), tasks
    assert count_duplicates(runs).total == 0, count_duplicates(runs)
    # (fleet.counts["duplicates"] counts redeliveries its guard refused, e.g. after the
    # hub was killed before an assignment's ack was stored: deliveries, not runs.)
    assert site.link.counters.forwarded > 0  # messages (an event, or a node's batch of them)
    if kind in CUTS:
        assert site.proxy.stats.bytes_up > 0 and site.proxy.stats.bytes_down > 0


async def test_a_real_site_agent_process_runs_through_a_cut(tmp_path, procs):
    """`mesh agent --site` as an operator runs it, on the leaf: its node reaches the hub
    (naming its site), a real command runs there, the link is reset mid-run, and the
    run's outcome reaches the hub once the link is back, once."""
    site = await Site(tmp_path).start(nodes=0)
    try:
        extra = ["--allow-root"] if os.geteuid() == 0 else []
        procs(
            site.leaf.url,
            "--insecure",
            "agent",
            "--site",
            SITE,
            "--node-id",
            "real-1",
            "--data-dir",
            str(tmp_path / "real-1"),
            *extra,
            name="agent",
        )
        beats = []

        async def on_beat(msg) -> None:
            beats.append(decode_beat(msg.data))

        await site.region.nc.subscribe(subjects.site_beat(REGION, SITE), cb=on_beat)
        await site.region.ready(1)
        (node,) = await site.region.client.nodes()
        assert node["node_id"] == "real-1"
        # The site's beats reach the hub and name the node heard on the leaf.
        await eventually(lambda: beats and beats[-1].nodes == ("real-1",), timeout=15)
        c = site.region.client
        job = await c.submit(
            {"name": "real", "tasks": [{"role": "w", "command": "sleep 1.5; echo done"}]}
        )
        await eventually(lambda: state_of(c, job, "RUNNING"), timeout=15)
        site.proxy.cut()
        await eventually(lambda: site.unlinked(), timeout=10)
        await asyncio.sleep(2.0)  # it ends while the site is cut off
        stored = (await site.leaf_nc.jetstream().stream_info(site.link.stream)).state
        assert stored.messages >= 1  # its SUCCEEDED waits at the site
        assert await state_of(c, job, "RUNNING")
        site.proxy.restore()
        done = await c.wait(job, timeout=15)
        assert done["state"] == "SUCCEEDED"
        history = [h["state"] for h in done["task_list"][0]["history"]]
        assert history.count("RUNNING") == 1 and history.count("SUCCEEDED") == 1
    finally:
        await site.close()


async def state_of(client, job_id: str, state: str) -> bool:
    """Whether the job's (one) task is in `state` in the hub's view."""
    return (await client.job(job_id))["task_list"][0]["state"] == state


async def test_mesh_edge_up_runs_a_site_and_stops_cleanly(tmp_path):
    """`mesh edge up`: the leaf, the link and the agent in one process; the site's node
    runs a job for the hub; SIGINT (Ctrl-C) stops it all, with exit 0."""
    hub = EmbeddedServer(
        ServerConfig(store_dir=str(tmp_path / "hub"), domain=subjects.HUB_DOMAIN, leaf_listen=True)
    )
    await hub.astart()
    region = Region(hub.url, tmp_path, REGION)
    port = free_port()
    env = {**cli_env(tmp_path), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "edge.log", "wb")
    proc = None
    try:
        await region.connect_client()
        await region.coordinator("c1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "mesh.cli.main", "--insecure", "edge", "up"]
            + ["--site", "s2", "--hub", hub.leaf_url, "--port", str(port)]
            + ["--node-id", "edge-1", "--autonomy", "5m"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        await region.ready(1)
        job = await region.client.submit(
            {"name": "at-edge", "tasks": [{"role": "w", "command": "true"}]}
        )
        assert (await region.client.wait(job, timeout=20))["state"] == "SUCCEEDED"
        assert (tmp_path / "home" / "edge" / "s2" / "nats").is_dir()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        await region.close()
        hub.stop()


async def test_a_backlog_goes_in_order_once_through_a_reset_mid_way(tmp_path):
    """Thousands of events stored at the site while it was cut off go to the hub's events
    stream in the site's order, each once, though the link is reset while they go; the
    cursor ends on the last, and the site stream is purged."""
    site = Site(tmp_path)
    site.hub = EmbeddedServer(
        ServerConfig(store_dir=str(tmp_path / "hub"), domain=subjects.HUB_DOMAIN, leaf_listen=True)
    )
    await site.hub.astart()
    site.proxy = await TcpProxy(target_port=site.hub.config.leaf_port).start()
    site.leaf = EmbeddedServer(site_server_config(SITE, [site.proxy.url], tmp_path / "leaf"))
    await site.leaf.astart()
    hub_nc = await connect(site.hub.url, name="test-hub")
    site.leaf_nc = await connect(site.leaf.url, name="test-leaf")
    try:
        await ensure_streams(hub_nc.jetstream(), REGION, agent=True)
        local = site.leaf_nc.jetstream()
        await ensure_site_stream(local, REGION, SITE)
        n = 3000
        acks = [
            await local.publish_async(
                subjects.site_events(REGION, SITE, f"n{i % 3}"),
                str(i).encode(),
                headers={"Nats-Msg-Id": f"ev-{i}"},
            )
            for i in range(n)
        ]
        await asyncio.gather(*acks)
        site.link = SiteLink(site.leaf.url, REGION, SITE)
        await site.link.start()
        await eventually(lambda: site.link.counters.forwarded > 0, timeout=15, interval=0.005)
        site.proxy.cut()  # mid-way (or just after: either way nothing may be lost)
        at_cut = site.link.cursor
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        site.proxy.restore()
        await eventually(lambda: site.link.cursor >= n, timeout=30, interval=0.01)
        print(
            f"backlog: cut at {at_cut}/{n}; "
            f"the rest forwarded {time.monotonic() - t0:.2f} s after link-up"
        )
        hub = hub_nc.jetstream()
        stream = subjects.events_stream(REGION)
        assert (await hub.stream_info(stream)).state.messages == n
        got = [int((await hub.get_msg(stream, seq)).data) for seq in range(1, n + 1)]
        assert got == list(range(n))  # in the site's order, none twice
        assert (await local.stream_info(site.link.stream)).state.messages == 0
        assert int((await site.link.kv.get("cursor")).value) == n
        assert site.proxy.stats.cuts == 1
    finally:
        await close_quietly(hub_nc)
        await site.close()


async def test_a_site_fleet_started_while_cut_off_runs_once_the_link_is_back(tmp_path):
    """Like a site agent, a site's hollow fleet starts while its leaf cannot reach the
    hub (a cut, or a leaf not linked yet: seen with 50 leaves starting at once in the
    edge bench), and joins the region when the link comes."""
    from agent.hollow import HollowFleet

    site = Site(tmp_path)
    fleet = None
    try:
        await site.start(nodes=0)
        site.proxy.cut()
        await eventually(lambda: site.unlinked(), timeout=10)
        fleet = HollowFleet(site.leaf.url, REGION, 2, prefix="late", site=SITE)
        await fleet.start()  # raised ServiceUnavailableError before
        site.proxy.restore()
        await site.region.ready(2)
        jobs = await site.submit(2, 0.2, "late")
        await eventually(lambda: site.all_succeeded(jobs), timeout=20)
    finally:
        if fleet is not None:
            await fleet.stop()
        await site.close()
