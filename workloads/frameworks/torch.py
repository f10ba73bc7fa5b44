"""The pytorch and pytorch-elastic adapters: each worker task runs one torchrun agent.

A job of either framework has one task group, its workers; task ``i`` runs
``python -m torch.distributed.run <flags> <the user's script and args>`` with
``--nproc-per-node slots_per_node`` (docs/training.md).

- ``pytorch`` (a fixed size, DDP): torchrun's static rendezvous at task 0's ``master``
  port, ``--node-rank i``. Task 0 is the rendezvous task; there is no primary task, each
  agent exits when its workers end. ``--max-restarts 0``: torchrun's in-place restarts
  and Mesh's re-placements do not mix under a static rendezvous (a re-placed agent would
  start at restart 0 while the survivors wait at restart 1: read in torch, not
  measured), so every failure surfaces to Mesh, which must restart the whole group.
- ``pytorch-elastic``: ``--nnodes MIN:MAX`` and the c10d rendezvous hosted by task 0's
  agent on its ``rdzv`` port (``is_host`` pinned, so no other agent on that host can take
  the port first and take the store down with it when it is scaled away: pytorch#67742).
  Task 0 is the rendezvous and the primary task (its agent exits 0 when training is
  done). A scale-down costs one of torchrun's restarts on every survivor (their
  workers see their peer's connection close, which torchrun counts as a failure), and a
  scale-up may cost one too. So ``--max-restarts`` is ``max_restarts +
  RESIZE_ALLOWANCE``; Mesh itself counts only task failures (an agent that exits
  non-zero) against ``max_restarts``.

Why ``python -m torch.distributed.run`` and not ``torchrun``: the agent's task PATH
starts with the directory of the agent's own interpreter (agent/executor.py), so
``python`` is the Python the agent runs under (in a virtual environment, that
environment's) whether or not a ``torchrun`` script is on the PATH, and torchrun starts
its workers with that same interpreter. A command that names its interpreter keeps it.
"""

from __future__ import annotations

from workloads.frameworks import Launch, TaskContext, common_env
from workloads.quantity import SpecError
from workloads.spec import JobSpec, TaskGroup
from workloads.torchrun import torchrun_command

__all__ = [
    "ELASTIC_PORT",
    "MASTER_PORT",
    "RDZV_CONF",
    "RESIZE_ALLOWANCE",
    "primary_task",
    "pytorch",
    "pytorch_elastic",
    "pytorch_elastic_ports",
    "pytorch_ports",
    "rendezvous_task",
    "torchrun_command",
]

MASTER_PORT = "master"  # pytorch: task 0's static rendezvous (TCPStore) port
ELASTIC_PORT = "rdzv"  # pytorch-elastic: task 0's c10d rendezvous store port
# torchrun's in-place restarts a pytorch-elastic agent may spend on resizes, on top of
# the job's max_restarts: each shrink costs every survivor one, and a grow may cost one
# too (an agent whose workers see their peers stop for the newcomer before its own
# monitor notices the newcomer counts a failure; measured). When an agent runs out it
# exits non-zero; Mesh counts a failure and starts it again, and it rejoins as a
# scale-up with a fresh budget.
RESIZE_ALLOWANCE = 10
# The c10d rendezvous settings that make a resize take seconds (measured in
# tests/integration/test_torchrun_adapter.py; torch's defaults in brackets):
# - keep_alive_interval × keep_alive_max_attempt [5 s × 3]: a scaled-away (SIGTERMed)
#   agent leaves without closing its place in the round, which only moves on once its
#   heartbeat has expired;
# - last_call_timeout [30 s]: the wait, once min nodes have joined, for more to come;
#   Mesh places a resize's newcomers at once, so 1 s is enough;
# - join_timeout [600 s]: kept: how long survivors wait for min nodes (a re-placement);
# - close_timeout [30 s]: how long the others wait for the end of a closed rendezvous.
RDZV_CONF: tuple[tuple[str, str], ...] = (
    ("join_timeout", "600"),
    ("last_call_timeout", "1"),
    ("close_timeout", "10"),
    ("keep_alive_interval", "1"),
    ("keep_alive_max_attempt", "3"),
)


