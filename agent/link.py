"""The agent's side of the wire, shared by real and hollow agents.

- `AssignmentFeed`: pulls this node's assignments from its durable consumer, decodes
  and checks them, and hands each to a handler; a message is acknowledged only after
  the handler returns, so an agent that dies mid-way gets it again (and recognises
  it by task id and attempt).
- `publish_event`: task transitions go to the events stream with a message id made
  of (node, task, attempt, state), so a resend after a crash is de-duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from mesh import subjects
from mesh.codec import WireError, decode, encode
from mesh.schema import Assignment, TaskEvent

log = logging.getLogger("mesh.agent.link")

Handler = Callable[[Assignment], Awaitable[None]]


class AssignmentFeed:
    def __init__(self, js: JetStreamContext, region: str, node_id: str, handler: Handler) -> None:
        self.js = js
        self.region = region
        self.node_id = node_id
        self.handler = handler
        self.rejected = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._psub = await self.js.pull_subscribe(
            subjects.assign(self.region, self.node_id),
            durable=subjects.agent_consumer(self.node_id),
            stream=subjects.assign_stream(self.region),
            config=ConsumerConfig(ack_wait=30.0, max_ack_pending=10_000),
        )
        self._task = asyncio.create_task(self._run(), name=f"assignments:{self.node_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self._psub.unsubscribe()

    async def _run(self) -> None:
        while True:
            try:
                msgs = await self._psub.fetch(1, timeout=1.0)
            except (TimeoutError, NatsTimeout):
                continue
            except Exception as exc:
                log.debug("assignment fetch: %s", exc)
                await asyncio.sleep(0.25)
                continue
            with contextlib.suppress(NatsTimeout, asyncio.TimeoutError):
                msgs += await self._psub.fetch(255, timeout=0.002)
            for msg in msgs:
                await self._handle(msg)

    async def _handle(self, msg) -> None:
        try:
            a = decode(Assignment, msg.data)
        except WireError as exc:
            self.rejected += 1
            log.warning("undecodable assignment dropped: %s", exc)
            await msg.term()
            return
        if a.node_id != self.node_id:
            self.rejected += 1
            log.warning("assignment for %s delivered to %s: refused", a.node_id, self.node_id)
            await msg.term()
            return
        try:
            await self.handler(a)
        except Exception:
            log.exception("assignment %s/%d failed; will be redelivered", a.task_id, a.attempt)
            await msg.nak(delay=1.0)
            return
        await msg.ack()


async def publish_event(js: JetStreamContext, region: str, ev: TaskEvent) -> None:
    """Raises on failure: the caller keeps the transition as unreported and retries."""
    await js.publish(
        subjects.events(region, ev.node_id),
        encode(ev),
        stream=subjects.events_stream(region),
        headers={"Nats-Msg-Id": f"{ev.node_id}:{ev.task_id}:{ev.attempt}:{ev.state}"},
    )
