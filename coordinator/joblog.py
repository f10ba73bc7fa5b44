"""The job log's I/O: following it (every candidate) and appending to it (the leader).

Appends are batched — whatever events queue up while one append is in flight go into
the next log entry — and fenced: each carries `Nats-Expected-Last-Sequence` equal to
the last sequence this candidate applied, so a deposed leader's append fails instead
of forking the log. A fenced writer reports it and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError

from coordinator.state import RegionState
from mesh import subjects
from mesh.codec import WireError, decode, encode
from mesh.schema import LogEntry, LogEvent
from mesh.tasks import cancel_and_wait

log = logging.getLogger("mesh.joblog")

MAX_EVENTS_PER_ENTRY = 2000
MAX_ENTRY_BYTES = 3 * 1024 * 1024
WRONG_LAST_SEQUENCE = 10071


class Fenced(Exception):
    """Another writer appended first: this candidate no longer leads."""


class Unavailable(Exception):
    """The append's outcome is unknown (timeout, no server); the caller may retry."""


RESUBSCRIBE_AFTER_S = 1.0  # behind the stream with nothing applied this long: consumer lost


class LogFollower:
    """Applies every entry of the log to `state`, in order, from the start."""

    def __init__(self, js: JetStreamContext, region: str, state: RegionState) -> None:
        self.js = js
        self.region = region
        self.state = state
        self.bad_entries = 0
        self._sub = None
        self._applied = asyncio.Event()

    async def start(self) -> None:
        await self._subscribe()

    async def _subscribe(self) -> None:
        """From the first entry not yet applied. nats-py's ordered consumer notices a lost
        consumer (a restarted server) only after two missed heartbeats, and gives up on a
        re-create that fails (JetStream still recovering) until the next two: with the
        default 5 s heartbeat a takeover waited 20-40 s. So heartbeats every second, and
        `catch_up` subscribes afresh when entries stop coming."""
        self._sub = await self.js.subscribe(
            subjects.job_log(self.region),
            stream=subjects.log_stream(self.region),
            ordered_consumer=True,
            idle_heartbeat=1.0,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self.state.last_seq + 1,
            ),
            cb=self._on_msg,
        )

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.state.last_seq:
            return  # this candidate wrote it (the writer applies on ack): do not decode twice
        try:
            entry = decode(LogEntry, msg.data, max_size=8 * 1024 * 1024)
        except WireError as exc:
            self.bad_entries += 1
            log.error("job log entry %d undecodable, skipped: %s", seq, exc)
            self.state.last_seq = max(self.state.last_seq, seq)
            return
        self.state.apply(seq, entry)
        self._applied.set()

    async def catch_up(self, timeout: float = 10.0) -> None:
        """Wait until everything in the stream now has been applied."""
        info = await self.js.stream_info(subjects.log_stream(self.region))
        target = info.state.last_seq
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet_since = loop.time()
        while self.state.last_seq < target:
            self._applied.clear()
            now = loop.time()
            remaining = deadline - now
            if remaining <= 0:
                raise Unavailable(f"job log catch-up stalled at {self.state.last_seq}/{target}")
            if now - quiet_since >= RESUBSCRIBE_AFTER_S:
                log.info("job log follower quiet at %d/%d: subscribing afresh",
                         self.state.last_seq, target)  # fmt: skip
                with contextlib.suppress(Exception):
                    await self.stop()
                    await self._subscribe()
                quiet_since = loop.time()
            try:
                await asyncio.wait_for(self._applied.wait(), min(remaining, 0.1))
                quiet_since = loop.time()
            except TimeoutError:
                pass


MAX_UNSEEN = 64  # entries a writer reads back to tell its own late appends from a rival's


