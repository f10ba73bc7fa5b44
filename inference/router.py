"""The inference router: the thin async shell around ``inference.router_core``.

One ``RouterCore`` per model, over that model's live workers (each worker is one "GPU"
whose profile is the one it announced; its worker id doubles as its GPU type, so every
worker plans with its own measured line). The shell:

- takes client requests on ``mesh.<r>.infer.*`` (queue group: routers share the load),
  turns each deadline into this process's monotonic clock, submits it to the core;
- runs ``core.step`` once per event-loop pass (arrivals are coalesced, never stepped
  one by one) and at ``core.next_wakeup_ns`` (one ``call_at`` per model);
- applies decisions: a ``Drop`` is answered ``DEADLINE`` at once; a ``Dispatch`` is one
  NATS message to the worker with every input, its reply comes back on this router's
  inbox and fans out to the clients;
- never serves late: a result that arrives after a request's deadline is answered
  ``DEADLINE`` instead; a batch whose worker fails or goes silent is re-submitted to the
  core (another worker serves it if its deadline still allows, else it is dropped);
- keeps workers from their hellos, forgets one silent for 3 intervals or on goodbye.

All outgoing messages go through one outbox drained by one task, so the hot path does
no per-request await. Everything here is owned by ``Router`` and cancelled in ``stop``.

``python -m inference.router --nats URL --region R`` runs one as a process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import struct
import time
from dataclasses import dataclass, field

import msgpack
from nats.aio.client import Client
from nats.aio.msg import Msg

from inference.decisions import Dispatch, Gpu, ModelSpec, Request
from inference.profile import LatencyProfile
from inference.router_core import RouterConfig, RouterCore
from inference.wire import (
    BAD_REQUEST,
    DEADLINE,
    LATE_MESSAGE,
    NO_WORKERS,
    WORKER_FAILED,
    BatchDone,
    BatchReply,
    ConnectionArgs,
    WireError,
    WorkerHello,
    add_connection_args,
    add_event_loop_arg,
    connection_args,
    decode,
    error_bytes,
    hello_subject,
    infer_all,
    ok_bytes,
    parse_infer_request,
    run,
    worker_subject,
)
from mesh.codec import from_wire, unpack
from mesh.connect import ClientTls, close_quietly
from mesh.subjects import SubjectError, token

log = logging.getLogger("inference.router")

QUEUE_GROUP = "mesh-infer-routers"
_packb = msgpack.Packer(use_bin_type=True).pack
_DROPPED = error_bytes(DEADLINE, "deadline cannot be met")
_LATE = error_bytes(DEADLINE, LATE_MESSAGE)
_NO_WORKERS = error_bytes(NO_WORKERS, "no live worker serves this model")
_OVERLOADED = error_bytes(DEADLINE, "deadline cannot be met: the router is overloaded")


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """The shell's knobs. ``dispatch_lead_ms``: time from deciding to the batch starting
    on a worker (one NATS hop); ``reply_margin_ms``: reserved for the result's way back
    to the client, taken off every deadline; ``batch_slack_ms``: how long past its
    planned end a batch may be before its worker is presumed dead."""

    url: str
    region: str = "local"
    name: str = "router"
    tls: ClientTls | None = None  # on a secure mesh: CA, client cert/key, inbox prefix
    inbox_prefix: str = "_INBOX"  # where batch replies come back (tls's, when set)
    default_slo_ms: float = 100.0
    dispatch_lead_ms: float = 2.0
    reply_margin_ms: float = 2.0
    batch_slack_ms: float = 50.0
    sweep_s: float = 0.25
    rebuild_drift: float = 0.25  # re-plan when a worker's profile moves by this fraction
    rebuild_floor_ms: float = 0.5  # ... and by at least this much (a 50 us batch is noise)
    # Requests waiting in the client library's queue beyond this are answered at once,
    # undecoded: under overload, serving the queue in order only reaches requests whose
    # deadlines have passed, and goodput collapses (receive livelock).
    shed_backlog: int = 512
    # "direct": workers answer each client themselves and send the router one BatchDone
    # per batch (the router never touches a result); "router": results come back to the
    # router in one BatchReply and it answers (a worker then needs no permission to
    # publish to client inboxes). See docs/inference_nats.md.
    answers: str = "direct"

    def __post_init__(self) -> None:
        if self.answers not in ("direct", "router"):
            raise ValueError(f"answers is 'direct' or 'router', not {self.answers!r}")


class _Worker:
    """A worker as the router plans with it: its announced profile plus the measured
    round-trip overhead (NATS hops, its queueing), which the worker cannot see."""

    __slots__ = (
        "a_ns",
        "b_ns",
        "dev_ns",
        "hello",
        "id",
        "last_batch",
        "last_seen",
        "max_batch",
        "over_ns",
        "planned_over_ns",
        "timeouts",
        "ttl",
    )

    def __init__(self, hello: WorkerHello, now: float) -> None:
        self.id = hello.worker_id
        self.hello = hello
        self.a_ns, self.b_ns, self.max_batch = hello.a_ns, hello.b_ns, hello.max_batch
        self.last_seen = now
        self.ttl = 3 * hello.interval_s
        self.last_batch = -1
        self.timeouts = 0
        self.over_ns = 0.0  # EWMA of (round trip - exec time)
        self.dev_ns = 0.0  # EWMA of its absolute deviation
        self.planned_over_ns = 0

    def observe(self, rtt_ns: int, exec_ns: int) -> None:
        x = max(0, rtt_ns - exec_ns)
        err = x - self.over_ns
        self.over_ns += 0.05 * err
        self.dev_ns += 0.05 * (abs(err) - self.dev_ns)

    def overhead(self) -> int:
        return int(self.over_ns + 3 * self.dev_ns)

    def profile(self) -> LatencyProfile:
        self.planned_over_ns = self.overhead()
        return LatencyProfile(
            max(self.a_ns + self.planned_over_ns, 1_000), self.b_ns, self.max_batch
        )


@dataclass
class _Route:
    """One model: its workers, its core, the requests queued in the core."""

    model: str
    slo_ns: int
    in_bytes: int = 0  # bytes of one input, as the workers announce it (0: any)
    workers: dict[str, _Worker] = field(default_factory=dict)
    core: RouterCore | None = None
    queued: dict[int, int] = field(default_factory=dict)  # request id -> deadline (mono ns)
    stepping: bool = False
    timer: asyncio.TimerHandle | None = None
    timer_at: int | None = None


@dataclass
class _Batch:
    id: int
    route: _Route
    worker_id: str
    rids: tuple[int, ...]
    end_ns: int
    sent_ns: int
    direct: bool
    timer: asyncio.TimerHandle | None = None


class Router:
    """Deadline-batching router for one region. ``start``/``stop`` own every task."""

    def __init__(self, settings: RouterSettings, nc: Client | None = None) -> None:
        self.s = settings
        self.nc = nc
        self._own_nc = nc is None
        self._lead = int(settings.dispatch_lead_ms * 1e6)
        self._margin = int(settings.reply_margin_ms * 1e6)
        self._slack = int(settings.batch_slack_ms * 1e6)
        self._floor = max(1, int(settings.rebuild_floor_ms * 1e6))
        self._routes: dict[str, _Route] = {}
        # rid -> (reply subject, input, deadline on our monotonic clock less the reply
        # margin, the client's deadline in unix ns)
        self._pending: dict[int, tuple[str, bytes, int, int]] = {}
        self._direct = settings.answers == "direct"
        self._batches: dict[int, _Batch] = {}
        self._next_rid = 0
        self._next_batch = 0
        self._outbox: list[tuple[str, bytes, str]] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._subs: list = []
        self._inbox = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats: dict[str, int] = dict(
            received=0,
            bad=0,
            ok=0,
            dropped=0,
            late=0,
            no_workers=0,
            worker_failed=0,
            redispatched=0,
            batches=0,
            batched_requests=0,
            batch_failures=0,
            hellos=0,
            bad_hellos=0,
            rebuilds=0,
            shed=0,
            worker_bad=0,
            served_after_give_up=0,
        )

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> Router:
        self._loop = asyncio.get_running_loop()
        if self.nc is None:
            conn = ConnectionArgs(self.s.url, self.s.region, self.s.tls, self.s.inbox_prefix)
            self.nc = await conn.connect(f"infer-{self.s.name}")
        nc = self.nc
        # One wildcard subscription for every batch reply, under the connection's inbox
        # prefix (nats-py's new_inbox uses it): the only replies a secure mesh lets us take.
        self._inbox = nc.new_inbox()
        self._subs = [
            await nc.subscribe(hello_subject(self.s.region), cb=self._on_hello),
            await nc.subscribe(
                f"{self._inbox}.*", cb=self._on_batch_reply, pending_msgs_limit=1_000_000
            ),
        ]
        self._req_sub = await nc.subscribe(
            infer_all(self.s.region),
            queue=QUEUE_GROUP,
            cb=self._on_request,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=512 * 1024 * 1024,
        )
        self._subs.append(self._req_sub)
        await nc.flush()
        self._tasks = [
            asyncio.create_task(self._flusher(), name="router-flusher"),
            asyncio.create_task(self._sweeper(), name="router-sweeper"),
        ]
        return self

    async def stop(self) -> None:
        """Stop taking requests, answer every one still held, then leave."""
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs = []
        for route in self._routes.values():
            self._cancel_timer(route)
        for b in self._batches.values():
            if b.timer is not None:
                b.timer.cancel()
        self._batches.clear()
        for rid in list(self._pending):
            self._answer(rid, error_bytes("UNAVAILABLE", "router stopping"))
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        with contextlib.suppress(Exception):
            await self._drain_outbox()
            await self.nc.flush(timeout=1)
        if self._own_nc and self.nc is not None:
            await close_quietly(self.nc)

    def workers(self, model: str) -> list[str]:
        route = self._routes.get(model)
        return sorted(route.workers) if route else []

    # ------------------------------------------------------------- the outbox

    def _send(self, subject: str, data: bytes, reply: str = "") -> None:
        self._outbox.append((subject, data, reply))
        if len(self._outbox) == 1:
            self._wake.set()

    def _answer(self, rid: int, data: bytes) -> None:
        p = self._pending.pop(rid, None)
        if p is not None:
            self._send(p[0], data)

    async def _drain_outbox(self) -> None:
        while self._outbox:
            out, self._outbox = self._outbox, []
            publish = self.nc.publish
            for subject, data, reply in out:
                try:
                    await publish(subject, data, reply=reply)
                except Exception as exc:  # a closed or reconnecting connection
                    log.warning("publish to %s failed: %s", subject, exc)

    async def _flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._drain_outbox()

    # ------------------------------------------------------------- requests

    async def _on_request(self, msg: Msg) -> None:
        st = self.stats
        st["received"] += 1
        reply = msg.reply
        if not reply:
            st["bad"] += 1
            return
        backlog = self._req_sub.pending_msgs  # requests behind this one, already received
        if backlog > self.s.shed_backlog:
            st["shed"] += 1
            self._send(reply, _OVERLOADED)
            return
        try:
            data, values, dl_unix, timeout_ms = parse_infer_request(msg.data)
        except WireError as exc:
            st["bad"] += 1
            self._send(reply, error_bytes(BAD_REQUEST, str(exc)[:500]))
            return
        subject = msg.subject
        model = subject[subject.rfind(".") + 1 :]
        route = self._routes.get(model)
        if route is None or route.core is None:
            st["no_workers"] += 1
            self._send(reply, _NO_WORKERS)
            return
        if values:
            data = struct.pack(f"<{len(values)}f", *values)
        if route.in_bytes and len(data) != route.in_bytes:
            st["bad"] += 1
            self._send(
                reply,
                error_bytes(
                    BAD_REQUEST,
                    f"input: model {model} takes {route.in_bytes // 4} float32 "
                    f"({route.in_bytes} bytes), got {len(data)} bytes",
                ),
            )
            return
        now = time.monotonic_ns()
        wall = time.time_ns()
        if dl_unix is None:
            dl_unix = wall + (int(timeout_ms * 1e6) if timeout_ms is not None else route.slo_ns)
        deadline = now + (dl_unix - wall) - self._margin
        rid = self._next_rid
        self._next_rid = rid + 1
        self._pending[rid] = (reply, data, deadline, dl_unix)
        route.queued[rid] = deadline
        route.core.submit(Request(rid, model, now, deadline), now)
        if not backlog:
            # The last request of this burst: plan now rather than on the next loop pass.
            self._step(route)
        elif not route.stepping:
            route.stepping = True
            self._loop.call_soon(self._step, route)

    def _step(self, route: _Route) -> None:
        """Run the core now and apply what it decides; re-arm its timer."""
        route.stepping = False
        core = route.core
        if core is None:
            return
        now = time.monotonic_ns()
        queued = route.queued
        for d in core.step(now):
            if type(d) is Dispatch:
                for rid in d.request_ids:
                    queued.pop(rid, None)
                self._dispatch(route, d)
            else:
                queued.pop(d.request_id, None)
                self.stats["dropped"] += 1
                self._answer(d.request_id, _DROPPED)
        self._arm(route)

    def _arm(self, route: _Route) -> None:
        w = route.core.next_wakeup_ns() if route.core is not None else None
        if w == route.timer_at:
            return
        self._cancel_timer(route)
        if w is not None:
            route.timer_at = w
            route.timer = self._loop.call_at(w / 1e9, self._on_timer, route)

    def _on_timer(self, route: _Route) -> None:
        route.timer = route.timer_at = None
        self._step(route)

    @staticmethod
    def _cancel_timer(route: _Route) -> None:
        if route.timer is not None:
            route.timer.cancel()
        route.timer = route.timer_at = None

    # ------------------------------------------------------------- batches

    def _dispatch(self, route: _Route, d: Dispatch) -> None:
        pending = self._pending
        inputs = []
        rids = []
        replies = []
        dls = []
        min_dl = None
        for rid in d.request_ids:
            p = pending.get(rid)
            if p is None:
                continue
            rids.append(rid)
            inputs.append(p[1])
            replies.append(p[0])
            dls.append(p[3])
            if min_dl is None or p[2] < min_dl:
                min_dl = p[2]
        if not rids:
            return
        bid = self._next_batch
        self._next_batch = bid + 1
        direct = self._direct
        batch = _Batch(bid, route, d.gpu_id, tuple(rids), d.end_ns, time.monotonic_ns(), direct)
        w = route.workers.get(d.gpu_id)
        if w is not None:
            w.last_batch = bid
        # Give up on the batch at its earliest deadline (its requests must not wait
        # longer) or when it is long overdue (its worker is then presumed dead).
        give_up = min(d.end_ns + self._slack, min_dl + self._margin // 2)
        batch.timer = self._loop.call_at(give_up / 1e9, self._on_batch_timeout, bid)
        self._batches[bid] = batch
        self.stats["batches"] += 1
        self.stats["batched_requests"] += len(rids)
        # A BatchRequest, encoded as mesh.codec would (field names, lists), built directly.
        body = {"batch_id": bid, "model": route.model, "inputs": inputs, "v": 1}
        if direct:
            body["replies"] = replies
            body["deadlines_unix_ns"] = dls
        self._send(worker_subject(self.s.region, d.gpu_id), _packb(body), f"{self._inbox}.{bid}")

    async def _on_batch_reply(self, msg: Msg) -> None:
        now = time.monotonic_ns()
        try:
            bid = int(msg.subject[msg.subject.rfind(".") + 1 :])
        except ValueError:
            self.stats["bad"] += 1
            return
        batch = self._batches.pop(bid, None)
        if batch is None:
            # Given up on already: its requests were answered or re-submitted. A worker
            # that answered them itself after all says so; the client kept the first.
            if self._direct and not msg.headers:
                with contextlib.suppress(WireError):
                    self.stats["served_after_give_up"] += decode(BatchDone, msg.data).served
            return
        if batch.timer is not None:
            batch.timer.cancel()
        if msg.headers and msg.headers.get("Status") == "503":
            self._batch_failed(batch, now, worker_gone=True)
            return
        try:
            obj = unpack(msg.data)
            # A worker that does not answer clients itself (an older one) sends the
            # outputs back even for a direct batch: then the router answers.
            direct = batch.direct and not (type(obj) is dict and "outputs" in obj)
            rep = from_wire(BatchDone if direct else BatchReply, obj)
        except WireError:
            self.stats["bad"] += 1
            self._batch_failed(batch, now, worker_gone=False)
            return
        n = len(batch.rids)
        if direct:
            ok = rep.ok and rep.served + rep.late + rep.bad == n
        else:
            ok = rep.ok and rep.out_dim > 0 and len(rep.outputs) == n * rep.out_dim * 4
        if not ok:
            log.warning("worker %s failed batch %d: %s", batch.worker_id, bid, rep.error)
            self._batch_failed(batch, now, worker_gone=False)
            return
        route = batch.route
        w = route.workers.get(batch.worker_id)
        if w is not None:
            w.timeouts = 0
            w.observe(now - batch.sent_ns, rep.exec_ns)
        if w is not None and w.last_batch == bid and route.core is not None:
            # Nothing queued behind it on that worker: it is free now, not when planned.
            with contextlib.suppress(ValueError):
                route.core.set_gpu_free_at(batch.worker_id, now)
            self._kick(route)
        pending = self._pending
        st = self.stats
        if direct:
            # The worker answered every request itself (late ones DEADLINE).
            st["ok"] += rep.served
            st["late"] += rep.late
            st["worker_bad"] += rep.bad
            for rid in batch.rids:
                pending.pop(rid, None)
            return
        size = rep.out_dim * 4
        out = memoryview(rep.outputs)
        wid = batch.worker_id
        for i, rid in enumerate(batch.rids):
            p = pending.pop(rid, None)
            if p is None:
                continue
            if now > p[2] + self._margin:
                st["late"] += 1
                self._send(p[0], _LATE)
            else:
                st["ok"] += 1
                self._send(p[0], ok_bytes(bytes(out[i * size : (i + 1) * size]), wid))

    def _on_batch_timeout(self, bid: int) -> None:
        """A batch not back in time. Its worker is presumed dead after two overdue
        batches in a row (one may be this process lagging); a dead worker's next batch
        usually fails at once anyway, with "no responders"."""
        batch = self._batches.pop(bid, None)
        if batch is None:
            return
        now = time.monotonic_ns()
        gone = False
        w = batch.route.workers.get(batch.worker_id)
        if w is not None and now >= batch.end_ns + self._slack:
            w.timeouts += 1
            gone = w.timeouts >= 2
        self._batch_failed(batch, now, worker_gone=gone)

    def _batch_failed(self, batch: _Batch, now: int, worker_gone: bool) -> None:
        """Re-submit what the batch held: another worker may still make the deadlines;
        the core drops (and we answer) whatever can no longer make it."""
        self.stats["batch_failures"] += 1
        route = batch.route
        if worker_gone and route.workers.pop(batch.worker_id, None) is not None:
            log.warning("worker %s presumed dead", batch.worker_id)
            self._rebuild(route)
        if route.core is None:
            for rid in batch.rids:
                if rid in self._pending:
                    self.stats["worker_failed"] += 1
                    self._answer(rid, error_bytes(WORKER_FAILED, "worker failed; none left"))
            return
        for rid in batch.rids:
            p = self._pending.get(rid)
            if p is None:
                continue
            self.stats["redispatched"] += 1
            route.queued[rid] = p[2]
            route.core.submit(Request(rid, route.model, now, p[2]), now)
        self._kick(route)

    def _kick(self, route: _Route) -> None:
        if not route.stepping:
            route.stepping = True
            self._loop.call_soon(self._step, route)

    # ------------------------------------------------------------- workers

    async def _on_hello(self, msg: Msg) -> None:
        try:
            h = decode(WorkerHello, msg.data)
            token(h.worker_id, "worker id")
            token(h.model, "model")
        except (WireError, SubjectError):
            self.stats["bad_hellos"] += 1
            return
        self.stats["hellos"] += 1
        route = self._routes.get(h.model)
        if route is None:
            route = self._routes[h.model] = _Route(h.model, int(h.slo_ms * 1e6))
        if h.stopping:
            if route.workers.pop(h.worker_id, None) is not None:
                self._rebuild(route)
            return
        now = time.monotonic()
        w = route.workers.get(h.worker_id)
        route.slo_ns = int(h.slo_ms * 1e6)
        route.in_bytes = 4 * h.in_dim
        if w is None:
            route.workers[h.worker_id] = _Worker(h, now)
            self._rebuild(route)
            return
        w.last_seen = now
        w.ttl = 3 * h.interval_s
        w.hello = h
        if self._drifted(w, h):
            w.a_ns, w.b_ns, w.max_batch = h.a_ns, h.b_ns, h.max_batch
            self._rebuild(route)

    def _drifted(self, w: _Worker, h: WorkerHello) -> bool:
        if h.max_batch != w.max_batch:
            return True
        old, new = w.a_ns + 8 * w.b_ns, h.a_ns + 8 * h.b_ns  # latency near a typical batch
        return abs(new - old) > max(self.s.rebuild_drift * old, self._floor)

    def _overhead_drifted(self, w: _Worker) -> bool:
        old, new = w.planned_over_ns, w.overhead()
        base = w.a_ns + 8 * w.b_ns + old
        return abs(new - old) > max(self.s.rebuild_drift * base, self._floor)

    def _rebuild(self, route: _Route) -> None:
        """A new core over the live workers (membership or profiles changed), carrying
        over the workers' free times and every queued request."""
        self.stats["rebuilds"] += 1
        old = route.core
        free = old.gpu_free_at() if old is not None else {}
        self._cancel_timer(route)
        if not route.workers:
            route.core = None
            for rid in list(route.queued):
                self.stats["no_workers"] += 1
                self._answer(rid, _NO_WORKERS)
            route.queued.clear()
            return
        ws = sorted(route.workers.values(), key=lambda w: w.id)
        spec = ModelSpec(route.model, route.slo_ns, {w.id: w.profile() for w in ws})
        gpus = [Gpu(w.id, free.get(w.id, 0), gpu_type=w.id) for w in ws]
        core = RouterCore([spec], gpus, RouterConfig(dispatch_lead_ns=self._lead))
        now = time.monotonic_ns()
        for rid, dl in route.queued.items():
            core.submit(Request(rid, route.model, now, dl), now)
        route.core = core
        self._kick(route)

    async def _sweeper(self) -> None:
        """Forget workers silent for 3 hello intervals."""
        while True:
            await asyncio.sleep(self.s.sweep_s)
            now = time.monotonic()
            for route in self._routes.values():
                dead = [w.id for w in route.workers.values() if now - w.last_seen > w.ttl]
                for wid in dead:
                    log.warning("worker %s silent; forgotten", wid)
                    del route.workers[wid]
                drift = any(self._overhead_drifted(w) for w in route.workers.values())
                if dead or drift:
                    self._rebuild(route)


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m inference.router", description="Mesh inference router (deadline batching)"
    )
    add_connection_args(p)
    add_event_loop_arg(p)
    p.add_argument("--name", default="router")
    p.add_argument("--dispatch-lead-ms", type=float, default=2.0)
    p.add_argument("--reply-margin-ms", type=float, default=2.0)
    p.add_argument("--batch-slack-ms", type=float, default=50.0)
    p.add_argument(
        "--answers",
        choices=("direct", "router"),
        default="direct",
        help="who answers clients: the workers directly (default; a worker must "
        "be allowed to publish to client inboxes) or the router",
    )
    return p


def parse_args(argv: list[str] | None = None) -> RouterSettings:
    p = _parser()
    return _config(p, p.parse_args(argv))


def _config(p: argparse.ArgumentParser, a: argparse.Namespace) -> RouterSettings:
    c = connection_args(p, a)
    return RouterSettings(
        url=c.url,
        region=c.region,
        tls=c.tls,
        inbox_prefix=c.inbox_prefix,
        name=a.name,
        dispatch_lead_ms=a.dispatch_lead_ms,
        reply_margin_ms=a.reply_margin_ms,
        batch_slack_ms=a.batch_slack_ms,
        answers=a.answers,
    )


async def serve(settings: RouterSettings) -> None:
    router = await Router(settings).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"router {settings.name} serving region {settings.region}", flush=True)
    await stop.wait()
    await router.stop()
    print(f"router {settings.name} stopped: {router.stats}", flush=True)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    p = _parser()
    a = p.parse_args(argv)
    run(serve(_config(p, a)), a.event_loop)


if __name__ == "__main__":
    main()
