"""Every message Mesh puts on the wire: versioned frozen dataclasses, msgpack-encoded.

Decoding (`decode(Cls, data)`) validates types, sizes and ranges and raises
`WireError` and nothing else; receivers count and drop what fails. Fields carry a
`v` version; readers ignore fields they do not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mesh.codec import (
    WireError,
    decode,
    encode,
    from_wire,
    register,
    tagged,
    to_wire,
    unpack,
    wf,
)
from workloads.lifecycle import TaskState
from workloads.load import LOAD_FIELDS, LoadCurve, check_load
from workloads.quantity import SpecError
from workloads.resources import Resources
from workloads.spec import MAX_SOURCE_BYTES, MAX_STOP_S, SimulatedRun

__all__ = [
    "WireError",
    "decode",
    "encode",
    "from_wire",
    "to_wire",
    "Resources",
    "TaskState",
    "GpuProcessInfo",
    "GpuStatus",
    "NodeState",
    "TaskSpec",
    "Assignment",
    "AssignmentBatch",
    "decode_assignments",
    "TaskEvent",
    "TaskEventBatch",
    "decode_task_events",
    "JobSubmitted",
    "TaskPlaced",
    "TaskUpdated",
    "JobKillRequested",
    "LeaderElected",
    "TaskPreemptRequested",
    "PoolsApplied",
    "NodePartitionSet",
    "NodePartitionChanged",
    "BreakGlassSet",
    "BreakGlassEnded",
    "PartitionsConfigSet",
    "FedHomeRecorded",
    "FedHoldRecorded",
    "SiteRecorded",
    "DuplicateStopped",
    "JobScaled",
    "PartitionRef",
    "PartitionApplyRequest",
    "PartitionMoveRequest",
    "BreakGlassRequest",
    "RestoreRequest",
    "JobUpdated",
    "ReplicaAdded",
    "TaskStopRequested",
    "HealthProbe",
    "HEALTH_STATES",
    "UpdateRequest",
    "ScaleRequest",
    "HostsRequest",
    "PoolApplyRequest",
    "PoolRef",
    "LogEvent",
    "LogEntry",
    "ErrorCode",
    "ApiError",
    "SubmitRequest",
    "MAX_SPEC_BYTES",
    "MAX_REQUEST",
    "JobRef",
    "JobListRequest",
    "KillRequest",
    "NodeRef",
    "LogsRequest",
    "ok",
    "error_reply",
]

ID = 128  # longest id we accept (job, task, client, node)
_ENFORCEMENT = ("mig", "mps", "watchdog", "none")


def _resources(x: Any, path: str) -> Resources:
    if not isinstance(x, dict):
        raise WireError(path, f"expected a map of resources, got {type(x).__name__}")
    try:
        return Resources.from_dict(x)
    except SpecError as exc:
        raise WireError(path, str(exc)) from None


register(Resources, _resources)


def _simulated_run(x: Any, path: str) -> SimulatedRun:
    if not isinstance(x, dict):
        raise WireError(path, f"expected a map, got {type(x).__name__}")
    duration, code = x.get("duration_s"), x.get("exit_code", 0)
    if duration is not None:  # None: runs until killed (`duration: forever`)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)):
            raise WireError(f"{path}.duration_s", "expected a number or nil")
        if not 0 <= duration <= 365 * 86400:
            raise WireError(f"{path}.duration_s", f"{duration} is out of range [0, 1 year]")
        duration = float(duration)
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        raise WireError(f"{path}.exit_code", "expected an integer in [0, 255]")
    stop = x.get("stop_s", 0.0)
    if isinstance(stop, bool) or not isinstance(stop, (int, float)) or not 0 <= stop <= MAX_STOP_S:
        raise WireError(f"{path}.stop_s", f"expected a number of seconds in [0, {MAX_STOP_S:g}]")
    load = x.get("load")
    load = None if load is None else _load(load, f"{path}.load")
    return SimulatedRun(duration, code, load, float(stop))


_LOAD_ATTRS = frozenset(LOAD_FIELDS.values())


def _load(x: Any, path: str) -> LoadCurve:
    """A task's simulated load, checked by the spec's own rules (workloads.load)."""
    if not isinstance(x, dict):
        raise WireError(path, f"expected a map, got {type(x).__name__}")
    kwargs = {k: v for k, v in x.items() if k in _LOAD_ATTRS}
    if "cores" in kwargs and kwargs["cores"] is None:
        del kwargs["cores"]
    try:
        return check_load(LoadCurve(**kwargs))
    except SpecError as exc:
        raise WireError(f"{path}.{exc.field}", exc.problem) from None


register(SimulatedRun, _simulated_run)


# ---------------------------------------------------------------- agent state


@dataclass(frozen=True, slots=True)
class GpuProcessInfo:
    pid: int = wf(ge=0)
    used_memory: int = wf(0, ge=0)


@dataclass(frozen=True, slots=True)
class GpuStatus:
    index: int = wf(ge=0, le=64)
    uuid: str = wf(max_len=ID)
    model: str = wf(max_len=ID)
    memory_total: int = wf(ge=0)
    memory_used: int = wf(0, ge=0)
    utilization: int = wf(0, ge=0, le=100)
    enforcement: str = wf("none", choices=_ENFORCEMENT)
    processes: tuple[GpuProcessInfo, ...] = wf((), max_len=256)


@dataclass(frozen=True, slots=True)
class NodeState:
    """What an agent publishes every heartbeat (always the full state: it is small)."""

    node_id: str = wf(max_len=64)
    region: str = wf(max_len=64)
    seq: int = wf(ge=0)
    ts: float = wf()
    capacity: Resources = field(default_factory=Resources)
    zone: str = wf("", max_len=64)
    simulated: bool = False
    labels: dict[str, str] = wf(default_factory=dict, max_len=64)
    cpu_percent: float = wf(0.0, ge=0.0, le=100.0)
    load1: float = wf(0.0, ge=0.0)
    memory_used: int = wf(0, ge=0)
    disk_used: int = wf(0, ge=0)
    gpus: tuple[GpuStatus, ...] = wf((), max_len=64)
    tasks: tuple[str, ...] = wf((), max_len=100_000)  # "task_id#attempt" of live tasks
    note: str = wf("", max_len=1024)  # e.g. "store recovered from corruption"
    # Non-empty: this node takes no tasks, and why (a root agent without --run-as).
    # It heartbeats (it is listed, as "refusing") but nothing is placed on it.
    refusing: str = wf("", max_len=256)
    # The id (mesh.signing.key_id) of the key it verifies assignments with; "": it does
    # not (or is older than this field). The leader places nothing on a node it would
    # send what the node refuses.
    verify_key: str = wf("", max_len=64)
    # Linux PSI (/proc/pressure/{cpu,memory}): the `some avg10` share of time, 0..100,
    # that at least one task waited for CPU or memory; None where the kernel has no PSI
    # (older kernels, some containers), on hollow nodes, and from senders older than
    # these fields.
    cpu_pressure: float | None = wf(None, ge=0.0, le=100.0)
    mem_pressure: float | None = wf(None, ge=0.0, le=100.0)
    # The edge site (a leafnode, docs/edge.md) this node belongs to; "": none (a
    # datacenter node, or a sender older than this field).
    site: str = wf("", max_len=64)
    # Training and services (docs/training.md): the address its tasks' peers reach it
    # at, and the ports [lo, hi] the coordinator may give its tasks (it checks each is
    # free before a task starts); (0, 0): it offers none (or is older than these).
    address: str = wf("", max_len=255)
    port_range: tuple[int, int] = (0, 0)
    v: int = 1


# ---------------------------------------------------------------- assignments and events


HEALTH_STATES = ("", "healthy", "unhealthy")  # "": no check, or no verdict yet


@dataclass(frozen=True, slots=True)
class HealthProbe:
    """A service replica's health check as its agent runs it (workloads.spec.HealthCheck):
    `argv` every `interval_s`, as the task's user, killed after `timeout_s`."""

    argv: tuple[str, ...] = wf((), max_len=4096)
    interval_s: float = wf(10.0, ge=0.1, le=3600.0)
    timeout_s: float = wf(5.0, ge=0.001, le=3600.0)
    healthy_after: int = wf(1, ge=1, le=100)
    unhealthy_after: int = wf(3, ge=1, le=100)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task as an agent needs it: what to run and with what."""

    argv: tuple[str, ...] = wf((), max_len=4096)
    env: dict[str, str] = wf(default_factory=dict, max_len=128)
    workdir: str | None = None
    resources: Resources = field(default_factory=Resources)
    simulate: SimulatedRun | None = None
    max_run_time_s: float | None = wf(None, ge=0.0)
    gpu_uuids: tuple[str, ...] = wf((), max_len=64)
    health: HealthProbe | None = None  # a service replica's health check (agents older: none)
    # Named ports given to this task (from its node's port_range): the agent checks each
    # is free before starting it, and fails the attempt, naming the port, if not.
    ports: dict[str, int] = wf(default_factory=dict, max_len=32)
    # Files its framework needs (a hostfile, a discovery script): the agent writes each
    # to the task's files directory (MESH_FILES_DIR) before starting it, and an argv
    # element or env value that starts with workloads.frameworks.FILES_PREFIX names a
    # path in it.
    files: dict[str, str] = wf(default_factory=dict, max_len=8)


@dataclass(frozen=True, slots=True)
class Assignment:
    """Run or kill one attempt of one task on one node, issued under a leader's term."""

    kind: str = wf(choices=("run", "kill"))
    node_id: str = wf(max_len=64)
    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    attempt: int = wf(ge=0, le=1_000_000)
    term: int = wf(ge=0)
    issued_at: float = wf()
    spec: TaskSpec | None = None
    grace_s: float = wf(5.0, ge=0.0, le=3600.0)
    signature: bytes = wf(b"", max_len=256)
    expires_at: float = wf(0.0, ge=0.0)  # signed runs are refused after it; 0: unsigned
    # A batch run's retries left under its restart policy (max_retries less the task's
    # failures so far; 0 for a service): what a site agent cut off from its region may
    # spend restarting it in place (agent/autonomy.py).
    retries_left: int = wf(0, ge=0, le=1_000_000)
    v: int = 1


