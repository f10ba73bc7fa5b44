"""Job specs: what a user asks to run, validated once at the edge.

A spec arrives as YAML from a user (hostile until checked) and leaves as frozen dataclasses
that the rest of Mesh trusts without re-checking. So :func:`parse_job_spec` validates every
field and every size limit, and reports the first problem as a :class:`SpecError` naming the
field's path (``tasks[1].resources.memory``) and what is wrong, in words meant for the user.

``JobSpec.to_dict`` is the exact inverse: ``parse_job_spec(spec.to_dict()) == spec`` for every
valid spec, so a spec can be stored or sent as plain data and read back unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from workloads import federation as _fed
from workloads import training as _training
from workloads.load import LoadCurve, load_to_dict, parse_load
from workloads.quantity import (
    SpecError,
    _show,
    format_bytes,
    format_cpu,
    format_gpu,
    parse_bytes,
    parse_cpu,
    parse_duration,
    parse_gpu,
)
from workloads.resources import Resources
from workloads.spark_memory import MASTER_CPU, MASTER_MEMORY

__all__ = [
    "DEFAULT_CPU",
    "DEFAULT_MEMORY",
    "FOREVER",
    "MAX_COMMAND_BYTES",
    "MAX_COUNT",
    "MAX_ENV_BYTES",
    "MAX_ENV_ENTRIES",
    "MAX_EXIT_CODE",
    "MAX_STOP_S",
    "MAX_LABELS",
    "MAX_LABEL_KEY_LEN",
    "MAX_LABEL_VALUE_LEN",
    "MAX_NAME_LEN",
    "MAX_POOL_DEPTH",
    "MAX_PRIORITY",
    "MAX_RETRIES",
    "MAX_ROLE_LEN",
    "MAX_SOURCE_BYTES",
    "MAX_TASKS",
    "MAX_WORKDIR_LEN",
    "MAX_YAML_NODES",
    "GPU_ISOLATION",
    "JOB_FIELDS",
    "BATCH",
    "DEFAULT_UPDATE",
    "HealthCheck",
    "JOB_KINDS",
    "JobSpec",
    "PlacementPolicy",
    "SERVICE",
    "UpdatePolicy",
    "RestartPolicy",
    "SimulatedRun",
    "TaskGroup",
    "parse_job_spec",
]

# Limits. Each bounds what one spec can make the coordinator, the log and an agent hold.
MAX_SOURCE_BYTES = 1 << 20  # YAML text of one spec
MAX_NAME_LEN = 63  # job name
MAX_ROLE_LEN = 32  # task group role
MAX_TASKS = 10_000  # tasks in a job, all groups together
MAX_COUNT = 10_000  # tasks in one group
MAX_COMMAND_BYTES = 64 * 1024  # one group's argv, UTF-8, each argument plus a NUL
MAX_ENV_ENTRIES = 128  # variables in one group's env
MAX_ENV_BYTES = 64 * 1024  # one group's env as NAME=value plus a NUL each, UTF-8
MAX_LABELS = 32  # labels on a job
MAX_LABEL_KEY_LEN = 63
MAX_LABEL_VALUE_LEN = 256
MAX_POOL_DEPTH = 8  # segments in a pool path
MAX_PRIORITY = 1000
MAX_RETRIES = 100
MAX_EXIT_CODE = 255
MAX_WORKDIR_LEN = 4096
# YAML nodes (scalars, lists, mappings; an alias is not one) in one spec's text. PyYAML
# composes and constructs each node in Python, 6-12 us apiece even with libyaml, so 1 MiB
# of tiny nodes (400k) held the coordinator's event loop ~5 s, past its 2 s lease; this
# caps it near 0.3 s. 50k nodes is 5000 task groups of 10 values; a bigger job can be
# sent as an already-decoded mapping (msgpack), which is not parsed as YAML.
MAX_YAML_NODES = 50_000

# What a task group gets for the kinds its `resources` leave out: enough to start a small
# process, so that a spec without resources still places and is still accounted for.
DEFAULT_CPU = 100  # millicores
DEFAULT_MEMORY = 64 * 2**20  # bytes (64Mi)

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_ROLE_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
_POOL_SEGMENT_RE = re.compile(r"[a-z0-9_-]{1,32}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]*")

JOB_FIELDS = (  # the top-level fields of a job spec
    "name",
    "pool",
    "priority",
    "preemptible",
    "min_tasks",
    "max_run_time",
    "restart",
    "labels",
    "placement",
    "tasks",
    "kind",
    "partition",
    "update",
    "health",
    *_fed.FIELDS,  # regions, spill, lost_after (workloads/federation.py)
    *_training.FIELDS,  # framework, workers, slots_per_node, max_restarts (workloads/training.py)
)
_GROUP_FIELDS = ("role", "count", "command", "env", "workdir", "resources", "simulate", "ports")
_RESTART_FIELDS = ("max_retries", "reschedule_on_lost", "backoff", "max_backoff")
_UPDATE_FIELDS = ("max_unavailable", "max_surge")
_HEALTH_FIELDS = ("command", "interval", "timeout", "healthy_after", "unhealthy_after")
BATCH, SERVICE = "batch", "service"
JOB_KINDS = (BATCH, SERVICE)
# A partition name: "stateless", "batch", or a virtual one inside them ("batch/critical").
_PARTITION_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}(/[a-z0-9][a-z0-9_-]{0,31})?")
MAX_BACKOFF_S = 86400.0  # a restart backoff (or its cap) of at most a day
MAX_HEALTH_INTERVAL_S = 3600.0
MIN_HEALTH_INTERVAL_S = 0.1  # a check every 100 ms at most: each one is a process
MAX_HEALTH_COUNT = 100  # healthy_after / unhealthy_after
_SIMULATE_FIELDS = ("duration", "exit_code", "load", "stop")
MAX_STOP_S = 3600.0  # as a kill's grace period (Assignment.grace_s) may be at most
FOREVER = "forever"  # simulate.duration of a run that lasts until it is killed
_PLACEMENT_FIELDS = ("labels", "strategy", "spread_by", "anti_affinity", "gpu_isolation", "gang")
STRATEGIES = ("binpack", "spread", "pack")
SPREAD_BY = ("zone", "node")
# Weakest to strongest: a task asking for one level is placed only on GPUs that deliver
# it or a stronger one (see docs/gpu.md for what each guarantees).
GPU_ISOLATION = ("none", "watchdog", "mps", "mig")
_RESOURCE_FIELDS = Resources.KINDS
_NO_RESOURCES = Resources()  # frozen, so one shared instance is a safe default


@dataclass(frozen=True, slots=True)
class SimulatedRun:
    """A run that only hollow (simulated) agents perform: they report it as lasting
    ``duration_s`` and ending with ``exit_code``, which lets scale tests and demos drive the
    whole scheduler without starting processes. ``duration_s`` None (``duration:
    forever``) runs until it is killed, as a service replica does. ``load`` is the CPU it
    keeps busy meanwhile (workloads.load); None: its cpu request, at the hollow node's
    default fraction. ``stop_s`` is how long it takes to stop once killed (a process
    that handles SIGTERM, as a checkpointing batch task does), never past the kill's
    grace period; 0: at once."""

    duration_s: float | None
    exit_code: int = 0
    load: LoadCurve | None = None
    stop_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TaskGroup:
    """``count`` identical tasks that play one ``role`` in a job (e.g. 1 ps, 8 workers).

    ``command`` is an argv; a YAML string command becomes ``("/bin/sh", "-c", cmd)``.
    ``env`` is sorted by name so that equal environments compare equal.
    ``resources`` is per task; the parser fills in ``DEFAULT_CPU``/``DEFAULT_MEMORY`` for
    those kinds a spec leaves out (the dataclass default itself is all zero).
    """

    role: str
    count: int = 1
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    resources: Resources = _NO_RESOURCES
    simulate: SimulatedRun | None = None
    workdir: str | None = None
    ports: tuple[str, ...] = ()  # named ports each task asks for (docs/training.md)


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """Where a job's tasks may go and how they are arranged.

    ``labels`` must all be carried by a node (the key ``zone`` matches the node's zone).
    ``strategy``: ``binpack`` fills the tightest nodes first (large holes stay open),
    ``spread`` balances the job's tasks over ``spread_by`` (zones or nodes), ``pack`` puts
    them on as few nodes as possible (NCCL locality). ``anti_affinity`` allows at most one
    of the job's tasks per node. ``gpu_isolation`` is the weakest GPU enforcement the job
    accepts. ``gang``: the job's pending tasks are placed all or nothing (or, for an
    elastic job, its first ``min_tasks``).
    """

    labels: tuple[tuple[str, str], ...] = ()  # sorted by key
    strategy: str = "binpack"
    spread_by: str = "zone"
    anti_affinity: bool = False
    gpu_isolation: str = "none"
    gang: bool = True


DEFAULT_PLACEMENT = PlacementPolicy()
# The master a spark job that names none is given: the framework supplies its command.
_SPARK_MASTER = TaskGroup("master", resources=Resources(cpu=MASTER_CPU, memory=MASTER_MEMORY))


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """What happens to a task whose attempt ended without success."""

    max_retries: int = 0  # re-runs after FAILED (batch only: a service restarts for good)
    reschedule_on_lost: bool = True  # re-place tasks whose node was lost
    # Services only: a replica that ended waits backoff_s x 2^(n-1) (n: its quick restarts
    # in a row), at most max_backoff_s, before it is started again.
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0


@dataclass(frozen=True, slots=True)
class UpdatePolicy:
    """How a service's replicas are moved (rolling update, a draining node): at most
    ``max_surge`` replicas above ``count`` at once, and never fewer than ``count -
    max_unavailable`` available (RUNNING, and healthy where there is a health check)
    by the coordinator's choice. The default moves one replica at a time, the new one
    started before the old one stops."""

    max_unavailable: int = 0
    max_surge: int = 1


DEFAULT_UPDATE = UpdatePolicy()


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """A command the agent runs beside each replica every ``interval_s`` (as the task's
    user, killed after ``timeout_s``): exit 0 is a pass. ``healthy_after`` passes in a row
    mark the replica healthy, ``unhealthy_after`` failures in a row unhealthy."""

    command: tuple[str, ...]
    interval_s: float = 10.0
    timeout_s: float = 5.0
    healthy_after: int = 1
    unhealthy_after: int = 3


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job: build it with :func:`parse_job_spec`, not by hand, unless the values
    are known to be valid (the dataclass itself does not re-check them)."""

    name: str
    tasks: tuple[TaskGroup, ...]
    pool: str = "/"
    priority: int = 0  # 0..MAX_PRIORITY, higher first
    preemptible: bool = True  # False: runs only within its pool's reservation, never preempted
    min_tasks: int | None = None  # elastic: preemption may shrink it to this many tasks first
    max_run_time_s: float | None = None
    restart: RestartPolicy = RestartPolicy()
    labels: tuple[tuple[str, str], ...] = ()  # sorted by key
    placement: PlacementPolicy = DEFAULT_PLACEMENT
    kind: str = BATCH  # batch: runs to completion; service: `count` replicas kept running
    partition: str = ""  # "": the kind's own (stateless for services, batch for batch jobs)
    update: UpdatePolicy = DEFAULT_UPDATE  # services only
    health: HealthCheck | None = None  # services only
    # Federation (workloads/federation.py): preferred regions, how long it waits at home
    # before it may spill (None: never), how long a region holding it may be away (None:
    # for ever) before the home places it again.
    regions: tuple[str, ...] = ()
    spill_after_s: float | None = None
    lost_after_s: float | None = None
    # Training (workloads/training.py, docs/training.md): the framework whose adapter
    # (workloads/frameworks) makes each task's argv and environment; an elastic job's
    # worker bounds (both None: a fixed size); slots (processes) per worker; and the
    # failures the whole job may restart from (a framework restarts all its workers).
    framework: str = "batch"
    workers_min: int | None = None
    workers_max: int | None = None
    slots_per_node: int = 1
    max_restarts: int = 3

    @property
    def is_service(self) -> bool:
        return self.kind == SERVICE

    @property
    def is_elastic(self) -> bool:
        """A training job the scheduler sizes between workers_min and workers_max."""
        return self.workers_min is not None and self.workers_min != self.workers_max

    @property
    def placement_partition(self) -> str:
        """The partition the job runs in: the one it names, else its kind's."""
        return self.partition or ("stateless" if self.kind == SERVICE else "batch")

    @property
    def task_count(self) -> int:
        return sum(group.count for group in self.tasks)

    @property
    def total_resources(self) -> Resources:
        """What the whole job asks for at once: what a gang needs free to start."""
        total = Resources()
        for group in self.tasks:
            total += group.resources.scaled(group.count)
        return total

    def to_dict(self) -> dict[str, Any]:
        """Plain data in the YAML shape, every field explicit (defaults included), so that
        ``parse_job_spec(spec.to_dict()) == spec``. Quantities are written as exact strings
        (``"500m"``, ``"64Mi"``, ``"0.25"``), durations as float seconds."""
        out: dict[str, Any] = {
            "name": self.name,
            "pool": self.pool,
            "priority": self.priority,
            "preemptible": self.preemptible,
            # A training job's min_tasks is its workers' min, written as `workers`.
            "min_tasks": self.min_tasks if self.framework == BATCH else None,
            "restart": {
                "max_retries": self.restart.max_retries,
                "reschedule_on_lost": self.restart.reschedule_on_lost,
            },
            "labels": dict(self.labels),
            "placement": {
                "labels": dict(self.placement.labels),
                "strategy": self.placement.strategy,
                "anti_affinity": self.placement.anti_affinity,
                "gpu_isolation": self.placement.gpu_isolation,
                "gang": self.placement.gang,
            },
            "tasks": [_group_to_dict(group) for group in self.tasks],
        }
        if self.placement.strategy == "spread":
            out["placement"]["spread_by"] = self.placement.spread_by
        if self.max_run_time_s is not None:
            out["max_run_time"] = float(self.max_run_time_s)
        out["kind"] = self.kind
        out["partition"] = self.partition
        if self.kind == SERVICE:
            out["restart"]["backoff"] = float(self.restart.backoff_s)
            out["restart"]["max_backoff"] = float(self.restart.max_backoff_s)
            out["update"] = {
                "max_unavailable": self.update.max_unavailable,
                "max_surge": self.update.max_surge,
            }
            if self.health is not None:
                h = self.health
                out["health"] = {
                    "command": list(h.command),
                    "interval": float(h.interval_s),
                    "timeout": float(h.timeout_s),
                    "healthy_after": h.healthy_after,
                    "unhealthy_after": h.unhealthy_after,
                }
        out.update(_fed.to_dict(self.regions, self.spill_after_s, self.lost_after_s))
        out.update(
            _training.to_dict(
                self.framework,
                self.workers_min,
                self.workers_max,
                self.slots_per_node,
                self.max_restarts,
            )
        )
        return out


