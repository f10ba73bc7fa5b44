"""A coordinator candidate: follows the region's log and node states, serves the API,
campaigns for the lease, and runs a `Leader` while it holds it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from dataclasses import dataclass, field, replace

from coordinator.api import Api
from coordinator.cluster import ClusterView
from coordinator.edgesites import SiteTracker
from coordinator.federation.board import Board, BoardConfig
from coordinator.federation.link import FedLink
from coordinator.federation.model import FederationConfig
from coordinator.federation.summary import summarize
from coordinator.joblog import LogFollower
from coordinator.leader import Leader
from coordinator.partitions.controlling import Controlling
from coordinator.scheduling import PlacementConfig
from coordinator.state import RegionState
from mesh import subjects
from mesh.codec import RepeatDecoder, WireError
from mesh.connect import close_quietly, connect, describe, endpoint
from mesh.lease import LeaseThread
from mesh.logs import fields
from mesh.schema import NodeState
from mesh.signing import NO_SIGNING_KEY_FIX, key_id, load_signing_key
from mesh.streams import ensure_streams

log = logging.getLogger("mesh.coordinator")

MAX_REMEMBERED_HEARTBEATS = 100_000


def _freeze_survivors(phase: str, info: dict) -> None:
    """After a full collection, move its survivors out of the collector's sight.

    A region's state is millions of long-lived objects (100,000 jobs: 1.3 million), and a
    full collection walks them all with the interpreter locked: 0.6 s and more, which
    stalls the lease's thread too and cost the leader its lease again and again under
    load. Survivors of a full collection are long-lived by definition; frozen, the next
    full collection sees only what was made since. The state holds no reference cycles
    (records refer to each other by id), so frozen records are still freed by reference
    counting when dropped; only a cycle that was alive at a full collection and dies later
    is never reclaimed (e.g. a stepped-down leader's objects): small and bounded by
    leadership changes."""
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()  # subjects whose last heartbeat is kept for comparison


@dataclass
class CoordinatorConfig:
    nats_url: str
    region: str = "default"
    candidate_id: str = "coordinator"
    lease_ttl: float = 2.0
    suspect_after: float = 3.0
    down_after: float = 10.0
    site_silent_s: float = 5.0  # an edge site unheard this long is disconnected (beats: 2 s)
    replicas: int = 1
    preempt_every_s: float = 0.25  # one preemption cycle this often (hysteresis counts them)
    preempt_cycles: int = 2  # cycles a pool must stay over entitlement before it is preempted
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    connect_options: dict = field(default_factory=dict)
    signing_key: str | None = None  # Ed25519 PEM: the leader signs every assignment with it
    summaries: BoardConfig = field(default_factory=BoardConfig)  # region summaries
    federation: FederationConfig = field(default_factory=FederationConfig)  # forwarding jobs
    # Elastic training jobs (coordinator/elastic.py): a resize waits this long after a
    # job's last membership change; a job whose progress stops this long after one is
    # requeued. Carried into `placement`, which the leader's rounds read.
    resize_every_s: float = 10.0
    progress_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("resize_every_s", "progress_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        self.placement = replace(
            self.placement,
            resize_every_s=self.resize_every_s,
            progress_timeout_s=self.progress_timeout_s,
        )


class Coordinator:
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        # Loaded now, so a missing or wrong key stops the candidate before it can lead.
        self.signing_key = load_signing_key(config.signing_key) if config.signing_key else None
        self.signer = key_id(self.signing_key) if self.signing_key is not None else None
        self.region = subjects.token(config.region, "region")
        self.candidate_id = subjects.token(config.candidate_id, "candidate id")
        self.state = RegionState()
        self.cluster = ClusterView(
            self.region, config.suspect_after, config.down_after, signer=self.signer
        )
        self.sites = SiteTracker(self.region, self.cluster, config.site_silent_s)
        self.cluster.site_suspect_after = max(config.suspect_after, config.site_silent_s)
        self.cluster.site_down_after = max(config.down_after, 2 * config.site_silent_s)
        self.controlling = Controlling()  # partition hotness, fed by every candidate
        self._said_barred: dict[str, str] = {}  # node -> the bar last logged for it
        self._said_unverified = False
        self.leader: Leader | None = None
        self.api = Api(self)
        self.board = Board(self.region, config.summaries, self._summary)
        self.link = FedLink(self)  # forwarding jobs between regions, while leading
        self.bad_states = 0
        self.nc = None
        self.js = None
        self.follower: LogFollower | None = None
        self.lease: LeaseThread | None = None
        self._state_sub = None
        self._beat_sub = None
        self.heartbeats = RepeatDecoder(NodeState, MAX_REMEMBERED_HEARTBEATS)
        self._lead_lock = asyncio.Lock()
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        c = self.config
        gc.callbacks.append(_freeze_survivors)
        self.nc = await connect(
            c.nats_url,
            name=f"coordinator:{self.candidate_id}",
            checked_start=True,
            **c.connect_options,
        )
        self.js = self.nc.jetstream(timeout=5.0)
        await ensure_streams(self.js, self.region, c.replicas)
        self.follower = LogFollower(self.js, self.region, self.state)
        await self.follower.start()
        await self.follower.catch_up(timeout=30.0)
        self._state_sub = await self.nc.subscribe(
            subjects.state_all(self.region), cb=self._on_state
        )
        self._beat_sub = await self.nc.subscribe(
            subjects.site_beat_all(self.region), cb=self._on_beat
        )
        await self.api.start()
        await self.board.start(self.nc)
        await self.nc.check_permissions()  # a wrong region is denied these subscriptions
        # The lease renews over a connection and a thread of its own: on the main
        # connection its small KV update would queue behind megabytes of assignments and
        # log appends, and on the main loop it would wait out every long placement round
        # (see LeaseThread).
        self.lease = LeaseThread(
            lambda: connect(
                c.nats_url, name=f"coordinator-lease:{self.candidate_id}", **c.connect_options
            ),
            subjects.lease_bucket(self.region),
            subjects.LEADER_KEY,
            self.candidate_id,
            ttl=c.lease_ttl,
            on_elected=self._elected,
            on_lost=self.step_down,
            replicas=c.replicas,
        )
        await self.lease.start()
        log.info(
            "coordinator candidate %s started in region %s, connected to %s",
            self.candidate_id,
            self.region,
            describe(self.nc),
            extra=fields(
                event="started", process="coordinator", region=self.region, **endpoint(self.nc)
            ),
        )
        self._say_signing()

    def _say_signing(self) -> None:
        """One line on whether assignments are signed: agents given the public key refuse
        whatever an unsigned coordinator sends them (then nothing is placed on them, and
        the jobs say why)."""
        if self.signing_key is not None:
            log.info("signing assignments with %s (key %s)", self.config.signing_key, self.signer)
        else:
            log.warning(
                "assignments are NOT signed: agents that verify signatures (--verify-key, "
                "or --certs holding assignments.pub) refuse all of them, and nothing is "
                "placed on them; %s",
                NO_SIGNING_KEY_FIX.replace("start it", "start this coordinator"),
            )

    async def stop(self) -> None:
        if self.lease is not None:
            await self.lease.stop()  # hands over gracefully, then step_down runs
        await self.step_down(None)
        await self.board.stop()
        await self.api.stop()
        for sub in (self._state_sub, self._beat_sub):
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        if self.follower is not None:
            await self.follower.stop()
        if self.nc is not None:
            await close_quietly(self.nc)
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(_freeze_survivors)
        self._stopped.set()

    def _summary(self, now: float):
        """This region's summary while this candidate leads (its board publishes it)."""
        return summarize(self.state, self.cluster, now) if self.leader is not None else None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _elected(self, term: int) -> None:
        async with self._lead_lock:
            if self.leader is not None or self.lease is None or self.lease.term != term:
                return  # already leading, or this term was lost before we got here
            leader = Leader(self, term)
            try:
                await leader.start()
            except Exception as exc:
                log.warning("could not take over as leader (term %d): %s", term, exc)
                await leader.stop()
                if self.lease is not None and self.lease.term == term:
                    asyncio.ensure_future(self._resign(term))
                return
            self.leader = leader
            try:
                await self.link.start(leader)
            except Exception as exc:  # its inbox comes back with the next term
                log.warning("federation link not started (term %d): %s", term, exc)
                await self.link.stop()
            await self.api.start_leading()
            log.info(
                "%s leads region %s (term %d)",
                self.candidate_id,
                self.region,
                term,
                extra=fields(event="leader", term=term),
            )

    async def _resign(self, term: int) -> None:
        """Give up a lease we could not act on, so another candidate can try."""
        if self.lease is not None:
            await self.lease.stop()
            await self.lease.start()

    async def step_down(self, term: int | None) -> None:
        async with self._lead_lock:
            leader, self.leader = self.leader, None
            if leader is None:
                return
            if term is not None and leader.term != term:
                self.leader = leader
                return
            await self.api.stop_leading()
            await self.link.stop()
            await leader.stop()
            log.info(
                "%s stepped down (term %d)",
                self.candidate_id,
                leader.term,
                extra=fields(event="stepped_down", term=leader.term),
            )

    async def _on_state(self, msg) -> None:
        try:
            st = self.heartbeats.decode(msg.subject, msg.data)
        except WireError as exc:
            self.bad_states += 1
            log.debug("bad node state dropped: %s", exc)
            return
        if not subjects.is_token(st.node_id) or msg.subject != subjects.state(
            self.region, st.node_id
        ):
            self.bad_states += 1  # a node may only speak for itself
            return
        partitions = self.state.partitions
        if partitions.divided:  # hotness matters only to a region split into partitions
            self.controlling.observe(
                st,
                time.time(),
                partitions.config.window_s,
                partitions.partition_of(st.node_id, st.labels),
            )
        if self.cluster.observe(st, time.monotonic()):
            self._say_bar(st)
            if self.leader is not None:
                self.leader.wake()
        if msg.reply and self.leader is not None:
            await self.sites.answer(msg)  # a site link's relay (edge.uplink): heard

    async def _on_beat(self, msg) -> None:
        wake = self.sites.on_beat(msg.subject, msg.data)
        if self.leader is not None:
            await self.sites.answer(msg)
            if wake:
                self.leader.wake()

    def _say_bar(self, st: NodeState) -> None:
        """A node whose verify key this coordinator cannot satisfy is logged once (and
        again when that changes); one that does not verify while this one signs, once
        per process (a hollow fleet is thousands of them)."""
        view = self.cluster.nodes[st.node_id]
        if view.barred != self._said_barred.get(st.node_id, ""):
            if view.barred:
                log.warning("placing nothing on node %s: %s", st.node_id, view.barred)
                self._said_barred[st.node_id] = view.barred
            else:
                log.info("node %s may be placed on again (its verify key matches)", st.node_id)
                self._said_barred.pop(st.node_id, None)
        if self.signer is not None and not st.verify_key and not self._said_unverified:
            self._said_unverified = True
            log.warning(
                "node %s does not verify assignment signatures (nor, maybe, others: this is "
                "said once): it runs whatever reaches its assignment subject; start its agent "
                "with --certs DIR (holding assignments.pub) or --verify-key FILE",
                st.node_id,
            )