MAX_ASSIGNMENT_BATCH = 256


@dataclass(frozen=True, slots=True)
class AssignmentBatch:
    """A round's runs for one node in one stream message, signed once as a whole.

    One message per node per round, not one per task: the ASSIGN stream's work-queue
    consumers slow down with the number of messages pending (docs/placement.md), and
    one signature covers them all. The items carry no signature of their own."""

    node_id: str = wf(max_len=64)
    items: tuple[Assignment, ...] = wf((), max_len=MAX_ASSIGNMENT_BATCH)
    signature: bytes = wf(b"", max_len=256)
    v: int = 1


def decode_assignments(data: bytes) -> Assignment | AssignmentBatch:
    """What an agent's assignment subject carries: one assignment, or a batch of them."""
    obj = unpack(data)
    if isinstance(obj, dict) and "items" in obj:
        return from_wire(AssignmentBatch, obj)
    return from_wire(Assignment, obj)


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """A task attempt's state transition, as seen by the agent running it."""

    node_id: str = wf(max_len=64)
    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    attempt: int = wf(ge=0, le=1_000_000)
    state: TaskState = TaskState.PENDING
    ts: float = 0.0
    exit_code: int | None = wf(None, ge=-(2**31), le=2**31)
    signal: int | None = wf(None, ge=0, le=128)
    message: str = wf("", max_len=4096)
    log_tail: str = wf("", max_len=4096)
    # A FAILED that is the agent refusing the attempt's run: the reason code
    # (mesh.signing.AssignmentRefused) and the id of the key it verified with. The leader
    # fails the attempt only if its own run could have been refused so
    # (mesh.signing.refusal_credited).
    refused: str = wf("", max_len=32)
    verify_key: str = wf("", max_len=64)
    # A service replica's health check verdict (HEALTH_STATES), sent with RUNNING when it
    # changes; `health_seq` counts the verdicts of the attempt, so each is its own stream
    # message (the de-duplication id names it). A leader older than these sees a repeated
    # RUNNING, and ignores it.
    health: str = wf("", choices=HEALTH_STATES)
    health_seq: int = wf(0, ge=0)
    # With RUNNING: the ports the agent checked and gave the task, and the training
    # progress the task last wrote to $MESH_PROGRESS_FILE (a step count; -1: none yet).
    # A RUNNING of a RUNNING attempt that changes only its progress is logged too.
    ports: dict[str, int] = wf(default_factory=dict, max_len=32)
    progress: int = wf(-1, ge=-1)
    v: int = 1


