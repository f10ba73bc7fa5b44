"""The federation's I/O shell: forwarding jobs between regions, thin over the pure core.

Owned by the Coordinator and run only while it leads (`start(leader)` / `stop()`):

- **Transport, store and forward.** Each region's leader reads its own inbox stream
  (`FED_<region>`, subjects `mesh.fed.in.<region>.<sender>`, in its own cluster) through
  one durable consumer shared by successive leaders, and acknowledges a message only
  after acting on it (its effect logged). A message to region R is a JetStream publish
  into R's inbox with `Nats-Msg-Id = dedup_id(msg)`, kept in an outbox and published
  again every tick until R's stream acknowledges it: a cut gateway delays a message,
  never loses it, and a repeat is dropped by the stream's de-duplication. Nothing of a
  region's job log crosses; a nomination and a confirm carry the job's spec.
- **Durability.** Every transition of a home's or a holder's record is logged in this
  region's job log first (`FedHomeRecorded`, `FedHoldRecorded`; folded by
  `coordinator/state.py`), then its messages are sent. A new leader resumes from the
  fold and repeats what is owed (`epochs.resend`, `holder.report`), so an outbox lost
  with a leader is repaired by the repeats (README.md beside this file, "Idempotence").
- **The loop** (every `TICK_S`): per job of this region that may spill, the core's
  `spill.tick` over views built from the region summaries (`Coordinator.board`); per job
  held for another region, a reservation's expiry or the run's end (`holder.finish`).

A bad message is counted (`bad`), logged and dropped; it never stops the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from coordinator.federation import epochs, holder, spill
from coordinator.federation.epochs import HomeRecord, HomeStep, Phase
from coordinator.federation.fold import hold_event, hold_of, home_event, home_of, policy_of
from coordinator.federation.holder import Hold, HolderRecord, HolderStep
from coordinator.federation.messages import (
    Admitted,
    Confirm,
    Finished,
    GaveUp,
    Message,
    Nominate,
    Refused,
    Revoke,
    dedup_id,
)
from coordinator.federation.model import RegionView
from coordinator.federation.summary import (
    FRESH,
    UNREACHABLE,
    RegionSummary,
    demand_of,
    fits,
    status,
    summarize,
)
from coordinator.joblog import Fenced, Unavailable
from coordinator.pools.default import job_pool
from mesh import subjects
from mesh.codec import WireError, encode
from mesh.fedschema import MAX_FED_BATCH, FedBatch, FedMessage, decode_fed_batch
from mesh.pull import PullLoop
from mesh.schema import JobKillRequested, JobSubmitted, LogEvent
from mesh.streams import DUPLICATE_WINDOW_S
from mesh.tasks import cancel_and_wait
from workloads.lifecycle import JobState
from workloads.quantity import SpecError
from workloads.spec import JobSpec, parse_job_spec

if TYPE_CHECKING:
    from coordinator.leader import Leader
    from coordinator.service import Coordinator

log = logging.getLogger("mesh.coordinator.federation")

TICK_S = 0.1  # the loop's period: spill decisions, time-outs, outbox (a spill is due to the tick)
RESYNC_S = 5.0  # repeat what is owed (nominations unanswered, what a holder holds)
PUBLISH_TIMEOUT_S = 2.0
INBOX_MAX_AGE_S = 7 * 24 * 3600.0
MAX_OUTBOX = 100_000
ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)
TO_HOLDER = ("nominate", "confirm", "revoke")
LIVE_HOLDS = (str(Hold.RESERVED), str(Hold.RUNNING))


class NotYet(Exception):
    """A message this leader cannot judge yet: it is delivered again shortly."""


@dataclasses.dataclass
class _Pass:
    """The transitions of one pass (an inbox batch, or a tick): logged in one append, then
    their messages sent. A later decision of the same pass sees the records decided
    earlier in it (`home`, `held`), which the fold has not seen yet. One append a pass
    rather than one per message is what lets a burst of forwards go at hundreds a second."""

    events: list[LogEvent] = dataclasses.field(default_factory=list)
    send: list[Message] = dataclasses.field(default_factory=list)
    home: dict[str, HomeRecord] = dataclasses.field(default_factory=dict)
    held: dict[str, HolderRecord] = dataclasses.field(default_factory=dict)
    summary: RegionSummary | None = None  # this region's, once per pass (not per message)


def inbox_config(region: str, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=subjects.fed_stream(region),
        subjects=[subjects.fed_inbox_all(region)],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
        max_age=INBOX_MAX_AGE_S,
        max_msgs=1_000_000,
    )


def to_wire(msg: Message, spec: dict | None = None, ts: float = 0.0) -> FedMessage:
    """The core's message as it crosses (`spec`: with a nomination or confirm)."""
    kind = {
        Nominate: "nominate",
        Confirm: "confirm",
        Revoke: "revoke",
        Admitted: "admitted",
        Refused: "refused",
        GaveUp: "gave_up",
        Finished: "finished",
    }[type(msg)]
    return FedMessage(
        kind=kind,
        job=msg.job,
        epoch=msg.epoch,
        home=msg.home,
        holder=msg.holder,
        running=getattr(msg, "running", False),
        reason=getattr(msg, "reason", "")[:1024],
        outcome=getattr(msg, "outcome", "")[:64],
        spec=spec if kind in ("nominate", "confirm") else None,
        ts=ts,
    )


