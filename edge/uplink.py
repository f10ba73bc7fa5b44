"""`SiteLink`: a site's events forwarded to its region, in order, and its beats.

One per site, beside the leaf (`mesh edge up`). Its agents publish task events into the
site's own stream on the leaf (acknowledged even while the hub is away); the link reads
that stream from its cursor and forwards each message to the region's events stream
(`subjects.events(region, node)`), a window at a time, each node's events of a window
merged into a few batches (`edge.merge`: one hub write each, not one per event),
pipelined (every publish of a window in flight together, acks awaited after), so a
backlog of thousands goes in a second or two. The cursor moves only over what the hub
acknowledged (`edge.cursor.advance`), is stored in the site's KV bucket, and what it
passed is purged from the site stream. A window's acks share one deadline
(`ack_timeout`): behind a dead connection it costs one timeout, not one per message.
While the hub is away it tries again every `retry_s` (0.2 s): a link that comes back is
caught up within a window's round trip, where NATS stream sources wait out a 10 s
health check and a backoff of up to 2 min.

Why a KV key for the cursor, not a durable consumer's ack floor: a window is acked as a
whole and out of order; with a consumer the floor moves by the server's redelivery
rules (ack_wait, max_deliver) and a redelivered message may come after later ones, while
a cursor we write ourselves is exactly "everything up to here is in the hub", read
back by a restarted link. An ephemeral consumer (no acks) reads from cursor + 1.

Every `beat_s` (2 s) it beats: a `SiteBeat` request on `subjects.site_beat` (the
region tells a cut-off site from a dead node by it, and counts it as hearing the nodes
it lists), answered by the region's leader with a few bytes. The region is reachable
while the hub answered within `reachable_s` (2 beats + 1 s: a beat's reply or a
forward's ack); the site's own agents are told (`SiteUplink`, leaf-local; at once on a
change). The site's heartbeats stay at the site (`subjects.site_state`); the link
relays a node's to the region's `subjects.state` when it changed in what the region
acts on (`edge.cursor.ACTED_ON`) or `relay_every_s` (30 s) after the last, and each
node's next one after the region was unreachable. So an idle site's link carries a
beat and its reply every 2 s and a heartbeat per node every 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from edge.cursor import acted_on, advance, heard_nodes, reachable, relay_due
from edge.leaf import ensure_link_bucket, ensure_site_stream
from edge.merge import Stored, merge_window
from mesh import subjects
from mesh.codec import WireError, encode, unpack
from mesh.connect import connect
from mesh.edgeschema import NEVER, SiteBeat, SiteUplink
from mesh.tasks import cancel_and_wait

log = logging.getLogger("mesh.edge.uplink")

CURSOR_KEY = "cursor"
UNREACHABLE_BEAT_S = 0.5  # how often a link that lost its region beats, to find it again


@dataclass
class LinkCounters:
    """What the link did, in site-stream messages (each one task event, or one node's
    batch of them, as its agent published it): forwarded (acknowledged by the hub),
    backlog (stored at the site, not yet forwarded), retries (windows sent again after a
    failure), skipped (a subject that names no node: never from our agents)."""

    forwarded: int = 0
    backlog: int = 0
    retries: int = 0
    skipped: int = 0


class SiteLink:
    """`start()` connects to the leaf (`nats_url`), ensures the site stream and the
    cursor bucket, and runs the forwarder, the beat and the heartbeat relay; `stop()`
    cancels them all and closes the connection. `nc` may be passed instead of a URL (the caller
    keeps it)."""

    def __init__(
        self,
        nats_url: str | None,
        region: str,
        site: str,
        *,
        nc=None,
        tls=None,
        autonomy_s: float = NEVER,
        window: int = 512,
        retry_s: float = 0.2,
        ack_timeout: float = 1.0,
        beat_s: float = 2.0,
        beat_timeout: float = 1.0,
        reachable_s: float | None = None,
        relay_every_s: float = 30.0,
        node_window_s: float = 10.0,
        stream_bytes: int | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.region = subjects.token(region, "region")
        self.site = subjects.token(site, "site")
        self.tls = tls
        self.autonomy_s = autonomy_s
        self.window = window
        self.retry_s = retry_s
        self.ack_timeout = ack_timeout
        self.beat_s = beat_s
        self.beat_timeout = beat_timeout
        # Two beats and a second: a reply missed once is no cut, two in a row are.
        self.reachable_s = 2 * beat_s + 1.0 if reachable_s is None else reachable_s
        self.relay_every_s = relay_every_s
        self.node_window_s = node_window_s
        self.stream_bytes = stream_bytes  # the site stream's bound if this creates it
        self.counters = LinkCounters()
        self.cursor = 0
        self.nc = nc
        self._own_nc = nc is None
        self._tasks: list[asyncio.Task[None]] = []
        self._sub = None  # the reader: an ephemeral consumer from cursor + 1
        self._state_sub = None
        self._heard: dict[str, float] = {}
        self._relayed: dict[str, tuple[float, bytes]] = {}  # node: (when, what the region acts on)
        self._relaying: dict[str, asyncio.Task[None]] = {}  # node: its relay awaiting the answer
        self.relays = 0  # heartbeats relayed to the region
        self._last_answer: float | None = None  # monotonic time the hub last answered
        self._reachable = False
        self.cut_since = 0.0  # wall time the region was last lost (0: not since start)
        self._seq = 0
        self._uplink_changed = asyncio.Event()
        self.stream = subjects.site_events_stream(self.site)

    # ------------------------------------------------------------ life

    async def start(self) -> None:
        if self.nc is None:
            self.nc = await connect(self.nats_url, name=f"sitelink:{self.site}", tls=self.tls)
        try:
            self.js = self.nc.jetstream(timeout=5.0)  # the leaf's own domain
            self.hub_js = self.nc.jetstream(domain=subjects.HUB_DOMAIN, timeout=self.ack_timeout)
            bound = {"max_bytes": self.stream_bytes} if self.stream_bytes else {}
            await ensure_site_stream(self.js, self.region, self.site, **bound)
            self.kv = await ensure_link_bucket(self.js, self.site)
            self.cursor = await self._read_cursor()
            self._state_sub = await self.nc.subscribe(
                subjects.site_state_all(self.region, self.site), cb=self._on_state
            )
        except BaseException:
            await self.stop()
            raise
        self._tasks = [
            asyncio.create_task(self._forward_loop(), name=f"sitelink-forward:{self.site}"),
            asyncio.create_task(self._beat_loop(), name=f"sitelink-beat:{self.site}"),
        ]
        log.info("site link %s -> region %s from cursor %d", self.site, self.region, self.cursor)

    async def stop(self) -> None:
        for t in [*self._tasks, *self._relaying.values()]:
            await cancel_and_wait(t)
        self._tasks = []
        self._relaying.clear()
        await self._drop_reader()
        if self._state_sub is not None:
            with contextlib.suppress(Exception):
                await self._state_sub.unsubscribe()
            self._state_sub = None
        if self._own_nc and self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
            self.nc = None

    @property
    def reachable(self) -> bool:
        return reachable(self._last_answer, time.monotonic(), self.reachable_s)

    # ------------------------------------------------------------ forwarding

    async def _read_cursor(self) -> int:
        with contextlib.suppress(Exception):  # absent: from the stream's start
            entry = await self.kv.get(CURSOR_KEY)
            return int(entry.value or b"0")
        return 0

    async def _forward_loop(self) -> None:
        while True:
            try:
                if await self._forward_window():
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the hub away, the leaf restarting: try again
                log.debug("site link %s: window not forwarded: %s", self.site, exc)
            self.counters.retries += 1
            await self._drop_reader()
            await asyncio.sleep(self.retry_s)

    async def _reader(self):
        if self._sub is None:
            self._sub = await self.js.pull_subscribe(
                subjects.site_events_all(self.region, self.site),
                durable=None,
                stream=self.stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=self.cursor + 1,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=30.0,
                    mem_storage=True,
                ),
                pending_msgs_limit=4 * self.window,
            )
        return self._sub

    async def _drop_reader(self) -> None:
        """Unsubscribe and delete the reader's consumer (else it lingers until its
        inactive threshold)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.stream, sub._consumer)

    async def _forward_window(self) -> bool:
        """One window: True when it went through whole (or there was nothing to send),
        False when the link must wait `retry_s` and resend from the cursor."""
        sub = await self._reader()
        try:
            msgs = await sub.fetch(self.window, timeout=1.0)
        except TimeoutError:
            self.counters.backlog = 0
            return True
        stored = [
            Stored(
                m.metadata.sequence.stream,
                m.subject,
                m.data,
                (m.headers or {}).get("Nats-Msg-Id"),
            )
            for m in msgs
        ]
        sent: list[tuple[int, asyncio.Future | None]] = []
        for seqs, node, data, headers in merge_window(self.region, self.site, stored):
            if node is None:
                self.counters.skipped += len(seqs)
                sent.extend((seq, None) for seq in seqs)
                continue
            fut = await self.hub_js.publish_async(
                subjects.events(self.region, node),
                data,
                stream=subjects.events_stream(self.region),
                headers=headers,
            )
            sent.extend((seq, fut) for seq in seqs)
        sent.sort(key=lambda item: item[0])  # a node's batch carries seqs of many places
        results = await self._acks(sent)
        if msgs:
            self.counters.backlog = msgs[-1].metadata.num_pending + sum(
                1 for _, ok in results if not ok
            )
        step = advance(self.cursor, results)
        if step.cursor != self.cursor:
            self.cursor = step.cursor
            self.counters.forwarded += step.forwarded
            self._heard_hub()
            await self.kv.put(CURSOR_KEY, str(self.cursor).encode())
            with contextlib.suppress(Exception):  # reclaimed next time if not now
                await self.js.purge_stream(self.stream, seq=self.cursor + 1)
        return step.complete

    async def _acks(self, sent: list[tuple[int, asyncio.Future | None]]) -> list[tuple[int, bool]]:
        """Every ack of a window awaited together, under one deadline (`ack_timeout`):
        a window behind a dead connection costs one timeout, not one per message, and
        is then sent again from the cursor. What is not acknowledged by then counts as
        not acknowledged (its late ack, if any, is dropped)."""
        futs = [f for _, f in sent if f is not None]
        if futs:
            _, pending = await asyncio.wait(futs, timeout=self.ack_timeout)
            for f in pending:
                f.cancel()
        return [(seq, fut is None or _ok(fut, self.site)) for seq, fut in sent]

    # ------------------------------------------------------------ reachability and beats

    def _heard_hub(self) -> None:
        self._last_answer = time.monotonic()
        self._note_reachability()

    def _note_reachability(self) -> None:
        now = self.reachable
        if now != self._reachable:
            self._reachable = now
            if not now:
                self.cut_since = time.time()
            else:  # what was relayed while cut was lost: each node's next one goes
                self._relayed.clear()
            log.info("site link %s: region %s", self.site, "reachable" if now else "unreachable")
            self._uplink_changed.set()

    async def _on_state(self, msg) -> None:
        """A heartbeat of one of this site's nodes (site-local, `subjects.site_state`):
        the node is heard, and the heartbeat goes on to the region's `subjects.state`
        when it changed in what the region acts on (`acted_on`), or `relay_every_s`
        after the last one relayed; in between the beat's node list keeps the node
        alive at the region, so an idle site's heartbeats cost the link nothing."""
        try:
            state = unpack(msg.data)
        except WireError:
            return
        if not isinstance(state, dict) or state.get("site") != self.site:
            return
        node = state.get("node_id")
        if not subjects.is_token(node) or msg.subject != subjects.site_state(
            self.region, self.site, node
        ):
            return  # a node speaks only for itself
        now = time.monotonic()
        self._heard[node] = now
        what = acted_on(state)
        if node in self._relaying or not relay_due(
            self._relayed.get(node), what, now, self.relay_every_s
        ):
            return
        task = asyncio.create_task(self._relay(node, msg.data, what, now))
        self._relaying[node] = task
        task.add_done_callback(lambda _: self._relaying.pop(node, None))

    async def _relay(self, node: str, data: bytes, what: bytes, now: float) -> None:
        """A relayed heartbeat is a request the region's leader answers, and counts as
        relayed only once answered: a core publish into a link that has just gone (the
        leaf not yet aware, or a cut shorter than `reachable_s`) was lost without a
        trace, and an unchanged node then waited `relay_every_s` for its next one (the
        region never saw the task it had just started, nor so its stale copy). Not
        answered: the node's next heartbeat is relayed."""
        try:
            subject = subjects.state(self.region, node)
            await self.nc.request(subject, data, timeout=self.beat_timeout)
        except asyncio.CancelledError:
            raise
        except Exception:
            return
        self._relayed[node] = (now, what)
        self.relays += 1
        self._heard_hub()

    def beat(self) -> SiteBeat:
        now = time.monotonic()
        self._heard = {n: t for n, t in self._heard.items() if now - t <= self.node_window_s}
        self._seq += 1
        return SiteBeat(
            site=self.site,
            region=self.region,
            seq=self._seq,
            ts=time.time(),
            autonomy_s=self.autonomy_s,
            nodes=heard_nodes(self._heard, now, self.node_window_s),
            backlog=self.counters.backlog,
            forwarded=self.counters.forwarded,
            cut_since=self.cut_since,
        )

    def uplink(self) -> SiteUplink:
        up = self.reachable
        return SiteUplink(
            site=self.site, ts=time.time(), reachable=up, since=0.0 if up else self.cut_since
        )

    async def _beat_loop(self) -> None:
        """Every `beat_s`, a beat as a request: the region's leader answers it with a
        few bytes, and that answer (or a forward's ack) is the region being reachable,
        so an idle link costs a beat and its reply, nothing else. While the region is
        unreachable it beats every half second, so a link back is known within one."""
        while True:
            with contextlib.suppress(Exception):  # no answer: the region is not reachable
                await self.nc.request(
                    subjects.site_beat(self.region, self.site),
                    encode(self.beat()),
                    timeout=self.beat_timeout,
                )
                self._heard_hub()
            self._note_reachability()
            with contextlib.suppress(Exception):  # leaf-local; lost while the leaf is away
                await self.nc.publish(
                    subjects.site_uplink(self.region, self.site), encode(self.uplink())
                )
            self._uplink_changed.clear()
            wait = self.beat_s if self._reachable else min(self.beat_s, UNREACHABLE_BEAT_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._uplink_changed.wait(), wait)


def _ok(fut: asyncio.Future, site: str) -> bool:
    """A publish acknowledged by the hub's stream (done, not cancelled, no error)."""
    if not fut.done() or fut.cancelled():
        return False
    exc = fut.exception()
    if exc is not None:
        log.debug("site link %s: not acknowledged: %r", site, exc)
        return False
    return True