# Events of one node in one message (the agent also keeps a batch under 512 KiB).
MAX_EVENT_BATCH = 64


@dataclass(frozen=True, slots=True)
class TaskEventBatch:
    """Task events of one node that were ready to send together, in one stream message.

    Every stream message is written (and with `sync_interval: always`, fsync'd), handed
    to the leader and acknowledged, then deleted one by one: a 5,000-node region whose
    tasks start by the round sent one message per event, and these took most of the NATS
    server's CPU (docs/benchmarks.md). Order within a task attempt holds: an attempt
    has at most one event in flight, so each event here is a different attempt's. A
    leader older than this message drops a batch as a bad event: upgrade coordinators
    before agents."""

    node_id: str = wf(max_len=64)
    events: tuple[TaskEvent, ...] = wf((), max_len=MAX_EVENT_BATCH)
    v: int = 1


def decode_task_events(data: bytes) -> tuple[str, tuple[TaskEvent, ...]]:
    """What an agent's events subject carries, one event or a batch: the node it speaks
    for and its events. A batch naming another node in any event is refused whole."""
    obj = unpack(data)
    if isinstance(obj, dict) and "events" in obj:
        batch = from_wire(TaskEventBatch, obj)
        for i, ev in enumerate(batch.events):
            if ev.node_id != batch.node_id:
                raise WireError(
                    f"events[{i}].node_id", f"{ev.node_id!r} in a batch of {batch.node_id!r}"
                )
        return batch.node_id, batch.events
    ev = from_wire(TaskEvent, obj)
    return ev.node_id, (ev,)


