"""Leader election on a JetStream KV key: a lease with a term that fences writes.

Campaign = `create` (succeeds only if the key is absent); renew = `update` at the
revision we hold; any failed renewal, or no successful renewal for most of a TTL,
means we step down at once — a leader that cannot prove its lease must assume it
lost it. The key's lifetime is the bucket's TTL (nats-py's `update` takes no
per-message TTL), so a holder that dies stops renewing and the key expires. A
graceful stop deletes the key; followers watch it and campaign immediately.

The term is the revision at which the lease was won: revisions grow with the
bucket's stream, so a later leader always has a larger term.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from mesh.logs import Throttle, fields
from mesh.refusals import Refused
from mesh.streams import raise_replicas
from mesh.tasks import cancel_and_wait

log = logging.getLogger("mesh.lease")

Callback = Callable[[int], Awaitable[None]]


class Lease:
    """Campaigns for `key` in `bucket`; calls `on_elected(term)` / `on_lost(term)`."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        key: str,
        holder: str,
        *,
        ttl: float = 2.0,
        on_elected: Callback | None = None,
        on_lost: Callback | None = None,
        replicas: int = 1,
        healthy: Callable[[], bool] | None = None,
    ) -> None:
        self.js = js
        self.healthy = healthy  # False: do not lead (see LeaseThread)
        self.bucket = bucket
        self.key = key
        self.holder = holder
        self.ttl = ttl
        self.renew_every = ttl / 4
        # A watch wakes followers at once on a graceful hand-over (delete). An expiry is
        # found by polling `create`: a bucket with expiry markers would announce it, but
        # then `create` is refused until the marker itself expires (a second later).
        self.poll_every = min(0.25, ttl / 8)
        self.replicas = replicas
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.term: int | None = None  # set while we lead
        self._rev = 0
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._seen_leader = ""  # the holder last seen by the watch (for the log)
        self._throttle = Throttle(30.0)

    @property
    def is_leader(self) -> bool:
        return self.term is not None

    async def start(self) -> None:
        self._kv = await open_lease_bucket(self.js, self.bucket, self.ttl, self.replicas)
        self._task = asyncio.create_task(self._run(), name=f"lease:{self.holder}")
        self._watch_task = asyncio.create_task(self._watch(), name=f"lease-watch:{self.holder}")

    async def stop(self) -> None:
        """Hand over gracefully: delete the key so a follower takes over at once."""
        for task in (self._task, self._watch_task):
            await cancel_and_wait(task)
        if self.term is not None and self._kv is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._release(), 1.0)
            await self._lose()

    async def _release(self) -> None:
        """Delete the key if it is still ours. A renewal cut short by cancellation may have
        landed without us seeing its revision, so look the revision up rather than trust it."""
        assert self._kv is not None
        entry = await self._kv.get(self.key)
        if entry.value == self.holder.encode() and entry.operation is None:
            await self._kv.delete(self.key, last=entry.revision)

    async def current_holder(self) -> str | None:
        assert self._kv is not None
        try:
            entry = await self._kv.get(self.key)
        except (NotFoundError, KeyError):
            return None
        if entry.value is None or entry.operation is not None:
            return None
        return entry.value.decode()

    async def _run(self) -> None:
        while True:
            if self.term is None:
                await self._campaign()
            else:
                await self._renew()

    async def _campaign(self) -> None:
        assert self._kv is not None
        try:
            if self.healthy is not None and not self.healthy():
                raise RuntimeError("not healthy: no campaign")
            rev = await self._kv.create(self.key, self.holder.encode())
        except KeyWrongLastSequenceError:
            rev = None
        except Refused as exc:  # not ours to fix by retrying: say so, now and then
            if self._throttle.allow("campaign", time.monotonic()) is not None:
                log.warning("%s cannot campaign: %s", self.holder, exc.message)
            rev = None
        except Exception as exc:  # server away: keep trying
            log.debug("campaign failed: %s", exc)
            rev = None
        if rev is None:
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_every)
            return
        self._rev = rev
        self.term = rev
        self._renewed_at = time.monotonic()
        log.info(
            "%s won the lease (term %d)",
            self.holder,
            rev,
            extra=fields(event="lease_won", holder=self.holder, term=rev),
        )
        if self.on_elected:
            await self.on_elected(rev)

    async def _renew(self) -> None:
        assert self._kv is not None
        await asyncio.sleep(self.renew_every)
        # Renewals race the TTL: if we have not renewed for most of a TTL, the key may be
        # gone and another candidate may lead, so stop acting as leader now.
        budget = self.ttl * 0.75 - (time.monotonic() - self._renewed_at)
        try:
            if budget <= 0:
                raise TimeoutError("lease not renewed within its TTL")
            if self.healthy is not None and not self.healthy():
                raise RuntimeError("the process it leads for has stalled")
            self._rev = await asyncio.wait_for(
                self._kv.update(self.key, self.holder.encode(), last=self._rev), budget
            )
            self._renewed_at = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "%s lost the lease (term %s): %s",
                self.holder,
                self.term,
                exc,
                extra=fields(event="lease_lost", holder=self.holder, term=self.term),
            )
            await self._lose()

    async def _lose(self) -> None:
        term, self.term = self.term, None
        if term is not None and self.on_lost:
            await self.on_lost(term)

    def _follow(self, entry: Any) -> None:
        """Log who leads when that changes, as seen by a candidate that does not."""
        holder = (entry.value or b"").decode(errors="replace")
        if holder and holder != self.holder and holder != self._seen_leader:
            log.info(
                "%s follows %s",
                self.holder,
                holder,
                extra=fields(event="following", leader=holder, revision=entry.revision),
            )
        self._seen_leader = holder

    async def _watch(self) -> None:
        """Wake the campaign loop when the key is deleted (graceful hand-over)."""
        assert self._kv is not None
        while True:
            watcher = None
            try:
                watcher = await self._kv.watch(self.key, include_history=False)
                async for entry in watcher:
                    if entry is None or entry.operation is not None:
                        self._wake.set()
                    else:
                        self._follow(entry)
            except asyncio.CancelledError:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
                raise
            except Exception as exc:
                log.debug("lease watch restarting: %s", exc)
                await asyncio.sleep(0.5)


