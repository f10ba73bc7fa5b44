"""The agent's side of the wire, shared by real and hollow agents.

- `AssignmentFeed`: pulls this node's assignments from its durable consumer, decodes
  and checks them, and hands each to a handler; a message is acknowledged only after
  the handler returns, so an agent that dies mid-way gets it again (and recognises
  it by task id and attempt).
- `publish_event`: task transitions go to the events stream with a message id made
  of (node, task, attempt, state), so a resend after a crash is de-duplicated (a
  refusal's id is marked as one: a forged assignment's refusal must never stand in for
  the genuine attempt's own FAILED).

For a process that speaks for many nodes (the hollow fleet):

- `FleetFeed`: one durable consumer for all of its nodes' assignment subjects, each
  message handed to the node its subject names.
- `EventPublisher`: the same events with the same message ids, published
  concurrently (acks awaited as futures), in order per task attempt, retried until
  acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

import msgpack
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import APIError, NotFoundError

from mesh import subjects
from mesh.codec import WireError, encode
from mesh.pull import PullLoop
from mesh.schema import (
    MAX_EVENT_BATCH,
    Assignment,
    AssignmentBatch,
    TaskEvent,
    TaskEventBatch,
    decode_assignments,
)
from mesh.tasks import cancel_and_wait
from workloads.lifecycle import TaskState

log = logging.getLogger("mesh.agent.link")

AssignmentMessage = Assignment | AssignmentBatch  # one, or a round's runs for one node
Handler = Callable[[AssignmentMessage], Awaitable[None]]


class _Feed:
    """Assignments read by a `PullLoop`: a feed defines `_subscribe` (the consumer's
    subscription) and `_handle` (one message)."""

    name = ""
    batch = 256
    wait_s = 1.0  # the long poll
    site_wait_s = 15.0  # a site's: its pull requests cross the site's link (kicked on link-up)
    linger_s = 0.002  # how long the batch after it waits
    _pull: PullLoop | None = None

    async def start(self) -> None:
        self._pull = PullLoop(
            self.name,
            self._subscribe,  # type: ignore[attr-defined]
            self._handle_all,
            batch=self.batch,
            wait_s=self.wait_s,
            linger_s=self.linger_s,
        )
        await self._pull.start()

    async def stop(self) -> None:
        if self._pull is not None:
            await self._pull.stop()
            self._pull = None

    def kick(self) -> None:
        """Pull anew now (the site's link is back: a pull sent while cut may be lost)."""
        if self._pull is not None:
            self._pull.kick()

    async def _handle_all(self, msgs) -> None:
        for msg in msgs:
            await self._handle(msg)  # type: ignore[attr-defined]


# A site agent's assignment consumer lives in the hub, its pull requests cross the leaf
# link: a message the hub delivers as the link drops is lost on the wire and comes again
# only after ack_wait. Shorter there, so a task assigned across a cut starts within
# seconds of the link's return (a redelivery is recognised by task id and attempt).
SITE_ACK_WAIT_S = 5.0


class AssignmentFeed(_Feed):
    def __init__(
        self,
        js: JetStreamContext,
        region: str,
        node_id: str,
        handler: Handler,
        *,
        ack_wait: float = 30.0,
    ) -> None:
        self.ack_wait = ack_wait
        self.js = js
        self.region = region
        self.node_id = node_id
        self.handler = handler
        self.rejected = 0
        self.name = f"assignments:{node_id}"

    async def _subscribe(self):
        return await self.js.pull_subscribe(
            subjects.assign(self.region, self.node_id),
            durable=subjects.agent_consumer(self.node_id),
            stream=subjects.assign_stream(self.region),
            config=ConsumerConfig(ack_wait=self.ack_wait, max_ack_pending=10_000),
        )

    async def _handle(self, msg) -> None:
        try:
            a = decode_assignments(msg.data)
        except WireError as exc:
            self.rejected += 1
            log.warning("undecodable assignment dropped: %s", exc)
            await _quietly(msg.term())
            return
        if a.node_id != self.node_id:
            self.rejected += 1
            log.warning("assignment for %s delivered to %s: refused", a.node_id, self.node_id)
            await _quietly(msg.term())
            return
        try:
            await self.handler(a)
        except Exception:
            log.exception("assignment for %s failed; will be redelivered", a.node_id)
            await _quietly(msg.nak(delay=1.0))
            return
        await _quietly(msg.ack())


def event_route(region: str, node_id: str, site: str = "") -> tuple[str, str]:
    """(subject, stream) of a node's task events: the region's events stream, or for a
    node of an edge site its site's own stream on the leaf (forwarded by the site link)."""
    if site:
        return subjects.site_events(region, site, node_id), subjects.site_events_stream(site)
    return subjects.events(region, node_id), subjects.events_stream(region)


async def publish_event(js: JetStreamContext, region: str, ev: TaskEvent, site: str = "") -> None:
    """Raises on failure: the caller keeps the transition as unreported and retries.
    With `site`, `js` is the leaf's own JetStream (the site's domain)."""
    subject, stream = event_route(region, ev.node_id, site)
    await js.publish(subject, encode(ev), stream=stream, headers={"Nats-Msg-Id": event_id(ev)})


def event_id(ev: TaskEvent) -> str:
    """One event's de-duplication id: its attempt and state, and whether it is a
    refusal (a refusal the leader does not credit must not make the stream drop the
    attempt's genuine FAILED as its duplicate)."""
    base = f"{ev.node_id}:{ev.task_id}:{ev.attempt}:{ev.state}"
    if ev.health_seq:  # a health verdict: each one its own message
        base = f"{base}:health{ev.health_seq}"
    if ev.progress >= 0:  # a progress report: each one its own message, even a value
        base = f"{base}:progress{ev.progress}@{int(ev.ts * 1000)}"  # seen before (a restart)
    return f"{base}:refused" if ev.refused else base


# ---------------------------------------------------------------- many nodes, one connection
#
# A hollow fleet carries thousands of nodes in one process. One pull consumer and one
# fetch loop per node (what `AssignmentFeed` is, right for one real agent) would be
# thousands of long polls; `FleetFeed` is one durable consumer for all of them, and
# `EventPublisher` sends everyone's task events without waiting for each ack in turn.
# Why `filter_subjects` and what it costs: see agent/hollow.py.

FleetHandler = Callable[[str, AssignmentMessage], None]

WQ_CONSUMER_OVERLAP = 10100
INFO_TIMEOUT_S = 5.0  # "filtered consumer not unique on workqueue stream"


class FleetFeed(_Feed):
    """One durable pull consumer over the assignment subjects of many nodes.

    The consumer lists each node's own subject `mesh.<r>.assign.<node>` in
    `filter_subjects` (nats-server >= 2.10), so it never overlaps another node's
    consumer on the work-queue stream. Each message goes to `handler(node_id, a)`,
    chosen by its subject, and is acknowledged when the handler returns; a handler that
    raises gets it redelivered. The handler is synchronous: it must only record the
    assignment and schedule work, never wait.
    """

    def __init__(
        self,
        js: JetStreamContext,
        region: str,
        name: str,
        node_ids: list[str],
        handler: FleetHandler,
        *,
        batch: int = 512,
        ack_wait: float = 30.0,
        max_ack_pending: int = 20_000,
        api_timeout: float = 120.0,
    ) -> None:
        self.js = js
        self.region = subjects.token(region, "region")
        self.durable = f"fleet_{subjects.token(name, 'fleet name')}"
        self.stream = subjects.assign_stream(self.region)
        self._prefix = subjects.assign(self.region, "x")[:-1]  # "mesh.<r>.assign."
        self.node_ids = frozenset(node_ids)
        self.filters = sorted(subjects.assign(self.region, n) for n in self.node_ids)
        self.handler = handler
        self.batch = batch
        self.ack_wait = ack_wait
        self.max_ack_pending = max_ack_pending
        self.api_timeout = api_timeout
        self.rejected = 0
        self.delivered = 0
        self.migrated = 0  # legacy per-node consumers removed at start
        self.name = f"assignments:{self.durable}"
        self.wait_s, self.linger_s = 5.0, 0.005

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            filter_subjects=self.filters,
            ack_wait=self.ack_wait,
            max_ack_pending=self.max_ack_pending,
            description=f"hollow fleet of {len(self.filters)} nodes",
        )

    async def _subscribe(self):
        """Also run after fetches kept failing: the consumer may be gone (deleted by
        hand, stream recreated); it is put back, and its backlog is still in the stream."""
        await self._ensure_consumer()
        return await self.js.pull_subscribe_bind(
            durable=self.durable, stream=self.stream, pending_msgs_limit=100 * self.batch
        )

    async def _ensure_consumer(self) -> None:
        """Create the consumer, or update it when the fleet's node set changed. Creating
        one with thousands of filters costs the server seconds (it checks them pairwise
        for overlap), so an unchanged one is bound as it is."""
        jsm = self.js
        with contextlib.suppress(NotFoundError):
            # Cheap, so not the long timeout: asked while a server is dying, the request
            # can go unanswered, and the feed would read nothing until it timed out.
            info = await jsm.consumer_info(self.stream, self.durable, timeout=INFO_TIMEOUT_S)
            c = info.config
            have = set(c.filter_subjects or ([c.filter_subject] if c.filter_subject else []))
            if have == set(self.filters) and c.ack_wait == self.ack_wait:
                return
        try:
            await jsm.add_consumer(self.stream, self.config(), timeout=self.api_timeout)
        except APIError as exc:
            if exc.err_code != WQ_CONSUMER_OVERLAP:
                raise
            # Per-node consumers left by an older hollow fleet (or by a run under the
            # same node ids) own some of these subjects: the work-queue stream allows only
            # one consumer per subject. They are ours: remove them (their unacknowledged
            # messages stay in the stream, and come to this consumer) and try again.
            await self._remove_legacy_consumers(jsm)
            await jsm.add_consumer(self.stream, self.config(), timeout=self.api_timeout)

    async def _remove_legacy_consumers(self, jsm) -> None:
        mine = {subjects.agent_consumer(n) for n in self.node_ids}
        names: list[str] = []
        offset = 0
        while True:
            page = await jsm.consumers_info(self.stream, offset=offset)
            names += [ci.name for ci in page if ci.name in mine]
            offset += len(page)
            if len(page) < 256:
                break
        for name in names:
            with contextlib.suppress(NotFoundError):
                await jsm.delete_consumer(self.stream, name)
                self.migrated += 1
        log.warning(
            "%s: removed %d per-node assignment consumers of its nodes", self.durable, len(names)
        )

    async def _handle(self, msg) -> None:
        self.delivered += 1
        node_id = msg.subject[len(self._prefix) :] if msg.subject.startswith(self._prefix) else ""
        try:
            a = decode_assignments(msg.data)
        except WireError as exc:
            self.rejected += 1
            log.warning("undecodable assignment on %s dropped: %s", msg.subject, exc)
            await _quietly(msg.term())
            return
        if a.node_id != node_id or node_id not in self.node_ids:
            self.rejected += 1
            log.warning("assignment for %s delivered on %s: refused", a.node_id, msg.subject)
            await _quietly(msg.term())
            return
        try:
            self.handler(node_id, a)
        except Exception:
            log.exception("assignment for %s failed; will be redelivered", a.node_id)
            await _quietly(msg.nak(delay=1.0))
            return
        await _quietly(msg.ack())