# ---------------------------------------------------------------- the job log


@tagged
@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job_id: str = wf(max_len=ID)
    client_id: str = wf(max_len=ID)
    spec: dict[str, Any] = wf(default_factory=dict)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class TaskPlaced:
    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    attempt: int = wf(ge=0)
    node_id: str = wf(max_len=64)
    ts: float = 0.0
    gpu_uuids: tuple[str, ...] = wf((), max_len=64)
    ports: dict[str, int] = wf(default_factory=dict, max_len=32)  # named ports it was given


@tagged
@dataclass(frozen=True, slots=True)
class TaskUpdated:
    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    attempt: int = wf(ge=0)
    state: TaskState = TaskState.PENDING
    node_id: str = wf("", max_len=64)
    ts: float = 0.0
    exit_code: int | None = None
    signal: int | None = None
    message: str = wf("", max_len=4096)
    log_tail: str = wf("", max_len=4096)
    # With RUNNING: the replica's health check verdict (HEALTH_STATES); a RUNNING of a
    # RUNNING attempt that changes only this is logged too.
    health: str = wf("", choices=HEALTH_STATES)
    progress: int = wf(-1, ge=-1)  # with RUNNING: the task's training progress (-1: none)


@tagged
@dataclass(frozen=True, slots=True)
class JobKillRequested:
    job_id: str = wf(max_len=ID)
    ts: float = 0.0
    reason: str = wf("", max_len=1024)