def _group_to_dict(group: TaskGroup) -> dict[str, Any]:
    r = group.resources
    out: dict[str, Any] = {
        "role": group.role,
        "count": group.count,
        "env": dict(group.env),
        # Every kind, so the parser's defaults never replace an explicit zero.
        "resources": {
            "cpu": format_cpu(r.cpu),
            "memory": format_bytes(r.memory),
            "disk": format_bytes(r.disk),
            "gpu": format_gpu(r.gpu),
            "gpu_memory": format_bytes(r.gpu_memory),
        },
    }
    if group.command:
        out["command"] = list(group.command)
    if group.simulate is not None:
        sim = group.simulate
        if sim.duration_s is None:
            out["simulate"] = {"duration": FOREVER}
        else:
            out["simulate"] = {"duration": float(sim.duration_s), "exit_code": sim.exit_code}
        if sim.load is not None:
            out["simulate"]["load"] = load_to_dict(sim.load)
        if sim.stop_s:
            out["simulate"]["stop"] = float(sim.stop_s)
    if group.workdir is not None:
        out["workdir"] = group.workdir
    if group.ports:
        out["ports"] = list(group.ports)
    return out


# --------------------------------------------------------------------------- parsing


# libyaml's parser is fast and caps nesting at 1000 levels; the pure-Python one is quadratic in
# nesting depth (a few KiB of "[" cost seconds), so it is only the fallback.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _TooManyNodes(yaml.YAMLError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} YAML nodes")
        self.limit = limit


