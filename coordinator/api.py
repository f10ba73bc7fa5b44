"""The request API, served as a NATS micro service on `mesh.<region>.api.*`.

Every candidate serves it. A follower forwards each call to the leader (one subject
only the leader listens on), so a client reads its own writes whoever answers; it
answers reads from its own warm state only while no leader is reachable. Writes
reply only after their event is acknowledged by the job log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import nats.micro
import yaml
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from coordinator import partition_api, training_api
from coordinator.federation import forward
from coordinator.fitting import submit_warning
from coordinator.joblog import MAX_ENTRY_BYTES, Fenced, Unavailable
from coordinator.partitions.membership import allocatable
from coordinator.pooling import pool_rows, pool_view
from coordinator.pools import parse_pool_tree
from coordinator.pools.default import job_pool, with_default_pool
from coordinator.pools.tree import load_pool_source
from coordinator.views import job_detail, job_federation, node_summary
from mesh import jsonwire, subjects
from mesh.codec import WireError, decode, encode, pack
from mesh.logs import Throttle
from mesh.schema import (
    MAX_REQUEST,
    MAX_SPEC_BYTES,
    ApiError,
    ErrorCode,
    JobKillRequested,
    JobListRequest,
    JobRef,
    JobSubmitted,
    JobUpdated,
    KillRequest,
    NodeRef,
    PoolApplyRequest,
    PoolRef,
    PoolsApplied,
    Resources,
    SubmitManyRequest,
    SubmitRequest,
    UpdateRequest,
    error_reply,
    ok,
)
from workloads.lifecycle import JobState
from workloads.quantity import SpecError
from workloads.spec import parse_job_spec

if TYPE_CHECKING:
    from coordinator.service import Coordinator

log = logging.getLogger("mesh.api")

MAX_CONCURRENT = 1024  # requests being answered at once by one candidate
FORWARD_TIMEOUT_S = 5.0
ENDPOINTS = (
    "pool.apply",
    "pool.list",
    "pool.get",
    "job.submit",
    "job.submit_many",
    "job.get",
    "job.list",
    "job.kill",
    "job.update",
    "node.list",
    "node.get",
    "cluster.info",
    "region.list",
    "site.list",
    *partition_api.ENDPOINTS,
    *training_api.ENDPOINTS,
)
WRITES = (
    frozenset({"job.submit", "job.submit_many", "job.kill", "job.update", "pool.apply"})
    | partition_api.WRITES
    | training_api.WRITES
)
VERSION = "0.1.0"


class Api:
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.service: nats.micro.Service | None = None
        self._leader_subs: list[Any] = []
        # client id -> the job it is making and that job's spec, until it is logged
        self._inflight: dict[str, tuple[asyncio.Future[str], Any]] = {}
        self._requests: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self._refusals = Throttle(10.0)  # a refused request is logged, a flood is not
        self.handlers: dict[str, Callable[[bytes], Awaitable[bytes]]] = {
            "job.submit": self.job_submit,
            "job.submit_many": self.job_submit_many,
            "job.get": self.job_get,
            "job.list": self.job_list,
            "job.kill": self.job_kill,
            "job.update": self.job_update,
            "node.list": self.node_list,
            "node.get": self.node_get,
            "cluster.info": self.cluster_info,
            "region.list": self.region_list,
            "site.list": self.site_list,
            "pool.apply": self.pool_apply,
            "pool.list": self.pool_list,
            "pool.get": self.pool_get,
            **partition_api.handlers(self, _decode),
            **training_api.handlers(self, _decode),
        }

    # ------------------------------------------------------------ serving

    async def start(self) -> None:
        c = self.coord
        self.service = await nats.micro.add_service(
            c.nc,
            name=subjects.SERVICE_NAME,
            version=VERSION,
            description=f"Mesh request API, region {c.region}",
            metadata={"region": c.region, "candidate": c.candidate_id},
        )
        group = self.service.add_group(name=subjects.api_prefix(c.region))
        for endpoint in ENDPOINTS:
            await group.add_endpoint(
                name=endpoint.replace(".", "_"),
                subject=endpoint,
                handler=self._micro_handler(endpoint),
            )

    async def stop(self) -> None:
        await self.stop_leading()
        if self.service is not None:
            await self.service.stop()
            self.service = None
        for task in list(self._requests):
            task.cancel()
        await asyncio.gather(*self._requests, return_exceptions=True)

    async def start_leading(self) -> None:
        """Listen on the leader-only subjects that followers forward to."""
        for endpoint in ENDPOINTS:
            sub = await self.coord.nc.subscribe(
                subjects.leader_api(self.coord.region, endpoint),
                queue="leader",
                cb=self._leader_handler(endpoint),
            )
            self._leader_subs.append(sub)

    async def stop_leading(self) -> None:
        subs, self._leader_subs = self._leader_subs, []
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception as exc:
                log.debug("unsubscribe: %s", exc)

    # nats-py runs one subscription's callbacks one at a time. Requests are answered in
    # their own tasks instead, so a slow one (a write forwarded to a dying leader) never
    # holds up the rest, and concurrent submits share one log append.
    def _micro_handler(self, endpoint: str):
        async def handle(req: nats.micro.Request) -> None:
            async def answer() -> None:
                await req.respond(await self.call(endpoint, req.data, True, req.headers))

            await self._spawn(answer())

        return handle

    def _leader_handler(self, endpoint: str):
        async def handle(msg) -> None:
            if not msg.reply:
                return

            async def answer() -> None:
                reply = await self.call(endpoint, msg.data, forward=False)
                await self.coord.nc.publish(msg.reply, reply)

            await self._spawn(answer())

        return handle

    async def _spawn(self, coro) -> None:
        await self._slots.acquire()  # back-pressure: at most MAX_CONCURRENT in flight
        task = asyncio.create_task(coro)
        self._requests.add(task)

        def done(t: asyncio.Task) -> None:
            self._requests.discard(t)
            self._slots.release()
            if not t.cancelled() and t.exception() is not None:
                log.warning("api reply not sent: %s", t.exception())

        task.add_done_callback(done)

    async def call(
        self, endpoint: str, data: bytes, forward: bool, headers: dict[str, str] | None = None
    ) -> bytes:
        """Answer one request, in the form it came in (msgpack, or JSON: see
        mesh.jsonwire); never raises. A JSON request is answered as the msgpack one it
        stands for, so one decoder checks both and a follower forwards msgpack."""
        if not jsonwire.is_json(data, headers):
            return await self._call(endpoint, data, forward, as_json=False)
        reply = await self._call(endpoint, data, forward, as_json=True)
        try:
            return jsonwire.from_msgpack(reply)
        except Exception:
            log.exception("api %s: reply not writable as JSON", endpoint)
            return jsonwire.from_msgpack(
                error_reply(ErrorCode.INTERNAL, "the reply could not be written as JSON")
            )

    def _say_refused(self, endpoint: str, exc: ApiError) -> None:
        """One line per refused request (at most one per endpoint and code every 10 s,
        with how many more were held back), so an operator sees what users are refused."""
        held = self._refusals.allow(f"{endpoint}:{exc.code}", time.monotonic())
        if held is not None:
            more = f" (and {held} more refused so since the last such line)" if held else ""
            log.warning("api %s refused: %s: %s%s", endpoint, exc.code, exc.message, more)

    async def _call(self, endpoint: str, data: bytes, forward: bool, as_json: bool) -> bytes:
        try:
            if len(data) > MAX_REQUEST:
                raise ApiError(
                    ErrorCode.TOO_LARGE,
                    f"request of {len(data)} bytes exceeds the {MAX_REQUEST}-byte limit",
                )
            if as_json:
                try:
                    data = jsonwire.to_msgpack(data)
                except WireError as exc:
                    raise ApiError(ErrorCode.BAD_REQUEST, _request_problem(exc)) from None
            if self.coord.leader is None and forward:
                forwarded = await self._forward(endpoint, data)
                if forwarded is not None:
                    return forwarded
                if endpoint in WRITES:
                    raise ApiError(
                        ErrorCode.NOT_LEADER,
                        "no leader is elected right now; retry in a few seconds",
                    )
            elif self.coord.leader is None and endpoint in WRITES:
                raise ApiError(ErrorCode.NOT_LEADER, "this candidate no longer leads; retry")
            return await self.handlers[endpoint](data)
        except ApiError as exc:
            self._say_refused(endpoint, exc)
            return error_reply(exc.code, exc.message)
        except Exception as exc:
            log.exception("api %s failed", endpoint)
            # What failed is in the coordinator's log; the reply says where, in words
            # (an exception's class name or empty text tells a client nothing).
            detail = f": {exc}" if str(exc).strip() else ""
            return error_reply(
                ErrorCode.INTERNAL,
                f"internal error answering {endpoint}{detail} (the coordinator's log has "
                "the details)",
            )

    async def _forward(self, endpoint: str, data: bytes) -> bytes | None:
        try:
            msg = await self.coord.nc.request(
                subjects.leader_api(self.coord.region, endpoint), data, timeout=FORWARD_TIMEOUT_S
            )
            return msg.data
        except NoRespondersError:
            return None
        except NatsTimeout:
            raise ApiError(
                ErrorCode.UNAVAILABLE, "the leader did not answer in time; retry"
            ) from None

    # ------------------------------------------------------------ writes

    async def job_submit(self, data: bytes) -> bytes:
        req = _decode(SubmitRequest, data)
        parsed = self._parsed_spec(self._checked_client_id(req))
        home = self._home_elsewhere(req.client_id, parsed)
        if home is not None:  # the job's home is its first named region: it is made there
            return encode(await forward.submit(self.coord.nc, home, data))
        spec = self._in_leaf_pool(parsed)
        existing = await self._existing(req.client_id, spec)
        if existing is not None:
            return ok(job_id=existing, duplicate=True)
        warning = self._fit_warning(spec)
        (job_id,) = await self._submit([(req.client_id, spec)])
        return ok(job_id=job_id, duplicate=False, **warning)

    async def job_submit_many(self, data: bytes) -> bytes:
        """Each item is checked alone (a bad spec fails that item, with its index); the
        good ones go to the log in one append."""
        req = _decode(SubmitManyRequest, data)
        results: list[dict[str, Any]] = [{} for _ in req.jobs]
        fresh: list[tuple[int, str, Any]] = []
        away: list[tuple[int, str, SubmitRequest]] = []  # made in their home regions
        seen: dict[str, int] = {}
        for i, item in enumerate(req.jobs):
            try:
                parsed = self._parsed_spec(self._checked_client_id(item))
                if item.client_id in seen:
                    raise ApiError(
                        ErrorCode.BAD_REQUEST,
                        f"client_id: repeats item {seen[item.client_id]} of this request",
                    )
                seen[item.client_id] = i
                home = self._home_elsewhere(item.client_id, parsed)
                if home is not None:
                    away.append((i, home, item))
                    continue
                spec = self._in_leaf_pool(parsed)
                existing = await self._existing(item.client_id, spec)
            except ApiError as exc:
                results[i] = {"error": {"code": str(exc.code), "message": exc.message}}
                continue
            if existing is not None:
                results[i] = {"job_id": existing, "duplicate": True}
            else:
                fresh.append((i, item.client_id, spec))
        if fresh:
            warnings = [self._fit_warning(spec) for _, _, spec in fresh]
            job_ids = await self._submit([(cid, spec) for _, cid, spec in fresh])
            for (i, _, _), job_id, w in zip(fresh, job_ids, warnings, strict=True):
                results[i] = {"job_id": job_id, "duplicate": False, **w}
        if away:
            replies = await asyncio.gather(*(self._forward_item(h, it) for _, h, it in away))
            for (i, _, _), item_reply in zip(away, replies, strict=True):
                results[i] = item_reply
        return ok(results=results)

    async def _forward_item(self, home: str, item: SubmitRequest) -> dict[str, Any]:
        """One item of a submit_many made in its home region: its result as an item's."""
        try:
            reply = await forward.submit(self.coord.nc, home, encode(item))
        except ApiError as exc:
            return {"error": {"code": str(exc.code), "message": exc.message}}
        if reply.get("ok") is not True:
            return {"error": reply.get("error") or {"code": str(ErrorCode.INTERNAL)}}
        return {k: v for k, v in reply.items() if k != "ok"}

    def _home_elsewhere(self, client_id: str, spec) -> str | None:
        """The region a submission goes to when its spec does not name this one
        (coordinator/federation/forward.py); None to make it here."""
        made_here = client_id in self.coord.state.by_client or client_id in self._inflight
        return forward.route(self.coord.region, spec.regions, made_here=made_here)

    def _fit_warning(self, spec) -> dict[str, str]:
        """A job that can never fit the region as it is now is accepted (the region may
        grow), with a `warning` saying why (coordinator/fitting.py)."""
        why = submit_warning(self.coord.state, self.coord.cluster, spec)
        return {} if why is None else {"warning": why}

    def _checked_client_id(self, req: SubmitRequest) -> Any:
        """The request's spec source, once its client id is known to be there."""
        if not req.client_id:
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                "client_id: required (a unique id per submit, reused on retry)",
            )
        return req.spec

    def _valid_spec(self, source: Any):
        """A spec as given (YAML text or a mapping), parsed and put in its leaf pool."""
        return self._in_leaf_pool(self._parsed_spec(source))

    def _parsed_spec(self, source: Any):
        """A spec as given (YAML text or a mapping), within the size limit and parsed;
        its pool is not checked yet (a job made in another region is checked there)."""
        size = _spec_size(source)
        if size > MAX_SPEC_BYTES:
            raise ApiError(
                ErrorCode.TOO_LARGE,
                f"spec of {size} bytes is over the limit of {MAX_SPEC_BYTES} bytes "
                f"({MAX_SPEC_BYTES // 1024} KiB) for one job spec",
            )
        try:
            spec = parse_job_spec(source if source is not None else "")
        except SpecError as exc:
            raise ApiError(ErrorCode.INVALID_SPEC, str(exc)) from None
        return spec

    def _in_leaf_pool(self, spec):
        """The spec in its leaf pool of this region (`/` is `/default` once pools are
        defined); INVALID_SPEC naming the pool when it is not a leaf here."""
        state = self.coord.state
        pool = job_pool(state.pools, spec.pool)  # `/` is `/default` once pools are defined
        if pool != spec.pool:
            spec = dataclasses.replace(spec, pool=pool)
        if spec.pool not in state.pools or not state.pools.is_leaf(spec.pool):
            what = "is not defined" if spec.pool not in state.pools else "has child pools"
            raise ApiError(
                ErrorCode.INVALID_SPEC,
                f"pool: {spec.pool} {what}; jobs go to leaf pools (see `mesh pool list`)",
            )
        return spec

    async def _existing(self, client_id: str, spec: Any) -> str | None:
        """The job a client id already made (or is making), so a retry makes no second;
        CONFLICT if that job's spec is another one (as an idempotency key reused for
        another request is refused elsewhere). A spec's identity is its parsed form: the
        fold keeps every job's (re-parsed from the log's `to_dict`, which parses back
        equal), so the same spec written with other spacing, order or quantities
        (`1000m`, `1`) is the same spec, and no hash needs to be logged."""
        job_id = self.coord.state.by_client.get(client_id)
        if job_id is not None:
            theirs = self.coord.state.jobs[job_id].spec
        elif client_id in self._inflight:
            fut, theirs = self._inflight[client_id]
            job_id = await asyncio.shield(fut)
        else:
            return None
        if theirs != spec:
            raise ApiError(
                ErrorCode.CONFLICT,
                f"client id {client_id} was used for job {job_id} with a different spec; "
                "a new job needs a new client id",
            )
        return job_id

    async def _submit(self, items: list[tuple[str, Any]]) -> list[str]:
        leader = self._leader()
        loop = asyncio.get_running_loop()
        job_ids = [f"{spec.name}-{secrets.token_hex(4)}" for _, spec in items]
        futs: list[asyncio.Future[str]] = []
        for cid, spec in items:
            fut: asyncio.Future[str] = loop.create_future()
            self._inflight[cid] = (fut, spec)
            futs.append(fut)
        now = time.time()
        state = self.coord.state
        for job_id, (_, spec) in zip(job_ids, items, strict=True):
            state.parsed[job_id] = spec
        try:
            await self._append(
                leader,
                [
                    JobSubmitted(job_id, cid, spec.to_dict(), now)
                    for job_id, (cid, spec) in zip(job_ids, items, strict=True)
                ],
            )
            for fut, job_id in zip(futs, job_ids, strict=True):
                fut.set_result(job_id)
        except BaseException as exc:
            for fut in futs:
                fut.set_exception(exc)
                fut.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            for cid, _ in items:
                del self._inflight[cid]
            for job_id in job_ids:
                state.parsed.pop(job_id, None)  # applied, or never will be
        leader.wake()
        return job_ids

    async def job_kill(self, data: bytes) -> bytes:
        req = _decode(KillRequest, data)
        job = self._job(req.job_id)
        if job.state not in (JobState.PENDING, JobState.RUNNING):
            raise ApiError(ErrorCode.CONFLICT, f"job {job.job_id} already ended ({job.state})")
        leader = self._leader()
        if not job.kill_requested:
            await self._append(
                leader,
                [JobKillRequested(job.job_id, time.time(), req.reason or "killed by request")],
            )
            leader.wake()
        return ok(job_id=job.job_id)

    async def job_update(self, data: bytes) -> bytes:
        """`mesh job update`: a running service's new spec, logged as JobUpdated; the
        leader then replaces its replicas one by one (coordinator/services.py). Only a
        service, and only with the same name and kind."""
        req = _decode(UpdateRequest, data)
        job = self._job(req.job_id)
        spec = self._valid_spec(req.spec)
        if not job.spec.is_service:
            raise ApiError(
                ErrorCode.CONFLICT,
                f"job {job.job_id} is a batch job: only a service's spec can be updated "
                "(submit a new job instead)",
            )
        if job.kill_requested or job.state not in (JobState.PENDING, JobState.RUNNING):
            raise ApiError(ErrorCode.CONFLICT, f"job {job.job_id} is killed or ended ({job.state})")
        for name in ("name", "kind"):
            if getattr(spec, name) != getattr(job.spec, name):
                raise ApiError(
                    ErrorCode.CONFLICT,
                    f"{name}: an update cannot change it ({getattr(job.spec, name)!r} -> "
                    f"{getattr(spec, name)!r}); submit a new job instead",
                )
        if spec == job.spec:
            return ok(job_id=job.job_id, generation=job.generation, changed=False)
        leader = self._leader()
        await self._append(leader, [JobUpdated(job.job_id, spec.to_dict(), time.time())])
        leader.wake()
        return ok(job_id=job.job_id, generation=job.generation, changed=True)

    def _leader(self):
        leader = self.coord.leader
        if leader is None:
            raise ApiError(ErrorCode.NOT_LEADER, "this candidate no longer leads; retry")
        return leader

    async def _append(self, leader, events) -> None:
        try:
            await leader.writer.append(events)
        except Fenced:
            raise ApiError(
                ErrorCode.NOT_LEADER, "leadership changed during the write; retry"
            ) from None
        except Unavailable as exc:
            raise ApiError(ErrorCode.UNAVAILABLE, f"job log not writable: {exc}; retry") from None

    # ------------------------------------------------------------ reads

    def _job(self, job_id: str):
        job = self.coord.state.jobs.get(job_id)
        if job is None:
            raise ApiError(ErrorCode.NOT_FOUND, f"no job {job_id!r}")
        return job

    async def job_get(self, data: bytes) -> bytes:
        job = self._job(_decode(JobRef, data).job_id)
        leader = self.coord.leader
        reason = leader.unplaced.get(job.job_id) if leader is not None else None
        fed = job_federation(self.coord.state, self.coord.region, job.job_id)
        return ok(job=job_detail(job, reason, fed))

    async def job_list(self, data: bytes) -> bytes:
        req = _decode(JobListRequest, data or b"\x80")
        if req.state is not None and req.state not in JobState.__members__:
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                f"state: {req.state!r} is not one of {', '.join(JobState.__members__)}",
            )
        jobs = sorted(self.coord.state.jobs.values(), key=lambda j: -j.submit_seq)
        out = []
        for job in jobs:
            if req.pool is not None and job.spec.pool != req.pool:
                continue
            if req.state is not None and job.state != req.state:
                continue
            out.append(job.summary())
            if len(out) >= req.limit:
                break
        return ok(jobs=out, total=len(self.coord.state.jobs))

    async def node_list(self, data: bytes) -> bytes:
        now = time.monotonic()
        views = sorted(self.coord.cluster.nodes.values(), key=lambda v: v.node_id)
        return ok(nodes=[node_summary(v, self.coord.state, now) for v in views])

    async def node_get(self, data: bytes) -> bytes:
        req = _decode(NodeRef, data)
        view = self.coord.cluster.nodes.get(req.node_id)
        if view is None:
            raise ApiError(ErrorCode.NOT_FOUND, f"no node {req.node_id!r}")
        detail = node_summary(view, self.coord.state, time.monotonic())
        detail["task_ids"] = sorted(self.coord.state.node_tasks.get(req.node_id, ()))
        return ok(node=detail)

    async def cluster_info(self, data: bytes) -> bytes:
        c = self.coord
        states = {s: n for s, n in c.state.job_counts.items() if n}
        statuses: dict[str, int] = {}
        for v in c.cluster.nodes.values():
            statuses[v.status] = statuses.get(v.status, 0) + 1
        return ok(
            region=c.region,
            answered_by=c.candidate_id,
            leader=c.state.leader_id,
            term=c.state.term,
            log_seq=c.state.last_seq,
            nodes=statuses,
            jobs=states,
            version=VERSION,
        )

    async def region_list(self, data: bytes) -> bytes:
        """The regions this candidate has heard summaries from (its own included)."""
        return ok(region=self.coord.region, regions=self.coord.board.rows(time.time()))

    async def site_list(self, data: bytes) -> bytes:
        """The region's edge sites as the leader sees them (docs/edge.md)."""
        return ok(sites=self.coord.sites.rows(self.coord.state))

    # ------------------------------------------------------------ pools

    async def pool_apply(self, data: bytes) -> bytes:
        req = _decode(PoolApplyRequest, data)
        try:
            # In a thread: a large tree takes seconds to read and check (no YAML node
            # limit, ~100 us a pool), which on the event loop cost the leader its lease.
            tree = await asyncio.to_thread(
                parse_pool_tree, req.source if req.source is not None else ""
            )
            # Read as parse_pool_tree read it (libyaml: the pure-Python loader took
            # seconds on a large tree), bytes too: `dict(bytes)` failed as INTERNAL.
            source = await asyncio.to_thread(load_pool_source, req.source)
            # With a leaf /default, where jobs that name no pool go (docs/pools.md).
            tree, source = await asyncio.to_thread(with_default_pool, tree, source)
        except (SpecError, yaml.YAMLError) as exc:
            raise ApiError(ErrorCode.INVALID_SPEC, str(exc)) from None
        event = PoolsApplied(dict(source), time.time())
        size = len(encode(event))
        if size > MAX_ENTRY_BYTES:  # YAML aliases repeat a value without its text
            raise ApiError(
                ErrorCode.TOO_LARGE,
                f"the pool tree encodes to {size} bytes, over the {MAX_ENTRY_BYTES}-byte "
                "limit of one log entry",
            )
        live: dict[str, int] = {}
        for job in self.coord.state.jobs.values():
            if job.state in (JobState.PENDING, JobState.RUNNING):
                live[job.spec.pool] = live.get(job.spec.pool, 0) + 1
        stranded = [p for p in sorted(live) if p not in tree or not tree.is_leaf(p)]
        if stranded:
            raise ApiError(
                ErrorCode.CONFLICT,
                "; ".join(
                    f"pool {p} has {live[p]} live job(s) and would no longer be a leaf pool"
                    for p in stranded
                ),
            )
        leader = self._leader()
        await self._append(leader, [event])
        leader.wake()
        return ok(pools=list(tree.order))

    def _pool_rows(self) -> list[dict]:
        c = self.coord
        # The pools divide the region's allocatable over all partitions, as placement
        # counts it (docs/partitions.md): it does not move when nodes change partition.
        capacity = Resources()
        m = c.state.partitions
        for v in c.cluster.ready():
            capacity = capacity + allocatable(
                v.state.capacity, m.spec(m.partition_of(v.node_id, v.state.labels))
            )
        view = pool_view(c.state, capacity, time.time())
        return pool_rows(c.state, view)

    async def pool_list(self, data: bytes) -> bytes:
        return ok(pools=self._pool_rows())

    async def pool_get(self, data: bytes) -> bytes:
        req = _decode(PoolRef, data)
        if req.path not in self.coord.state.pools:
            raise ApiError(ErrorCode.NOT_FOUND, f"no pool {req.path!r}")
        row = next(r for r in self._pool_rows() if r["path"] == req.path)
        jobs: dict[str, int] = {}
        for job in self.coord.state.jobs.values():
            if job.spec.pool == req.path:
                jobs[str(job.state)] = jobs.get(str(job.state), 0) + 1
        return ok(pool={**row, "jobs": jobs})


def _decode(cls: type, data: bytes) -> Any:
    try:
        return decode(cls, data, max_size=MAX_REQUEST)
    except WireError as exc:
        raise ApiError(ErrorCode.BAD_REQUEST, _request_problem(exc)) from None


def _request_problem(exc: WireError) -> str:
    """A refused request's message: where (the field) and what, in words; never a
    class name (the codec's and the JSON reader's messages are written for people)."""
    if not exc.field:
        return f"request: {exc.problem}"
    return f"request field {exc.field}: {exc.problem}"


def _spec_size(spec: Any) -> int:
    """A spec's size as the limit counts it: its text's UTF-8 bytes, or a mapping's
    msgpack encoding (how it came, or how its JSON form is sent on)."""
    if isinstance(spec, str):
        return len(spec.encode("utf-8", "surrogatepass"))
    if isinstance(spec, bytes | bytearray):
        return len(spec)
    if spec is None:
        return 0
    return len(pack(spec))