@tagged
@dataclass(frozen=True, slots=True)
class LeaderElected:
    term: int = wf(ge=0)
    leader_id: str = wf(max_len=ID)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class TaskPreemptRequested:
    """The leader decided to reclaim this attempt for another pool; the agent's KILLED
    report for it is then logged as PREEMPTED (and the task requeued)."""

    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    attempt: int = wf(ge=0)
    reason: str = wf("", max_len=1024)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class PoolsApplied:
    """A new pool tree (the `pools:` document as plain data), replacing the old one."""

    source: dict[str, Any] = wf(default_factory=dict)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class JobUpdated:
    """`mesh job update`: a running service's new spec (its `to_dict`). The fold bumps
    the job's generation; the leader replaces the replicas of older ones, one by one
    with surge (coordinator/services.py)."""

    job_id: str = wf(max_len=ID)
    spec: dict[str, Any] = wf(default_factory=dict)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class ReplicaAdded:
    """A new replica task of a service (`role`, `index`: its task id), PENDING on the
    job's current spec: a surge replacement, or one more for a raised count."""

    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    role: str = wf(max_len=64)
    index: int = wf(ge=0, le=10_000_000)
    reason: str = wf("", max_len=1024)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class TaskStopRequested:
    """Stop this service replica for good (replaced, or beyond the count): the agent's
    KILLED ends it, and an attempt that ends otherwise is not started again."""

    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    attempt: int = wf(ge=0)
    reason: str = wf("", max_len=1024)
    ts: float = 0.0


# ---------------------------------------------------------------- partitions (docs/partitions.md)

PARTITION = 65  # longest partition name: "parent/child", 32 each


@tagged
@dataclass(frozen=True, slots=True)
class NodePartitionSet:
    """A move starts: the node's desired partition (it is cordoned until it converges).
    `source`: the partition the leader saw it in (a node the log never named may be in
    the one its agent label says; the fold has no heartbeats)."""

    node_id: str = wf(max_len=64)
    desired: str = wf(max_len=PARTITION)
    reason: str = wf("", max_len=1024)
    break_glass: bool = False
    ts: float = 0.0
    source: str = wf("", max_len=PARTITION)


@tagged
@dataclass(frozen=True, slots=True)
class NodePartitionChanged:
    """The move converged: nothing of the old partition runs there; current := desired."""

    node_id: str = wf(max_len=64)
    partition: str = wf(max_len=PARTITION)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class BreakGlassSet:
    """Break-glass: `nodes` move to `to` at once; recorded with who and why."""

    to: str = wf(max_len=PARTITION)
    nodes: tuple[str, ...] = wf((), max_len=100_000)
    reason: str = wf("", max_len=1024)
    by: str = wf("", max_len=ID)
    until_ts: float = wf(0.0, ge=0.0)  # 0: until restored
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class BreakGlassEnded:
    reason: str = wf("", max_len=1024)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class PartitionsConfigSet:
    """`mesh partition apply FILE`: the partitions config, as the YAML text applied."""

    source: str = wf("", max_len=256 * 1024)
    ts: float = 0.0


# ---------------------------------------------------------------- federation (docs/federation.md)

FED_HOME_PHASES = ("local", "nominated", "held", "done")  # coordinator/federation/epochs.Phase
FED_HOLD_PHASES = ("reserved", "running", "refused", "released", "finished")  # holder.Hold


@tagged
@dataclass(frozen=True, slots=True)
class FedHomeRecorded:
    """The home's record of a federated job after a transition (epochs.HomeRecord, its
    policy aside: that is the job's spec). Each one replaces the last, so a new leader's
    fold holds what its predecessor decided. `why`: the core's one line."""

    job_id: str = wf(max_len=ID)
    home: str = wf(max_len=64)
    phase: str = wf(choices=FED_HOME_PHASES)
    epoch: int = wf(ge=0)
    region: str = wf("", max_len=64)
    since: float = 0.0
    queued_since: float = 0.0
    tried: tuple[str, ...] = wf((), max_len=64)
    last_try: float | None = None
    outcome: str = wf("", max_len=64)
    why: str = wf("", max_len=1024)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class FedHoldRecorded:
    """A holder's record of another region's job after a transition (holder.HolderRecord):
    the highest epoch seen and what became of it. With `running`, the same log entry
    submits the job here under the home's job id."""

    job_id: str = wf(max_len=ID)
    home: str = wf(max_len=64)
    holder: str = wf(max_len=64)
    epoch: int = wf(ge=0)
    phase: str = wf(choices=FED_HOLD_PHASES)
    since: float = 0.0
    note: str = wf("", max_len=1024)
    why: str = wf("", max_len=1024)
    ts: float = 0.0


