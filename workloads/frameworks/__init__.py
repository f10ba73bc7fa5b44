"""Framework adapters: how the tasks of a training job find each other and start.

One pure adapter per framework (``batch``, ``pytorch``, ``pytorch-elastic``,
``horovod-elastic``, ``mpi``, ``spark``): given the job's spec, one task and the job's
placed peers (their hosts and named ports), it returns that task's argv, environment and
files. The coordinator calls it when it sends a run, so every task starts knowing its
peers (docs/training.md); nothing here does I/O.

Vocabulary:
- *peer*: a placed task of the same job (PLACED or RUNNING), with its node's address and
  the named ports it was given;
- *rendezvous task*: the task the others meet at (torchrun's c10d store, the Spark
  master, the mpirun launcher): placed first, preempted last, never moved by a resize;
- *primary task*: the task whose end ends the job (the Spark driver, task 0 of an
  elastic or launcher-based job); None: each task runs to its own end;
- *generation*: the job's membership count, moved by every resize.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from workloads.spec import JobSpec, TaskGroup
from workloads.training import FRAMEWORKS

__all__ = [
    "ADAPTERS",
    "FILES_PREFIX",
    "FRAMEWORKS",
    "REGISTRY",
    "Framework",
    "Launch",
    "Peer",
    "TaskContext",
    "common_env",
    "launch",
    "ports_for",
    "primary_task",
    "rendezvous_task",
]

# An argv element or env value that starts with this names a file of Launch.files: the
# agent writes the files to the task's files directory and puts its path in their place.
FILES_PREFIX = "@files/"


@dataclass(frozen=True, slots=True)
class Peer:
    """A placed task of the job, as its peers see it."""

    role: str
    index: int  # within its role
    host: str  # its node's address (NodeState.address)
    ports: tuple[tuple[str, int], ...] = ()  # named ports it was given, sorted by name
    node_id: str = ""

    def port(self, name: str) -> int | None:
        return next((p for n, p in self.ports if n == name), None)


@dataclass(frozen=True, slots=True)
class TaskContext:
    """One task about to start, and the job as it is placed now."""

    job_id: str
    role: str
    index: int  # within its role
    generation: int
    # Every placed task of the job, this one included, in the spec's group order and
    # then by index.
    peers: tuple[Peer, ...]

    @property
    def me(self) -> Peer:
        return next(p for p in self.peers if p.role == self.role and p.index == self.index)

    def of_role(self, role: str) -> tuple[Peer, ...]:
        return tuple(p for p in self.peers if p.role == role)


@dataclass(frozen=True, slots=True)
class Launch:
    """What the agent runs: the group's argv and env as the framework completes them
    (its variables win over the group's own of the same name)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # sorted by name
    files: tuple[tuple[str, str], ...] = ()  # (name, content), written by the agent


Adapter = Callable[[JobSpec, TaskGroup, TaskContext], Launch]


def _batch(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    return Launch(group.command, tuple(sorted({**dict(group.env), **common_env(ctx)}.items())))


def common_env(ctx: TaskContext) -> dict[str, str]:
    """What every task of every framework gets (the Volcano style)."""
    env = {
        "MESH_JOB_ID": ctx.job_id,
        "MESH_TASK_ROLE": ctx.role,
        "MESH_TASK_INDEX": str(ctx.index),
        "MESH_GENERATION": str(ctx.generation),
    }
    roles: dict[str, list[str]] = {}
    for p in ctx.peers:
        roles.setdefault(p.role, []).append(p.host)
    for role, hosts in roles.items():
        key = role.upper().replace("-", "_")
        env[f"MESH_{key}_HOSTS"] = ",".join(hosts)
        env[f"MESH_{key}_NUM"] = str(len(hosts))
    for name, port in ctx.me.ports:
        env[f"MESH_PORT_{name.upper().replace('-', '_')}"] = str(port)
    return env


TaskRef = tuple[str, int]  # (role, index within the role)


def _no_ports(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    return ()


def _nobody(spec: JobSpec) -> TaskRef | None:
    return None


@dataclass(frozen=True, slots=True)
class Framework:
    """One framework's hooks: its adapter, the ports it gives a task beside the group's
    own (torchrun's rendezvous port on task 0, say), its rendezvous and primary task."""

    adapter: Adapter
    extra_ports: Callable[[JobSpec, TaskGroup, int], tuple[str, ...]] = _no_ports
    rendezvous: Callable[[JobSpec], TaskRef | None] = _nobody
    primary: Callable[[JobSpec], TaskRef | None] = _nobody


# The adapters import this module's contract, so they are imported once it is defined.
from workloads.frameworks import horovod, mpi, spark, torch  # noqa: E402


def _hooks(module: ModuleType, adapter: Adapter) -> Framework:
    return Framework(adapter, module.ports_for, module.rendezvous, module.primary)


REGISTRY: dict[str, Framework] = {
    "batch": Framework(_batch),
    "pytorch": Framework(
        torch.pytorch, torch.pytorch_ports, torch.rendezvous_task, torch.primary_task
    ),
    "pytorch-elastic": Framework(
        torch.pytorch_elastic,
        torch.pytorch_elastic_ports,
        torch.rendezvous_task,
        torch.primary_task,
    ),
    "horovod-elastic": _hooks(horovod, horovod.horovod_elastic),
    "mpi": _hooks(mpi, mpi.mpi),
    "spark": _hooks(spark, spark.spark),
}
ADAPTERS: dict[str, Adapter] = {name: fw.adapter for name, fw in REGISTRY.items()}


def launch(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    """The task's argv, env and files under its job's framework."""
    return REGISTRY[spec.framework].adapter(spec, group, ctx)


def ports_for(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    """The named ports this task is given: its group's, then its framework's own."""
    extra = REGISTRY[spec.framework].extra_ports(spec, group, index)
    return group.ports + tuple(p for p in extra if p not in group.ports)


def rendezvous_task(spec: JobSpec) -> TaskRef | None:
    """(role, index) of the task the others meet at; None: there is none."""
    return REGISTRY[spec.framework].rendezvous(spec)


def primary_task(spec: JobSpec) -> TaskRef | None:
    """(role, index) of the task whose end ends the job; None: each runs to its end."""
    return REGISTRY[spec.framework].primary(spec)
