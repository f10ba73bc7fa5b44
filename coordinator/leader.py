"""The leader's control loops: agent events in, reconcile, assignments out.

Created when a candidate wins the lease and stopped when it loses it. It owns the
log writer (the only way decisions take effect), the events consumer and the
reconcile loop; every task it starts is cancelled by `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import TYPE_CHECKING

from nats.js.api import ConsumerConfig

from coordinator.elastic import WATCHDOG
from coordinator.joblog import Fenced, LogWriter, Unavailable
from coordinator.partitions.loop import PartitionLoop
from coordinator.peers import launchable, launched_spec, launches
from coordinator.pooling import PoolView, preemptions
from coordinator.reconcile import reconcile
from coordinator.records import TaskRecord
from coordinator.reports import Kill, report_outcomes, report_parts, reports_fetch, still_placed
from mesh import subjects
from mesh.codec import WireError, encode
from mesh.pull import PullLoop
from mesh.schema import (
    MAX_ASSIGNMENT_BATCH,
    Assignment,
    AssignmentBatch,
    DuplicateStopped,
    HealthProbe,
    LeaderElected,
    LogEvent,
    TaskEvent,
    TaskPlaced,
    TaskPreemptRequested,
    TaskSpec,
    decode_task_events,
)
from mesh.signing import credit_refusals, sign, sign_batch
from mesh.tasks import cancel_and_wait
from workloads.spec import TaskGroup

if TYPE_CHECKING:
    from coordinator.service import Coordinator

log = logging.getLogger("mesh.leader")

RECONCILE_EVERY_S = 0.5
KILL_RESEND_S = 5.0
MAX_ROUNDS = 20
EVENTS_ACK_WAIT_S = 3.0
# How often the leader reads how far the task events are handled (two JetStream API
# requests): a task a node stopped listing is LOST only after such a check (reconcile).
EVENTS_CHECK_EVERY_S = 1.0
# Agent report messages taken per fetch: each fetch, append and acknowledgement waits
# its turn behind placement rounds on the loop (a cycle took 2-3 s while 50,000 tasks
# were submitted to 5,000 nodes), and each fetch asks the server for at most this many,
# so it bounds the reports taken per second (512 left 25,000 waiting; 2,000 left RUNNING
# 25 s behind placement, 10,000 about 8 s).
EVENTS_BATCH = 10_000
# Reports logged per append, and about as many taken per fetch (a message may carry up
# to MAX_EVENT_BATCH of one node's, so the next fetch asks for as many messages as held
# this many reports in the last): 10,000 hold the loop for about 0.2 s while they are
# decoded, and again while their entry is encoded and folded (measured in process). A
# fetch of more waits in parts, and its last part could pass the 3 s ack_wait.
EVENTS_PER_APPEND = 10_000
PUBLISH_TIMEOUT_S = 10.0
BATCH_BYTES = 512 * 1024  # a batch stays well inside the 1 MiB a message may have


def _wire_size(group: TaskGroup) -> int:
    """About what one run of `group` adds to a batch: its command and env dominate (up
    to 64 KiB each); the rest is a few hundred bytes."""
    return (
        512
        + sum(len(a.encode()) + 8 for a in group.command)
        + sum(len(k.encode()) + len(v.encode()) + 16 for k, v in group.env)
    )


def run_batches(tasks: list[TaskRecord]) -> list[list[TaskRecord]]:
    """The round's runs in messages: per node, in order, at most MAX_ASSIGNMENT_BATCH
    runs and about BATCH_BYTES each (a run bigger than that goes alone)."""
    by_node: dict[str, list[TaskRecord]] = {}
    for t in tasks:
        by_node.setdefault(t.node_id, []).append(t)
    batches: list[list[TaskRecord]] = []
    sizes: dict[int, int] = {}  # per task group: its tasks share one
    for node_tasks in by_node.values():
        batch: list[TaskRecord] = []
        size = 0
        for t in node_tasks:
            est = sizes.get(id(t.group)) or sizes.setdefault(id(t.group), _wire_size(t.group))
            if batch and (len(batch) == MAX_ASSIGNMENT_BATCH or size + est > BATCH_BYTES):
                batches.append(batch)
                batch, size = [], 0
            batch.append(t)
            size += est
        batches.append(batch)
    return batches


def _probe(health) -> HealthProbe | None:
    if health is None:
        return None
    return HealthProbe(
        health.command,
        health.interval_s,
        health.timeout_s,
        health.healthy_after,
        health.unhealthy_after,
    )


class Leader:
    def __init__(self, coord: Coordinator, term: int) -> None:
        self.coord = coord
        self.term = term
        self.state = coord.state
        self.writer = LogWriter(
            coord.js,
            coord.region,
            coord.state,
            term,
            coord.candidate_id,
            on_fenced=self._fenced,
        )
        self.unplaced: dict[str, str] = {}
        self.bad_events = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._events: PullLoop | None = None
        self._kills_sent: dict[tuple[str, str, int], float] = {}
        self._over_counts: dict[str, int] = {}
        self._last_preempt = 0.0
        self._unsent: set[tuple[str, int]] = set()  # placed, assignment not acknowledged
        self._in_doubt: set[tuple[str, int]] = set()  # placed, append outcome unknown
        self._doubt_mark = 0  # writer.appends when the last of them was added
        self._sending: set[asyncio.Task[None]] = set()
        self._sent_again: set[tuple[str, int]] = set()  # resent once after a doubted refusal
        # Partition moves: TTLs of break-glass, and the controller once it is wired in.
        self.partitions = PartitionLoop(self, decide=coord.controlling, hold=coord.controlling.hold)

    async def start(self) -> None:
        """Catch up with the log, then claim it with a fenced LeaderElected entry."""
        await self.coord.follower.catch_up()
        self.writer.start()
        await self.writer.append([LeaderElected(self.term, self.coord.candidate_id, time.time())])
        self.coord.sites.seed(self.state)  # before any node's silence is judged
        self._seed_unheard_nodes()
        await self._republish_placed()
        self._events = self._events_reader()
        await self._events.start()
        self._tasks = [
            asyncio.create_task(self._reconcile_loop(), name="leader-reconcile"),
            asyncio.create_task(self._check_events_loop(), name="leader-events-check"),
            asyncio.create_task(self.partitions.run(), name="leader-partitions"),
        ]

    async def stop(self) -> None:
        if self._events is not None:
            await self._events.stop()
            self._events = None
        for task in [*self._tasks, *self._sending]:
            await cancel_and_wait(task)
        self._tasks = []
        await self.writer.stop()

    def _publish_in_background(self, tasks: list[TaskRecord]) -> None:
        """Send a round's assignments without waiting for their acknowledgements, so the
        next round is placed while the stream stores these (a large region's stream can
        take seconds to acknowledge thousands). What is not acknowledged goes to
        `_unsent` and is sent again; publish_async's own limit on messages in flight is
        the back-pressure."""
        task = asyncio.create_task(self._publish_runs(tasks), name="leader-assign")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def wake(self) -> None:
        self._wake.set()

    async def _fenced(self) -> None:
        log.warning("%s was fenced off the job log: stepping down", self.coord.candidate_id)
        asyncio.get_running_loop().call_soon(
            lambda: asyncio.ensure_future(self.coord.step_down(self.term))
        )

    def _seed_unheard_nodes(self) -> None:
        """Nodes holding tasks that this candidate never heard from: start their clock
        now, so if they stay silent they go DOWN and their tasks are LOST."""
        now = time.monotonic()
        for node_id in self.state.node_tasks:
            self.coord.cluster.expect(node_id, now)

    # ------------------------------------------------------------ reconcile

    async def _reconcile_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RECONCILE_EVERY_S)
            self._wake.clear()
            try:
                await self.reconcile_once()
            except (Fenced, Unavailable) as exc:
                log.warning("reconcile: %s", exc)
                await asyncio.sleep(0.2)
            except Exception:
                # A bug must not leave the region without placement: log it, go on.
                log.exception("reconcile round failed")
                await asyncio.sleep(0.2)

    async def reconcile_once(self) -> None:
        if self._in_doubt and self.writer.appends > self._doubt_mark:
            # A later append was acknowledged: none of these can land any more (it
            # expected the log's last sequence), so the state now tells which did, and
            # those are sent like any unacknowledged assignment.
            self._unsent |= self._in_doubt
            self._in_doubt = set()
        if self._unsent:
            self._resend_unsent()
        records = self.coord.sites.round(self.state)  # before nodes' silence is judged
        if records:
            await self.writer.append(records)
        for _ in range(MAX_ROUNDS):
            self.coord.cluster.sweep(time.monotonic())
            now = time.time()
            # On the loop: the placement config's per-round budget and window bound it.
            d = reconcile(self.state, self.coord.cluster, now, self.coord.config.placement)
            self.unplaced = d.unplaced
            if d.kills:
                await self._send_kills(d.kills)
            if not d.events and d.pools is not None:
                d.events = self._preemptions(d.pools, now)
            elif d.pools is None:
                self._over_counts = {}
            if not d.events:
                return
            placed = [ev for ev in d.events if isinstance(ev, TaskPlaced)]
            for ev in d.events:
                if isinstance(ev, DuplicateStopped):
                    log.warning("task %s on node %s: %s", ev.task_id, ev.node_id, ev.message)
                elif isinstance(ev, TaskPreemptRequested) and ev.reason.startswith(WATCHDOG):
                    log.warning("task %s: %s", ev.task_id, ev.reason)  # (elastic.stalled)
            try:
                await self.writer.append(d.events)
            except Unavailable:
                # It may have landed anyway (then applied by the follower or the writer)
                # with its assignments never sent.
                self._in_doubt.update((ev.task_id, ev.attempt) for ev in placed)
                self._doubt_mark = self.writer.appends
                raise
            if placed:
                self._publish_in_background([self.state.tasks[ev.task_id] for ev in placed])

    # ------------------------------------------------------------ assignments

    def _preemptions(self, view: PoolView, now: float) -> list[LogEvent]:
        """One preemption cycle every `preempt_every_s`: hysteresis counts cycles, not
        reconcile rounds (those run on every event)."""
        mono = time.monotonic()
        if mono - self._last_preempt < self.coord.config.preempt_every_s:
            return []
        self._last_preempt = mono
        events, self._over_counts = preemptions(
            self.state, view, self._over_counts, self.coord.config.preempt_cycles, now
        )
        for ev in events:
            log.info("%s", ev.reason)
        return list(events)

    def _run_assignment(
        self, t: TaskRecord, specs: dict | None = None, peers: dict | None = None
    ) -> Assignment:
        """`specs`: TaskSpecs made so far in this send, so the runs of one group share one
        object, which signing then converts once (see signing.batch_signed_bytes).
        `peers`: per job, its peers as made so far in this send (a training job's runs).
        Raises AddressUnknown when a peer's address is not known yet."""
        g = t.group
        job = self.state.jobs[t.job_id]
        health = job.spec.health if t.checked else None
        key = (id(g), job.spec.max_run_time_s, t.gpu_uuids, health)
        spec = None if specs is None else specs.get(key)
        if launches(job, t):
            # Its own argv, env, files and ports: never shared (a training job's peers).
            spec = launched_spec(job, t, self.coord.cluster.nodes, _probe(health), peers)
        if spec is None:
            probe = _probe(health)
            spec = TaskSpec(
                argv=g.command,
                env=dict(g.env),
                workdir=g.workdir,
                resources=g.resources,
                simulate=g.simulate,
                max_run_time_s=job.spec.max_run_time_s,
                gpu_uuids=t.gpu_uuids,
                health=probe,
            )
            if specs is not None:
                specs[key] = spec
        retries = 0 if job.spec.is_service else job.spec.restart.max_retries - t.failures
        return Assignment(
            "run", t.node_id, t.job_id, t.task_id, t.attempt, self.term, time.time(), spec,
            retries_left=max(0, retries),
        )  # fmt: skip

    async def _publish_runs(self, tasks: list[TaskRecord], again: bool = False) -> None:
        """One message per node (up to MAX_ASSIGNMENT_BATCH runs), not one per task.
        `again`: under message ids of their own, so the stream does not drop them as
        repeats of what was sent before."""
        batches = self._launchable(run_batches(tasks))
        items = []
        specs: dict = {}  # the groups stay alive in the state while this runs: ids hold
        peers: dict = {}
        for batch in batches:
            runs = tuple(self._run_assignment(t, specs, peers) for t in batch)
            keys = sorted(f"{a.task_id}:{a.attempt}" for a in runs)
            # The same runs sent again are one message to the stream's de-duplication.
            msg_id = "runs:" + hashlib.sha1("\n".join(keys).encode()).hexdigest()
            if again:
                msg_id = f"again:{self.term}:{msg_id}"
            items.append((AssignmentBatch(runs[0].node_id, runs), msg_id))
        keyed = [[(t.task_id, t.attempt) for t in b] for b in batches]  # attempts move on
        sent = await self._send(items)
        for keys, ok in zip(keyed, sent, strict=True):
            if ok:
                self._unsent.difference_update(keys)
            else:
                self._unsent.update(keys)

    def _launchable(self, batches: list[list[TaskRecord]]) -> list[list[TaskRecord]]:
        """The batches less the runs whose peers' addresses are not known yet (nodes a
        new leader has not heard): those wait in `_unsent` for a later round."""
        out, waiting = launchable(self.state, batches, self.coord.cluster.nodes)
        for (tid, attempt), why in waiting.items():
            log.info("run of %s#%d waits: %s", tid, attempt, why)
            self._unsent.add((tid, attempt))
        return out

    def _resend_unsent(self) -> None:
        """Placements whose assignment did not reach the stream: send them again while
        they are still this attempt's (a message id makes a repeat harmless)."""
        due = still_placed(self.state, self._unsent)
        self._unsent = {(t.task_id, t.attempt) for t in due}
        if due:
            self._publish_in_background(due)

    async def _republish_placed(self) -> None:
        """A previous leader may have logged a placement and died before sending it."""
        placed = [
            t for tid in sorted(self.state.tasks) if (t := self.state.tasks[tid]).state == "PLACED"
        ]
        if placed:
            await self._publish_runs(placed)

    async def _send_kills(self, kills: list[Kill]) -> None:
        now = time.monotonic()
        due = []
        for k in kills:
            key = (k.node_id, k.task_id, k.attempt)
            if now - self._kills_sent.get(key, -KILL_RESEND_S) >= KILL_RESEND_S:
                self._kills_sent[key] = now
                due.append(k)
        if len(self._kills_sent) > 10_000:
            self._kills_sent = {
                k: v for k, v in self._kills_sent.items() if now - v < KILL_RESEND_S
            }
        await self._send(
            [
                (
                    Assignment(
                        "kill", k.node_id, k.job_id, k.task_id, k.attempt, self.term, time.time()
                    ),
                    f"kill:{k.task_id}:{k.attempt}:{int(now)}",
                )
                for k in due
            ]
        )

    async def _send(self, items: list[tuple[Assignment | AssignmentBatch, str]]) -> list[bool]:
        """Publish assignments pipelined (one acknowledgement each, thousands in flight,
        not one round trip after another); True for each the stream acknowledged."""
        if not items:
            return []
        js = self.coord.js
        loop = asyncio.get_running_loop()
        stream = subjects.assign_stream(self.coord.region)
        key = self.coord.signing_key
        futures: list[asyncio.Future | None] = []
        for i, (a, msg_id) in enumerate(items):
            if key is not None:
                # Last thing before it leaves: a resend is signed afresh.
                a = sign_batch(a, key) if isinstance(a, AssignmentBatch) else sign(a, key)
            if i % 1024 == 1023:
                # Rarely: a round's sends run between its placement rounds, and a yield
                # here waits out a whole round (64 per yield held a 5,000-node region
                # to 43 messages/s). The lease does not need the loop (LeaseThread).
                await asyncio.sleep(0)
            try:
                # No wait_stall: with one, nats-py waits for its semaphore through
                # asyncio.wait_for, which yields to the loop on every message, free or
                # not, and each yield waited out a placement round (a 5,000-node region
                # sent 40 messages/s, assignments reaching nodes two minutes late). A
                # full semaphore still waits, for acknowledgements or for the timers
                # below to give up on them.
                fut = await js.publish_async(
                    subjects.assign(self.coord.region, a.node_id),
                    encode(a),
                    stream=stream,
                    headers={"Nats-Msg-Id": msg_id},
                )
            except Exception as exc:
                log.warning("assignment %s to %s not sent: %s", msg_id, a.node_id, exc)
                fut = None
            else:
                loop.call_later(PUBLISH_TIMEOUT_S, fut.cancel)
            futures.append(fut)
        pending = [f for f in futures if f is not None]
        if pending:
            await asyncio.wait(pending, timeout=PUBLISH_TIMEOUT_S)
        sent = []
        for (_, msg_id), fut in zip(items, futures, strict=True):
            ok = fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None
            if fut is not None and not fut.done():
                fut.cancel()
            if not ok:
                log.warning("assignment %s not acknowledged; will resend", msg_id)
            sent.append(ok)
        return sent

    # ------------------------------------------------------------ agent events

    def _events_reader(self) -> PullLoop:
        c = self.coord

        async def subscribe():
            return await c.js.pull_subscribe(
                subjects.events_all(c.region),
                durable=subjects.events_consumer(),
                stream=subjects.events_stream(c.region),
                # A new leader gets what its predecessor fetched but never acknowledged
                # after this long, so keep it short.
                config=ConsumerConfig(ack_wait=EVENTS_ACK_WAIT_S, max_ack_pending=4 * EVENTS_BATCH),
            )

        return PullLoop(
            "leader-events",
            subscribe,
            self._handle_events,
            batch=EVENTS_BATCH,
            wait_s=1.0,
            linger_s=0.002,
        )

    async def _check_events_loop(self) -> None:
        """Keeps the cluster's `events_*` current: the stream's last sequence, read
        first, then the sequence up to which the leaders' consumer acknowledged every
        event. A check that fails (JetStream away) leaves the last one standing, so no
        task is declared forgotten on what cannot be read."""
        c = self.coord
        stream = subjects.events_stream(c.region)
        while True:
            await asyncio.sleep(EVENTS_CHECK_EVERY_S)
            check = c.cluster.events_check_started()
            try:
                last = (await c.js.stream_info(stream)).state.last_seq
                info = await c.js.consumer_info(stream, subjects.events_consumer())
            except Exception as exc:
                log.debug("events check failed: %r", exc)
                continue
            c.cluster.events_checked_at(check, last, info.ack_floor.stream_seq)

    async def _handle_events(self, msgs) -> None:
        # In the stream's order, which is each node's: a fetch hands a message this
        # consumer delivered before (to a leader that died, or naked) after newer ones.
        msgs = sorted(msgs, key=lambda m: m.metadata.sequence.stream)
        decoded = [self._events_of(msg) for msg in msgs]
        for part in report_parts([len(events) for events in decoded], EVENTS_PER_APPEND):
            if not await self._log_reports([(msgs[k], decoded[k]) for k in part]):
                for later in msgs[part.stop :]:
                    with contextlib.suppress(Exception):
                        await later.nak(delay=0.5)
                return
        if self._events is not None:
            reports = sum(map(len, decoded))
            self._events.batch = reports_fetch(reports, len(msgs), EVENTS_PER_APPEND, EVENTS_BATCH)
        self.wake()

    def _doubted(self, refusals: list[TaskEvent]) -> None:
        """Refusals of runs this leader signed with the key the node verifies with: what
        the node refused was not this leader's run (a forgery naming the attempt, or an
        earlier leader's, unsigned or under another key). The attempt is not failed; its
        run is sent once more, signed, under a new message id, in case the node never
        had this leader's (a repeat of one it had is ignored by its store)."""
        again = []
        for ev in refusals:
            key = (ev.task_id, ev.attempt)
            t = self.state.tasks.get(ev.task_id)
            placed_here = t is not None and (t.node_id, t.attempt) == (ev.node_id, ev.attempt)
            log.warning(
                "node %s refused %s#%d (%s) though this leader's run of it verifies there: "
                "a forgery on its assignment subject, or an earlier leader's run; %s",
                ev.node_id,
                ev.task_id,
                ev.attempt,
                ev.refused,
                "sending it again" if placed_here and key not in self._sent_again else "ignored",
            )
            if placed_here and key not in self._sent_again:
                self._sent_again.add(key)
                again.append(key)
        due = still_placed(self.state, again)  # not once it runs: it did arrive
        if due:
            task = asyncio.create_task(self._publish_runs(due, again=True), name="leader-again")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    def _events_of(self, msg) -> tuple[TaskEvent, ...]:
        """The events a message carries, or none if it is bad or speaks for another node
        than its subject's."""
        try:
            node_id, events = decode_task_events(msg.data)
        except WireError as exc:
            self.bad_events += 1
            log.warning("bad task event dropped: %s", exc)
            return ()
        if not subjects.is_token(node_id) or subjects.events(self.coord.region, node_id) != (
            msg.subject
        ):
            self.bad_events += 1
            log.warning("task events for %s arrived on %s: dropped", node_id, msg.subject)
            return ()
        return events

    async def _log_reports(self, chunk) -> bool:
        """Log what these messages' events mean, then acknowledge the messages; False
        if they could not be logged (then they come again)."""
        events, doubted = credit_refusals((ev for _, evs in chunk for ev in evs), self.coord.signer)
        if doubted:
            self._doubted(doubted)
        updates, stale = report_outcomes(self.state, events)
        if updates:
            try:
                await self.writer.append(updates)
            except Fenced:
                return False  # stepping down: the next leader gets them after ack_wait
            except Unavailable as exc:
                log.warning("events not logged, will be redelivered: %s", exc)
                for msg, _ in chunk:
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=0.5)
                return False
        for msg, _ in chunk:
            with contextlib.suppress(Exception):
                await msg.ack()
        if stale:
            await self._send_kills(stale)
        return True