SITE_STATUSES = ("connected", "disconnected")  # edge/sites.py


@tagged
@dataclass(frozen=True, slots=True)
class SiteRecorded:
    """An edge site's status as the leader judged it from its beats (edge/sites.py),
    logged on each transition and autonomy change: a new leader continues the site's
    autonomy clock from `last_heard` (the region's wall clock) instead of from zero."""

    site: str = wf(max_len=64)
    status: str = wf(choices=SITE_STATUSES)
    since: float = 0.0
    autonomy_s: float = wf(-1.0, ge=-1.0)  # -1: never declare its tasks lost
    last_heard: float = 0.0
    ts: float = 0.0
    # Its nodes, from its newest beat: a new leader that never heard them knows them as
    # the site's (not down after 10 s of silence, but waiting out the autonomy).
    nodes: tuple[str, ...] = wf((), max_len=4096)


@tagged
@dataclass(frozen=True, slots=True)
class DuplicateStopped:
    """A node came back running an attempt that was re-placed meanwhile (its site was
    cut off past its autonomy, or the node was declared down); that copy is killed (the
    highest attempt wins) and this says so in the task's history."""

    job_id: str = wf(max_len=ID)
    task_id: str = wf(max_len=ID)
    attempt: int = wf(ge=0)  # the stale copy's
    node_id: str = wf(max_len=ID)
    current: int = wf(ge=0)  # the attempt that stands
    message: str = wf("", max_len=1024)
    ts: float = 0.0


@tagged
@dataclass(frozen=True, slots=True)
class JobScaled:
    """An elastic training job's target size, asked by hand (`mesh job scale`) or set
    by the scheduler: it places tasks up to it and stops those above it (docs/training.md)."""

    job_id: str = wf(max_len=ID)
    workers: int = wf(ge=1, le=10_000)
    reason: str = wf("", max_len=1024)
    by: str = wf("", max_len=ID)
    ts: float = 0.0


LogEvent = (
    JobSubmitted
    | TaskPlaced
    | TaskUpdated
    | JobKillRequested
    | LeaderElected
    | TaskPreemptRequested
    | PoolsApplied
    | JobUpdated
    | ReplicaAdded
    | TaskStopRequested
    | NodePartitionSet
    | NodePartitionChanged
    | BreakGlassSet
    | BreakGlassEnded
    | PartitionsConfigSet
    | FedHomeRecorded
    | FedHoldRecorded
    | SiteRecorded
    | DuplicateStopped
    | JobScaled
)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One message of the job log: a batch of events appended under one leader's term."""

    term: int = wf(ge=0)
    leader_id: str = wf(max_len=ID)
    events: tuple[LogEvent, ...] = wf((), max_len=100_000)
    v: int = 1


# ---------------------------------------------------------------- request API


class ErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"  # undecodable or invalid request
    INVALID_SPEC = "INVALID_SPEC"  # the job spec does not validate
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"  # e.g. killing a finished job
    NOT_LEADER = "NOT_LEADER"  # no leader reachable for a write
    UNAVAILABLE = "UNAVAILABLE"  # the log could not be written; retry
    TOO_LARGE = "TOO_LARGE"
    INTERNAL = "INTERNAL"


class ApiError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


def ok(**payload: Any) -> bytes:
    return encode({"ok": True, **payload})


def error_reply(code: ErrorCode, message: str) -> bytes:
    return encode({"ok": False, "error": {"code": str(code), "message": message}})


# The size limits of the request API, each defined here once; docs/api.md states them
# and a doc test holds it to these values.
MAX_SPEC_BYTES = MAX_SOURCE_BYTES  # one job spec: YAML text, or a mapping as msgpack
# One request: the largest spec with room for its envelope, and for the escapes a JSON
# string adds to YAML text (a newline is two bytes there). Past it: TOO_LARGE. Mesh's
# nats-server configs allow 8 MiB messages; NATS's own default (1 MiB) is less, and the
# client says so before it sends (mesh.client).
MAX_REQUEST = 2 * MAX_SPEC_BYTES


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    client_id: str = wf(max_len=ID)
    # YAML text (str or UTF-8 bytes) or a mapping; validated by workloads.parse_job_spec.
    # The text is capped only by the request here: the API refuses one over MAX_SPEC_BYTES
    # as TOO_LARGE, naming the limit (MAX_STR's 64 KiB refused valid specs).
    spec: Any = wf(None, max_len=MAX_REQUEST)
    v: int = 1


