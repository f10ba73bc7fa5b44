"""A real edge site for the integration tests (issue 21): a hub nats-server (domain hub,
leafnodes, 1 s pings), a TCP proxy in the leaf's remote (tests/integration/tcpproxy.py:
reset, black-hole, flap), the site's leaf, a coordinator on the hub, a hollow fleet of
the site's nodes and/or a real `Agent` (site mode) on the leaf, and the site link
(edge/uplink.py) beside them. Used by test_edge_link.py (the link loses nothing),
test_edge_hub.py (the region's site rules) and test_edge_autonomy.py (a cut-off agent's
in-place restarts): a cut is a real cut of the wire, so beats, heartbeats, assignments
and the link's uplink all stop or change for real.

Several sites may share one hub: `Site(tmp, "s2", hub=first)` uses `first`'s hub server,
region and coordinators (and closes none of them)."""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

from agent.hollow import GiB, HollowFleet, Inventory
from agent.ledger import Run
from agent.service import Agent, AgentConfig
from edge.leaf import site_server_config
from edge.uplink import SiteLink
from mesh import subjects
from mesh.connect import close_quietly, connect
from mesh.edgeschema import NEVER, decode_beat, decode_uplink
from mesh.server import EmbeddedServer, ServerConfig

from .conftest import Region, eventually
from .tcpproxy import TcpProxy

SITE = "s1"
REGION = "default"
MiB = 1024 * 1024
# What the link tests use: the hub's rules for a cut-off site are not theirs to meet.
PATIENT = {"suspect_after": 600.0, "down_after": 600.0}


