"""A job spec's training fields: which framework starts its tasks, and how many workers.

``framework: pytorch-elastic`` (default ``batch``: each task is its own program),
``workers: 3`` (a fixed size) or ``workers: {min: 2, max: 4}`` (elastic: the scheduler
sizes it), ``slots_per_node`` (processes per worker) and ``max_restarts`` (failures the
whole job may restart from). The rules live here so that a user learns at submit time
what a framework would otherwise fail on at run time (docs/training.md):

- a framework other than spark runs one task group, its workers: ``workers`` sets its
  ``count`` (the max) and, when elastic, ``min_tasks`` (the min: the gang it is placed
  as, the size preemption may shrink it to);
- spark runs a standalone cluster: groups ``master`` (one; added if the spec leaves it
  out), ``worker`` (``workers`` of them) and ``driver`` (one: its command is the
  application spark-submit runs). Its size is fixed: a Spark standalone cluster does
  not follow a scheduler's resize.
- only pytorch-elastic and horovod-elastic may be elastic: the others fix their world
  size when they start.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workloads.quantity import SpecError, _show, format_bytes
from workloads.spark_memory import MIN_DRIVER_MEMORY, MIN_WORKER_MEMORY
from workloads.torchrun import torchrun_command

if TYPE_CHECKING:
    from workloads.spec import TaskGroup

__all__ = [
    "BATCH",
    "ELASTIC_FRAMEWORKS",
    "FIELDS",
    "FRAMEWORKS",
    "MAX_PORTS",
    "MAX_SLOTS",
    "SPARK_ROLES",
    "Training",
    "commandless_roles",
    "parse",
    "parse_framework",
    "parse_ports",
    "to_dict",
]

FIELDS = ("framework", "workers", "slots_per_node", "max_restarts")
BATCH = "batch"
# The one list of frameworks (workloads.frameworks re-exports it: it imports the spec).
FRAMEWORKS = ("batch", "pytorch", "pytorch-elastic", "horovod-elastic", "mpi", "spark")
ELASTIC_FRAMEWORKS = ("pytorch-elastic", "horovod-elastic")
SPARK = "spark"
SPARK_ROLES = ("master", "worker", "driver")
MAX_SLOTS = 256  # processes per worker
MAX_PORTS = 16  # named ports per task
DEFAULT_SLOTS = 1
DEFAULT_MAX_RESTARTS = 3
_PORT_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")


@dataclass(frozen=True, slots=True)
class Training:
    """The JobSpec fields this module decides: the groups come back with their counts
    set from ``workers`` (and, for spark, the master added)."""

    framework: str
    tasks: tuple[TaskGroup, ...]
    min_tasks: int | None
    workers_min: int | None = None
    workers_max: int | None = None
    slots_per_node: int = DEFAULT_SLOTS
    max_restarts: int = DEFAULT_MAX_RESTARTS


def parse_framework(f: Mapping[str, Any], service: bool) -> str:
    """The framework, checked first: it decides which groups may go without a command."""
    value = f.get("framework", BATCH)
    if not isinstance(value, str) or value not in FRAMEWORKS:
        shown = repr(value[:40]) if isinstance(value, str) else _show(value)
        raise SpecError("framework", f"expected one of {', '.join(FRAMEWORKS)}; got {shown}")
    if service and value != BATCH:
        raise SpecError(
            "framework", "does not apply to kind: service (a service's replicas run on their own)"
        )
    return value


def commandless_roles(framework: str) -> frozenset[str]:
    """Roles whose command the framework supplies (Spark's master and worker daemons)."""
    return frozenset(("master", "worker")) if framework == SPARK else frozenset()


def parse(
    f: Mapping[str, Any],
    framework: str,
    tasks: tuple[TaskGroup, ...],
    spark_master: TaskGroup,
    max_retries_limit: int,
    max_count: int,
) -> Training:
    """The training fields of a spec whose groups are already parsed (``f``: the spec's
    given top-level fields, so that a group's given ``count`` can be told from its
    default). ``spark_master`` is the group added to a spark job that names none."""
    if framework == BATCH:
        for key in ("workers", "slots_per_node", "max_restarts"):
            if key in f:
                raise SpecError(
                    key, f"applies only to a training framework ({', '.join(FRAMEWORKS[1:])})"
                )
        return Training(BATCH, tasks, None)
    if "min_tasks" in f:
        raise SpecError(
            "min_tasks",
            f"does not apply to framework: {framework} (give workers: {{min, max}} to an "
            f"elastic one: {', '.join(ELASTIC_FRAMEWORKS)})",
        )
    retries = f.get("restart", {})
    if isinstance(retries, Mapping) and retries.get("max_retries"):
        raise SpecError(
            "restart.max_retries",
            "does not apply to a training job: it restarts as a whole (use max_restarts)",
        )
    low, high = _workers(f.get("workers"), framework, max_count)
    slots = _int(f.get("slots_per_node", DEFAULT_SLOTS), "slots_per_node", 1, MAX_SLOTS)
    restarts = _int(
        f.get("max_restarts", DEFAULT_MAX_RESTARTS), "max_restarts", 0, max_retries_limit
    )
    raw = f.get("tasks")
    if framework == SPARK:
        groups = _spark(tasks, raw, high, spark_master)
    else:
        groups = _workers_group(tasks, raw, framework, high)
        simulated = groups[0].simulate is not None and not groups[0].command
        if framework in ("pytorch", "pytorch-elastic") and not simulated:
            at = next(i for i, g in enumerate(tasks) if g.role == groups[0].role)
            try:
                torchrun_command(groups[0].command)
            except SpecError as exc:
                raise SpecError(f"tasks[{at}].command", exc.problem) from None
    elastic = low is not None and low != high
    return Training(
        framework=framework,
        tasks=groups,
        min_tasks=low if elastic else None,
        workers_min=low if elastic else None,
        workers_max=high if elastic else None,
        slots_per_node=slots,
        max_restarts=restarts,
    )


def _workers(value: object, framework: str, max_count: int) -> tuple[int | None, int | None]:
    """(min, max) as given; (None, None): not given (the group's count stands)."""
    if value is None:
        return None, None
    if isinstance(value, Mapping):
        for key in value:
            if key not in ("min", "max"):
                raise SpecError(f"workers.{str(key)[:64]}", "unknown field (known: max, min)")
        for key in ("min", "max"):
            if value.get(key) is None:
                raise SpecError(f"workers.{key}", "required (or give workers a number)")
        low = _int(value["min"], "workers.min", 1, max_count)
        high = _int(value["max"], "workers.max", 1, max_count)
        if low > high:
            raise SpecError("workers.min", f"must be at most workers.max ({high}), got {low}")
        if low != high and framework not in ELASTIC_FRAMEWORKS:
            raise SpecError(
                "workers",
                f"framework: {framework} is not elastic: give a number of workers "
                f"(elastic: {', '.join(ELASTIC_FRAMEWORKS)})",
            )
        return low, high
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(
            "workers", f"expected a number or a mapping like {{min: 2, max: 4}}, got {_show(value)}"
        )
    n = _int(value, "workers", 1, max_count)
    return n, n


def _given_count(raw: object, i: int) -> bool:
    return (
        isinstance(raw, list | tuple)
        and isinstance(raw[i], Mapping)
        and (raw[i].get("count") is not None)
    )


def _sized(group: TaskGroup, raw: object, i: int, workers: int | None) -> TaskGroup:
    """The group with ``count`` set from ``workers`` (a different given count is an error)."""
    if workers is None:
        return group
    if _given_count(raw, i) and group.count != workers:
        raise SpecError(
            f"tasks[{i}].count", f"must equal workers ({workers}) or be left out, got {group.count}"
        )
    return dataclasses.replace(group, count=workers)


def _workers_group(
    tasks: tuple[TaskGroup, ...], raw: object, framework: str, workers: int | None
) -> tuple[TaskGroup, ...]:
    if len(tasks) != 1:
        raise SpecError(
            "tasks",
            f"a {framework} job has exactly one task group (its workers), got {len(tasks)}",
        )
    return (_sized(tasks[0], raw, 0, workers),)


_SPARK_MIN_MEMORY = {"worker": MIN_WORKER_MEMORY, "driver": MIN_DRIVER_MEMORY}


def _spark(
    tasks: tuple[TaskGroup, ...], raw: object, workers: int | None, master: TaskGroup
) -> tuple[TaskGroup, ...]:
    groups: dict[str, TaskGroup] = {}
    for i, group in enumerate(tasks):
        if group.role not in SPARK_ROLES:
            raise SpecError(
                f"tasks[{i}].role",
                f"a spark job's roles are {', '.join(SPARK_ROLES)}; got {group.role!r}",
            )
        if group.role == "worker":
            group = _sized(group, raw, i, workers)
        elif group.count != 1:
            raise SpecError(
                f"tasks[{i}].count", f"a spark job has one {group.role}, got {group.count}"
            )
        least = _SPARK_MIN_MEMORY.get(group.role, 0)
        if group.resources.memory < least:
            raise SpecError(
                f"tasks[{i}].resources.memory",
                f"a spark {group.role} needs at least {format_bytes(least)} (its JVM's heap "
                f"and overhead), got {format_bytes(group.resources.memory)}",
            )
        groups[group.role] = group
    if "worker" not in groups:
        raise SpecError("tasks", "a spark job needs a `worker` group (its executors' hosts)")
    if "driver" not in groups:
        raise SpecError(
            "tasks", "a spark job needs a `driver` group (its command: the application to submit)"
        )
    sized = tuple(groups[g.role] for g in tasks)
    return sized if "master" in groups else (master, *sized)


def parse_ports(value: object, field: str) -> tuple[str, ...]:
    """A group's named ports: the names its tasks look up as MESH_PORT_<NAME>."""
    if not isinstance(value, list | tuple):
        raise SpecError(field, f"expected a list of port names, got {_show(value)}")
    if len(value) > MAX_PORTS:
        raise SpecError(field, f"at most {MAX_PORTS} ports (MAX_PORTS), got {len(value)}")
    names: list[str] = []
    for j, name in enumerate(value):
        if not isinstance(name, str) or not _PORT_RE.fullmatch(name):
            raise SpecError(
                f"{field}[{j}]",
                "a port name is a-z, then up to 31 of a-z, 0-9, '_' and '-'; "
                f"got {_show(name[:40] if isinstance(name, str) else name)}",
            )
        if name in names:
            raise SpecError(f"{field}[{j}]", f"{name!r} is named twice")
        names.append(name)
    return tuple(names)


def _int(value: object, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"expected an integer, got {_show(value)}")
    if not low <= value <= high:
        raise SpecError(field, f"must be between {low} and {high}, got {_show(value)}")
    return value


def to_dict(
    framework: str,
    workers_min: int | None,
    workers_max: int | None,
    slots_per_node: int,
    max_restarts: int,
) -> dict[str, Any]:
    """The fields as ``parse`` reads them back; none for a batch job (so specs from
    before training keep their exact shape). A fixed size is the groups' counts."""
    out: dict[str, Any] = {}
    if framework == BATCH:
        return out
    out["framework"] = framework
    if workers_min is not None:
        out["workers"] = {"min": workers_min, "max": workers_max}
    if slots_per_node != DEFAULT_SLOTS:
        out["slots_per_node"] = slots_per_node
    if max_restarts != DEFAULT_MAX_RESTARTS:
        out["max_restarts"] = max_restarts
    return out
