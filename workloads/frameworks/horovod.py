"""The horovod-elastic adapter: task 0 runs ``horovodrun``, which asks Mesh for the hosts.

Elastic Horovod polls a host discovery script (every second) and grows or shrinks its
ring to the hosts it prints, ``host:slots`` lines. Ours asks the mesh: ``mesh job hosts
JOB --format horovod`` prints the job's placed workers as Mesh sees them now (the same
lines as :func:`horovod_hosts`), so the scheduler's resizes are what Horovod follows.
As with mpi, the other tasks only hold their slots (horovodrun starts their ranks) and
task 0, the launcher, is the job's rendezvous and primary task. The hostfile is also
written (the placement when task 0 started) for a program that wants it.

On a secure mesh the script's `mesh` needs an identity: task 0 asks its agent for the
task identity (``MESH_TASK_IDENTITY=worker``), whose files the agent hands over in
``MESH_TLS_*`` (``mesh.tls_env``) and whose permissions allow ``job.hosts`` and no
other API call. An agent without one refuses to start task 0, saying so. The tasks that
only hold their slots ask for nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from workloads.frameworks import FILES_PREFIX, Launch, Peer, TaskContext
from workloads.frameworks.mpi import HOLD_ARGV, HOSTFILE, host_slots, task_env
from workloads.model import TASK_IDENTITY_VAR, WORKER_IDENTITY
from workloads.spec import JobSpec, TaskGroup

__all__ = [
    "DISCOVER",
    "discover_script",
    "horovod_elastic",
    "horovod_hosts",
    "ports_for",
    "primary",
    "rendezvous",
]

DISCOVER = "discover_hosts.sh"


def horovod_hosts(peers: Iterable[Peer], slots: int) -> str:
    """Horovod's host list: one ``host:slots`` line per distinct host, in peer order."""
    return "".join(f"{host}:{n}\n" for host, n in host_slots(peers, slots))


def discover_script(job_id: str) -> str:
    """The discovery script (POSIX sh). $MESH_CLI names another `mesh` (a test's, a venv's);
    the CLI finds the mesh from the task's environment ($MESH_NATS_URL, $MESH_REGION, and
    on a secure mesh the task identity's $MESH_TLS_* and $MESH_INBOX_PREFIX)."""
    return (
        "#!/bin/sh\n"
        "# Horovod's host discovery: the job's placed workers, host:slots, as Mesh sees them.\n"
        f'exec "${{MESH_CLI:-mesh}}" job hosts {shlex.quote(job_id)} --format horovod\n'
    )


def horovod_elastic(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    workers = ctx.of_role(group.role)
    slots = spec.slots_per_node
    files = (
        (DISCOVER, discover_script(ctx.job_id)),
        (HOSTFILE, horovod_hosts(workers, slots)),
    )
    if ctx.index != 0:
        env = task_env(group, ctx, {"MESH_HOSTFILE": FILES_PREFIX + HOSTFILE})
        return Launch(HOLD_ARGV, env, files)
    # The launcher runs the discovery script, which calls the API: it asks for the
    # task identity (the agent hands its files over; job.hosts is all it may call).
    extra = {"MESH_HOSTFILE": FILES_PREFIX + HOSTFILE, TASK_IDENTITY_VAR: WORKER_IDENTITY}
    env = task_env(group, ctx, extra)
    low = spec.workers_min if spec.workers_min is not None else group.count
    high = spec.workers_max if spec.workers_max is not None else group.count
    argv = (
        "horovodrun",
        "-np", str(low * slots),
        "--min-np", str(low * slots),
        "--max-np", str(high * slots),
        "--host-discovery-script", FILES_PREFIX + DISCOVER,
        *group.command,
    )  # fmt: skip
    return Launch(argv, env, files)


def ports_for(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    return ()


def rendezvous(spec: JobSpec) -> tuple[str, int] | None:
    """The launcher (horovodrun's driver): preempted last, never moved by a resize."""
    return (spec.tasks[0].role, 0)


def primary(spec: JobSpec) -> tuple[str, int] | None:
    """The launcher: horovodrun ends when training does."""
    return (spec.tasks[0].role, 0)