async def open_lease_bucket(
    js: JetStreamContext, bucket: str, ttl: float, replicas: int = 1
) -> KeyValue:
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError:
        pass
    else:
        # Created earlier with fewer replicas: else the lease lives on one server and
        # the region has no leader while that server is down.
        await raise_replicas(js, f"KV_{bucket}", replicas)
        return kv
    try:
        return await js.create_key_value(bucket=bucket, ttl=ttl, history=1, replicas=replicas)
    except BadRequestError:  # another candidate created it meanwhile
        return await js.key_value(bucket)


class LeaseThread:
    """A `Lease` campaigned and renewed from a thread of its own, with its own event loop
    and NATS connection; `on_elected` / `on_lost` run on the caller's loop.

    Why: a leader's loop that places a large backlog, or decodes thousands of node
    heartbeats a second, is busy for a second or more at a time. A lease renewed on that
    loop expires during such a stretch and the region changes leader for nothing (11
    elections in one 5,000-node run). The thread gets the interpreter every switch
    interval (5 ms) however busy the loop is. What keeps this honest is `stall_s`: the
    caller's loop ticks a clock every `tick_s`, and a lease whose loop has not ticked for
    `stall_s` is neither renewed nor campaigned for, so a hung process loses the region
    within `stall_s + ttl`. Safety never rested on the renewal: every write is fenced by
    the term (expected-last-sequence and the writer's term check).
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        bucket: str,
        key: str,
        holder: str,
        *,
        ttl: float = 2.0,
        on_elected: Callback | None = None,
        on_lost: Callback | None = None,
        replicas: int = 1,
        stall_s: float = 15.0,
        tick_s: float = 0.1,
    ) -> None:
        self._connect = connect
        self._args = (bucket, key, holder)
        self.ttl = ttl
        self.replicas = replicas
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.stall_s = stall_s
        self.tick_s = tick_s
        self.lease: Lease | None = None
        self._ticked = time.monotonic()
        self._main: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ticker: asyncio.Task[None] | None = None

    @property
    def term(self) -> int | None:
        return None if self.lease is None else self.lease.term

    @property
    def is_leader(self) -> bool:
        return self.term is not None

    def _healthy(self) -> bool:
        return time.monotonic() - self._ticked < self.stall_s

    async def _tick(self) -> None:
        while True:
            self._ticked = time.monotonic()
            await asyncio.sleep(self.tick_s)

    async def start(self) -> None:
        """Returns once the lease has started campaigning; raises what stopped it."""
        self._main = asyncio.get_running_loop()
        self._ticked = time.monotonic()
        self._ticker = asyncio.create_task(self._tick(), name="lease-tick")
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._serve(ready)),
            name=f"lease:{self._args[2]}",
            daemon=True,
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(ready)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Hand over gracefully (the lease deletes its key); `on_lost` runs before this
        returns if we led."""
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        await cancel_and_wait(self._ticker)
        self._ticker = None

    async def _serve(self, ready: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        nc = None
        try:
            nc = await self._connect()
            self.lease = Lease(
                nc.jetstream(timeout=5.0),
                *self._args,
                ttl=self.ttl,
                on_elected=self._elected,
                on_lost=self._lost,
                replicas=self.replicas,
                healthy=self._healthy,
            )
            await self.lease.start()
        except BaseException as exc:
            ready.set_exception(exc)
            if nc is not None:
                await nc.close()
            return
        ready.set_result(None)
        try:
            await self._stop.wait()
        finally:
            await self.lease.stop()
            with contextlib.suppress(Exception):
                await nc.close()

    async def _elected(self, term: int) -> None:
        # Not awaited: taking over (catching up with the log) may take longer than a
        # renewal period, and the lease must go on renewing meanwhile. The callbacks
        # run in order on the caller's loop; `on_lost` for this term comes after.
        self._call(self.on_elected, term)

    async def _lost(self, term: int) -> None:
        done = self._call(self.on_lost, term)
        if done is not None and self._stop is not None and self._stop.is_set():
            # Stopping: let the caller's step-down finish before stop() returns.
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(done)

    def _call(self, cb: Callback | None, term: int) -> concurrent.futures.Future | None:
        if cb is None or self._main is None or self._main.is_closed():
            return None
        return asyncio.run_coroutine_threadsafe(cb(term), self._main)