class LogWriter:
    """The leader's single writer: batches events, appends fenced, applies on ack."""

    def __init__(
        self,
        js: JetStreamContext,
        region: str,
        state: RegionState,
        term: int,
        leader_id: str,
        on_fenced: Callable[[], Awaitable[None]],
    ) -> None:
        self.js = js
        self.region = region
        self.state = state
        self.term = term
        self.leader_id = leader_id
        self.on_fenced = on_fenced
        self._queue: asyncio.Queue[tuple[list[LogEvent], asyncio.Future[int]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.fenced = False
        self.appends = 0  # acknowledged appends: one after a failed one settles its outcome
        # The log's last sequence as this writer knows it; None until its first append
        # (a LeaderElected), which goes after whatever the follower has applied.
        self._known: int | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="log-writer")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        while not self._queue.empty():
            _, fut = self._queue.get_nowait()
            if not fut.done():
                fut.set_exception(Unavailable("leader stepping down"))

    async def append(self, events: list[LogEvent]) -> int:
        """Append events; returns the log sequence once JetStream acknowledged it."""
        if self.fenced:
            raise Fenced("this candidate was fenced off the log")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._queue.put((list(events), fut))
        return await fut

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            count = len(batch[0][0])
            while not self._queue.empty() and count < MAX_EVENTS_PER_ENTRY:
                item = self._queue.get_nowait()
                batch.append(item)
                count += len(item[0])
            events = [ev for evs, _ in batch for ev in evs]
            try:
                seq = await self._write(events)
            except Fenced as exc:
                self.fenced = True
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                await self.on_fenced()
                return
            except Exception as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(Unavailable(str(exc) or type(exc).__name__))
                continue
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(seq)

    async def _write(self, events: list[LogEvent]) -> int:
        entry = LogEntry(term=self.term, leader_id=self.leader_id, events=tuple(events))
        data = encode(entry)
        if len(data) > MAX_ENTRY_BYTES and len(events) > 1:
            half = len(events) // 2
            await self._write(events[:half])
            return await self._write(events[half:])
        # Fence locally first: every leader's first entry is its LeaderElected, so any
        # entry of another writer that the follower applied raises the term it has seen.
        if self.state.term > self.term:
            raise Fenced(f"term {self.state.term} was elected after ours ({self.term})")
        # Expect the log where this writer last knew it, not where the follower has got
        # to: an append whose acknowledgement was lost may land late, and the follower
        # apply it, while the events here were decided without it (a task placed again).
        # The append then fails, the late entry is checked and applied, and the callers
        # decide again on a state that has it.
        expected = self.state.last_seq if self._known is None else self._known
        try:
            ack = await self.js.publish(
                subjects.job_log(self.region),
                data,
                stream=subjects.log_stream(self.region),
                headers={"Nats-Expected-Last-Sequence": str(expected)},
                timeout=5.0,
            )
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            if not await self._moved_by_us(expected):
                raise Fenced(f"log moved past {expected}: another leader wrote") from None
            raise Unavailable("an earlier append landed late: decide again on it") from None
        self.state.apply(ack.seq, entry)
        self._known = ack.seq
        self.appends += 1
        return ack.seq

    async def _moved_by_us(self, expected: int) -> bool:
        """The log moved past `expected` behind our back: was it only our own appends,
        which timed out and landed anyway (a loaded server acknowledges late)? Reads what
        was appended since, and applies what the follower has not, if it is all of our
        term, as an acknowledged append would have been. Another term: fenced."""
        stream = subjects.log_stream(self.region)
        target = (await self.js.stream_info(stream)).state.last_seq
        if target <= expected or target - expected > MAX_UNSEEN:
            return False
        landed = []
        for seq in range(expected + 1, target + 1):
            if seq <= self.state.last_seq:
                continue  # the follower applied it meanwhile
            msg = await self.js.get_msg(stream, seq)
            try:
                entry = decode(LogEntry, msg.data, max_size=8 * 1024 * 1024)
            except WireError:
                return False
            if entry.term != self.term or entry.leader_id != self.leader_id:
                return False
            landed.append((seq, entry))
        for seq, entry in landed:
            if seq > self.state.last_seq:
                self.state.apply(seq, entry)
        self._known = target
        return self.state.term <= self.term