def to_core(m: FedMessage) -> Message:
    args = {"job": m.job, "epoch": m.epoch, "home": m.home, "holder": m.holder}
    if m.kind == "nominate":
        return Nominate(**args)
    if m.kind == "confirm":
        return Confirm(**args)
    if m.kind == "revoke":
        return Revoke(**args, reason=m.reason)
    if m.kind == "admitted":
        return Admitted(**args, running=m.running)
    if m.kind == "refused":
        return Refused(**args, reason=m.reason)
    if m.kind == "gave_up":
        return GaveUp(**args, reason=m.reason)
    return Finished(**args, outcome=m.outcome)


class FedLink:
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.region = coord.region
        self.config = coord.config.federation
        self.leader: Leader | None = None
        self.outbox: dict[str, tuple[str, FedMessage]] = {}  # dedup id -> (region, message)
        self.bad = 0  # messages dropped: undecodable, misaddressed, for no known job
        self.sent = 0
        self.received = 0
        self._pull: PullLoop | None = None
        self._task: asyncio.Task | None = None
        self._last_resync = 0.0
        self._since = 0.0  # (monotonic) when this term's link started
        # Jobs the tick found over for good (done, or ended without leaving home): a tick
        # every 0.1 s must not walk every job that ever could spill.
        self._closed: set[str] = set()
        self._next_due = 0.0  # (wall clock) the earliest a waiting job's spill is due
        self._batches: dict[str, tuple[str, tuple[str, ...]]] = {}  # id -> (region, keys)
        self._batched: dict[str, str] = {}  # outbox key -> the batch it travels in

    # ------------------------------------------------------------ lifecycle

    async def start(self, leader: Leader) -> None:
        js = self.coord.js
        try:
            await js.add_stream(inbox_config(self.region, self.coord.config.replicas))
        except BadRequestError:
            pass  # there already, with another config: its subjects are what matter
        self.leader = leader
        self._since = time.monotonic()
        self._pull = PullLoop(
            "fed-inbox", self._subscribe, self._handle, batch=256, wait_s=1.0, linger_s=0.002
        )
        await self._pull.start()
        self._resync(everything=True)
        self._task = asyncio.create_task(self._loop(), name="fed-link")

    async def stop(self) -> None:
        if self._pull is not None:
            await self._pull.stop()
            self._pull = None
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self.leader = None
        self.outbox.clear()  # what is owed is in the log: the next leader repeats it
        self._batches.clear()
        self._batched.clear()

    async def _subscribe(self):
        return await self.coord.js.pull_subscribe(
            subjects.fed_inbox_all(self.region),
            durable=subjects.fed_consumer(),
            stream=subjects.fed_stream(self.region),
            config=ConsumerConfig(ack_wait=5.0, max_ack_pending=1024),
        )

    async def _loop(self) -> None:
        while True:
            # Wake at the tick, or sooner when a job's wait at home ends before it: a
            # spill is due `after` from its queueing, not at the next tick after that.
            await asyncio.sleep(max(0.0, min(TICK_S, self._next_due - time.time())))
            try:
                await self.tick()
            except (Fenced, Unavailable) as exc:
                log.warning("federation tick: %s", exc)
            except Exception:
                log.exception("federation tick failed")

    # ------------------------------------------------------------ inbox

    async def _handle(self, msgs: list) -> None:
        batch = _Pass()
        done, again = [], []
        for msg in msgs:
            try:
                await self._receive(msg, batch)
            except NotYet:
                again.append(msg)
                continue
            except Exception:
                self.bad += 1
                log.exception("federation message dropped: handling failed")
            done.append(msg)
        try:
            await self._commit(batch)
        except (Fenced, Unavailable) as exc:
            log.warning("federation messages not acted on, will come again: %s", exc)
            again, done = again + done, []
        for msg in again:
            with contextlib.suppress(Exception):
                await msg.nak(delay=0.5)
        for msg in done:
            with contextlib.suppress(Exception):
                await msg.ack()
        await self._flush()

    async def _receive(self, msg, batch: _Pass) -> None:
        sender = subjects.fed_inbox_sender(self.region, msg.subject)
        try:
            items = decode_fed_batch(msg.data)
        except WireError as exc:
            self.bad += 1
            log.warning("bad federation message on %s dropped: %s", msg.subject, exc)
            return
        for m in items:
            to_holder = m.kind in TO_HOLDER
            ours, theirs = (m.holder, m.home) if to_holder else (m.home, m.holder)
            if ours != self.region or theirs != sender:
                self.bad += 1  # a region may only speak for itself, to the region it names
                log.warning(
                    "federation %s for %s/%s from %s dropped", m.kind, m.home, m.job, sender
                )
                continue
            self.received += 1
            if to_holder:
                self._as_holder(m, batch)
            else:
                self._as_home(m, batch)

    def _as_home(self, m: FedMessage, batch: _Pass) -> None:
        state = self.coord.state
        job = state.jobs.get(m.job)
        if job is None or m.job not in state.federated:
            self.bad += 1
            log.warning("federation %s from %s for unknown job %s dropped", m.kind, m.holder, m.job)
            return
        rec = self._home_record(job.job_id, batch)
        msg = to_core(m)
        step = epochs.handle(rec, msg, time.time())  # type: ignore[arg-type]
        self._record_home(rec, step, batch)

    def _as_holder(self, m: FedMessage, batch: _Pass) -> None:
        state = self.coord.state
        now = time.time()
        rec = batch.held.get(m.job)
        if rec is None and m.job in state.fed_held:
            rec = hold_of(state.fed_held[m.job])
        if rec is None and m.job in state.jobs or rec is not None and rec.home != m.home:
            # This region has a job of that id of its own (or another home's): not ours.
            reason = f"job id {m.job} is taken in {self.region}"
            if m.kind == "nominate":
                self._send(Refused(m.job, m.epoch, m.home, m.holder, reason))
            elif m.kind == "confirm":
                self._send(GaveUp(m.job, m.epoch, m.home, m.holder, reason))
            return
        msg = to_core(m)
        fits_here = False
        spec = None
        if (
            m.kind == "nominate"
            and time.monotonic() - self._since < self.coord.config.suspect_after
        ):
            # A new leader has not heard from its nodes yet: it would refuse for no room.
            raise NotYet()
        if m.kind in ("nominate", "confirm"):
            spec = self._guest_spec(m.spec)
            fits_here = spec is not None and self._fits_here(spec, now, batch)
        step = holder.receive(rec, msg, fits_here, now)  # type: ignore[arg-type]
        if step.start is not None and spec is None:
            step = holder.give_up(step.record, "its spec is not valid here", now)
        self._record_hold(rec, step, batch, spec)

    def _guest_spec(self, source: Any) -> JobSpec | None:
        """Another region's job spec as it runs here: in this region's pool for it (`/`
        is `/default` here once pools are defined); None if it does not parse or no
        such leaf pool is here."""
        try:
            spec = parse_job_spec(source)
        except SpecError as exc:
            log.warning("forwarded spec refused: %s", exc)
            return None
        pools = self.coord.state.pools
        pool = job_pool(pools, spec.pool)
        if pool not in pools or not pools.is_leaf(pool):
            return None
        return dataclasses.replace(spec, pool=pool)

    def _fits_here(self, spec: JobSpec, now: float, batch: _Pass) -> bool:
        """Admission from this region's own state now (as its summary says it), summed
        up once a pass: a burst of nominations is judged against the same room."""
        if batch.summary is None:
            batch.summary = summarize(self.coord.state, self.coord.cluster, now)
        return fits(batch.summary, demand_of(spec))

    # ------------------------------------------------------------ records

    def _home_record(self, job_id: str, batch: _Pass) -> HomeRecord:
        if job_id in batch.home:
            return batch.home[job_id]
        state = self.coord.state
        job = state.jobs[job_id]
        ev = state.fed_home.get(job_id)
        policy = policy_of(job.spec)
        if ev is None:
            return epochs.new_job(job_id, self.region, policy, job.submitted_at)
        return home_of(ev, policy)

    async def _commit(self, batch: _Pass) -> None:
        """Log the pass's transitions, then queue what they send (logged first: a message
        sent for a transition a new leader would not know of could not be repeated)."""
        if batch.events:
            leader = self.leader
            if leader is None:
                raise Unavailable("not leading")
            await leader.writer.append(batch.events)
            leader.wake()
        for msg in batch.send:
            self._send(msg)

    def _record_home(self, rec: HomeRecord, step: HomeStep, batch: _Pass) -> None:
        if step.record != rec:
            log.info("federation: job %s: %s", rec.job, step.why)
            batch.events.append(home_event(step.record, step.why, time.time()))
            batch.home[rec.job] = step.record
        batch.send.extend(step.send)

    def _record_hold(
        self,
        rec: HolderRecord | None,
        step: HolderStep,
        batch: _Pass,
        spec: JobSpec | None = None,
    ) -> None:
        now = time.time()
        if step.record != rec:
            log.info("federation: held job %s: %s", step.record.job, step.why)
            batch.events.append(hold_event(step.record, step.why, now))
            batch.held[step.record.job] = step.record
        if step.stop is not None:
            job = self.coord.state.jobs.get(step.stop.job)
            if job is not None and not job.kill_requested and job.state not in ENDED:
                batch.events.append(JobKillRequested(job.job_id, now, step.stop.reason[:1024]))
        if step.start is not None and spec is not None:
            r = step.record
            client = f"fed:{r.home}:{r.job}:{r.epoch}"[:256]
            batch.events.append(JobSubmitted(r.job, client, spec.to_dict(), now))
        batch.send.extend(step.send)

    # ------------------------------------------------------------ the loop

    async def tick(self) -> None:
        now = time.time()
        state = self.coord.state
        batch = _Pass()
        next_due = now + TICK_S
        for job_id in sorted(state.federated - self._closed):
            job = state.jobs.get(job_id)
            if job is None or self.leader is None:
                continue
            rec = self._home_record(job_id, batch)
            if rec.phase is Phase.DONE or (rec.phase is Phase.LOCAL and job.state in ENDED):
                self._closed.add(job_id)
                continue
            if job.kill_requested:
                if rec.phase is not Phase.LOCAL:
                    self._record_home(rec, epochs.cancel(rec, job.kill_reason, now), batch)
                continue
            queued = job_id in state.waiting and job.pending == len(job.tasks)
            after = rec.policy.spill_after
            if queued and rec.phase is Phase.LOCAL and after is not None:
                due = rec.queued_since + after
                if due > now:
                    next_due = min(next_due, due)
            step = spill.tick(rec, self._views(job.spec, now), self.config, now, queued=queued)
            self._record_home(rec, step, batch)
        for ev in list(state.fed_held.values()):
            if ev.phase not in LIVE_HOLDS:  # (a plain string test: most are long over)
                continue
            rec = hold_of(ev)
            if rec.phase is Hold.RESERVED:
                self._record_hold(rec, holder.expire_reservation(rec, self.config, now), batch)
            elif rec.phase is Hold.RUNNING:
                job = state.jobs.get(rec.job)
                if job is not None and job.state in ENDED:
                    self._record_hold(rec, holder.finish(rec, str(job.state), now), batch)
        self._next_due = next_due
        await self._commit(batch)
        if now - self._last_resync >= RESYNC_S:
            self._resync()
        await self._flush()

    def _views(self, spec: JobSpec, now: float) -> dict[str, RegionView]:
        """What this region knows of each region the job names, from their summaries:
        fresh, reachable (heard within the board's `unreachable_s`), whether the job fits
        the room the summary reports, when it was last heard."""
        board = self.coord.board
        cfg = self.coord.config.summaries
        demand = demand_of(spec)
        views = {}
        for region in spec.regions:
            s = board.latest.get(region)
            if region == self.region or s is None:
                continue
            st = status(s, now, cfg.max_age_s, cfg.unreachable_s)
            views[region] = RegionView(
                region,
                fresh=st == FRESH,
                reachable=st != UNREACHABLE,
                fits=fits(s, demand),
                last_heard=s.ts,
            )
        return views

    def _resync(self, everything: bool = False) -> None:
        """Repeat what is owed: unanswered nominations (home); what this region holds for
        others (holder: the home confirms or revokes it); at a new leader's start, every
        record's last word, in case its predecessor's outbox died with it."""
        self._last_resync = time.time()
        state = self.coord.state
        for job_id, ev in list(state.fed_home.items()):
            job = state.jobs.get(job_id)
            if job is not None:
                for msg in epochs.resend(home_of(ev, policy_of(job.spec))):
                    self._send(msg)
        for ev in list(state.fed_held.values()):
            rec = hold_of(ev)
            if everything or rec.phase in (Hold.RESERVED, Hold.RUNNING):
                self._send(holder.report(rec))

    # ------------------------------------------------------------ outbox

    def _send(self, msg: Message) -> None:
        to_holder = isinstance(msg, Nominate | Confirm | Revoke)
        to = msg.holder if to_holder else msg.home
        spec = None
        if isinstance(msg, Nominate | Confirm):
            job = self.coord.state.jobs.get(msg.job)
            spec = job.spec.to_dict() if job is not None else None
            if spec is None:
                return
        if len(self.outbox) >= MAX_OUTBOX:
            log.warning("federation outbox full: %s not sent (it is repeated later)", msg)
            return
        self.outbox[dedup_id(msg)] = (to, to_wire(msg, spec, time.time()))

    async def _flush(self) -> None:
        """Publish everything owed, a batch per region (up to MAX_FED_BATCH messages),
        at once; keep what no stream acknowledged. A batch keeps its messages until it
        is acknowledged and is re-sent as the same batch under the same id: a publish
        that reached the stream but whose acknowledgement was lost is then dropped by the
        stream's de-duplication, as a single message's repeat is (a message is stored
        once, however often it was sent)."""
        if not self.outbox:
            return
        fresh: dict[str, list[str]] = {}
        for key, (to, _) in self.outbox.items():
            if key not in self._batched:
                fresh.setdefault(to, []).append(key)
        for to, keys in fresh.items():
            for i in range(0, len(keys), MAX_FED_BATCH):
                chunk = tuple(sorted(keys[i : i + MAX_FED_BATCH]))
                digest = hashlib.sha256("\n".join(chunk).encode()).hexdigest()[:32]
                bid = f"batch:{digest}"
                self._batches[bid] = (to, chunk)
                for key in chunk:
                    self._batched[key] = bid
        pending = list(self._batches.items())
        results = await asyncio.gather(
            *(self._publish_batch(bid, to, keys) for bid, (to, keys) in pending),
            return_exceptions=True,
        )
        for (bid, (_, keys)), ok in zip(pending, results, strict=True):
            if ok is not True:
                continue
            self._batches.pop(bid, None)
            for key in keys:
                self._batched.pop(key, None)
                if self.outbox.pop(key, None) is not None:
                    self.sent += 1

    async def _publish_batch(self, bid: str, to: str, keys: tuple[str, ...]) -> bool:
        items = tuple(self.outbox[k][1] for k in keys if k in self.outbox)
        if not items:
            return True
        return await self._publish(bid, to, encode(FedBatch(items)))

    async def _publish(self, key: str, to: str, data: bytes) -> bool:
        try:
            await self.coord.js.publish(
                subjects.fed_inbox(to, self.region),
                data,
                timeout=PUBLISH_TIMEOUT_S,
                headers={"Nats-Msg-Id": key},
            )
        except Exception as exc:  # the region is away, or its stream is: next tick
            log.debug("federation %s to %s not sent yet: %r", key, to, exc)
            return False
        return True