class _Loader(_SafeLoader):  # type: ignore[misc, valid-type]
    """A safe loader that rejects duplicate keys, which plain YAML silently resolves to the
    last one: in a job spec that hides a mistake (two `resources:` blocks, say), and stops
    after ``max_nodes`` nodes (None: no limit)."""

    max_nodes: int | None = MAX_YAML_NODES
    _nodes = 0

    def descend_resolver(self, current_node: object, current_index: object) -> None:
        # Called once per node the composer makes, explicitly tagged ones included.
        self._nodes += 1
        if self.max_nodes is not None and self._nodes > self.max_nodes:
            raise _TooManyNodes(self.max_nodes)
        return super().descend_resolver(current_node, current_index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {_show(key)}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def parse_job_spec(source: str | bytes | Mapping[str, Any]) -> JobSpec:
    """Validate a job spec given as YAML text, UTF-8 bytes or an already-decoded mapping.

    Raises :class:`SpecError` for the first problem found. A YAML ``null`` counts as the
    field not being given.
    """
    return _job(_load(source))


def _load(source: object) -> object:
    if isinstance(source, Mapping):
        return source
    if isinstance(source, bytes | bytearray):
        if len(source) > MAX_SOURCE_BYTES:
            raise SpecError("", _too_big("spec", len(source), MAX_SOURCE_BYTES, "MAX_SOURCE_BYTES"))
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as err:
            raise SpecError(
                "", f"spec is not valid UTF-8: {err.reason} at byte {err.start}"
            ) from None
    if not isinstance(source, str):
        raise SpecError("", f"expected YAML text, bytes or a mapping, got {type(source).__name__}")
    size = len(source) if len(source) > MAX_SOURCE_BYTES else len(source.encode("utf-8"))
    if size > MAX_SOURCE_BYTES:
        raise SpecError("", _too_big("spec", size, MAX_SOURCE_BYTES, "MAX_SOURCE_BYTES"))
    try:
        return yaml.load(source, Loader=_Loader)  # _Loader is a SafeLoader
    except _TooManyNodes as err:
        raise SpecError(
            "",
            f"spec has more than {err.limit} YAML values (MAX_YAML_NODES); send a job "
            "this big as an already-decoded mapping",
        ) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise SpecError("", f"invalid YAML: {where}{err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise SpecError("", f"invalid YAML: {err}") from None
    except RecursionError:
        raise SpecError("", "invalid YAML: nested too deeply") from None
    except _UNREADABLE as err:
        raise SpecError("", f"invalid YAML: {_unreadable(err)}") from None


def _text(value: object) -> str:
    """str() of a user value, short when it is an int too big to print (a YAML ``0x...`` int
    has no digit limit, but its str() raises ValueError past 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 1024:
        return _show(value)
    return str(value)


# What PyYAML's constructors raise, besides YAMLError, for a scalar they cannot convert: an
# int of over 4300 digits (ValueError), a timestamp with month 13 (ValueError), an explicit
# `!!timestamp 1` or `2001-02-30 25:61:61` (AttributeError: its regex did not match).
_UNREADABLE = (ValueError, OverflowError, TypeError, AttributeError, LookupError)


def _unreadable(err: Exception) -> str:
    """What PyYAML could not convert, in words: its errors here are Python's own, and
    their class names (`ValueError: ...`, `TypeError: cannot unpack non-iterable
    MappingNode object`) went back to API clients, who cannot act on them."""
    text = str(err)
    if "digits" in text and "integer" in text:
        return "a value could not be read: an integer of more than 4300 digits"
    if isinstance(err, ValueError | OverflowError) and text:  # a date with month 13
        return f"a value could not be read: {text[:200]}"
    return "a value could not be read: it does not fit its tag or type (e.g. `!!timestamp 1`)"


def _too_big(what: str, size: int, limit: int, name: str) -> str:
    return f"{what} is {size} bytes, over the limit of {limit} ({name})"


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _kind(value: object) -> str:
    """How a wrong value is described: its YAML-ish type, never its (maybe huge) content."""
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "nothing",
    }
    return names.get(type(value), type(value).__name__)


def _fields(value: object, path: str, known: tuple[str, ...]) -> dict[str, Any]:
    """The given (non-null) fields of a mapping; unknown fields are errors, because in a
    hand-written spec they are nearly always a typo that would otherwise be ignored."""
    if type(value) is not dict and not isinstance(value, Mapping):  # (ABC checks are slow)
        raise SpecError(path, f"expected a mapping, got {_kind(value)}")
    fields: dict[str, Any] = {}
    for key, item in value.items():
        if key not in known:
            raise SpecError(
                _join(path, _text(key)[:64]), f"unknown field (known: {', '.join(sorted(known))})"
            )
        if item is not None:
            fields[key] = item
    return fields


def _int(value: object, field: str, low: int, high: int, limit_name: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"expected an integer, got {_kind(value)}")
    if not low <= value <= high:
        limit = f" ({limit_name})" if limit_name and value > high else ""
        raise SpecError(field, f"must be between {low} and {high}{limit}, got {_text(value)}")
    return value


def _str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise SpecError(field, f"expected a string, got {_kind(value)}")
    return value


def _scalar_str(value: object, field: str) -> str:
    """A string, or a number written without quotes (YAML makes ``PORT: 80`` an int)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 1024:  # str() raises past 4300 digits (0x... has no cap)
            raise SpecError(field, f"integer of {value.bit_length()} bits is too long")
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if not isinstance(value, str):
        raise SpecError(field, f"expected a string, got {_kind(value)}")
    return value


def _no_nul(text: str, field: str) -> str:
    if "\x00" in text:
        raise SpecError(field, "must not contain a NUL character")
    return text


def _job(data: object) -> JobSpec:
    if data is None:
        raise SpecError("", "the spec is empty")
    f = _fields(data, "", JOB_FIELDS)
    kind = _choice(f.get("kind", BATCH), "kind", JOB_KINDS)
    service = kind == SERVICE
    name = _name(f.get("name"))
    pool = _pool(f.get("pool", "/"))
    priority = _int(f.get("priority", 0), "priority", 0, MAX_PRIORITY, "MAX_PRIORITY")
    max_run_time = None
    if "max_run_time" in f:
        max_run_time = parse_duration(f["max_run_time"], "max_run_time")
        if max_run_time <= 0:
            raise SpecError("max_run_time", "must be more than 0")
    preemptible = f.get("preemptible", True)
    if not isinstance(preemptible, bool):
        raise SpecError("preemptible", f"expected true or false, got {_kind(preemptible)}")
    min_tasks = f.get("min_tasks")
    restart = _restart(f.get("restart", {}), service)
    labels = _labels(f.get("labels", {}))
    placement = _placement(f.get("placement", {}), service)
    framework = _training.parse_framework(f, service)
    tasks = _tasks(f.get("tasks"), _training.commandless_roles(framework))
    partition = _partition(f.get("partition", ""))
    update, health = _service_fields(f, service, max_run_time, min_tasks)
    regions, spill_after, lost_after = _fed.parse(f)
    train = _training.parse(f, framework, tasks, _SPARK_MASTER, MAX_RETRIES, MAX_COUNT)
    tasks = train.tasks
    if sum(g.count for g in tasks) > MAX_TASKS:  # a spark job's workers, its master, its driver
        raise SpecError("workers", f"at most {MAX_TASKS} tasks in a job (MAX_TASKS)")
    if framework != BATCH:
        min_tasks = train.min_tasks
    elif min_tasks is not None:
        total = sum(g.count for g in tasks)
        min_tasks = _int(min_tasks, "min_tasks", 1, total, "the job's task count")
        if len({g.resources for g in tasks}) != 1:
            raise SpecError(
                "min_tasks",
                "an elastic job's task groups must ask for the same resources, so that any "
                "of its tasks can be given back",
            )
    return JobSpec(
        name=name,
        tasks=tasks,
        pool=pool,
        priority=priority,
        preemptible=preemptible,
        min_tasks=min_tasks,
        max_run_time_s=max_run_time,
        restart=restart,
        labels=labels,
        placement=placement,
        kind=kind,
        partition=partition,
        update=update,
        health=health,
        regions=regions,
        spill_after_s=spill_after,
        lost_after_s=lost_after,
        framework=framework,
        workers_min=train.workers_min,
        workers_max=train.workers_max,
        slots_per_node=train.slots_per_node,
        max_restarts=train.max_restarts,
    )


def _name(value: object) -> str:
    if value is None:
        raise SpecError("name", "required")
    name = _str(value, "name")
    if len(name) > MAX_NAME_LEN:
        raise SpecError(
            "name", f"at most {MAX_NAME_LEN} characters (MAX_NAME_LEN), got {len(name)}"
        )
    if not _NAME_RE.fullmatch(name):
        raise SpecError(
            "name", f"use a-z, 0-9, '_', '.' and '-', starting with a letter or digit; got {name!r}"
        )
    return name


def _pool(value: object) -> str:
    pool = _str(value, "pool")
    if pool == "/":
        return pool
    segments = pool.split("/")
    if segments[0] != "" or not all(_POOL_SEGMENT_RE.fullmatch(s) for s in segments[1:]):
        raise SpecError(
            "pool",
            "expected '/' or a path like /ml/vision (segments of 1-32 "
            f"a-z, 0-9, '_', '-'); got {pool[:80]!r}",
        )
    if len(segments) - 1 > MAX_POOL_DEPTH:
        raise SpecError(
            "pool",
            f"at most {MAX_POOL_DEPTH} levels deep (MAX_POOL_DEPTH), got {len(segments) - 1}",
        )
    return pool


def _restart(value: object, service: bool) -> RestartPolicy:
    f = _fields(value, "restart", _RESTART_FIELDS)
    retries = _int(f.get("max_retries", 0), "restart.max_retries", 0, MAX_RETRIES, "MAX_RETRIES")
    on_lost = f.get("reschedule_on_lost", True)
    if not isinstance(on_lost, bool):
        raise SpecError(
            "restart.reschedule_on_lost", f"expected true or false, got {_kind(on_lost)}"
        )
    if not service:
        for key in ("backoff", "max_backoff"):
            if key in f:
                raise SpecError(
                    f"restart.{key}", "applies only to kind: service (a batch job retries at once)"
                )
        return RestartPolicy(max_retries=retries, reschedule_on_lost=on_lost)
    if retries:
        raise SpecError(
            "restart.max_retries",
            "does not apply to a service: its replicas are restarted for good (with backoff)",
        )
    if not on_lost:
        raise SpecError(
            "restart.reschedule_on_lost",
            "a service's replicas are always started again elsewhere when their node is lost",
        )
    backoff = _seconds(f.get("backoff", 1.0), "restart.backoff", MAX_BACKOFF_S)
    most = _seconds(f.get("max_backoff", max(60.0, backoff)), "restart.max_backoff", MAX_BACKOFF_S)
    if most < backoff:
        raise SpecError("restart.max_backoff", f"must be at least restart.backoff ({backoff:g}s)")
    return RestartPolicy(0, True, backoff, most)


def _seconds(value: object, field: str, high: float, least: float = 0.0) -> float:
    """A duration of more than 0 (and at least `least`), and at most `high`."""
    seconds = parse_duration(value, field)
    if not (0 < seconds <= high and seconds >= least):
        low = f"at least {least:g}s" if least else "more than 0s"
        raise SpecError(field, f"must be {low} and at most {high:g}s, got {seconds:g}s")
    return seconds


def _partition(value: object) -> str:
    name = _str(value, "partition")
    if name and not _PARTITION_RE.fullmatch(name):
        raise SpecError(
            "partition",
            "expected a partition name like stateless, batch or batch/critical "
            f"(a-z, 0-9, '_', '-'; at most one '/'); got {name[:80]!r}",
        )
    return name


def _service_fields(
    f: dict[str, Any], service: bool, max_run_time: float | None, min_tasks: object
) -> tuple[UpdatePolicy, HealthCheck | None]:
    """A service's own fields, and the batch fields that make no sense for one."""
    if not service:
        for key in ("update", "health"):
            if key in f:
                raise SpecError(key, "applies only to kind: service")
        return DEFAULT_UPDATE, None
    if max_run_time is not None:
        raise SpecError("max_run_time", "does not apply to a service: its replicas run for good")
    if min_tasks is not None:
        raise SpecError(
            "min_tasks", "does not apply to a service: its replicas are placed one by one"
        )
    update = _update(f.get("update", {}))
    health = _health(f["health"]) if "health" in f else None
    return update, health


def _update(value: object) -> UpdatePolicy:
    f = _fields(value, "update", _UPDATE_FIELDS)
    unavailable = _int(f.get("max_unavailable", 0), "update.max_unavailable", 0, MAX_COUNT)
    surge = _int(f.get("max_surge", 1), "update.max_surge", 0, MAX_COUNT)
    if not surge and not unavailable:
        raise SpecError(
            "update",
            "max_surge and max_unavailable are both 0: no replica could ever be moved",
        )
    return UpdatePolicy(max_unavailable=unavailable, max_surge=surge)


def _health(value: object) -> HealthCheck:
    f = _fields(value, "health", _HEALTH_FIELDS)
    if "command" not in f:
        raise SpecError("health.command", "required")
    command = _command(f["command"], "health.command")
    interval = _seconds(
        f.get("interval", 10.0), "health.interval", MAX_HEALTH_INTERVAL_S, MIN_HEALTH_INTERVAL_S
    )
    timeout = _seconds(f.get("timeout", min(5.0, interval)), "health.timeout", interval)
    counts = {}
    for key, default in (("healthy_after", 1), ("unhealthy_after", 3)):
        counts[key] = _int(f.get(key, default), f"health.{key}", 1, MAX_HEALTH_COUNT)
    return HealthCheck(
        command, interval, timeout, counts["healthy_after"], counts["unhealthy_after"]
    )


def _placement(value: object, service: bool = False) -> PlacementPolicy:
    f = _fields(value, "placement", _PLACEMENT_FIELDS)
    if service:
        # A service's replicas are each placed alone (and each kept running alone).
        if f.get("gang", False) is True:
            raise SpecError(
                "placement.gang", "does not apply to a service: its replicas are placed one by one"
            )
        f = {**f, "gang": False}
    if not f:
        return DEFAULT_PLACEMENT
    labels = _labels(f.get("labels", {}), "placement.labels")
    strategy = _choice(f.get("strategy", "binpack"), "placement.strategy", STRATEGIES)
    spread_by = _choice(f.get("spread_by", "zone"), "placement.spread_by", SPREAD_BY)
    if "spread_by" in f and strategy != "spread":
        raise SpecError("placement.spread_by", "only applies with strategy: spread")
    isolation = _choice(f.get("gpu_isolation", "none"), "placement.gpu_isolation", GPU_ISOLATION)
    flags = {}
    for key, default in (("anti_affinity", False), ("gang", True)):
        flags[key] = f.get(key, default)
        if not isinstance(flags[key], bool):
            raise SpecError(f"placement.{key}", f"expected true or false, got {_kind(flags[key])}")
    if flags["anti_affinity"] and strategy == "pack":
        raise SpecError(
            "placement.anti_affinity",
            "contradicts strategy: pack (one task per node vs fewest nodes)",
        )
    return PlacementPolicy(
        labels, strategy, spread_by, flags["anti_affinity"], isolation, flags["gang"]
    )


def _choice(value: object, field: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        shown = repr(value[:40]) if isinstance(value, str) else _kind(value)
        raise SpecError(field, f"expected one of {', '.join(choices)}; got {shown}")
    return value


def _labels(value: object, path: str = "labels") -> tuple[tuple[str, str], ...]:
    return _parsed_once(_parse_labels, value, path, MAX_LABELS)  # (label sets repeat too)


def _parse_labels(value: object, path: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected a mapping, got {_kind(value)}")
    if len(value) > MAX_LABELS:
        raise SpecError(path, f"at most {MAX_LABELS} labels (MAX_LABELS), got {len(value)}")
    labels: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise SpecError(path, f"label names must be strings, got {_kind(key)}")
        field = f"{path}.{key[:MAX_LABEL_KEY_LEN]}"
        if len(key) > MAX_LABEL_KEY_LEN:
            raise SpecError(
                field, f"label name longer than {MAX_LABEL_KEY_LEN} characters (MAX_LABEL_KEY_LEN)"
            )
        if not _LABEL_KEY_RE.fullmatch(key):
            raise SpecError(
                field,
                "label names use A-Z, a-z, 0-9, '_', '.', '/', '-', starting "
                "with a letter or digit",
            )
        text = _scalar_str(item, field)
        if len(text) > MAX_LABEL_VALUE_LEN:
            raise SpecError(
                field,
                f"at most {MAX_LABEL_VALUE_LEN} characters (MAX_LABEL_VALUE_LEN), got {len(text)}",
            )
        labels[key] = text
    return tuple(sorted(labels.items()))


def _tasks(value: object, commandless: frozenset[str] = frozenset()) -> tuple[TaskGroup, ...]:
    if value is None:
        raise SpecError("tasks", "a job needs at least one task group")
    if not isinstance(value, list | tuple):
        raise SpecError("tasks", f"expected a list of task groups, got {_kind(value)}")
    if not value:
        raise SpecError("tasks", "a job needs at least one task group")
    if len(value) > MAX_TASKS:
        raise SpecError(
            "tasks", f"at most {MAX_TASKS} tasks in a job (MAX_TASKS), got {len(value)} groups"
        )
    groups: list[TaskGroup] = []
    roles: set[str] = set()
    total = 0
    for i, item in enumerate(value):
        group = _group(item, f"tasks[{i}]", roles, commandless)
        total += group.count
        if total > MAX_TASKS:
            raise SpecError(
                "tasks", f"at most {MAX_TASKS} tasks in a job (MAX_TASKS), got {total} or more"
            )
        groups.append(group)
    return tuple(groups)


def _group(
    value: object, path: str, roles: set[str], commandless: frozenset[str] = frozenset()
) -> TaskGroup:
    f = _fields(value, path, _GROUP_FIELDS)
    role = _role(f.get("role"), f"{path}.role", roles)
    count = _int(f.get("count", 1), f"{path}.count", 1, MAX_COUNT, "MAX_COUNT")
    command = _command(f["command"], f"{path}.command") if "command" in f else ()
    env = _env(f.get("env", {}), f"{path}.env")
    workdir = _workdir(f["workdir"], f"{path}.workdir") if "workdir" in f else None
    resources = _resources(f.get("resources", {}), f"{path}.resources")
    simulate = _simulate(f["simulate"], f"{path}.simulate") if "simulate" in f else None
    ports = _training.parse_ports(f["ports"], f"{path}.ports") if "ports" in f else ()
    if not command and simulate is None and role not in commandless:
        raise SpecError(f"{path}.command", "required (or give `simulate` for a simulated run)")
    return TaskGroup(
        role=role,
        count=count,
        command=command,
        env=env,
        resources=resources,
        simulate=simulate,
        workdir=workdir,
        ports=ports,
    )


def _role(value: object, field: str, roles: set[str]) -> str:
    if value is None:
        raise SpecError(field, "required")
    role = _str(value, field)
    if len(role) > MAX_ROLE_LEN:
        raise SpecError(field, f"at most {MAX_ROLE_LEN} characters (MAX_ROLE_LEN), got {len(role)}")
    if not _ROLE_RE.fullmatch(role):
        raise SpecError(
            field, f"use a-z, 0-9, '_' and '-', starting with a letter or digit; got {role!r}"
        )
    if role in roles:
        raise SpecError(field, f"duplicate role {role!r}: roles must be unique within a job")
    roles.add(role)
    return role


def _command(value: object, field: str) -> tuple[str, ...]:
    if isinstance(value, str):
        if not value.strip():
            raise SpecError(field, "must not be empty")
        argv: tuple[str, ...] = ("/bin/sh", "-c", value)
    elif isinstance(value, list | tuple):
        if not value:
            raise SpecError(field, "must not be empty")
        if len(value) > MAX_COMMAND_BYTES:  # each argument takes at least its NUL
            raise SpecError(
                field, _too_big("command", len(value), MAX_COMMAND_BYTES, "MAX_COMMAND_BYTES")
            )
        argv = tuple(_scalar_str(arg, f"{field}[{i}]") for i, arg in enumerate(value))
        if not argv[0]:
            raise SpecError(f"{field}[0]", "the program must not be empty")
    else:
        raise SpecError(field, f"expected a string or a list of arguments, got {_kind(value)}")
    size = 0
    for i, arg in enumerate(argv):
        _no_nul(arg, field if isinstance(value, str) else f"{field}[{i}]")
        size += len(arg.encode("utf-8")) + 1
    if size > MAX_COMMAND_BYTES:
        raise SpecError(field, _too_big("command", size, MAX_COMMAND_BYTES, "MAX_COMMAND_BYTES"))
    return argv


def _env(value: object, field: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(field, f"expected a mapping of NAME: value, got {_kind(value)}")
    if len(value) > MAX_ENV_ENTRIES:
        raise SpecError(
            field, f"at most {MAX_ENV_ENTRIES} variables (MAX_ENV_ENTRIES), got {len(value)}"
        )
    env: dict[str, str] = {}
    size = 0
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
            shown = name[:64] if isinstance(name, str) else name
            raise SpecError(
                field,
                f"variable names use A-Z, a-z, 0-9 and '_', not starting "
                f"with a digit; got {_show(shown)}",
            )
        text = _no_nul(_scalar_str(item, f"{field}.{name}"), f"{field}.{name}")
        size += len(name.encode("utf-8")) + len(text.encode("utf-8")) + 2
        if size > MAX_ENV_BYTES:
            raise SpecError(field, f"over the limit of {MAX_ENV_BYTES} bytes (MAX_ENV_BYTES)")
        env[name] = text
    return tuple(sorted(env.items()))


def _workdir(value: object, field: str) -> str:
    workdir = _no_nul(_str(value, field), field)
    if len(workdir) > MAX_WORKDIR_LEN:
        raise SpecError(field, f"at most {MAX_WORKDIR_LEN} characters (MAX_WORKDIR_LEN)")
    if not workdir.startswith("/"):
        raise SpecError(field, f"must be an absolute path, got {workdir[:80]!r}")
    return workdir


def _resources(value: object, path: str) -> Resources:
    """Parsed once per distinct request: a backlog's jobs ask for a few dozen resource
    mappings between them, and quantities cost the leader a quarter of a spec's parse."""
    return _parsed_once(_parse_resources, value, path, len(_RESOURCE_FIELDS))


def _parsed_once(parse: Any, value: object, path: str, most: int) -> Any:
    """`parse(value, path)`, kept for a mapping of plain values seen before (errors are
    never kept: they are raised again, with the caller's path)."""
    key = _plain_key(value, most)
    return parse(value, path) if key is None else _kept(parse, key, path)


@lru_cache(maxsize=2048)
def _kept(parse: Any, key: tuple, path: str) -> Any:
    return parse({name: item for name, _, item, _ in key}, path)


def _plain_key(value: object, most: int) -> tuple | None:
    """A hashable form of a mapping of at most `most` strings and numbers (bools excluded:
    True equals 1, and reads differently), typed so that 1 and 1.0 differ; else None."""
    if type(value) is not dict or len(value) > most:
        return None
    key = []
    for name, item in value.items():
        kind = type(item)
        if kind is not str and kind is not int and kind is not float:
            return None
        key.append((name, kind, item, repr(item) if kind is float else None))
    return tuple(key)


def _parse_resources(value: object, path: str) -> Resources:
    f = _fields(value, path, _RESOURCE_FIELDS)
    cpu = parse_cpu(f["cpu"], f"{path}.cpu") if "cpu" in f else DEFAULT_CPU
    memory = parse_bytes(f["memory"], f"{path}.memory") if "memory" in f else DEFAULT_MEMORY
    disk = parse_bytes(f["disk"], f"{path}.disk") if "disk" in f else 0
    gpu = parse_gpu(f["gpu"], f"{path}.gpu") if "gpu" in f else 0
    gpu_memory = parse_bytes(f["gpu_memory"], f"{path}.gpu_memory") if "gpu_memory" in f else 0
    if gpu_memory and not gpu:
        raise SpecError(f"{path}.gpu_memory", "needs a gpu request too (set gpu)")
    return Resources(cpu=cpu, memory=memory, disk=disk, gpu=gpu, gpu_memory=gpu_memory)


def _simulate(value: object, path: str) -> SimulatedRun:
    f = _fields(value, path, _SIMULATE_FIELDS)
    if "duration" not in f:
        raise SpecError(
            f"{path}.duration", f"required (a duration, or {FOREVER!r} to run until killed)"
        )
    load = parse_load(f["load"], f"{path}.load") if "load" in f else None
    stop = parse_duration(f["stop"], f"{path}.stop") if "stop" in f else 0.0
    if stop > MAX_STOP_S:
        raise SpecError(f"{path}.stop", f"at most {MAX_STOP_S:g}s (a kill's longest grace period)")
    if f["duration"] == FOREVER:
        if "exit_code" in f:
            raise SpecError(f"{path}.exit_code", f"a run of duration {FOREVER!r} never exits")
        return SimulatedRun(duration_s=None, load=load, stop_s=stop)
    duration = parse_duration(f["duration"], f"{path}.duration")
    exit_code = _int(f.get("exit_code", 0), f"{path}.exit_code", 0, MAX_EXIT_CODE)
    return SimulatedRun(duration_s=duration, exit_code=exit_code, load=load, stop_s=stop)
