"""A client of the request API: what the CLI, tests and benchmarks use.

Each call is one NATS request to `mesh.<region>.api.<endpoint>`; an `{ok: false}`
reply raises `ApiError` with the server's code and message. On a connection from
`mesh.connect.connect`, a request the server denies (a wrong region, say) raises
`mesh.refusals.PermissionDenied` at once, and is not retried: retrying cannot fix it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from mesh import subjects
from mesh.codec import WireError, encode, unpack
from mesh.schema import (
    MAX_BATCH,
    MAX_REQUEST,
    ApiError,
    ErrorCode,
    HostsRequest,
    JobListRequest,
    JobRef,
    KillRequest,
    LogsRequest,
    NodeRef,
    PoolApplyRequest,
    PoolRef,
    ScaleRequest,
    SubmitManyRequest,
    SubmitRequest,
    UpdateRequest,
)

FINISHED = frozenset({"SUCCEEDED", "FAILED", "KILLED"})


class MeshClient:
    def __init__(self, nc: Client, region: str = "default", timeout: float = 10.0) -> None:
        self.nc = nc
        self.region = subjects.token(region, "region")
        self.timeout = timeout

    async def request(self, endpoint: str, payload: Any = None, *, retries: int = 0) -> dict:
        data = encode(payload if payload is not None else {})
        return await self.request_raw(endpoint, data, retries=retries)

    def max_request(self) -> int:
        """The largest request this connection can send: the API's limit, or the
        server's max_payload where that is less (NATS's default is 1 MiB)."""
        server = getattr(self.nc, "max_payload", 0) or MAX_REQUEST
        return min(MAX_REQUEST, server)

    def _check_size(self, data: bytes) -> None:
        """Refuse a request that cannot arrive, saying which limit (nats-py raises a
        bare `MaxPayloadError` for the server's, after encoding it all)."""
        server = getattr(self.nc, "max_payload", 0) or MAX_REQUEST
        if len(data) > MAX_REQUEST:
            raise ApiError(
                ErrorCode.TOO_LARGE,
                f"request of {len(data)} bytes is over the API's limit of {MAX_REQUEST} bytes",
            )
        if len(data) > server:
            raise ApiError(
                ErrorCode.TOO_LARGE,
                f"request of {len(data)} bytes is over this NATS server's max_payload of "
                f"{server} bytes (raise max_payload in its config to {MAX_REQUEST}; the "
                "configs Mesh writes allow 8 MiB)",
            )

    async def request_raw(self, endpoint: str, data: bytes, *, retries: int = 0) -> dict:
        subject = subjects.api(self.region, endpoint)
        self._check_size(data)
        for attempt in range(retries + 1):
            try:
                msg = await self.nc.request(subject, data, timeout=self.timeout)
            except NoRespondersError:
                err = ApiError(
                    ErrorCode.UNAVAILABLE, f"no coordinator answers on {subject}: is the mesh up?"
                )
            except NatsTimeout:
                err = ApiError(ErrorCode.UNAVAILABLE, f"no answer on {subject} in {self.timeout}s")
            else:
                reply = _reply(msg.data)
                if reply.get("ok"):
                    return reply
                e = reply.get("error") or {}
                err = ApiError(_code(e.get("code")), str(e.get("message", "unknown error")))
                if err.code not in (ErrorCode.NOT_LEADER, ErrorCode.UNAVAILABLE):
                    raise err
            if attempt < retries:
                await asyncio.sleep(min(0.1 * 2**attempt, 1.0))
        raise err

    async def submit(self, spec: Any, client_id: str | None = None, retries: int = 20) -> str:
        """Submit a job (YAML text or mapping). Retried with the same client id, so a
        retry after a lost reply or a leader change never creates a second job."""
        return (await self.submit_reply(spec, client_id, retries))["job_id"]

    async def submit_reply(
        self, spec: Any, client_id: str | None = None, retries: int = 20
    ) -> dict:
        """`submit`, returning the whole reply: `job_id`, `duplicate`, and a `warning`
        when the job can never fit the region as it is now (it is accepted all the same)."""
        cid = client_id or uuid.uuid4().hex
        return await self.request("job.submit", SubmitRequest(cid, spec), retries=retries)

    async def submit_many(
        self, specs: list[Any], client_ids: list[str] | None = None, retries: int = 20
    ) -> list[dict]:
        """Submit up to MAX_BATCH jobs in one request; per job, {"job_id", "duplicate"} or
        {"error": {"code", "message"}}. Retries reuse the client ids, as `submit` does."""
        cids = client_ids or [uuid.uuid4().hex for _ in specs]
        if len(cids) != len(specs):
            raise ValueError("one client id per spec")
        items = [SubmitRequest(c, s) for c, s in zip(cids, specs, strict=True)]
        return await self._submit_many(items, retries)

    async def _submit_many(self, items: list[SubmitRequest], retries: int) -> list[dict]:
        """Send `items` in as few requests as the limits allow (MAX_BATCH jobs, and
        `max_request` bytes: a thousand 2 KB specs are more than NATS's default 1 MiB),
        halving a batch that is too large. A spec too large alone fails alone."""
        if not items:
            return []
        data = encode(SubmitManyRequest(tuple(items)))
        if len(items) <= MAX_BATCH and len(data) <= self.max_request():
            return (await self.request_raw("job.submit_many", data, retries=retries))["results"]
        if len(items) == 1:
            message = f"request of {len(data)} bytes is over the limit of {self.max_request()}"
            return [{"error": {"code": str(ErrorCode.TOO_LARGE), "message": message}}]
        half = min(len(items) // 2, MAX_BATCH)
        return await self._submit_many(items[:half], retries) + await self._submit_many(
            items[half:], retries
        )

    async def job(self, job_id: str) -> dict:
        return (await self.request("job.get", JobRef(job_id), retries=5))["job"]

    async def jobs(
        self, state: str | None = None, pool: str | None = None, limit: int = 100
    ) -> list[dict]:
        return (await self.request("job.list", JobListRequest(state, pool, limit), retries=5))[
            "jobs"
        ]

    async def kill(self, job_id: str, reason: str = "") -> None:
        await self.request("job.kill", KillRequest(job_id, reason), retries=20)

    async def scale(self, job_id: str, workers: int, reason: str = "", by: str = "") -> dict:
        """An elastic training job's new target size (docs/training.md)."""
        req = ScaleRequest(job_id, workers, reason, by)
        return await self.request("job.scale", req, retries=20)

    async def hosts(self, job_id: str, fmt: str = "plain") -> list[str]:
        """A training job's holding tasks' hosts, as hostfile lines of `fmt`."""
        reply = await self.request("job.hosts", HostsRequest(job_id, fmt), retries=5)
        return reply["hosts"]

    async def update(self, job_id: str, spec: Any) -> dict:
        """Replace a running service's spec (YAML text or mapping): its replicas are
        replaced one by one. The reply says whether anything changed."""
        return await self.request("job.update", UpdateRequest(job_id, spec), retries=20)

    async def nodes(self) -> list[dict]:
        return (await self.request("node.list", retries=5))["nodes"]

    async def node(self, node_id: str) -> dict:
        return (await self.request("node.get", NodeRef(node_id), retries=5))["node"]

    async def pool_apply(self, source: Any) -> list[str]:
        """Replace the region's pool tree (YAML text or mapping); returns the pool paths."""
        reply = await self.request("pool.apply", PoolApplyRequest(source), retries=20)
        return reply["pools"]

    async def pools(self) -> list[dict]:
        return (await self.request("pool.list", retries=5))["pools"]

    async def pool(self, path: str) -> dict:
        return (await self.request("pool.get", PoolRef(path), retries=5))["pool"]

    async def cluster_info(self) -> dict:
        return await self.request("cluster.info", retries=5)

    async def wait(self, job_id: str, timeout: float = 60.0, poll: float = 0.1) -> dict:
        """Poll until the job ends; returns its detail. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.job(job_id)
            if job["state"] in FINISHED:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout}s")
            await asyncio.sleep(poll)

    async def logs(
        self,
        job_id: str,
        task_id: str | None = None,
        stream: str = "stdout",
        tail_bytes: int = 64 * 1024,
    ) -> dict:
        """A task's log, fetched from the agent that ran it."""
        job = await self.job(job_id)
        tasks = job["task_list"]
        task = (
            next((t for t in tasks if t["task_id"] == task_id), None)
            if task_id
            else (tasks[0] if tasks else None)
        )
        if task is None:
            raise ApiError(ErrorCode.NOT_FOUND, f"no task {task_id!r} in job {job_id}")
        node = task["node_id"] or next(
            (h["node_id"] for h in reversed(task["history"]) if h["node_id"]), ""
        )
        if not node:
            raise ApiError(ErrorCode.NOT_FOUND, f"task {task['task_id']} never ran on a node")
        req = LogsRequest(task["task_id"], task["attempt"] or None, stream, tail_bytes)
        try:
            msg = await self.nc.request(
                subjects.task_logs(self.region, node), encode(req), timeout=self.timeout
            )
        except (NoRespondersError, NatsTimeout):
            raise ApiError(ErrorCode.UNAVAILABLE, f"node {node} does not answer for logs") from None
        reply = _reply(msg.data)
        if not reply.get("ok"):
            e = reply.get("error") or {}
            raise ApiError(_code(e.get("code")), str(e.get("message")))
        reply["node_id"] = node
        return reply


MAX_REPLY = 8 * 1024 * 1024  # the embedded server's max_payload: a 5,000-node list is ~2.4 MB


def _reply(data: bytes) -> dict:
    try:
        reply = unpack(data, max_size=MAX_REPLY)
    except WireError as exc:
        raise ApiError(ErrorCode.INTERNAL, f"undecodable reply: {exc}") from None
    if not isinstance(reply, dict):
        raise ApiError(ErrorCode.INTERNAL, "reply is not a map")
    return reply


def _code(code: Any) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.INTERNAL
