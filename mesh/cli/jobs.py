"""Job commands that act on many jobs or pick among tasks: bulk kill and submit,
`--task` resolution. Decisions (which task a name means, which jobs a selector
picks) are pure functions; the async parts only send requests.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from mesh.client import MeshClient
from mesh.schema import ApiError, ErrorCode

KILL_CONCURRENCY = 64  # kill requests in flight at once, over the one connection
LIST_LIMIT = 10_000  # job.list's largest page
SUBMIT_BATCH = 1000  # job.submit_many's largest request


class TaskChoiceError(Exception):
    """`--task` names no task, or more than one; the message lists what it could mean."""


def resolve_task(tasks: list[dict], key: str | None) -> dict:
    """The task `--task KEY` means: its full id; else its index (`0`) or its group's
    role when that picks one task; else the one task whose id ends or starts with KEY
    (`main.0`, `train-1a2b.main`). No key: the first task."""
    if not tasks:
        raise TaskChoiceError("the job has no tasks")
    if not key:
        return tasks[0]
    exact = [t for t in tasks if t["task_id"] == key]
    if exact:
        return exact[0]
    for how, found in (
        ("index", [t for t in tasks if key.isdigit() and t.get("index") == int(key)]),
        ("role", [t for t in tasks if t.get("role") == key]),
        ("suffix", [t for t in tasks if t["task_id"].endswith("." + key)]),
        ("prefix", [t for t in tasks if t["task_id"].startswith(key)]),
    ):
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(t["task_id"] for t in found[:8])
            more = f" and {len(found) - 8} more" if len(found) > 8 else ""
            raise TaskChoiceError(
                f"--task {key!r} matches {len(found)} tasks by {how}: {names}{more}; "
                "give more of the id"
            )
    names = ", ".join(t["task_id"] for t in tasks[:8])
    raise TaskChoiceError(f"--task {key!r} matches no task of this job (tasks: {names})")


def never_started(task: dict) -> bool:
    """True when no attempt of the task has started, so no agent has a log of it."""
    if task.get("started_at") is not None:
        return False
    return not any(h.get("state") in ("RUNNING", "STARTING") for h in task.get("history") or [])


@dataclass
class KillOutcome:
    requested: list[str] = field(default_factory=list)
    already_ended: list[str] = field(default_factory=list)
    errors: dict[str, ApiError] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "kill_requested": self.requested,
            "already_ended": self.already_ended,
            "errors": {
                j: {"code": str(e.code), "message": e.message} for j, e in self.errors.items()
            },
        }


async def kill_many(
    client: MeshClient, job_ids: list[str], reason: str, concurrency: int = KILL_CONCURRENCY
) -> KillOutcome:
    """One kill request per job, `concurrency` in flight at once on one connection
    (1,000 one-by-one `mesh job kill` processes took minutes). A job that has already
    ended (CONFLICT) is counted apart, not as a failure."""
    outcome = KillOutcome()
    gate = asyncio.Semaphore(concurrency)

    async def one(job_id: str) -> None:
        async with gate:
            try:
                await client.kill(job_id, reason)
            except ApiError as exc:
                if exc.code == ErrorCode.CONFLICT:
                    outcome.already_ended.append(job_id)
                else:
                    outcome.errors[job_id] = exc
            else:
                outcome.requested.append(job_id)

    await asyncio.gather(*(one(j) for j in dict.fromkeys(job_ids)))
    return outcome


def selected(jobs: list[dict], state: str | None, pool: str | None) -> list[str]:
    """The active jobs a selector picks, not yet asked to die."""
    return [
        j["job_id"]
        for j in jobs
        if j["state"] in ("PENDING", "RUNNING")
        and not j.get("kill_requested")
        and (state is None or j["state"] == state)
        and (pool is None or j["pool"] == pool)
    ]


async def kill_selected(
    client: MeshClient, state: str | None, pool: str | None, reason: str
) -> KillOutcome:
    """Kill every active job matching; listed again until none is left unasked, so
    more than one page of jobs is covered."""
    total = KillOutcome()
    asked: set[str] = set()
    while True:
        states = [state] if state else ["PENDING", "RUNNING"]
        found: list[str] = []
        for s in states:
            found += selected(await client.jobs(s, pool, LIST_LIMIT), state, pool)
        fresh = [j for j in found if j not in asked]
        if not fresh:
            return total
        asked.update(fresh)
        got = await kill_many(client, fresh, reason)
        total.requested += got.requested
        total.already_ended += got.already_ended
        total.errors |= got.errors


@dataclass
class Submitted:
    path: str
    job_id: str | None = None
    error: dict | None = None  # {"code", "message"} from the server
    warning: str | None = None  # accepted, but it can never fit the region as it is
    home: str | None = None  # the region that made it, when not the one asked


def went_elsewhere(job_id: str, home: str, asked: str) -> str:
    """What `mesh job run` says when the region asked made the job in another: its spec's
    regions do not name the one asked, so its home is the first they name."""
    return (
        f"job {job_id} is in region {home}, the first region its spec names (not {asked}): "
        f"mesh --region {home} job status {job_id}"
    )


async def submit_files(
    client: MeshClient, items: list[tuple[str, str]], client_id: str | None
) -> list[Submitted]:
    """Submit several checked specs (path, text) with job.submit_many, in batches of
    its limit; client ids ID-0, ID-1, ... when one is given, so a rerun is a retry."""
    base = client_id or uuid.uuid4().hex
    results: list[Submitted] = []
    for start in range(0, len(items), SUBMIT_BATCH):
        batch = items[start : start + SUBMIT_BATCH]
        cids = [f"{base}-{start + i}" for i in range(len(batch))]
        replies = await client.submit_many([text for _, text in batch], cids)
        for (path, _), reply in zip(batch, replies, strict=True):
            results.append(
                Submitted(
                    path,
                    reply.get("job_id"),
                    reply.get("error"),
                    reply.get("warning"),
                    reply.get("home"),
                )
            )
    return results
