"""The request API's training endpoints (docs/api.md, docs/training.md): `job.scale`
moves an elastic job's target size (logged as JobScaled; the leader grows or shrinks
it, coordinator/elastic.py), and `job.hosts` lists a training job's holding tasks as
a hostfile (what horovodrun's host discovery script and an MPI launcher read). Served
by `api.Api`, whose writing path (`_append`: fenced, through the leader's log writer)
`job.scale` takes."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from coordinator.records import HOLDING, JobRecord
from mesh.schema import ApiError, ErrorCode, HostsRequest, JobScaled, ScaleRequest, ok
from workloads.frameworks import Peer
from workloads.frameworks.horovod import horovod_hosts
from workloads.frameworks.mpi import host_slots, mpi_hostfile
from workloads.lifecycle import JobState

if TYPE_CHECKING:
    from coordinator.api import Api

ENDPOINTS = ("job.scale", "job.hosts")
WRITES = frozenset({"job.scale"})


def handlers(
    api: Api, decode: Callable[[type, bytes], Any]
) -> dict[str, Callable[[bytes], Awaitable[bytes]]]:
    t = TrainingApi(api, decode)
    return {"job.scale": t.scale, "job.hosts": t.hosts}


def host_lines(hosts: list[str], slots: int, fmt: str) -> list[str]:
    """The job's hosts as the framework reads them, one line per distinct host (its
    tasks' slots summed): horovod `host:slots`, mpi `host slots=N`, plain `host`. The
    same writers make the hostfile the agent puts beside each mpi or horovod task."""
    peers = [Peer("", i, h) for i, h in enumerate(hosts)]
    if fmt == "horovod":
        return horovod_hosts(peers, slots).splitlines()
    if fmt == "mpi":
        return mpi_hostfile(peers, slots).splitlines()
    return [h for h, _ in host_slots(peers, slots)]


class TrainingApi:
    def __init__(self, api: Api, decode: Callable[[type, bytes], Any]) -> None:
        self.api = api
        self.decode = decode

    async def scale(self, data: bytes) -> bytes:
        req = self.decode(ScaleRequest, data)
        job = self.api._job(req.job_id)
        spec = job.spec
        if not spec.is_elastic:
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                f"job {job.job_id} is not elastic (its size is fixed: give workers: "
                "{min, max} in its spec to scale it)",
            )
        lo, hi = spec.workers_min or 1, spec.workers_max or len(job.tasks)
        if not lo <= req.workers <= hi:
            raise ApiError(
                ErrorCode.BAD_REQUEST,
                f"workers: {req.workers} is out of the job's bounds [{lo}, {hi}]",
            )
        if job.kill_requested or job.state not in (JobState.PENDING, JobState.RUNNING):
            raise ApiError(ErrorCode.CONFLICT, f"job {job.job_id} is killed or ended ({job.state})")
        was = job.target or hi
        leader = self.api._leader()
        if req.workers != was:
            why = req.reason or f"scaled by hand from {was} to {req.workers}"
            ev = JobScaled(job.job_id, req.workers, why, req.by, time.time())
            await self.api._append(leader, [ev])
            leader.wake()
        return ok(job_id=job.job_id, workers=req.workers, was=was)

    async def hosts(self, data: bytes) -> bytes:
        req = self.decode(HostsRequest, data)
        job = self.api._job(req.job_id)
        hosts = self.holding_hosts(job)
        lines = host_lines(hosts, job.spec.slots_per_node, req.format)
        return ok(job_id=job.job_id, format=req.format, hosts=lines)

    def holding_hosts(self, job: JobRecord) -> list[str]:
        """The address of each holding task's node, in task order (the node's id when
        its agent advertises no address)."""
        nodes = self.api.coord.cluster.nodes
        out = []
        for t in sorted(job.tasks.values(), key=lambda t: (t.role, t.index)):
            if t.state not in HOLDING:
                continue
            view = nodes.get(t.node_id)
            address = view.state.address if view is not None else ""
            out.append(address or t.node_id)
        return out
