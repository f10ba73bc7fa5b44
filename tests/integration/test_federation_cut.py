"""A real gateway link cut and restored (issue 20): three regions of one NATS
supercluster, the eu<->us gateway link through proxies (tests/integration/tcpproxy.py),
both servers running all along. While the link is cut, eu and us each still reach ap; a
job us holds for eu keeps running in us (no eviction: no `lost_after`), its outcome
waits in us's outbox; a nomination eu sends to us waits in eu's outbox; ap serves as
ever. Restored, the nomination is delivered and its job runs once, in us, and the held
job's outcome reaches its home."""

from __future__ import annotations

import asyncio

from coordinator.federation.board import BoardConfig
from coordinator.federation.model import FederationConfig
from mesh.client import MeshClient
from mesh.server import supercluster_configs

from .conftest import eventually
from .tcpproxy import GatewayLinks
from .test_federation import fed_of, fill, job, runs, start, state_is

# eu keeps believing us's last summary (max_age 30 s) and waits for an answer (60 s), so
# it nominates us while the link is cut and keeps the nomination owed, not moved on.
SLOW = BoardConfig(interval_s=0.5, check_s=0.25, max_age_s=30.0, unreachable_s=60.0)
PATIENT = FederationConfig(nominate_timeout_s=60.0, round_backoff_s=2.0, reserve_ttl_s=60.0)


async def answers(nc, region: str) -> bool:
    """Whether `region`'s API answers a request sent from this connection's server."""
    try:
        await MeshClient(nc, region=region, timeout=1.0).cluster_info()
        return True
    except Exception:
        return False


def dialed(server, to: str) -> set[int]:
    """The ports a server's log says it opened outbound gateway connections to `to` on."""
    marker = f'Creating outbound gateway connection to "{to}"'
    lines = server.log_path.read_text().splitlines()
    return {int(ln.split(" - ")[0].rsplit(":", 1)[1]) for ln in lines if marker in ln}


def owed(link, kind: str, job_id: str) -> bool:
    return any(k.startswith(f"{kind}:{job_id}:") for k in link.outbox)


async def test_a_cut_gateway_link_holds_messages_and_delivers_them_once_restored(regions, tmp_path):
    configs = supercluster_configs(["eu", "us", "ap"], tmp_path / "supercluster")
    links = await GatewayLinks.around(configs)
    eu_us, us_eu = links.pair("eu", "us")
    try:
        fed = await regions(configs=configs)
        await start(fed, summaries=SLOW, timers=PATIENT)
        eu, us, ap = fed["eu"], fed["us"], fed["ap"]
        # Gateways connect both ways, and both of the pair's connections ride the proxies.
        assert eu_us.stats.bytes_up > 0 and us_eu.stats.bytes_up > 0
        await fill(eu)
        held = await eu.client.submit(
            job("held", "2", 8, regions=["eu", "us", "ap"], spill={"after": "1s"})
        )
        await eventually(lambda: state_is(us, held, "RUNNING"), timeout=20)
        await eventually(lambda: fed_of(eu, held), timeout=5)
        assert (await fed_of(eu, held))["phase"] == "held"

        links.cut("eu", "us")
        # The cut is real and the pair's alone: eu and us no longer reach each other,
        # both still reach ap.
        await eventually(lambda: not_(answers(eu.nc, "us")), timeout=10)
        assert not await answers(us.nc, "eu")
        assert await answers(eu.nc, "ap") and await answers(us.nc, "ap")
        assert await answers(ap.nc, "eu") and await answers(ap.nc, "us")

        # eu still believes us fresh: the nomination goes to us and stays owed.
        j = await eu.client.submit(
            job("cut", "2", 0.5, regions=["eu", "us", "ap"], spill={"after": "1s"})
        )
        eu_link, us_link = eu.coordinators[0].link, us.coordinators[0].link
        await eventually(lambda: owed(eu_link, "nominate", j), timeout=10)
        await asyncio.sleep(2.0)  # a few ticks of failed sends: still owed, still nominated
        assert owed(eu_link, "nominate", j)
        f = await fed_of(eu, j)
        assert (f["phase"], f["region"]) == ("nominated", "us")

        # ap works all along: a job of its own runs there during the cut.
        local = await ap.client.submit(job("in-ap", "1", 0.2))
        assert (await ap.client.wait(local, timeout=20))["state"] == "SUCCEEDED"

        # The held job keeps running in us and ends there; its home still says held,
        # the outcome owed in us's outbox. Nothing was evicted or stopped.
        await eventually(lambda: state_is(us, held, "SUCCEEDED"), timeout=20)
        await eventually(lambda: owed(us_link, "finished", held), timeout=5)
        await asyncio.sleep(1.0)
        assert owed(us_link, "finished", held)
        assert (await fed_of(eu, held))["phase"] == "held"
        assert us.fleets[0].counts["kills"] == 0
        assert eu_us.stats.refused > 0 and us_eu.stats.refused > 0  # redials

        before = (eu_us.stats.connections, us_eu.stats.connections)
        links.restore("eu", "us")
        await eventually(lambda: state_is(eu, held, "SUCCEEDED"), timeout=30)
        f = await fed_of(eu, held)
        assert (f["phase"], f["region"], f["outcome"]) == ("done", "us", "SUCCEEDED")
        await eventually(lambda: state_is(eu, j, "SUCCEEDED"), timeout=30)
        f = await fed_of(eu, j)
        assert (f["region"], f["epoch"]) == ("us", 1)  # the nomination sent during the cut
        # Each ran once, in us: the hollow nodes' own record of the runs they started.
        assert len(runs(us.fleets[0], j)) == 1 and len(runs(us.fleets[0], held)) == 1
        for r in (eu, ap):
            assert runs(r.fleets[0], j) == [] and runs(r.fleets[0], held) == []
        assert us.fleets[0].counts["kills"] == 0
        # The link came back through the proxies, not around them.
        assert eu_us.stats.connections > before[0]
        assert us_eu.stats.connections > before[1]
        assert await answers(eu.nc, "us") and await answers(us.nc, "eu")
        # And the servers' own logs: each dialed the other through its proxy, never the
        # real gateway (other proxies it learned of refuse it: not its pair).
        for a, b in (("eu", "us"), ("us", "eu")):
            ports = dialed(fed[a].server, b)
            assert links.proxies[(a, b)].port in ports
            assert configs[b].gateway_port not in ports
    finally:
        await links.close()


async def not_(aw) -> bool:
    return not await aw
