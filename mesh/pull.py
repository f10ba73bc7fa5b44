"""Fetching from a JetStream pull consumer for as long as the process runs.

Agents, hollow fleets and the leader each read one durable consumer (assignments, task
events). A NATS server dying under them is routine: for seconds the consumer has no
leader, so fetches fail with "service unavailable", creating the consumer fails, and
acknowledging a message can fail on a reconnecting connection. None of that may end the
reader: a reader that ends leaves its node's assignments (or the region's task events)
unread while everything else looks healthy. `PullLoop` keeps going through all of it:

- subscribing (which creates or binds the consumer) is retried until it works;
- a fetch that keeps failing for `resubscribe_after_s` drops the subscription and
  subscribes again, so a consumer deleted or a stream recreated meanwhile comes back;
- a handler that raises is logged and the loop goes on: what it did not acknowledge is
  delivered again after the consumer's ack_wait.

Waiting for messages is a fetch of one (a long poll of `wait_s`); whatever else is
ready then comes in one more fetch of up to `batch - 1` that waits `linger_s` at most.
`kick()` ends the wait at once and pulls anew: a site agent's long poll is long (its
pull requests cross the site's link), and one sent while the link was cut may never be
answered, so it is kicked when the link is back. A message the abandoned pull brings
later waits in the subscription's queue for the next fetch, or is redelivered after
the consumer's ack_wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.errors import TimeoutError as NatsTimeout

from mesh.tasks import cancel_and_wait

log = logging.getLogger("mesh.pull")

Subscribe = Callable[[], Awaitable[Any]]  # returns a nats-py pull subscription
Handle = Callable[[list], Awaitable[None]]

RETRY_S = 0.25
WARN_EVERY_S = 10.0


class PullLoop:
    def __init__(
        self,
        name: str,
        subscribe: Subscribe,
        handle: Handle,
        *,
        batch: int,
        wait_s: float,
        linger_s: float,
        resubscribe_after_s: float = 1.0,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.name = name
        self.subscribe = subscribe
        self.handle = handle
        self.batch = batch
        self.wait_s = wait_s
        self.linger_s = linger_s
        self.resubscribe_after_s = resubscribe_after_s
        self.fetch_errors = 0
        self.handler_errors = 0
        self.subscriptions = 0
        self._psub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._waiting: asyncio.Future | None = None  # the long poll in progress
        self.kicks = 0
        self._warned_at = float("-inf")

    async def start(self) -> None:
        """Subscribes once here, so a reader that can subscribe is reading when this
        returns; one that cannot (JetStream without a leader yet) keeps trying."""
        with contextlib.suppress(Exception):
            await self._subscribe()
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self._unsubscribe()

    def kick(self) -> None:
        """End the long poll in progress (if any) and pull anew."""
        if self._waiting is not None and not self._waiting.done():
            self.kicks += 1
            self._waiting.cancel()

    async def _long_poll(self) -> list:
        """A fetch of one for up to `wait_s`; [] when kicked."""
        waiting = self._waiting = asyncio.ensure_future(self._psub.fetch(1, timeout=self.wait_s))
        try:
            await asyncio.wait({waiting})
        finally:
            self._waiting = None
            if not waiting.done():  # this loop itself was cancelled
                waiting.cancel()
        if waiting.cancelled():
            return []
        return waiting.result()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _subscribe(self) -> None:
        try:
            self._psub = await self.subscribe()
        except Exception as exc:
            self._warn("cannot subscribe (will retry): %r", exc)
            raise
        self.subscriptions += 1

    async def _unsubscribe(self) -> None:
        psub, self._psub = self._psub, None
        if psub is not None:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    def _warn(self, what: str, exc: BaseException) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s: " + what, self.name, exc)
        else:
            log.debug("%s: " + what, self.name, exc)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        while True:
            if self._psub is None:
                try:
                    await self._subscribe()
                except Exception:
                    await asyncio.sleep(RETRY_S)
                    continue
            try:
                msgs = await self._long_poll()
                if not msgs:
                    continue  # kicked
            except (TimeoutError, NatsTimeout):
                failing_since = None
                continue
            except Exception as exc:
                self.fetch_errors += 1
                self._warn("fetch failed: %r", exc)
                now = loop.time()
                if failing_since is None:
                    failing_since = now
                elif now - failing_since > self.resubscribe_after_s:
                    failing_since = None
                    await self._unsubscribe()
                await asyncio.sleep(RETRY_S)
                continue
            failing_since = None
            if self.batch > 1:
                # A timeout or an error here only ends the batch early: handle what came.
                with contextlib.suppress(Exception):
                    msgs += await self._psub.fetch(self.batch - 1, timeout=self.linger_s)
            try:
                await self.handle(msgs)
            except Exception:
                self.handler_errors += 1
                log.exception("%s: handling %d messages failed", self.name, len(msgs))
