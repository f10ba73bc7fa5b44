"""Model specs: an inference model to serve, turned into an ordinary job.

A model is registered with what the router needs to plan deadlines (its SLO, maximum
batch, memory need and, optionally, a declared latency profile per GPU type,
``latency(batch) = a_ms + b_ms * batch``) and with what its replicas need to run.
:func:`model_job` turns it into a :class:`~workloads.spec.JobSpec` whose one task group
runs ``count = replicas`` inference workers, so the coordinator places the replicas as it
places any (fractional-GPU) task, and the agent gives each its GPU through
``CUDA_VISIBLE_DEVICES`` as it does for any task. A worker announces itself to the
router, then refits its profile from what it measures.

```yaml
name: mlp               # required; requests go to mesh.<region>.infer.<name>
runtime: numpy          # numpy | profile | torch
slo_ms: 100             # deadline of a request that names none
max_batch: 64
memory: 64Mi            # required: the model's memory (on the GPU if it has one)
replicas: 2
min_replicas: 1         # optional: preemption may shrink the job to this many first
resources:              # per replica; defaults below
  cpu: 500m
  memory: 512Mi
  gpu: 0.25
  gpu_memory: 2Gi       # default: the model's memory
gpu_type: A100          # optional: only nodes labelled gpu_type=A100, and profiles.A100
profiles:               # optional, per GPU type ("cpu" for replicas with no GPU)
  A100: {a_ms: 5.2, b_ms: 1.08}
pool: /ml               # pool, priority, preemptible, labels, placement: as in a job spec
max_retries: 3          # re-runs of a replica that fails
```

Which declared profile a replica starts from must be known before placement, since
every replica runs the same command: the one of ``gpu_type`` when it is given, ``cpu``
when the replicas ask for no GPU, otherwise none (the worker starts from its defaults
and fits its own). The ``profile`` runtime sleeps to its profile, so it needs one.

Pure: no I/O, nothing of Mesh but ``workloads``. This is not
``inference.decisions.ModelSpec`` (the router's planning view of a model).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from workloads.quantity import SpecError, parse_bytes, parse_cpu, parse_gpu
from workloads.resources import Resources
from workloads.spec import (
    DEFAULT_PLACEMENT,
    MAX_COUNT,
    MAX_LABELS,
    MAX_PRIORITY,
    MAX_RETRIES,
    JobSpec,
    PlacementPolicy,
    RestartPolicy,
    TaskGroup,
    _fields,
    _int,
    _kind,
    _labels,
    _load,
    _placement,
    _pool,
    _show,
    _text,
)

__all__ = [
    "GPU_TYPE_LABEL",
    "MODEL_FIELDS",
    "MODEL_LABEL",
    "RUNTIMES",
    "TASK_IDENTITY_VAR",
    "WORKER_IDENTITY",
    "WORKER_ROLE",
    "DeclaredProfile",
    "ModelSpec",
    "declared_profile",
    "model_job",
    "parse_model_spec",
    "worker_command",
]

RUNTIMES = ("numpy", "profile", "torch")
MODEL_FIELDS = (
    "name",
    "runtime",
    "slo_ms",
    "max_batch",
    "memory",
    "replicas",
    "min_replicas",
    "resources",
    "gpu_type",
    "profiles",
    "pool",
    "priority",
    "preemptible",
    "labels",
    "placement",
    "max_retries",
)
_PROFILE_FIELDS = ("a_ms", "b_ms")

MAX_MODEL_NAME_LEN = 40  # leaves room in the job and task ids built from it
MAX_BATCH = 1024  # what one batch message may carry (inference.wire.MAX_BATCH)
MAX_SLO_MS = 3_600_000.0  # an hour, the longest deadline a request may carry
MAX_PROFILE_MS = 100_000.0  # 100 s, the longest a+b a worker may announce
MAX_PROFILES = 32
DEFAULT_SLO_MS = 100.0
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_RETRIES = 3
DEFAULT_REPLICA_CPU = 500  # millicores
# Host memory a worker process needs besides the model (interpreter, numpy, NATS buffers;
# torch and its CUDA context take far more).
RUNTIME_OVERHEAD = {"numpy": 256 * 2**20, "profile": 256 * 2**20, "torch": 2 * 2**30}

WORKER_ROLE = "worker"
MODEL_LABEL = "mesh.model"  # job label naming the model the job serves
GPU_TYPE_LABEL = "gpu_type"  # node label that `gpu_type` requires (mesh agent --label)
CPU_PROFILE = "cpu"  # the profile of replicas that ask for no GPU
# The task asks its agent for the worker identity (agent.executor hands its files over).
TASK_IDENTITY_VAR = "MESH_TASK_IDENTITY"
WORKER_IDENTITY = "worker"

# A subject token ([A-Za-z0-9_-]) that is also a valid job name: lowercase, no dots.
_MODEL_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
_GPU_TYPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class DeclaredProfile:
    """``latency(batch) = a_ms + b_ms * batch`` on one GPU type, as declared."""

    a_ms: float
    b_ms: float


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A validated model spec: build it with :func:`parse_model_spec`.

    ``memory`` is the model's need (bytes); ``resources`` is per replica, defaults filled
    in; ``profiles`` is sorted by GPU type; ``placement`` is the user's, before
    :func:`model_job` adds ``gpu_type`` to its labels.
    """

    name: str
    memory: int
    runtime: str = "numpy"
    slo_ms: float = DEFAULT_SLO_MS
    max_batch: int = DEFAULT_MAX_BATCH
    replicas: int = 1
    min_replicas: int | None = None
    resources: Resources = Resources(cpu=DEFAULT_REPLICA_CPU)
    gpu_type: str | None = None
    profiles: tuple[tuple[str, DeclaredProfile], ...] = ()
    pool: str = "/"
    priority: int = 0
    preemptible: bool = True
    labels: tuple[tuple[str, str], ...] = ()
    placement: PlacementPolicy = replace(DEFAULT_PLACEMENT, gang=False)
    max_retries: int = DEFAULT_MAX_RETRIES