def pytorch_ports(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    return _with(group.ports, MASTER_PORT if index == 0 else None)


def pytorch_elastic_ports(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    return _with(group.ports, ELASTIC_PORT if index == 0 else None)


def rendezvous_task(spec: JobSpec) -> tuple[str, int]:
    """Task 0 of the workers, for both frameworks."""
    return (_workers(spec).role, 0)


def primary_task(spec: JobSpec) -> tuple[str, int] | None:
    """pytorch-elastic: task 0 (its end is the job's); pytorch: none."""
    return (_workers(spec).role, 0) if spec.framework == "pytorch-elastic" else None


def pytorch(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    """Static DDP over ``group.count`` nodes. The env also names the master and the world
    for a script that reads them before torchrun's own: WORLD_SIZE = nodes × slots, RANK
    = index × slots (this task's first global rank; torchrun gives each process its own)."""
    addr, port = _task0(ctx, MASTER_PORT)
    nodes, slots = group.count, spec.slots_per_node
    flags = (
        ("--nnodes", str(nodes)),
        ("--nproc-per-node", str(slots)),
        ("--node-rank", str(ctx.index)),
        ("--master-addr", addr),
        ("--master-port", str(port)),
        ("--local-addr", ctx.me.host),
        ("--max-restarts", "0"),
    )
    env = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nodes * slots),
        "RANK": str(ctx.index * slots),
        "NODE_RANK": str(ctx.index),
    }
    return _launch(group, ctx, flags, env)


def pytorch_elastic(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    """c10d elastic rendezvous at task 0's ``rdzv`` port, ``--nnodes MIN:MAX``; the same
    settings as torchrun's PET_* variables too, for a script that reads them."""
    addr, port = _task0(ctx, ELASTIC_PORT)
    lo = spec.workers_min if spec.workers_min is not None else group.count
    hi = spec.workers_max if spec.workers_max is not None else group.count
    conf = ",".join(f"{k}={v}" for k, v in (*RDZV_CONF, ("is_host", _bool(ctx.index == 0))))
    settings = {
        "NNODES": f"{lo}:{hi}",
        "NPROC_PER_NODE": str(spec.slots_per_node),
        "RDZV_BACKEND": "c10d",
        "RDZV_ENDPOINT": f"{addr}:{port}",
        "RDZV_ID": ctx.job_id,
        "RDZV_CONF": conf,
        "MAX_RESTARTS": str(spec.max_restarts + RESIZE_ALLOWANCE),
        "LOCAL_ADDR": ctx.me.host,
    }
    flags = tuple((f"--{k.lower().replace('_', '-')}", v) for k, v in settings.items())
    env = {f"PET_{k}": v for k, v in settings.items()}
    # Without it a scale-up deadlocks: the old rank 0 never republishes the workers'
    # master address and the newcomer waits for it (pytorch#135712, measured here).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return _launch(group, ctx, flags, env)


def _launch(
    group: TaskGroup,
    ctx: TaskContext,
    flags: tuple[tuple[str, str], ...],
    env: dict[str, str],
) -> Launch:
    if group.simulate is not None and not group.command:
        argv: tuple[str, ...] = ()  # a hollow node's simulated run: nothing to start
    else:
        launcher, target = torchrun_command(group.command)
        argv = (*launcher, *(x for pair in flags for x in pair), *target)
    merged = {**dict(group.env), **common_env(ctx), **env}
    return Launch(argv, tuple(sorted(merged.items())))


def _task0(ctx: TaskContext, port_name: str) -> tuple[str, int]:
    """Task 0's address and rendezvous port: it is placed first, so a missing one is a
    bug in the caller, not a spec error."""
    task0 = next((p for p in ctx.of_role(ctx.role) if p.index == 0), None)
    if task0 is None:
        raise ValueError(f"job {ctx.job_id}: task {ctx.role}[0] is not placed")
    port = task0.port(port_name)
    if port is None:
        raise ValueError(f"job {ctx.job_id}: task {ctx.role}[0] has no {port_name!r} port")
    return task0.host, port


def _workers(spec: JobSpec) -> TaskGroup:
    if len(spec.tasks) != 1:
        raise SpecError("tasks", f"a {spec.framework} job has exactly one task group")
    return spec.tasks[0]


def _with(ports: tuple[str, ...], extra: str | None) -> tuple[str, ...]:
    return ports if extra is None or extra in ports else (*ports, extra)


def _bool(value: bool) -> str:
    return "true" if value else "false"
