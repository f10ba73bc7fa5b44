"""The mpi adapter: task 0 is the launcher (``mpirun``), every task holds its slots.

mpirun starts every rank itself, on the hosts of a hostfile, so Mesh places the workers
(each a reservation of ``slots_per_node`` processes on its node) and task 0 runs mpirun
over all of them; the other tasks only keep their place until the launcher ends (the
job's primary task: its end ends them). The hostfile is the job's placement as it is
when task 0 starts: one ``host slots=N`` line per distinct host, the slots of every
worker placed on it summed (several agents may share one address), in peer order.
"""

from __future__ import annotations

from collections.abc import Iterable

from workloads.frameworks import FILES_PREFIX, Launch, Peer, TaskContext, common_env
from workloads.spec import JobSpec, TaskGroup

__all__ = [
    "HOLD_ARGV",
    "HOSTFILE",
    "host_slots",
    "mpi",
    "mpi_hostfile",
    "ports_for",
    "primary",
    "rendezvous",
    "task_env",
]

HOSTFILE = "hostfile"
# What a worker other than the launcher runs: nothing, until it is stopped (the launcher
# starts its ranks); a TERM ends it at once and cleanly.
HOLD_ARGV = ("/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done")


def host_slots(peers: Iterable[Peer], slots: int) -> list[tuple[str, int]]:
    """(host, slots) per distinct host, in the order the peers first name it."""
    totals: dict[str, int] = {}
    for peer in peers:
        totals[peer.host] = totals.get(peer.host, 0) + slots
    return list(totals.items())


def mpi_hostfile(peers: Iterable[Peer], slots: int) -> str:
    """An Open MPI / MPICH hostfile: ``host slots=N`` lines."""
    return "".join(f"{host} slots={n}\n" for host, n in host_slots(peers, slots))


def task_env(
    group: TaskGroup, ctx: TaskContext, extra: dict[str, str]
) -> tuple[tuple[str, str], ...]:
    """The group's env, then Mesh's, then the framework's (later ones win), sorted."""
    return tuple(sorted({**dict(group.env), **common_env(ctx), **extra}.items()))


def mpi(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    workers = ctx.of_role(group.role)
    files = ((HOSTFILE, mpi_hostfile(workers, spec.slots_per_node)),)
    env = task_env(group, ctx, {"MESH_HOSTFILE": FILES_PREFIX + HOSTFILE})
    if ctx.index != 0:
        return Launch(HOLD_ARGV, env, files)
    np = len(workers) * spec.slots_per_node
    argv = ("mpirun", "--hostfile", FILES_PREFIX + HOSTFILE, "-np", str(np), *group.command)
    return Launch(argv, env, files)


def ports_for(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    return ()


def rendezvous(spec: JobSpec) -> tuple[str, int] | None:
    """The launcher: it is the job (preempted last, never moved by a resize)."""
    return (spec.tasks[0].role, 0)


def primary(spec: JobSpec) -> tuple[str, int] | None:
    """The launcher: mpirun ends when every rank has, and so does the job."""
    return (spec.tasks[0].role, 0)