async def _quietly(settle: Awaitable[None]) -> None:
    """Acknowledging fails on a connection that is reconnecting: the message then comes
    again after the consumer's ack_wait, and the node knows it by task id and attempt."""
    with contextlib.suppress(Exception):
        await settle


def _event_map(ev: TaskEvent) -> dict:
    return {
        "node_id": ev.node_id,
        "job_id": ev.job_id,
        "task_id": ev.task_id,
        "attempt": ev.attempt,
        "state": str(ev.state),
        "ts": ev.ts,
        "exit_code": ev.exit_code,
        "signal": ev.signal,
        "message": ev.message,
        "log_tail": ev.log_tail,
        "refused": ev.refused,
        "verify_key": ev.verify_key,
        "health": ev.health,
        "health_seq": ev.health_seq,
        "ports": ev.ports,
        "progress": ev.progress,
        "v": ev.v,
    }


def _fast_event_encoder() -> Callable[[list[TaskEvent]], bytes]:
    """`encode` for one node's events (one TaskEvent, or a TaskEventBatch of several)
    without the generic walk over their fields (a third of the cost of sending one),
    used only if it gives the very same bytes on a sample."""
    sample = TaskEvent("n", "j", "t", 2, TaskState.FAILED, 1.5, -3, 9, "msg", "tail")

    def fast(evs: list[TaskEvent]) -> bytes:
        if len(evs) == 1:
            return msgpack.packb(_event_map(evs[0]), use_bin_type=True)
        batch = {"node_id": evs[0].node_id, "events": [_event_map(ev) for ev in evs], "v": 1}
        return msgpack.packb(batch, use_bin_type=True)

    def generic(evs: list[TaskEvent]) -> bytes:
        return encode(evs[0] if len(evs) == 1 else TaskEventBatch(evs[0].node_id, tuple(evs)))

    if all(fast(evs) == generic(evs) for evs in ([sample], [sample, sample])):
        return fast
    log.warning("TaskEvent's wire form changed: events are encoded the generic way")
    return generic