MAX_BATCH = 1000  # jobs in one job.submit_many request


@dataclass(frozen=True, slots=True)
class SubmitManyRequest:
    """Many submits in one request and one log append: for generators and pipelines
    that submit thousands of small jobs. Each item succeeds or fails on its own."""

    jobs: tuple[SubmitRequest, ...] = wf((), max_len=MAX_BATCH)
    v: int = 1


@dataclass(frozen=True, slots=True)
class JobRef:
    job_id: str = wf(max_len=ID)
    v: int = 1


@dataclass(frozen=True, slots=True)
class JobListRequest:
    state: str | None = wf(None, max_len=32)
    pool: str | None = wf(None, max_len=256)
    limit: int = wf(100, ge=1, le=10_000)
    v: int = 1


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """job.update: a running service's new spec (YAML text or a mapping), as for submit."""

    job_id: str = wf(max_len=ID)
    spec: Any = wf(None, max_len=MAX_REQUEST)
    v: int = 1


@dataclass(frozen=True, slots=True)
class ScaleRequest:
    """job.scale: an elastic training job's new target size (docs/training.md)."""

    job_id: str = wf(max_len=ID)
    workers: int = wf(ge=1, le=10_000)
    reason: str = wf("", max_len=1024)
    by: str = wf("", max_len=ID)
    v: int = 1


HOSTS_FORMATS = ("horovod", "mpi", "plain")


@dataclass(frozen=True, slots=True)
class HostsRequest:
    """job.hosts: a training job's holding tasks' hosts, as a hostfile's lines."""

    job_id: str = wf(max_len=ID)
    format: str = wf("plain", choices=HOSTS_FORMATS)
    v: int = 1


@dataclass(frozen=True, slots=True)
class KillRequest:
    job_id: str = wf(max_len=ID)
    reason: str = wf("", max_len=1024)
    v: int = 1


@dataclass(frozen=True, slots=True)
class NodeRef:
    node_id: str = wf(max_len=64)
    v: int = 1


@dataclass(frozen=True, slots=True)
class LogsRequest:
    task_id: str = wf(max_len=ID)
    attempt: int | None = wf(None, ge=0)
    stream: str = wf("stdout", choices=("stdout", "stderr"))
    tail_bytes: int = wf(64 * 1024, ge=1, le=1024 * 1024)
    v: int = 1


@dataclass(frozen=True, slots=True)
class PoolApplyRequest:
    source: Any = wf(None, max_len=MAX_REQUEST)  # YAML text or a mapping; parse_pool_tree
    v: int = 1


@dataclass(frozen=True, slots=True)
class PoolRef:
    path: str = wf(max_len=512)
    v: int = 1


@dataclass(frozen=True, slots=True)
class PartitionRef:
    name: str = wf(max_len=PARTITION)
    v: int = 1


@dataclass(frozen=True, slots=True)
class PartitionApplyRequest:
    source: str = wf("", max_len=256 * 1024)  # YAML text: parse_partitions_config
    v: int = 1


@dataclass(frozen=True, slots=True)
class PartitionMoveRequest:
    nodes: tuple[str, ...] = wf((), max_len=10_000)
    to: str = wf("", max_len=PARTITION)
    reason: str = wf("", max_len=1024)
    by: str = wf("", max_len=ID)
    v: int = 1


@dataclass(frozen=True, slots=True)
class BreakGlassRequest:
    to: str = wf(max_len=PARTITION)
    count: int | None = wf(None, ge=1, le=100_000)  # None: every movable node
    ttl_s: float = wf(1800.0, ge=0.0, le=7 * 86400.0)  # 0: until restored
    reason: str = wf("", max_len=1024)
    by: str = wf("", max_len=ID)
    v: int = 1


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    reason: str = wf("", max_len=1024)
    by: str = wf("", max_len=ID)
    v: int = 1