# --------------------------------------------------------------------------- parsing


def parse_model_spec(source: str | bytes | Mapping[str, Any]) -> ModelSpec:
    """Validate a model spec given as YAML text, UTF-8 bytes or a mapping.

    Raises :class:`SpecError` naming the field (``resources.gpu_memory``) and the problem.
    """
    data = _load(source)
    if data is None:
        raise SpecError("", "the model spec is empty")
    f = _fields(data, "", MODEL_FIELDS)
    name = _model_name(f.get("name"))
    runtime = f.get("runtime", "numpy")
    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        shown = _show(runtime) if isinstance(runtime, str) else _kind(runtime)
        raise SpecError("runtime", f"expected one of {', '.join(RUNTIMES)}; got {shown}")
    slo_ms = _ms(f.get("slo_ms", DEFAULT_SLO_MS), "slo_ms", MAX_SLO_MS, positive=True)
    max_batch = _int(f.get("max_batch", DEFAULT_MAX_BATCH), "max_batch", 1, MAX_BATCH)
    if "memory" not in f:
        raise SpecError("memory", "required: the model's memory need, e.g. 2Gi")
    memory = parse_bytes(f["memory"], "memory")
    if memory <= 0:
        raise SpecError("memory", "must be more than 0")
    replicas = _int(f.get("replicas", 1), "replicas", 1, MAX_COUNT, "MAX_COUNT")
    min_replicas = None
    if "min_replicas" in f:
        min_replicas = _int(f["min_replicas"], "min_replicas", 1, replicas, "replicas")
    gpu_type = None
    if "gpu_type" in f:
        gpu_type = _gpu_type(f["gpu_type"], "gpu_type")
    resources = _replica_resources(f.get("resources", {}), runtime, memory, gpu_type)
    profiles = _profiles(f.get("profiles", {}))
    placement = _placement(f.get("placement", {}))
    raw_placement = f.get("placement") or {}
    # Replicas are useful one by one: placed as they fit, unless the spec asks for a gang.
    placement = replace(placement, gang=bool(raw_placement.get("gang", False)))
    if gpu_type is not None:
        pinned = dict(placement.labels).get(GPU_TYPE_LABEL)
        if pinned is not None and pinned != gpu_type:
            raise SpecError(
                f"placement.labels.{GPU_TYPE_LABEL}",
                f"contradicts gpu_type {gpu_type!r}: give the GPU type once, as gpu_type",
            )
    labels = _labels(f.get("labels", {}))
    if MODEL_LABEL in dict(labels):
        raise SpecError(f"labels.{MODEL_LABEL}", "is set by Mesh to the model's name")
    if len(labels) >= MAX_LABELS:
        raise SpecError(
            "labels",
            f"at most {MAX_LABELS - 1} labels (Mesh adds {MODEL_LABEL}), got {len(labels)}",
        )
    preemptible = f.get("preemptible", True)
    if not isinstance(preemptible, bool):
        raise SpecError("preemptible", f"expected true or false, got {_kind(preemptible)}")
    spec = ModelSpec(
        name=name,
        memory=memory,
        runtime=runtime,
        slo_ms=slo_ms,
        max_batch=max_batch,
        replicas=replicas,
        min_replicas=min_replicas,
        resources=resources,
        gpu_type=gpu_type,
        profiles=profiles,
        pool=_pool(f.get("pool", "/")),
        priority=_int(f.get("priority", 0), "priority", 0, MAX_PRIORITY, "MAX_PRIORITY"),
        preemptible=preemptible,
        labels=labels,
        placement=placement,
        max_retries=_int(
            f.get("max_retries", DEFAULT_MAX_RETRIES), "max_retries", 0, MAX_RETRIES, "MAX_RETRIES"
        ),
    )
    if runtime == "profile" and declared_profile(spec) is None:
        raise SpecError(
            "profiles",
            "runtime profile sleeps to a declared profile: give profiles.cpu (replicas "
            "without a GPU), or set gpu_type and give profiles.<gpu_type>",
        )
    return spec