# A batch stays well inside the 1 MiB a message may have: an event's two texts may take
# up to 32 KiB as UTF-8, so 64 of them may not.
EVENT_BATCH_BYTES = 512 * 1024


def _message_id(evs: list[TaskEvent]) -> str:
    """The stream's de-duplication id: the same for a message sent again (one event: its
    attempt and state; several: a digest of theirs)."""
    ids = [event_id(ev) for ev in evs]
    if len(ids) == 1:
        return ids[0]
    digest = hashlib.blake2b("|".join(ids).encode(), digest_size=16).hexdigest()
    return f"{evs[0].node_id}:batch:{digest}"


def by_node(keys: Iterable[tuple[str, str, int]], most: int) -> list[list[tuple[str, str, int]]]:
    """Ready attempts (node, task, attempt) grouped by node in the order they became
    ready, at most `most` a group: a message's worth each. An attempt listed twice goes
    once."""
    groups: dict[str, list[list[tuple[str, str, int]]]] = {}
    for key in dict.fromkeys(keys):
        node = groups.setdefault(key[0], [[]])
        if len(node[-1]) == most:
            node.append([])
        node[-1].append(key)
    return [keys for node in groups.values() for keys in node]


class EventPublisher:
    """Task events of many nodes, published concurrently over one connection.

    `send` never waits: it queues the event. A single loop publishes with
    `publish_async` (the ack is a future, not a round trip to wait out), so thousands
    of events are in flight together. Order is kept per task attempt: an attempt's
    next event is sent only after the previous one was acknowledged, so RUNNING is
    stored before SUCCEEDED. The events of one node that are ready together go in one
    message (a `TaskEventBatch`, up to MAX_EVENT_BATCH): a node starting a round's
    tasks reports them in one stream write, not one each. A failed or unanswered
    publish is sent again (same `Nats-Msg-Id`, so a resend whose first copy did land is
    dropped by the server) until it is acknowledged or the publisher stops. `on_acked`
    hears of each event once the stream has it.
    """

    def __init__(
        self,
        js: JetStreamContext,
        region: str,
        *,
        ack_timeout: float = 5.0,
        retry_s: float = 0.5,
        on_acked: Callable[[TaskEvent], None] | None = None,
        site: str = "",
    ) -> None:
        self.on_acked = on_acked
        self.js = js
        self.region = subjects.token(region, "region")
        self.site = subjects.token(site, "site") if site else ""
        self.stream = event_route(self.region, "x", self.site)[1]
        self.ack_timeout = ack_timeout
        self.retry_s = retry_s
        self.sent = 0
        self.acked = 0
        self.retries = 0
        self.messages = 0  # stream messages that carried them
        self._chains: dict[tuple[str, str, int], deque[TaskEvent]] = {}
        self._ready: deque[tuple[str, str, int]] = deque()
        self._resend: deque[list[tuple[str, str, int]]] = deque()  # groups to send again
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self._encode = _fast_event_encoder()

    @property
    def pending(self) -> int:
        """Events queued or in flight, not yet acknowledged."""
        return sum(len(c) for c in self._chains.values())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="events-publisher")

    def send(self, ev: TaskEvent) -> None:
        key = (ev.node_id, ev.task_id, ev.attempt)
        chain = self._chains.get(key)
        if chain is not None:
            chain.append(ev)  # goes once the one before it is acknowledged
            return
        self._chains[key] = deque((ev,))
        self._idle.clear()
        self._ready.append(key)
        self._wake.set()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything sent so far is acknowledged; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def stop(self, flush_timeout: float = 2.0) -> None:
        if self._task is not None and flush_timeout > 0:
            await self.flush(flush_timeout)
        for h in self._timers:
            h.cancel()
        self._timers.clear()
        await cancel_and_wait(self._task)
        self._task = None
        self._ready.clear()
        self._resend.clear()
        self._chains.clear()
        self._idle.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ready or self._resend:
                groups = [*self._resend, *self._take_ready()]
                self._resend.clear()
                for keys in groups:
                    await self._publish(loop, keys)

    def _take_ready(self) -> list[list[tuple[str, str, int]]]:
        ready = [k for k in self._ready if self._chains.get(k)]
        self._ready.clear()
        return by_node(ready, MAX_EVENT_BATCH)

    async def _publish(self, loop, keys: list[tuple[str, str, int]]) -> None:
        evs = [self._chains[k][0] for k in keys]
        data = self._encode(evs)
        if len(data) > EVENT_BATCH_BYTES and len(keys) > 1:
            half = len(keys) // 2  # long texts in many events: in parts, each in bounds
            await self._publish(loop, keys[:half])
            await self._publish(loop, keys[half:])
            return
        try:
            fut = await self.js.publish_async(
                event_route(self.region, evs[0].node_id, self.site)[0],
                data,
                stream=self.stream,
                headers={"Nats-Msg-Id": _message_id(evs)},
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("events of %s not sent: %s", keys[0][0], exc)
            self._retry_later(loop, keys)
            return
        self.sent += len(evs)
        self.messages += 1
        timer = loop.call_later(self.ack_timeout, fut.cancel)
        fut.add_done_callback(lambda f: self._done(loop, keys, f, timer))

    def _done(self, loop, keys, fut: asyncio.Future, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        keys = [k for k in keys if k in self._chains]  # (all gone if stopped meanwhile)
        if not keys:
            return
        if fut.cancelled() or fut.exception() is not None:
            why = "no ack in time" if fut.cancelled() else fut.exception()
            log.debug("events of %s not acknowledged: %s", keys[0][0], why)
            self._retry_later(loop, keys)
            return
        for key in keys:
            chain = self._chains[key]
            self.acked += 1
            ev = chain.popleft()
            if self.on_acked is not None:
                self.on_acked(ev)
            if chain:
                self._ready.append(key)
                self._wake.set()
            else:
                del self._chains[key]
        if not self._chains:
            self._idle.set()

    def _retry_later(self, loop, keys) -> None:
        """Sent again as the same group: the same message with the same de-duplication
        id, so if the first copy did land the server drops this one (regrouped with
        events that became ready meanwhile, it would land twice)."""
        self.retries += 1

        def again() -> None:
            self._timers.discard(handle)
            live = [k for k in keys if k in self._chains]
            if live:
                self._resend.append(live)
                self._wake.set()

        handle = loop.call_later(self.retry_s, again)
        self._timers.add(handle)
