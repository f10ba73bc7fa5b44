"""The msgpack wire codec: round trips of every message, and every way a message can be bad
ends in `WireError` and nothing else."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import typing

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mesh import codec
from mesh.codec import MAX_DEPTH, MAX_MESSAGE, MAX_STR, WireError, to_wire
from mesh.schema import (
    FED_HOLD_PHASES,
    FED_HOME_PHASES,
    MAX_EVENT_BATCH,
    MAX_REQUEST,
    Assignment,
    AssignmentBatch,
    BreakGlassEnded,
    BreakGlassRequest,
    BreakGlassSet,
    DuplicateStopped,
    ErrorCode,
    FedHoldRecorded,
    FedHomeRecorded,
    GpuProcessInfo,
    GpuStatus,
    HealthProbe,
    HostsRequest,
    JobKillRequested,
    JobListRequest,
    JobRef,
    JobScaled,
    JobSubmitted,
    JobUpdated,
    KillRequest,
    LeaderElected,
    LogEntry,
    LogsRequest,
    NodePartitionChanged,
    NodePartitionSet,
    NodeRef,
    NodeState,
    PartitionApplyRequest,
    PartitionMoveRequest,
    PartitionRef,
    PartitionsConfigSet,
    PoolApplyRequest,
    PoolRef,
    PoolsApplied,
    ReplicaAdded,
    RestoreRequest,
    ScaleRequest,
    SiteRecorded,
    SubmitRequest,
    TaskEvent,
    TaskEventBatch,
    TaskPlaced,
    TaskPreemptRequested,
    TaskSpec,
    TaskStopRequested,
    TaskUpdated,
    UpdateRequest,
    decode,
    decode_task_events,
    encode,
    error_reply,
    ok,
)
from workloads.lifecycle import TaskState
from workloads.load import LoadCurve
from workloads.resources import Resources
from workloads.spec import SimulatedRun

# Generation dominates the cost, so fuzz inputs are drawn once and decoded as every class
# (300 inputs each), and round trips draw fewer, richer examples for the big messages.
_COMMON = dict(
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings(max_examples=300, **_COMMON)
MUTATE = settings(max_examples=50, **_COMMON)
ROUND = settings(max_examples=20, **_COMMON)
ROUND_BIG = settings(max_examples=40, **_COMMON)
BIG = ("NodeState", "Assignment", "AssignmentBatch", "TaskEvent", "LogEntry")
INT64 = 2**63 - 1

# --------------------------------------------------------------------------- strategies


def text(n: int) -> st.SearchStrategy[str]:
    return st.text(max_size=n)


def ints(lo: int = 0, hi: int = INT64) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


def floats(lo: float | None = None, hi: float | None = None) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


resources = st.builds(
    Resources, cpu=ints(), memory=ints(), disk=ints(), gpu=ints(), gpu_memory=ints()
)

gpu_process = st.builds(GpuProcessInfo, pid=ints(), used_memory=ints())

gpu_status = st.builds(
    GpuStatus,
    index=ints(0, 64),
    uuid=text(128),
    model=text(128),
    memory_total=ints(),
    memory_used=ints(),
    utilization=ints(0, 100),
    enforcement=st.sampled_from(["mig", "mps", "watchdog", "none"]),
    processes=st.lists(gpu_process, max_size=3).map(tuple),
)

node_state = st.builds(
    NodeState,
    node_id=text(64),
    region=text(64),
    seq=ints(),
    ts=floats(),
    capacity=resources,
    zone=text(64),
    simulated=st.booleans(),
    labels=st.dictionaries(text(20), text(20), max_size=5),
    cpu_percent=floats(0.0, 100.0),
    load1=floats(0.0),
    memory_used=ints(),
    disk_used=ints(),
    gpus=st.lists(gpu_status, max_size=3).map(tuple),
    tasks=st.lists(text(40), max_size=5).map(tuple),
    note=text(100),
    cpu_pressure=st.none() | floats(0.0, 100.0),
    mem_pressure=st.none() | floats(0.0, 100.0),
    v=ints(-(2**63), INT64),
)

# The wire accepts what a spec can say: 0..1 year (or forever), exit codes 0..255, the
# load curves workloads.load.check_load accepts.
_level = floats(0.0, 1.0)
load_curve = st.builds(
    LoadCurve,
    curve=st.sampled_from(["flat", "diurnal", "step"]),
    peak=st.just(1.0),
    trough=_level,
    period_s=floats(0.001, 366 * 86400.0),
    phase_s=floats(0.0, 366 * 86400.0),
    cores=st.none() | floats(0.0, 4096.0),
    noise=_level,
    step_at_s=floats(0.0, 366 * 86400.0),
    step_to=_level,
    origin=floats(0.0, 2.0**40),
)
simulated_run = st.builds(
    SimulatedRun,
    duration_s=st.none() | floats(0.0, 365 * 86400.0),
    exit_code=ints(0, 255),
    load=st.none() | load_curve,
    stop_s=st.just(0.0) | floats(0.0, 3600.0),
)

health_probe = st.builds(
    HealthProbe,
    argv=st.lists(text(30), max_size=5).map(tuple),
    interval_s=floats(0.1, 3600.0),
    timeout_s=floats(0.001, 3600.0),
    healthy_after=ints(1, 100),
    unhealthy_after=ints(1, 100),
)

task_spec = st.builds(
    TaskSpec,
    health=st.none() | health_probe,
    argv=st.lists(text(30), max_size=5).map(tuple),
    env=st.dictionaries(text(10), text(20), max_size=4),
    workdir=st.none() | text(50),
    resources=resources,
    simulate=st.none() | simulated_run,
    max_run_time_s=st.none() | floats(0.0),
    gpu_uuids=st.lists(text(40), max_size=3).map(tuple),
)

assignment = st.builds(
    Assignment,
    kind=st.sampled_from(["run", "kill"]),
    node_id=text(64),
    job_id=text(128),
    task_id=text(128),
    attempt=ints(0, 1_000_000),
    term=ints(),
    issued_at=floats(),
    spec=st.none() | task_spec,
    grace_s=floats(0.0, 3600.0),
    signature=st.binary(max_size=256),
)

task_event = st.builds(
    TaskEvent,
    node_id=text(64),
    job_id=text(128),
    task_id=text(128),
    attempt=ints(0, 1_000_000),
    state=st.sampled_from(list(TaskState)),
    ts=floats(),
    exit_code=st.none() | ints(-(2**31), 2**31),
    signal=st.none() | ints(0, 128),
    message=text(200),
    log_tail=text(200),
    health=st.sampled_from(["", "healthy", "unhealthy"]),
    health_seq=ints(),
)

# Free-form data as the codec hands it back: lists (never tuples), str keys, finite floats.
free_form = st.recursive(
    st.none()
    | st.booleans()
    | ints(-(2**63), INT64)
    | floats()
    | text(20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text(10), inner, max_size=4),
    max_leaves=20,
)

job_submitted = st.builds(
    JobSubmitted,
    job_id=text(128),
    client_id=text(128),
    spec=st.dictionaries(text(10), free_form, max_size=5),
    ts=floats(),
)
task_placed = st.builds(
    TaskPlaced,
    job_id=text(128),
    task_id=text(128),
    attempt=ints(),
    node_id=text(64),
    ts=floats(),
    gpu_uuids=st.lists(text(40), max_size=3).map(tuple),
)
task_updated = st.builds(
    TaskUpdated,
    job_id=text(128),
    task_id=text(128),
    attempt=ints(),
    state=st.sampled_from(list(TaskState)),
    node_id=text(64),
    ts=floats(),
    exit_code=st.none() | ints(-(2**63), INT64),
    signal=st.none() | ints(-(2**63), INT64),
    message=text(100),
    log_tail=text(100),
    health=st.sampled_from(["", "healthy", "unhealthy"]),
)
job_kill_requested = st.builds(JobKillRequested, job_id=text(128), ts=floats(), reason=text(100))
leader_elected = st.builds(LeaderElected, term=ints(), leader_id=text(128), ts=floats())
task_preempt_requested = st.builds(
    TaskPreemptRequested,
    job_id=text(128),
    task_id=text(128),
    attempt=ints(),
    reason=text(100),
    ts=floats(),
)
pools_applied = st.builds(
    PoolsApplied, source=st.dictionaries(text(20), free_form, max_size=4), ts=floats()
)
job_updated = st.builds(
    JobUpdated, job_id=text(128), spec=st.dictionaries(text(10), free_form, max_size=5), ts=floats()
)
replica_added = st.builds(
    ReplicaAdded,
    job_id=text(128),
    task_id=text(128),
    role=text(64),
    index=ints(0, 10_000_000),
    reason=text(100),
    ts=floats(),
)
task_stop_requested = st.builds(
    TaskStopRequested,
    job_id=text(128),
    task_id=text(128),
    attempt=ints(),
    reason=text(100),
    ts=floats(),
)
node_partition_set = st.builds(
    NodePartitionSet,
    node_id=text(64),
    desired=text(65),
    reason=text(100),
    break_glass=st.booleans(),
    ts=floats(),
    source=text(65),
)
node_partition_changed = st.builds(
    NodePartitionChanged, node_id=text(64), partition=text(65), ts=floats()
)
break_glass_set = st.builds(
    BreakGlassSet,
    to=text(65),
    nodes=st.lists(text(64), max_size=4).map(tuple),
    reason=text(100),
    by=text(128),
    until_ts=floats(0.0, 1e12),
    ts=floats(),
)
break_glass_ended = st.builds(BreakGlassEnded, reason=text(100), ts=floats())
partitions_config_set = st.builds(PartitionsConfigSet, source=text(200), ts=floats())
fed_home_recorded = st.builds(
    FedHomeRecorded,
    job_id=text(128),
    home=text(64),
    phase=st.sampled_from(FED_HOME_PHASES),
    epoch=ints(),
    region=text(64),
    since=floats(),
    queued_since=floats(),
    tried=st.lists(text(64), max_size=4).map(tuple),
    last_try=st.none() | floats(),
    outcome=text(64),
    why=text(100),
    ts=floats(),
)
fed_hold_recorded = st.builds(
    FedHoldRecorded,
    job_id=text(128),
    home=text(64),
    holder=text(64),
    epoch=ints(),
    phase=st.sampled_from(FED_HOLD_PHASES),
    since=floats(),
    note=text(100),
    why=text(100),
    ts=floats(),
)
site_recorded = st.builds(
    SiteRecorded,
    site=text(64),
    status=st.sampled_from(("connected", "disconnected")),
    since=floats(),
    autonomy_s=floats(-1.0),
    last_heard=floats(),
    ts=floats(),
    nodes=st.lists(text(64), max_size=4).map(tuple),
)
duplicate_stopped = st.builds(
    DuplicateStopped,
    job_id=text(128),
    task_id=text(128),
    attempt=ints(),
    node_id=text(128),
    current=ints(),
    message=text(100),
    ts=floats(),
)
job_scaled = st.builds(
    JobScaled,
    job_id=text(128),
    workers=st.integers(1, 10_000),
    reason=text(100),
    by=text(128),
    ts=floats(),
)
log_event = st.one_of(
    job_scaled,
    site_recorded,
    duplicate_stopped,
    fed_home_recorded,
    fed_hold_recorded,
    job_updated,
    replica_added,
    task_stop_requested,
    job_submitted,
    task_placed,
    task_updated,
    job_kill_requested,
    leader_elected,
    task_preempt_requested,
    pools_applied,
    node_partition_set,
    node_partition_changed,
    break_glass_set,
    break_glass_ended,
    partitions_config_set,
)
log_entry = st.builds(
    LogEntry,
    term=ints(),
    leader_id=text(128),
    events=st.lists(log_event, max_size=6).map(tuple),
)

submit_request = st.builds(SubmitRequest, client_id=text(128), spec=free_form)
job_ref = st.builds(JobRef, job_id=text(128))
job_list_request = st.builds(
    JobListRequest, state=st.none() | text(32), pool=st.none() | text(256), limit=ints(1, 10_000)
)
kill_request = st.builds(KillRequest, job_id=text(128), reason=text(1024))
node_ref = st.builds(NodeRef, node_id=text(64))
logs_request = st.builds(
    LogsRequest,
    task_id=text(128),
    attempt=st.none() | ints(),
    stream=st.sampled_from(["stdout", "stderr"]),
    tail_bytes=ints(1, 1024 * 1024),
)

assignment_batch = st.builds(
    AssignmentBatch,
    node_id=text(64),
    items=st.lists(assignment, max_size=3).map(tuple),
    signature=st.binary(max_size=80),
)

task_event_batch = st.builds(
    TaskEventBatch, node_id=text(64), events=st.lists(task_event, max_size=3).map(tuple)
)

STRATEGIES = {
    GpuProcessInfo: gpu_process,
    GpuStatus: gpu_status,
    NodeState: node_state,
    TaskSpec: task_spec,
    Assignment: assignment,
    AssignmentBatch: assignment_batch,
    TaskEvent: task_event,
    TaskEventBatch: task_event_batch,
    JobSubmitted: job_submitted,
    TaskPlaced: task_placed,
    TaskUpdated: task_updated,
    JobKillRequested: job_kill_requested,
    LeaderElected: leader_elected,
    TaskPreemptRequested: task_preempt_requested,
    PoolsApplied: pools_applied,
    HealthProbe: health_probe,
    JobUpdated: job_updated,
    ReplicaAdded: replica_added,
    TaskStopRequested: task_stop_requested,
    UpdateRequest: st.builds(UpdateRequest, job_id=text(128), spec=free_form),
    ScaleRequest: st.builds(
        ScaleRequest,
        job_id=text(128),
        workers=st.integers(1, 10_000),
        reason=text(100),
        by=text(128),
    ),
    HostsRequest: st.builds(
        HostsRequest, job_id=text(128), format=st.sampled_from(["horovod", "mpi", "plain"])
    ),
    PoolApplyRequest: st.builds(PoolApplyRequest, source=free_form),
    PoolRef: st.builds(PoolRef, path=text(512)),
    NodePartitionSet: node_partition_set,
    NodePartitionChanged: node_partition_changed,
    BreakGlassSet: break_glass_set,
    BreakGlassEnded: break_glass_ended,
    PartitionsConfigSet: partitions_config_set,
    FedHomeRecorded: fed_home_recorded,
    FedHoldRecorded: fed_hold_recorded,
    SiteRecorded: site_recorded,
    DuplicateStopped: duplicate_stopped,
    JobScaled: job_scaled,
    PartitionRef: st.builds(PartitionRef, name=text(65)),
    PartitionApplyRequest: st.builds(PartitionApplyRequest, source=text(200)),
    PartitionMoveRequest: st.builds(
        PartitionMoveRequest,
        nodes=st.lists(text(64), max_size=4).map(tuple),
        to=text(65),
        reason=text(100),
        by=text(128),
    ),
    BreakGlassRequest: st.builds(
        BreakGlassRequest,
        to=text(65),
        count=st.none() | ints(1, 100_000),
        ttl_s=floats(0.0, 7 * 86400.0),
        reason=text(100),
        by=text(128),
    ),
    RestoreRequest: st.builds(RestoreRequest, reason=text(100), by=text(128)),
    LogEntry: log_entry,
    SubmitRequest: submit_request,
    JobRef: job_ref,
    JobListRequest: job_list_request,
    KillRequest: kill_request,
    NodeRef: node_ref,
    LogsRequest: logs_request,
}
CLASSES = list(STRATEGIES)


def test_every_wire_dataclass_of_the_schema_has_a_strategy():
    import mesh.schema as schema

    wire = {
        obj
        for name in schema.__all__
        if dataclasses.is_dataclass(obj := getattr(schema, name))
        and isinstance(obj, type)
        and obj.__module__ == "mesh.schema"
    }
    assert wire == set(STRATEGIES)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_round_trip(cls):
    @(ROUND_BIG if cls.__name__ in BIG else ROUND)
    @given(STRATEGIES[cls])
    def check(msg):
        data = encode(msg)
        assert isinstance(data, bytes)
        back = decode(cls, data)
        assert back == msg  # dataclass equality also compares the types of nested events
        assert type(back) is cls
        assert encode(back) == data
        # packb's default hook converts one dataclass at a time; the bytes must be those
        # of the whole tree converted first (signatures are over encoded bytes).
        assert data == msgpack.packb(to_wire(msg), use_bin_type=True)

    check()


def test_defaults_round_trip():
    for msg in [
        NodeState(node_id="n", region="r", seq=0, ts=0.0),
        Assignment("run", "n", "j", "t", 0, 1, 2.5),
        TaskEvent("n", "j", "t", 0),
        LogEntry(0, "c"),
        JobListRequest(),
        LogsRequest("t"),
        TaskSpec(),
    ]:
        assert decode(type(msg), encode(msg)) == msg


def test_tagged_events_carry_their_type_name():
    entry = LogEntry(1, "c", (TaskPlaced("j", "j.w.0", 1, "n1"), LeaderElected(1, "c")))
    raw = msgpack.unpackb(encode(entry))
    assert [e["_t"] for e in raw["events"]] == ["TaskPlaced", "LeaderElected"]
    # untagged messages carry no tag
    assert "_t" not in raw
    assert "_t" not in msgpack.unpackb(encode(TaskEvent("n", "j", "t", 0)))


def test_enum_travels_as_its_value():
    raw = msgpack.unpackb(encode(TaskEvent("n", "j", "t", 0, TaskState.RUNNING)))
    assert raw["state"] == "RUNNING"
    assert (
        decode(TaskEvent, encode(TaskEvent("n", "j", "t", 0, TaskState.RUNNING))).state
        is TaskState.RUNNING
    )


def test_what_msgpack_cannot_pack_is_converted_or_refused():
    import enum

    class Colour(enum.Enum):
        RED = 1

    assert msgpack.unpackb(codec.pack({"c": Colour.RED, "t": (1, 2)})) == {"c": 1, "t": [1, 2]}
    with pytest.raises(TypeError, match="cannot encode a set"):
        codec.pack({"s": {1, 2}})


def test_decode_accepts_bytearray_and_memoryview():
    data = encode(JobRef("j1"))
    assert decode(JobRef, bytearray(data)) == JobRef("j1")
    assert decode(JobRef, memoryview(data)) == JobRef("j1")


def test_ok_and_error_replies():
    assert msgpack.unpackb(ok(job_id="j")) == {"ok": True, "job_id": "j"}
    assert msgpack.unpackb(error_reply(ErrorCode.NOT_FOUND, "no job")) == {
        "ok": False,
        "error": {"code": "NOT_FOUND", "message": "no job"},
    }


def test_int_fields_accept_the_int64_extremes():
    msg = NodeState(node_id="n", region="r", seq=INT64, ts=0.0)
    assert decode(NodeState, encode(msg)).seq == INT64


def test_float_fields_accept_ints():
    assert (
        decode(NodeState, msgpack.packb({"node_id": "n", "region": "r", "seq": 1, "ts": 5})).ts
        == 5.0
    )


# --------------------------------------------------------------------------- forward compatibility


def test_unknown_fields_are_ignored():
    msg = NodeState(node_id="n", region="r", seq=3, ts=1.0, gpus=(GpuStatus(0, "u", "m", 10),))
    raw = to_wire(msg)
    raw["future_field"] = {"anything": [1, 2, 3]}
    raw["gpus"][0]["new_metric"] = 0.5
    raw["capacity"] = dict(raw["capacity"])
    assert decode(NodeState, msgpack.packb(raw)) == msg


def test_unknown_fields_in_tagged_events_are_ignored():
    entry = LogEntry(2, "c", (TaskPlaced("j", "j.w.0", 1, "n1"),))
    raw = to_wire(entry)
    raw["events"][0]["priority_class"] = "gold"
    raw["v"] = 2
    back = decode(LogEntry, msgpack.packb(raw))
    assert back.events == entry.events
    assert back.v == 2


def test_a_newer_version_field_decodes():
    raw = to_wire(JobRef("j"))
    raw["v"] = 7
    assert decode(JobRef, msgpack.packb(raw)) == JobRef("j", v=7)


# --------------------------------------------------------------------------- rejection


def reject(cls, obj, field: str | None = None) -> WireError:
    """`obj` packed and decoded as `cls` raises WireError (any other exception fails)."""
    data = obj if isinstance(obj, bytes) else msgpack.packb(obj, use_bin_type=True)
    with pytest.raises(WireError) as info:
        decode(cls, data)
    if field is not None:
        assert info.value.field == field, info.value
    return info.value


def node(**over):
    raw = to_wire(
        NodeState(node_id="n1", region="r", seq=1, ts=1.0, gpus=(GpuStatus(0, "u", "m", 10),))
    )
    raw.update(over)
    return raw


def event(**over):
    raw = to_wire(TaskEvent("n1", "j", "j.w.0", 1, TaskState.RUNNING))
    raw.update(over)
    return raw


def assign(**over):
    raw = to_wire(Assignment("run", "n1", "j", "j.w.0", 1, 3, 1.0, TaskSpec(argv=("true",))))
    raw.update(over)
    return raw


def entry(*events, **over):
    raw = {"term": 1, "leader_id": "c", "events": list(events)}
    raw.update(over)
    return raw


def placed(**over):
    raw = to_wire(TaskPlaced("j", "j.w.0", 1, "n1"))
    raw["_t"] = "TaskPlaced"
    raw.update(over)
    return raw


def test_wire_error_is_a_value_error_with_a_field():
    err = reject(TaskEvent, event(attempt=-1), "attempt")
    assert isinstance(err, ValueError)
    assert "attempt" in str(err)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x81",  # map of one entry, nothing follows
        b"\xdb\xff\xff\xff\xff",  # str32 with an absurd length
        b"not msgpack at all \xff\xfe",
        b"\x92\x01",  # array of two, one given
    ],
)
def test_non_msgpack_bytes(data):
    reject(NodeState, data)


@pytest.mark.parametrize("not_bytes", ["a string", None, 5, {"node_id": "n"}])
def test_non_bytes_input(not_bytes):
    with pytest.raises(WireError):
        decode(NodeState, not_bytes)


def test_every_truncation_of_a_message_is_refused():
    data = encode(
        Assignment(
            "run",
            "n1",
            "j",
            "j.w.0",
            1,
            3,
            1.0,
            TaskSpec(argv=("python", "-c", "print(1)"), env={"A": "b"}),
        )
    )
    for n in range(len(data)):
        with pytest.raises(WireError):
            decode(Assignment, data[:n])


def test_trailing_bytes_are_refused():
    reject(JobRef, encode(JobRef("j")) + b"\x00")


def test_oversized_message_is_refused_before_parsing():
    data = encode(JobRef("j" * 100))
    assert decode(JobRef, data, max_size=len(data)) == JobRef("j" * 100)
    err = reject_sized(JobRef, data, len(data) - 1)
    assert "exceeds" in str(err)


def reject_sized(cls, data, max_size):
    with pytest.raises(WireError) as info:
        decode(cls, data, max_size=max_size)
    return info.value


def test_message_over_the_default_limit_is_refused():
    data = msgpack.packb({"job_id": "j", "pad": b"x" * MAX_MESSAGE})
    assert len(data) > MAX_MESSAGE
    reject(JobRef, data)


def test_top_level_must_be_a_map():
    for obj in [[1, 2], "x", 5, None, True, 1.5, b"x"]:
        reject(NodeState, obj)


@pytest.mark.parametrize(
    "cls,raw,field",
    [
        (NodeState, node(node_id=5), "node_id"),  # int where str
        (NodeState, node(seq=True), "seq"),  # bool where int
        (NodeState, node(seq="1"), "seq"),  # str where int
        (NodeState, node(seq=1.0), "seq"),  # float where int
        (NodeState, node(ts="now"), "ts"),  # str where float
        (NodeState, node(ts=True), "ts"),  # bool where float
        (NodeState, node(simulated=1), "simulated"),  # int where bool
        (NodeState, node(simulated="true"), "simulated"),
        (NodeState, node(node_id=None), "node_id"),  # None where required str
        (NodeState, node(labels=["a", "b"]), "labels"),  # list where map
        (NodeState, node(labels={"a": 1}), "labels.a"),  # int as a label value
        (NodeState, node(gpus={"0": {}}), "gpus"),  # map where list
        (NodeState, node(tasks="j.w.0#1"), "tasks"),  # str where list
        (NodeState, node(tasks=[1]), "tasks[0]"),
        (NodeState, node(capacity=[1, 2]), "capacity"),
        (NodeState, node(capacity={"cpu": "2"}), "capacity"),
        (NodeState, node(capacity={"cpu": 1.5}), "capacity"),
        (NodeState, node(capacity={"cpu": True}), "capacity"),
        (TaskEvent, event(state=3), "state"),
        (TaskEvent, event(exit_code="1"), "exit_code"),
        (TaskEvent, event(message=b"bytes"), "message"),
        (Assignment, assign(signature="text, not bytes"), "signature"),
        (Assignment, assign(spec="run me"), "spec"),
        (Assignment, assign(spec={"argv": "true"}), "spec.argv"),
        (Assignment, assign(spec={"env": {"A": 1}}), "spec.env.A"),
        (Assignment, assign(spec={"simulate": {"duration_s": "1s"}}), "spec.simulate.duration_s"),
        (Assignment, assign(spec={"simulate": {"duration_s": -1}}), "spec.simulate.duration_s"),
        (
            Assignment,
            assign(spec={"simulate": {"duration_s": 1, "exit_code": 256}}),
            "spec.simulate.exit_code",
        ),
        (Assignment, assign(spec={"simulate": {"load": 0.5}}), "spec.simulate.load"),
        (Assignment, assign(spec={"simulate": {"stop_s": "3s"}}), "spec.simulate.stop_s"),
        (Assignment, assign(spec={"simulate": {"stop_s": 3601}}), "spec.simulate.stop_s"),
        (
            Assignment,
            assign(spec={"simulate": {"load": {"curve": "sawtooth"}}}),
            "spec.simulate.load.curve",
        ),
        (
            Assignment,
            assign(spec={"simulate": {"load": {"peak": "high"}}}),
            "spec.simulate.load.peak",
        ),
        (
            Assignment,
            assign(spec={"simulate": {"load": {"curve": "diurnal", "peak": 0.1, "trough": 0.5}}}),
            "spec.simulate.load.peak",
        ),
        (
            Assignment,
            assign(spec={"simulate": {"load": {"noise": -1.0}}}),
            "spec.simulate.load.noise",
        ),
        (
            Assignment,
            assign(spec={"simulate": {"load": {"curve": "diurnal", "period_s": 0}}}),
            "spec.simulate.load.period_s",
        ),
        (NodeState, node(cpu_pressure="high"), "cpu_pressure"),
        (LogEntry, entry(placed(attempt="2")), "events[0].attempt"),
    ],
)
def test_wrong_types(cls, raw, field):
    reject(cls, raw, field)


@pytest.mark.parametrize(
    "cls,raw,field",
    [
        (TaskEvent, event(attempt=-1), "attempt"),
        (TaskEvent, event(attempt=1_000_001), "attempt"),
        (TaskEvent, event(signal=129), "signal"),
        (TaskEvent, event(signal=-1), "signal"),
        (TaskEvent, event(exit_code=2**31 + 1), "exit_code"),
        (TaskEvent, event(exit_code=-(2**31) - 1), "exit_code"),
        (
            NodeState,
            node(gpus=[to_wire(GpuStatus(0, "u", "m", 10, utilization=101))]),
            "gpus[0].utilization",
        ),
        (NodeState, node(gpus=[to_wire(GpuStatus(65, "u", "m", 10))]), "gpus[0].index"),
        (NodeState, node(gpus=[to_wire(GpuStatus(0, "u", "m", -1))]), "gpus[0].memory_total"),
        (NodeState, node(cpu_percent=100.5), "cpu_percent"),
        (NodeState, node(cpu_percent=-0.1), "cpu_percent"),
        (NodeState, node(load1=-1.0), "load1"),
        (NodeState, node(seq=-1), "seq"),
        (NodeState, node(seq=2**64 - 1), "seq"),  # beyond int64
        (NodeState, node(memory_used=-5), "memory_used"),
        (NodeState, node(ts=float("nan")), "ts"),
        (NodeState, node(ts=float("inf")), "ts"),
        (NodeState, node(capacity={"cpu": -1}), "capacity"),
        (Assignment, assign(grace_s=3600.5), "grace_s"),
        (Assignment, assign(grace_s=-1), "grace_s"),
        (Assignment, assign(term=-1), "term"),
        (Assignment, assign(spec={"max_run_time_s": -1.0}), "spec.max_run_time_s"),
        (LogEntry, entry(placed(attempt=-1)), "events[0].attempt"),
        (LogEntry, entry(term=-3), "term"),
        (JobListRequest, {"limit": 0}, "limit"),
        (JobListRequest, {"limit": 10_001}, "limit"),
        (LogsRequest, {"task_id": "t", "tail_bytes": 0}, "tail_bytes"),
        (LogsRequest, {"task_id": "t", "attempt": -1}, "attempt"),
    ],
)
def test_out_of_range(cls, raw, field):
    reject(cls, raw, field)


@pytest.mark.parametrize(
    "cls,raw,field",
    [
        (NodeState, node(node_id="n" * 65), "node_id"),
        (NodeState, node(note="x" * 1025), "note"),
        (NodeState, node(labels={f"k{i}": "v" for i in range(65)}), "labels"),
        (NodeState, node(gpus=[to_wire(GpuStatus(0, "u", "m", 1))] * 65), "gpus"),
        (NodeState, node(gpus=[to_wire(GpuStatus(0, "u" * 129, "m", 1))]), "gpus[0].uuid"),
        (
            NodeState,
            node(gpus=[{**to_wire(GpuStatus(0, "u", "m", 1)), "processes": [{"pid": 1}] * 257}]),
            "gpus[0].processes",
        ),
        (NodeState, node(labels={"k": "v" * (MAX_STR + 1)}), "labels.k"),
        (TaskEvent, event(job_id="j" * 129), "job_id"),
        (TaskEvent, event(message="m" * 4097), "message"),
        (TaskEvent, event(log_tail="m" * 4097), "log_tail"),
        (Assignment, assign(signature=b"s" * 257), "signature"),
        (Assignment, assign(spec={"argv": ["a"] * 4097}), "spec.argv"),
        (Assignment, assign(spec={"env": {f"K{i}": "v" for i in range(129)}}), "spec.env"),
        (Assignment, assign(spec={"workdir": "/" * (MAX_STR + 1)}), "spec.workdir"),
        (Assignment, assign(spec={"gpu_uuids": ["g"] * 65}), "spec.gpu_uuids"),
        (LogEntry, entry(placed(task_id="t" * 129)), "events[0].task_id"),
        (LogEntry, entry(placed(gpu_uuids=["g"] * 65)), "events[0].gpu_uuids"),
        (JobListRequest, {"state": "S" * 33}, "state"),
        (KillRequest, {"job_id": "j", "reason": "r" * 1025}, "reason"),
    ],
)
def test_too_long(cls, raw, field):
    reject(cls, raw, field)


@pytest.mark.parametrize(
    "cls,raw,field",
    [
        (TaskEvent, event(state="BOGUS"), "state"),
        (TaskEvent, event(state="running"), "state"),
        (TaskEvent, event(state=None), "state"),
        (TaskEvent, event(state=["RUNNING"]), "state"),
        (TaskEvent, event(state={"RUNNING": 1}), "state"),
        (LogEntry, entry(placed(_t="TaskUpdated", state="BOGUS")), "events[0].state"),
        (Assignment, assign(kind="start"), "kind"),
        (
            NodeState,
            node(gpus=[{**to_wire(GpuStatus(0, "u", "m", 1)), "enforcement": "magic"}]),
            "gpus[0].enforcement",
        ),
        (LogsRequest, {"task_id": "t", "stream": "stdin"}, "stream"),
    ],
)
def test_unknown_enum_and_choice_values(cls, raw, field):
    reject(cls, raw, field)


@pytest.mark.parametrize("tag", ["Bogus", "", None, 5, "LogEntry", "taskplaced"])
def test_tagged_union_with_an_unknown_tag(tag):
    reject(LogEntry, entry(placed(_t=tag)), "events[0]")


def test_tagged_union_without_a_tag():
    raw = placed()
    del raw["_t"]
    reject(LogEntry, entry(raw), "events[0]")


def test_tagged_union_member_must_be_a_map():
    reject(LogEntry, entry(["TaskPlaced"]), "events[0]")
    reject(LogEntry, entry("TaskPlaced"), "events[0]")


@pytest.mark.parametrize("tag", [[1], ["TaskPlaced"], {"a": 1}, {}])
def test_tagged_union_with_an_unhashable_tag(tag):
    # msgpack hands back lists and maps as values; the tag lookup must not raise TypeError.
    reject(LogEntry, entry(placed(_t=tag)), "events[0]")


@pytest.mark.parametrize(
    "cls,raw,field",
    [
        (NodeState, {"region": "r", "seq": 1, "ts": 1.0}, "node_id"),
        (NodeState, {"node_id": "n", "region": "r", "ts": 1.0}, "seq"),
        (TaskEvent, {"node_id": "n", "job_id": "j", "task_id": "t"}, "attempt"),
        (Assignment, {k: v for k, v in assign().items() if k != "kind"}, "kind"),
        (LogEntry, {"leader_id": "c"}, "term"),
        (
            LogEntry,
            entry({"_t": "TaskPlaced", "job_id": "j", "attempt": 1, "node_id": "n"}),
            "events[0].task_id",
        ),
        (LogEntry, entry({"_t": "LeaderElected", "leader_id": "c"}), "events[0].term"),
        (NodeState, node(gpus=[{"index": 0, "uuid": "u", "model": "m"}]), "gpus[0].memory_total"),
        (JobRef, {}, "job_id"),
        (GpuProcessInfo, {"used_memory": 1}, "pid"),
    ],
)
def test_missing_required_fields(cls, raw, field):
    reject(cls, raw, field)


def nested(depth: int, leaf=1):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_free_form_spec_nesting_is_capped():
    ok_spec = {"tasks": nested(MAX_DEPTH)}
    assert (
        decode(JobSubmitted, msgpack.packb({"job_id": "j", "client_id": "c", "spec": ok_spec})).spec
        == ok_spec
    )
    for depth in (MAX_DEPTH + 2, 100, 500):
        reject(JobSubmitted, {"job_id": "j", "client_id": "c", "spec": {"tasks": nested(depth)}})
        reject(
            LogEntry,
            entry(
                {
                    "_t": "JobSubmitted",
                    "job_id": "j",
                    "client_id": "c",
                    "spec": {"a": nested(depth)},
                }
            ),
        )
        reject(SubmitRequest, {"client_id": "c", "spec": nested(depth)}, None)


def test_free_form_nesting_of_maps_is_capped_too():
    value: object = 1
    for _ in range(MAX_DEPTH + 5):
        value = {"a": value}
    reject(JobSubmitted, {"job_id": "j", "client_id": "c", "spec": {"a": value}})


def test_nesting_deeper_than_msgpack_allows_is_a_wire_error():
    # msgpack's own stack limit, far beyond MAX_DEPTH, must also come out as WireError
    data = b"\x91" * 5000 + b"\x01"
    reject(JobSubmitted, data)
    reject(SubmitRequest, b"\x82\xa9client_id\xa1c\xa4spec" + data)


@pytest.mark.parametrize(
    "cls,raw",
    [
        (NodeState, node(labels={1: "x"})),
        (NodeState, node(labels={b"k": "x"})),
        (JobSubmitted, {"job_id": "j", "client_id": "c", "spec": {1: "x"}}),
        (JobSubmitted, {"job_id": "j", "client_id": "c", "spec": {"a": {2: "x"}}}),
        (JobSubmitted, {"job_id": "j", "client_id": "c", "spec": {"a": [{None: 1}]}}),
        (SubmitRequest, {"client_id": "c", "spec": {1.5: "x"}}),
        (Assignment, assign(spec={"env": {7: "v"}})),
        (NodeState, node(capacity={1: 5})),
    ],
)
def test_non_str_map_keys(cls, raw):
    reject(cls, raw)


# Free-form values, including what the fast check must send to the full one: tuples,
# non-str keys, strings past the cap, nesting past the cap, unsupported types.
odd_free_form = st.recursive(
    st.none()
    | st.booleans()
    | ints(-(2**63), INT64)
    | st.floats()
    | st.text(max_size=3)
    | st.just("y" * (MAX_STR + 1))
    | st.just(nested(MAX_DEPTH - 2))
    | st.just(nested(MAX_DEPTH + 1))
    | st.sets(st.integers(), max_size=2),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(odd_free_form)
@example("y" * (MAX_STR + 1))  # a spec that is one long string
@example({"k": "y" * (MAX_STR + 1)})
def test_free_form_fast_check_keeps_only_what_the_full_check_gives_back_equal(value):
    """The decoder keeps a free-form value as it came when `_any.ok` passes it: then the
    full check must take it and give back an equal value; whatever it refuses, the fast
    check must not pass."""
    try:
        full = codec._any(value, "spec")
    except WireError:
        assert not codec._any_ok(value)
        return
    if codec._any_ok(value):
        # `is`: a NaN kept as it came is not == to itself
        assert (full is value or full == value) and type(full) is type(value)


def test_free_form_string_and_list_sizes_are_capped():
    # inside free-form data, a string is capped at MAX_STR ...
    reject(SubmitRequest, {"client_id": "c", "spec": {"name": "y" * (MAX_STR + 1)}})
    reject(SubmitRequest, {"client_id": "c", "spec": ["y" * (MAX_STR + 1)]})
    # ... but a spec sent as one YAML text only by the request (the API judges its size
    # against MAX_SPEC_BYTES, with TOO_LARGE): a valid 100 KB spec was refused
    text = "y" * (MAX_STR + 1)
    assert decode(SubmitRequest, msgpack.packb({"client_id": "c", "spec": text})).spec == text
    big = msgpack.packb({"client_id": "c", "spec": "y" * (MAX_REQUEST + 1)})
    with pytest.raises(WireError, match="exceed the limit"):
        decode(SubmitRequest, big, max_size=len(big))
    reject(SubmitRequest, {"client_id": "c", "spec": [0] * (codec.MAX_ITEMS + 1)})
    reject(
        SubmitRequest, {"client_id": "c", "spec": {f"k{i}": 0 for i in range(codec.MAX_ITEMS + 1)}}
    )


def test_msgpack_extension_types_are_refused():
    reject(JobRef, msgpack.packb({"job_id": msgpack.ExtType(5, b"xyz")}))
    reject(
        SubmitRequest,
        msgpack.packb(
            {"client_id": "c", "spec": datetime.datetime.now(datetime.UTC)}, datetime=True
        ),
    )


def test_unknown_resource_kind_is_refused():
    reject(NodeState, node(capacity={"cpu": 1, "tpu": 4}), "capacity")


def test_invalid_utf8_string_is_refused():
    # a str8 header with bytes that are not UTF-8
    reject(JobRef, b"\x81\xa6job_id\xa2\xff\xfe")


# --------------------------------------------------------------------------- fuzz

FIELD_NAMES = sorted(
    {f.name for cls in CLASSES for f in dataclasses.fields(cls)}
    | {"_t", "cpu", "memory", "gpu", "duration_s", "exit_code", "load", "curve", "peak", "period_s"}
)
TAGS = [
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
]
STRING_VALUES = TAGS + [s.value for s in TaskState] + ["run", "kill", "mig", "none", "stdout"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=10),
    st.sampled_from(STRING_VALUES),
    st.binary(max_size=10),
)
keys = st.one_of(
    st.sampled_from(FIELD_NAMES),
    st.text(max_size=5),
    st.integers(-5, 5),
    st.binary(max_size=3),
    st.none(),
    st.booleans(),
    st.floats(),
)
wireish = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=8,
)
# Maps that look like a message of this schema: its field names, plausible values.
messageish = st.dictionaries(st.sampled_from(FIELD_NAMES), wireish, max_size=6)


def decode_or_wire_error(cls, data):
    try:
        out = decode(cls, data)
    except WireError:
        return None
    assert type(out) is cls
    return out


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        wireish.map(lambda o: msgpack.packb(o, use_bin_type=True)),
        messageish.map(lambda o: msgpack.packb(o, use_bin_type=True)),
    )
)
def test_fuzz_decode_returns_an_instance_or_raises_wire_error(data):
    for cls in CLASSES:
        decode_or_wire_error(cls, data)


def _mutate(obj, data):
    """Replace one randomly chosen value somewhere inside `obj` with something arbitrary."""
    if isinstance(obj, dict) and obj and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(obj, key=repr)))
        out = dict(obj)
        out[key] = _mutate(obj[key], data)
        if data.draw(st.booleans()):
            out[data.draw(keys)] = data.draw(wireish)
        return out
    if isinstance(obj, list) and obj and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(obj) - 1))
        out = list(obj)
        out[i] = _mutate(obj[i], data)
        return out
    return data.draw(wireish)


@pytest.mark.parametrize(
    "cls", [NodeState, Assignment, TaskEvent, LogEntry], ids=lambda c: c.__name__
)
def test_fuzz_mutated_valid_messages(cls):
    @MUTATE
    @given(STRATEGIES[cls], st.data())
    def check(msg, data):
        raw = _mutate(to_wire(msg), data)
        decode_or_wire_error(cls, msgpack.packb(raw, use_bin_type=True))

    check()


def test_schema_types_are_all_convertible():
    # building a converter for every field type must not raise TypeError at first use
    for cls in CLASSES:
        for f in dataclasses.fields(cls):
            codec._converter(typing.get_type_hints(cls)[f.name])


# --------------------------------------------------------------------------- fast path

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.text(max_size=70)
    | st.binary(max_size=300)
)


def _converters_with_a_fast_path():
    out = []
    for cls in STRATEGIES:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            meta = {k: v for k, v in f.metadata.items() if v is not None}
            conv = codec._converter(hints[f.name], meta)
            if getattr(conv, "ok", None) is not None:
                out.append((f"{cls.__name__}.{f.name}", conv))
    return out


FAST = _converters_with_a_fast_path()


def test_scalar_fields_have_a_fast_path():
    assert {"NodeState.node_id", "NodeState.seq", "NodeState.ts", "Assignment.kind"} <= {
        name for name, _ in FAST
    }


@FUZZ
@given(value=_SCALARS, choice=st.data())
def test_a_value_the_fast_path_accepts_is_one_the_converter_returns_unchanged(value, choice):
    """The decoder skips a field's converter when its `ok` says the value is valid as it is:
    so `ok(x)` must mean exactly "the converter returns x, same type", never more."""
    name, conv = choice.draw(st.sampled_from(FAST))
    if conv.ok(value):
        out = conv(value, name)
        assert out == value and type(out) is type(value)
    else:
        with contextlib.suppress(WireError):
            conv(value, name)  # refused or converted (an int for a float): the slow path


@ROUND_BIG
@given(old=node_state, new=node_state, names=st.sets(st.sampled_from(NodeState.__slots__)))
def test_changing_some_fields_gives_what_decoding_the_whole_message_gives(old, new, names):
    """`with_changes` validates only the fields a repeated message changed (a heartbeat's
    clock), keeping the rest: the result must be the full decode of the merged message,
    and a name the class lacks is ignored as a full decode ignores it."""
    changes = {k: v for k, v in to_wire(new).items() if k in names}
    changes["later_field"] = [1, 2]
    assert codec.with_changes(old, changes) == codec.from_wire(
        NodeState, {**to_wire(old), **changes}
    )


@pytest.mark.parametrize(
    "name,value",
    [
        ("seq", True),
        ("seq", -1),
        ("ts", "now"),
        ("ts", float("inf")),
        ("cpu_percent", 100.5),
        ("tasks", "j.w.0#1"),
        ("tasks", ["ok#1", 7]),
        ("gpus", [{"index": -1}]),
        ("capacity", {"cpu": 1.5}),
        ("labels", {"a": 1}),
        ("node_id", "n" * 65),
        ("node_id", None),
    ],
)
def test_a_bad_changed_field_is_refused_as_in_a_whole_message(name, value):
    old = NodeState("n1", "r", 1, 1.0, Resources(cpu=1000))
    with pytest.raises(WireError) as whole:
        codec.from_wire(NodeState, {**to_wire(old), name: value})
    with pytest.raises(WireError) as changed:
        codec.with_changes(old, {name: value})
    assert changed.value.field == whole.value.field


def test_a_node_s_events_travel_one_or_many_to_a_message():
    one = TaskEvent("n1", "j", "j.w.0", 1, TaskState.RUNNING, 1.0)
    two = TaskEvent("n1", "j", "j.w.1", 2, TaskState.SUCCEEDED, 2.0, exit_code=0)
    assert decode_task_events(encode(one)) == ("n1", (one,))
    assert decode_task_events(encode(TaskEventBatch("n1", (one, two)))) == ("n1", (one, two))
    other = dataclasses.replace(two, node_id="n2")
    with pytest.raises(WireError) as err:  # a node may only speak for itself
        decode_task_events(encode(TaskEventBatch("n1", (one, other))))
    assert err.value.field == "events[1].node_id"
    with pytest.raises(WireError, match="limit"):
        decode_task_events(encode(TaskEventBatch("n1", (one,) * (MAX_EVENT_BATCH + 1))))
    with pytest.raises(WireError):
        decode_task_events(msgpack.packb({"node_id": "n1", "events": [{"task_id": 3}]}))