def _model_name(value: object) -> str:
    if value is None:
        raise SpecError("name", "required")
    if not isinstance(value, str):
        raise SpecError("name", f"expected a string, got {_kind(value)}")
    if len(value) > MAX_MODEL_NAME_LEN:
        raise SpecError("name", f"at most {MAX_MODEL_NAME_LEN} characters, got {len(value)}")
    if not _MODEL_NAME_RE.fullmatch(value):
        raise SpecError(
            "name",
            f"use a-z, 0-9, '_' and '-', starting with a letter or digit; got {_show(value)}",
        )
    return value


def _gpu_type(value: object, field: str) -> str:
    text = _text(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not _GPU_TYPE_RE.fullmatch(text):
        raise SpecError(
            field,
            "expected a GPU type like A100 (A-Z, a-z, 0-9, '_', '.', '-', at most 64), "
            f"got {_show(value)}",
        )
    return text


def _ms(value: object, field: str, high: float, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"expected a number of milliseconds, got {_kind(value)}")
    ms = float(value)
    if not math.isfinite(ms) or ms < 0 or (positive and ms == 0) or ms > high:
        low = "more than 0" if positive else "at least 0"
        raise SpecError(field, f"must be {low} and at most {high:g}, got {_show(value)}")
    return ms


def _replica_resources(value: object, runtime: str, memory: int, gpu_type: str | None) -> Resources:
    path = "resources"
    f = _fields(value, path, Resources.KINDS)
    cpu = parse_cpu(f["cpu"], f"{path}.cpu") if "cpu" in f else DEFAULT_REPLICA_CPU
    gpu = parse_gpu(f["gpu"], f"{path}.gpu") if "gpu" in f else 0
    disk = parse_bytes(f["disk"], f"{path}.disk") if "disk" in f else 0
    if cpu <= 0:
        raise SpecError(f"{path}.cpu", "a worker needs some CPU: must be more than 0")
    if gpu_type is not None and not gpu:
        raise SpecError("gpu_type", f"needs a GPU request too (set {path}.gpu)")
    overhead = RUNTIME_OVERHEAD[runtime]
    if gpu:
        host = parse_bytes(f["memory"], f"{path}.memory") if "memory" in f else overhead
        gpu_memory = (
            parse_bytes(f["gpu_memory"], f"{path}.gpu_memory") if "gpu_memory" in f else memory
        )
        if gpu_memory < memory:
            raise SpecError(
                f"{path}.gpu_memory",
                f"{gpu_memory} bytes is less than the model's memory ({memory} bytes): "
                "a replica would be evicted for using what it needs",
            )
    else:
        if "gpu_memory" in f:
            raise SpecError(f"{path}.gpu_memory", f"needs a gpu request too (set {path}.gpu)")
        gpu_memory = 0
        host = parse_bytes(f["memory"], f"{path}.memory") if "memory" in f else memory + overhead
        if host < memory:
            raise SpecError(
                f"{path}.memory",
                f"{host} bytes is less than the model's memory ({memory} bytes): a replica "
                "without a GPU holds the model in host memory",
            )
    return Resources(cpu=cpu, memory=host, disk=disk, gpu=gpu, gpu_memory=gpu_memory)


def _profiles(value: object) -> tuple[tuple[str, DeclaredProfile], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(
            "profiles", f"expected a mapping of GPU type to a_ms/b_ms, got {_kind(value)}"
        )
    if len(value) > MAX_PROFILES:
        raise SpecError("profiles", f"at most {MAX_PROFILES} GPU types, got {len(value)}")
    out: dict[str, DeclaredProfile] = {}
    for key, item in value.items():
        gpu_type = _gpu_type(key, "profiles")
        path = f"profiles.{gpu_type}"
        f = _fields(item, path, _PROFILE_FIELDS)
        for name in _PROFILE_FIELDS:
            if name not in f:
                raise SpecError(f"{path}.{name}", "required (latency = a_ms + b_ms * batch)")
        a = _ms(f["a_ms"], f"{path}.a_ms", MAX_PROFILE_MS, positive=False)
        b = _ms(f["b_ms"], f"{path}.b_ms", MAX_PROFILE_MS, positive=False)
        if a == 0 and b == 0:
            raise SpecError(path, "a_ms and b_ms are both 0: no batch takes no time")
        out[gpu_type] = DeclaredProfile(a, b)
    return tuple(sorted(out.items()))


# --------------------------------------------------------------------------- the job


def declared_profile(spec: ModelSpec) -> tuple[str, DeclaredProfile] | None:
    """The GPU type the replicas run on, with its declared profile, when both are known
    before placement: ``gpu_type``'s, or ``cpu``'s for replicas that ask for no GPU."""
    key = (
        spec.gpu_type
        if spec.gpu_type is not None
        else (CPU_PROFILE if not spec.resources.gpu else None)
    )
    if key is None:
        return None
    profile = dict(spec.profiles).get(key)
    return None if profile is None else (key, profile)


def _num(x: float) -> str:
    return repr(float(x))  # the shortest text that reads back as the same float


def worker_command(spec: ModelSpec) -> tuple[str, ...]:
    """The argv of every replica. ``python`` is the agent's own interpreter (the agent
    puts its directory first on a task's PATH); NATS URL, region, credentials and the
    worker id come from the environment the agent gives the task."""
    argv = [
        "python",
        "-m",
        "inference.worker",
        "--model",
        spec.name,
        "--runtime",
        spec.runtime,
        "--max-batch",
        str(spec.max_batch),
        "--slo-ms",
        _num(spec.slo_ms),
        "--memory-bytes",
        str(spec.memory),
    ]
    if spec.gpu_type is not None:
        argv += ["--gpu-type", spec.gpu_type]
    elif not spec.resources.gpu:
        argv += ["--gpu-type", CPU_PROFILE]
    chosen = declared_profile(spec)
    if chosen is not None:
        argv += ["--a-ms", _num(chosen[1].a_ms), "--b-ms", _num(chosen[1].b_ms)]
    return tuple(argv)


def model_job(spec: ModelSpec) -> JobSpec:
    """The ordinary job that serves ``spec``: one group of ``replicas`` workers, each
    asking its agent for the worker identity, placed without a gang (each replica is
    useful alone) on nodes carrying ``gpu_type`` when it is given."""
    placement = spec.placement
    if spec.gpu_type is not None:
        labels = dict(placement.labels) | {GPU_TYPE_LABEL: spec.gpu_type}
        placement = replace(placement, labels=tuple(sorted(labels.items())))
    group = TaskGroup(
        role=WORKER_ROLE,
        count=spec.replicas,
        command=worker_command(spec),
        env=((TASK_IDENTITY_VAR, WORKER_IDENTITY),),
        resources=spec.resources,
    )
    return JobSpec(
        name=spec.name,
        tasks=(group,),
        pool=spec.pool,
        priority=spec.priority,
        preemptible=spec.preemptible,
        min_tasks=spec.min_replicas,
        restart=RestartPolicy(max_retries=spec.max_retries, reschedule_on_lost=True),
        labels=tuple(sorted((dict(spec.labels) | {MODEL_LABEL: spec.name}).items())),
        placement=placement,
    )