class RecordingFleet(HollowFleet):
    """A hollow fleet that also records which of its events the leaf's stream
    acknowledged (what its ledger, `ledger()`, does not say)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.acked: list[tuple[str, int, str]] = []  # (task, attempt, state)

    def _reported(self, ev) -> None:
        self.acked.append((ev.task_id, ev.attempt, str(ev.state)))
        super()._reported(ev)


def started_tasks(runs: list[Run]) -> collections.Counter:
    """How many runs each task had, from a ledger."""
    return collections.Counter(r.task_id for r in runs)


class Site:
    """The hub, the proxy, the leaf, the coordinator, the fleet, the agent and the link.

    `coordinator`: the coordinator's settings (None: start none, e.g. a test that starts
    its own); `autonomy_s` and `link` (more `SiteLink` keywords): the link's;
    `fleet` (more `RecordingFleet` keywords, e.g. heartbeat_s, labels)."""

    def __init__(
        self,
        tmp: Path,
        name: str = SITE,
        *,
        hub: Site | None = None,
        coordinator: dict | None = PATIENT,
        autonomy_s: float = NEVER,
        link: dict | None = None,
        fleet: dict | None = None,
    ) -> None:
        self.tmp = tmp
        self.name = name
        self.owner = hub  # the site whose hub this one shares (None: its own)
        self.coordinator_kw = coordinator
        self.autonomy_s = autonomy_s
        self.link_kw = link or {}
        self.fleet_kw = fleet or {}
        self.uplinks: list = []  # (monotonic time, SiteUplink) heard on the leaf
        self.beats: list = []  # (wall time, SiteBeat) heard on the hub, as a coordinator does

    async def start(self, nodes: int = 3, agent: str = "") -> Site:
        """`nodes` hollow nodes (prefix `<site>n`), and a real agent when `agent` names
        its node."""
        if self.owner is None:
            await self._start_hub()
        else:
            self.hub, self.region = self.owner.hub, self.owner.region
        self.proxy = await TcpProxy(target_port=self.hub.config.leaf_port).start()
        self.leaf = EmbeddedServer(
            site_server_config(
                self.name, [self.proxy.url], self.tmp / f"leaf-{self.name}", store_bytes=64 * MiB
            )
        )
        await self.leaf.astart()
        self.leaf_nc = await connect(self.leaf.url, name=f"test-leaf-{self.name}")
        await eventually(lambda: self.linked(), timeout=15)
        await self.region.nc.subscribe(subjects.site_beat(REGION, self.name), cb=self._beat)
        if nodes:
            self.fleet = RecordingFleet(
                self.leaf.url,
                REGION,
                nodes,
                prefix=f"{self.name}n",
                inventories=[Inventory(4, 16 * GiB)] * nodes,
                site=self.name,
                **self.fleet_kw,
            )
            await self.fleet.start()
        if agent:
            self.agent = Agent(
                AgentConfig(
                    self.leaf.url,
                    region=REGION,
                    node_id=agent,
                    site=self.name,
                    data_dir=str(self.tmp / f"agent-{agent}"),
                    allow_root=os.geteuid() == 0,
                    heartbeat_s=0.5,
                )
            )
            await self.agent.start()
        self.link = SiteLink(
            self.leaf.url, REGION, self.name, autonomy_s=self.autonomy_s, **self.link_kw
        )
        await self.link.start()
        await self.leaf_nc.subscribe(subjects.site_uplink(REGION, self.name), cb=self._uplink)
        if nodes or agent:
            await self.region.ready(nodes + bool(agent) + (self.owner.nodes if self.owner else 0))
            # and the hub heard a beat naming them (a site's nodes as the log records it,
            # what a new leader knows of a site it never heard)
            names = set(self.fleet.nodes) if nodes else set()
            names |= {agent} if agent else set()
            await eventually(lambda: self.beats and set(self.beats[-1][1].nodes) >= names)
        self.nodes = nodes + bool(agent)
        return self

    async def _start_hub(self) -> None:
        self.hub = EmbeddedServer(
            ServerConfig(
                store_dir=str(self.tmp / "hub"),
                domain=subjects.HUB_DOMAIN,
                leaf_listen=True,
                ping_interval="1s",
                ping_max=3,
            )
        )
        await self.hub.astart()
        self.region = Region(self.hub.url, self.tmp, REGION)
        await self.region.connect_client()
        if self.coordinator_kw is not None:
            await self.region.coordinator("c1", **self.coordinator_kw)

    async def _uplink(self, msg) -> None:
        self.uplinks.append((time.monotonic(), decode_uplink(msg.data)))

    async def _beat(self, msg) -> None:
        self.beats.append((time.time(), decode_beat(msg.data)))

    @property
    def last_beat(self) -> float:
        """The hub's wall time of the last beat it heard from this site."""
        return self.beats[-1][0] if self.beats else 0.0

    async def linked(self) -> bool:
        try:
            await self.leaf_nc.jetstream(domain=subjects.HUB_DOMAIN, timeout=1.0).account_info()
            return True
        except Exception:
            return False

    async def unlinked(self) -> bool:
        return not await self.linked()

    async def close(self) -> None:
        for part in ("link", "fleet"):
            if hasattr(self, part):
                await getattr(self, part).stop()
        if hasattr(self, "agent"):
            await self.agent.stop(kill_tasks=True)
        if hasattr(self, "leaf_nc"):
            await close_quietly(self.leaf_nc)
        if self.owner is None and hasattr(self, "region"):
            await self.region.close()
        if hasattr(self, "proxy"):
            await self.proxy.close()
        if hasattr(self, "leaf"):
            self.leaf.stop()
        if self.owner is None and hasattr(self, "hub"):
            self.hub.stop()

    async def submit(self, n: int, seconds: float, tag: str) -> list[str]:
        c = self.region.client
        return [
            await c.submit(
                {
                    "name": f"{tag}-{i}",
                    "tasks": [
                        {
                            "role": "w",
                            "resources": {"cpu": "0.1"},
                            "simulate": {"duration": f"{seconds}s"},
                        }
                    ],
                }
            )
            for i in range(n)
        ]

    async def hub_history(self, jobs: list[str]) -> collections.Counter:
        """(task, attempt, state) of every agent-reported transition in the hub's view."""
        seen: collections.Counter = collections.Counter()
        for j in jobs:
            for t in (await self.region.client.job(j))["task_list"]:
                for h in t["history"]:
                    if h["state"] in ("RUNNING", "SUCCEEDED", "FAILED"):
                        seen[(t["task_id"], h["attempt"], h["state"])] += 1
        return seen

    async def all_succeeded(self, jobs: list[str]) -> bool:
        for j in jobs:
            if (await self.region.client.job(j))["state"] != "SUCCEEDED":
                return False
        return True
