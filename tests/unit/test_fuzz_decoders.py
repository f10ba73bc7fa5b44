"""Hostile input against every decoder, in process: each wire message that arrives from the
network, the receive paths that drop bad messages (and count them), and the YAML readers of
job specs and pool trees. Every input ends in a valid value or the target's own error
(WireError, SpecError, PoolConfigError), quickly, with a short message.

The generators are bench/fuzz.py's (`python -m bench fuzz` runs the same targets at volume);
hypothesis drives their seeds here and shrinks a failure to one seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import typing
from types import SimpleNamespace

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import fuzz
from coordinator.api import MAX_REQUEST, Api, _request_problem
from coordinator.pools import PoolConfigError, parse_pool_tree
from coordinator.pools.tree import MAX_DESCRIPTION, MAX_POOLS
from mesh import jsonwire
from mesh.codec import MAX_DEPTH, MAX_MESSAGE, WireError, decode, encode, to_wire
from mesh.schema import (
    MAX_BATCH,
    ErrorCode,
    JobRef,
    SubmitManyRequest,
    SubmitRequest,
    TaskEvent,
    TaskEventBatch,
    decode_assignments,
    decode_task_events,
)
from mesh.schema import (
    NodeState as NodeStateMsg,
)
from tests.wording import assert_readable
from workloads.quantity import SpecError
from workloads.spec import (
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRIES,
    MAX_LABELS,
    MAX_POOL_DEPTH,
    MAX_SOURCE_BYTES,
    MAX_TASKS,
    MAX_YAML_NODES,
    parse_job_spec,
)

_COMMON = dict(
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings(max_examples=150, **_COMMON)
FEW = settings(max_examples=40, **_COMMON)
CLASSES = fuzz.WIRE_CLASSES
# How long the worst inputs take is measured by `python -m bench fuzz` (slowest cases),
# not asserted here: a timed test flakes on a loaded machine.


def test_every_network_message_is_fuzzed():
    import mesh.schema as schema

    requests = {
        obj
        for name in dir(schema)
        if name.endswith(("Request", "Ref"))
        and dataclasses.is_dataclass(obj := getattr(schema, name))
    }
    assert requests <= set(CLASSES)
    assert {
        schema.NodeState,
        schema.TaskEvent,
        schema.TaskEventBatch,
        schema.Assignment,
        schema.AssignmentBatch,
        schema.LogEntry,
    } <= set(CLASSES)


def decoded_or_wire_error(cls, data):
    try:
        out = decode(cls, data)
    except WireError as exc:
        assert len(str(exc)) < 1000
        # what the API sends back for it: words, never empty, never a class name
        assert_readable(str(exc))
        assert_readable(_request_problem(exc))
        out = None
    assert out is None or type(out) is cls
    return out


# --------------------------------------------------------------------------- wire


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(data):
    for cls in CLASSES:
        decoded_or_wire_error(cls, data)


@FEW
@given(st.integers(0, 2**32))
def test_generated_hostile_messages(seed):
    """Truncated, mutated, wrong-typed, deeply nested, oversized fields, random maps, YAML
    payloads in the free-form fields: one of each class per seed."""
    rng = random.Random(seed)
    for cls in CLASSES:
        _, data = fuzz.wire_case(rng, cls, yaml_case=lambda r: fuzz.spec_input(r)[1])
        decoded_or_wire_error(cls, data)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_truncation_is_refused(cls):
    for sample in fuzz.SAMPLES[cls]:
        data = encode(sample)
        assert decode(cls, data) == sample
        for cut in range(len(data)):
            with pytest.raises(WireError):
                decode(cls, data[:cut])


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_oversized_and_deeply_nested(cls):
    with pytest.raises(WireError, match="exceeds"):
        decode(cls, fuzz.oversized(MAX_MESSAGE))
    for depth in (MAX_DEPTH + 2, 2000, 100_000):
        with pytest.raises(WireError):
            decode(cls, fuzz._nested_bytes(depth, "array"))
        # a map of unknown fields is valid where every field has a default
        decoded_or_wire_error(cls, fuzz._nested_bytes(depth, "map"))
    # nested inside every field, free-form ones included
    plain = to_wire(fuzz.SAMPLES[cls][0])
    for key in plain:
        raw = dict(plain, **{key: fuzz._nested(random.Random(1), MAX_DEPTH + 5)})
        decoded_or_wire_error(cls, msgpack.packb(raw, use_bin_type=True))
    hints = typing.get_type_hints(cls)
    for key in ("spec", "source"):  # free-form: the depth cap applies
        if hints.get(key) is typing.Any:
            raw = dict(plain, **{key: fuzz._nested(random.Random(1), MAX_DEPTH + 5)})
            with pytest.raises(WireError, match="nested deeper"):
                decode(cls, msgpack.packb(raw, use_bin_type=True))


WRONG = [None, True, -1, 2**64 - 1, 1.5, float("nan"), "x", "", b"\x00", [], [1], {}, {"a": 1}]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_wrong_type_in_every_field(cls):
    plain = to_wire(fuzz.SAMPLES[cls][0])
    hints = typing.get_type_hints(cls)
    for key in plain:
        for value in WRONG:
            out = decoded_or_wire_error(cls, msgpack.packb({**plain, key: value}))
            if out is not None and hints[key] is not typing.Any:
                # accepted: it must be a value the field's type allows
                got = getattr(out, key)
                assert got is None or not isinstance(got, list)
    for top in WRONG + [[plain]]:
        if not isinstance(top, dict):
            with pytest.raises(WireError):
                decode(cls, msgpack.packb(top))


def test_a_long_key_over_many_entries_decodes_in_linear_time():
    # was 5.4 s for this 1 MB message: each of the 120k entries copied the 400 KB key
    # into its error path
    inner = {f"{i:04x}": 1 for i in range(9999)}
    data = msgpack.packb({"client_id": "c", "spec": {"A" * 400_000: [inner] * 10}})
    assert len(data) <= MAX_MESSAGE
    decode(SubmitRequest, data)


def test_error_messages_stay_short():
    # was: the repr of whatever was sent (megabytes for a nested list), sent back in the reply
    nested = fuzz._nested(random.Random(0), 30)
    for raw in ({"job_id": "j", "state": nested}, {"job_id": "j", "state": "x" * 60_000}):
        with pytest.raises(WireError) as err:
            decode(TaskEvent, msgpack.packb({"node_id": "n", "task_id": "t", "attempt": 0, **raw}))
        assert len(str(err.value)) < 300


def test_submit_many_batch_limit():
    item = {"client_id": "c", "spec": "name: x"}
    assert len(decode(SubmitManyRequest, msgpack.packb({"jobs": [item] * MAX_BATCH})).jobs) == (
        MAX_BATCH
    )
    with pytest.raises(WireError, match=f"limit of {MAX_BATCH}"):
        decode(SubmitManyRequest, msgpack.packb({"jobs": [item] * (MAX_BATCH + 1)}))


# msgpack's own errors were class names with an empty text or its internals; each case is
# one kind it raises, with the words the reply says now
MSGPACK_CASES = [
    (b"\x80\x80", "not valid msgpack: extra bytes after the first value"),
    (b"\xc1", "not valid msgpack: a byte that starts no msgpack value"),
    (b"\x91" * 5000, "not valid msgpack: nested too deeply"),
    (b"\x92\x01", "not valid msgpack: the message ends in the middle of a value"),
    (b"", "not valid msgpack: the message is empty"),
    (b"\xa2\xff\xfe", "not valid msgpack: a string that is not valid UTF-8 (byte 0xff)"),
    (b"\x81\x91\x01\x01", "not valid msgpack: a map key that is a list or a map"),
    (b"\xc7\x01\x05a", "not valid msgpack: an extension value"),
    (b"\xdd\xff\xff\xff\xff", "not valid msgpack: a list of 4294967295 items or bytes, over"),
    (b"\x05", "expected a map, got an integer"),
    (msgpack.packb({"job_id": None}), "job_id: expected a string, got nil"),
]


@pytest.mark.parametrize("data, words", MSGPACK_CASES)
def test_decode_errors_say_what_is_wrong_in_words(data, words):
    with pytest.raises(WireError) as err:
        decode(JobRef, data)
    assert str(err.value).startswith(words), str(err.value)
    assert_readable(str(err.value))
    assert _request_problem(err.value).startswith("request")


@FUZZ
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_json_requests_decode_or_say_why_in_words(data):
    """Anything the JSON reader is given, as a request that starts with `{` would be."""
    for body in (data, b"{" + data, b'{"job_id": ' + data):
        try:
            packed = jsonwire.to_msgpack(body)
        except WireError as exc:
            assert_readable(str(exc))
            continue
        decoded_or_wire_error(JobRef, packed)


# --------------------------------------------------------------------------- receive paths


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


@FEW
@given(st.integers(0, 2**32))
def test_receive_paths_drop_and_count_bad_messages(seed):
    """The coordinator's node-state path, the leader's task-event path, the log follower
    and the agent's assignment feed: a bad message is counted and dropped, never raised,
    and changes nothing."""
    rng = random.Random(seed)

    async def check():
        recv = fuzz.Receivers()
        for cls, path in (
            (fuzz.NodeState, recv.state),
            (fuzz.TaskEvent, recv.events),
            (fuzz.TaskEventBatch, recv.events),
            (fuzz.Assignment, recv.assignment),
            (fuzz.AssignmentBatch, recv.assignment),
        ):
            for _ in range(5):
                _, data = fuzz.wire_case(rng, cls)
                try:
                    if cls in (fuzz.Assignment, fuzz.AssignmentBatch):
                        valid = decode_assignments(data)  # what the feed decodes
                    elif cls in (fuzz.TaskEvent, fuzz.TaskEventBatch):
                        node_id, _ = decode_task_events(data)  # what the leader decodes
                        valid = fuzz.TaskEventBatch(node_id)
                    else:
                        valid = decode(cls, data)
                except WireError:
                    valid = None
                if valid is not None and not _token_ok(getattr(valid, "node_id", "n1")):
                    continue  # see test_an_event_with_a_node_id_that_is_no_subject_token
                dropped = await path(data)
                if valid is None:
                    assert dropped
        assert recv.handled == [] or all(a.node_id == "n1" for a in recv.handled)
        assert recv.coord.cluster.nodes == {} or all(n == "n1" for n in recv.coord.cluster.nodes)
        seq = recv.coord.state.last_seq
        for i in range(5):
            _, data = fuzz.wire_case(rng, fuzz.LogEntry)
            try:
                decode(fuzz.LogEntry, data)
            except WireError:
                assert await recv.log(data, seq + 1 + i)
        assert recv.coord.state.jobs == {}

    _run(check())


def _token_ok(node_id: str) -> bool:
    from mesh import subjects

    try:
        subjects.token(node_id, "node id")
    except ValueError:
        return False
    return True


def test_bad_state_and_event_counters():
    async def check():
        recv = fuzz.Receivers()
        for data in (b"", b"\xc1", b"\x80", msgpack.packb([1]), fuzz._nested_bytes(5000)):
            assert await recv.state(data)
            assert await recv.events(data)
            assert await recv.assignment(data)
        assert recv.coord.bad_states == 5 and recv.leader.bad_events == 5
        assert recv.feed.rejected == 5 and recv.handled == []
        # valid, but speaking for another node than its subject says
        other = encode(NodeStateMsg("n2", "r", 1, 1.0))
        assert await recv.state(other) and recv.coord.bad_states == 6
        ev = encode(TaskEvent("n2", "j", "t", 0))
        assert await recv.events(ev) and recv.leader.bad_events == 6
        mine = TaskEvent("n1", "j", "t", 0)
        for batch in (  # a batch for another node, or with another node's event in it
            TaskEventBatch("n2", (dataclasses.replace(mine, node_id="n2"),)),
            TaskEventBatch("n1", (mine, dataclasses.replace(mine, node_id="n2"))),
        ):
            assert await recv.events(encode(batch))
        assert recv.leader.bad_events == 8

    _run(check())


def test_an_event_with_a_node_id_that_is_no_subject_token():
    async def check():
        recv = fuzz.Receivers()
        assert await recv.events(encode(TaskEvent("a.b", "j", "t", 0)))
        assert await recv.state(encode(NodeStateMsg("a.b", "r", 1, 1.0)))
        assert recv.leader.bad_events == 1 and recv.coord.bad_states == 1

    _run(check())


# --------------------------------------------------------------------------- YAML


def spec_error(parse, source, error=SpecError):
    try:
        out = parse(source)
    except error as exc:
        assert len(str(exc)) < 2000, str(exc)[:200]
        assert_readable(str(exc))  # an INVALID_SPEC reply's message
        out = None
    return out


@FUZZ
@given(st.text(max_size=200))
def test_random_text(text):
    spec_error(parse_job_spec, text)
    spec_error(parse_pool_tree, text, PoolConfigError)


@FEW
@given(st.integers(0, 2**32))
def test_generated_hostile_yaml_and_mappings(seed):
    """Random, truncated, mutated, deeply nested, duplicate-key, anchor-bomb, huge-scalar,
    tagged, wide and oversized documents, as text, bytes and decoded mappings."""
    rng = random.Random(seed)
    spec_error(parse_job_spec, fuzz.spec_input(rng)[1])
    spec_error(parse_pool_tree, fuzz.spec_input(rng, pools=True)[1], PoolConfigError)


def test_the_valid_samples_parse():
    assert parse_job_spec(fuzz.VALID_SPEC).task_count == 3
    assert "/ml/vision" in parse_pool_tree(fuzz.VALID_POOLS)


@pytest.mark.parametrize("slot", fuzz._BOMB_SLOTS_SPEC)
def test_anchor_bomb_in_a_job_spec(slot):
    with pytest.raises(SpecError) as err:
        spec_error(parse_job_spec, slot.format(b=fuzz._BOMB), ())
    assert len(str(err.value)) < 300


@pytest.mark.parametrize("slot", fuzz._BOMB_SLOTS_POOLS)
def test_anchor_bomb_in_a_pool_tree(slot):
    # was: a `type:`/`share:`/quantity bomb put its repr (gigabytes) in the message
    with pytest.raises(PoolConfigError) as err:
        spec_error(parse_pool_tree, slot.format(b=fuzz._BOMB), ())
    assert len(str(err.value)) < 300


HUGE_INTS = ["1" * 5000, "0x" + "f" * 5000, "-0x" + "f" * 2000, "0o" + "7" * 5000]


@pytest.mark.parametrize("value", HUGE_INTS, ids=["dec", "hex", "neg-hex", "oct"])
def test_huge_integers_anywhere(value):
    # was: ValueError (int <-> str past 4300 digits) from the YAML constructor, from
    # str()/repr() in messages and from the share check: INTERNAL at the API
    for slot in fuzz._SCALAR_SLOTS_SPEC:
        spec_error(parse_job_spec, slot.format(v=value))
    for slot in fuzz._SCALAR_SLOTS_POOLS:
        spec_error(parse_pool_tree, slot.format(v=value), PoolConfigError)
    with pytest.raises(SpecError):
        parse_job_spec(f"name: x\npriority: {value}\ntasks: [{{role: a, command: x}}]\n")
    with pytest.raises(PoolConfigError):
        parse_pool_tree(f"pools:\n  /a: {{share: {value}}}\n")


@pytest.mark.parametrize(
    "doc",
    [
        "name: x\nmax_run_time: 2001-02-30 25:61:61\ntasks: [{role: a, command: x}]\n",
        "name: x\nmax_run_time: !!timestamp 1\ntasks: [{role: a, command: x}]\n",
        "name: x\nmax_run_time: 2001-13-45\ntasks: [{role: a, command: x}]\n",
        "name: !!binary '!!!'\n",
        "name: !!python/object/apply:os.system [true]\n",
        "name: !!float x\n",
        "name: x\nname: y\n",
        "name: x\ntasks: [{role: a, command: x, role: b}]\n",
        "[" * 1001 + "]" * 1001,
        "{a: " * 5000,
        "".join(" " * i + "- \n" for i in range(300)),
        "\ufeff\x00",
        "%YAML 9.9\n--- x\n",
        "--- a\n--- b\n",
    ],
)
def test_malformed_yaml(doc):
    # the first two were AttributeError from PyYAML's timestamp constructor
    with pytest.raises(SpecError):
        spec_error(parse_job_spec, doc, ())
    pools = doc.replace("name:", "pools:", 1)
    with pytest.raises(PoolConfigError):
        spec_error(parse_pool_tree, pools, ())


# --------------------------------------------------------------------------- limits


def _group(**kw):
    return {"name": "x", "tasks": [{"role": "a", "command": "x", **kw}]}


def _problem(source, parse=parse_job_spec) -> str:
    with pytest.raises(SpecError) as err:
        parse(source)
    return str(err.value)


def test_spec_limits_have_clear_errors():
    assert "MAX_SOURCE_BYTES" in _problem("#" * (MAX_SOURCE_BYTES + 1))
    assert "MAX_SOURCE_BYTES" in _problem(b"#" * (MAX_SOURCE_BYTES + 1))
    groups = [{"role": f"g{i}", "command": "x"} for i in range(MAX_TASKS + 1)]
    assert "MAX_TASKS" in _problem({"name": "x", "tasks": groups})
    assert "MAX_TASKS" in _problem(
        _group(count=MAX_TASKS)
        | {
            "tasks": [
                {"role": "a", "command": "x", "count": MAX_TASKS},
                {"role": "b", "command": "x"},
            ]
        }
    )
    assert "MAX_COMMAND_BYTES" in _problem(_group(command="x" * MAX_COMMAND_BYTES))
    assert "MAX_COMMAND_BYTES" in _problem(_group(command=["x"] * (MAX_COMMAND_BYTES + 1)))
    env = {f"V{i}": "x" for i in range(MAX_ENV_ENTRIES + 1)}
    assert "MAX_ENV_ENTRIES" in _problem(_group(env=env))
    assert "MAX_ENV_BYTES" in _problem(_group(env={"A": "x" * MAX_ENV_BYTES}))
    labels = {f"k{i}": "v" for i in range(MAX_LABELS + 1)}
    assert "MAX_LABELS" in _problem({**_group(), "labels": labels})
    deep = "/a" * (MAX_POOL_DEPTH + 1)
    assert "MAX_POOL_DEPTH" in _problem({**_group(), "pool": deep})
    assert parse_job_spec({**_group(), "pool": "/a" * MAX_POOL_DEPTH}).pool


def test_yaml_node_limit():
    # 1 MiB of tiny task groups took ~5 s to read (PyYAML composes and constructs every
    # node in Python); reading now stops at MAX_YAML_NODES
    wide = "name: x\ntasks: [" + ",".join(["a"] * (MAX_YAML_NODES + 10)) + "]\n"
    assert "MAX_YAML_NODES" in _problem(wide)
    groups = "".join(f"- {{role: r{i}, simulate: {{duration: 1}}}}\n" for i in range(2000))
    assert parse_job_spec("name: x\ntasks:\n" + groups).task_count == 2000  # 14k nodes
    # a mapping is not YAML: no node limit
    big = {"name": "x", "tasks": [{"role": f"r{i}", "command": "x"} for i in range(MAX_TASKS)]}
    assert parse_job_spec(big).task_count == MAX_TASKS


def test_yaml_nesting_limit():
    # libyaml refuses nesting past 1000 levels; the pure-Python parser hits RecursionError;
    # both are a SpecError
    assert "nesting" in _problem("a: " + "[" * 1001 + "]" * 1001) or "deep" in _problem(
        "a: " + "[" * 1001 + "]" * 1001
    )
    assert "YAML" in _problem("[" * 20_000, parse_pool_tree)


def test_pool_tree_limits_have_clear_errors():
    deep = "/a" * (MAX_POOL_DEPTH + 1)
    assert "MAX_POOL_DEPTH" in _problem({"pools": {deep: {}}}, parse_pool_tree)
    many = {"pools": {f"/p{i}": None for i in range(MAX_POOLS + 1)}}
    assert "MAX_POOLS" in _problem(many, parse_pool_tree)
    long = {"pools": {"/a": {"description": "d" * (MAX_DESCRIPTION + 1)}}}
    assert "MAX_DESCRIPTION" in _problem(long, parse_pool_tree)
    assert parse_pool_tree({"pools": {"/a": {"description": "d" * MAX_DESCRIPTION}}})


def test_api_refuses_an_oversized_request_before_reading_it():
    api = Api(SimpleNamespace())  # the size check needs no coordinator state

    async def call():
        return await api.call("job.submit", b"\x80" * (MAX_REQUEST + 1), forward=True)

    reply = msgpack.unpackb(_run(call()))
    assert reply["ok"] is False and reply["error"]["code"] == ErrorCode.TOO_LARGE
