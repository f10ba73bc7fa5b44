"""Hostile requests against every endpoint of a live request API (a real nats-server and an
in-process coordinator): each gets an error reply with a clear code, the service keeps
serving, and nothing reaches the job log that was not acknowledged as a write.

A few hundred generated cases (bench/fuzz.py's generators, as `python -m bench fuzz` runs
at volume) over one connection, then one request per limit with the code it must get.
"""

from __future__ import annotations

import random

import msgpack

from bench import fuzz
from coordinator.api import ENDPOINTS, MAX_REQUEST
from coordinator.pools.tree import MAX_DESCRIPTION
from mesh import subjects
from mesh.codec import encode
from mesh.schema import MAX_BATCH, NodeState, TaskEvent, TaskEventBatch
from tests.wording import assert_readable
from workloads.spec import MAX_YAML_NODES

from .conftest import eventually

REGION = "default"
CASES = 330  # 30 per endpoint


class WordedFuzzer(fuzz.ApiFuzzer):
    """The bench's fuzzer, keeping every error message it was sent back."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.messages: list[str] = []

    async def request(self, endpoint: str, data: bytes) -> dict:
        reply = await super().request(endpoint, data)
        if not reply.get("ok"):
            self.messages.append((reply.get("error") or {}).get("message"))
        for item in reply.get("results") or ():  # job.submit_many: per item
            if isinstance(item, dict) and "error" in item:
                self.messages.append(item["error"].get("message"))
        return reply


async def _log_seq(region) -> int:
    js = region.nc.jetstream()
    return (await js.stream_info(subjects.log_stream(REGION))).state.last_seq


async def test_hostile_requests_get_clear_errors_and_change_nothing(region):
    coord = await region.coordinator()
    await region.ready(0)
    assert set(fuzz.API_TARGETS) == set(ENDPOINTS)
    fz = WordedFuzzer(region.nc, REGION, random.Random(20261130))
    term, seq0 = coord.state.term, await _log_seq(region)

    await fz.run(CASES, check_every=30)
    # every refusal says what is wrong in words: never empty, never a class name
    assert len(fz.messages) > CASES // 2
    for message in fz.messages:
        assert_readable(message)

    assert fz.tally.crashes == [], fz.tally.crashes[:5]
    assert fz.liveness_failures == 0
    assert sum(fz.tally.cases.values()) == CASES
    assert not set(fz.codes) & set(fuzz.BAD_CODES), fz.codes
    # the job log grew only by what was acknowledged (mutated valid requests may succeed)
    assert await _log_seq(region) - seq0 <= fz.ok_writes
    assert coord.state.last_seq == await _log_seq(region)
    assert coord.state.term == term  # the leader never lost its lease while busy

    # and a valid request right after still works
    seq = await _log_seq(region)
    job_id = await region.client.submit(
        {"name": "after", "tasks": [{"role": "a", "simulate": {"duration": "1s"}}]}
    )
    assert (await region.client.job(job_id))["job_id"] == job_id
    assert await _log_seq(region) == seq + 1


def _submit(spec, client_id: str = "cid") -> bytes:
    return msgpack.packb({"client_id": client_id, "spec": spec}, use_bin_type=True)


async def test_each_limit_has_its_code(region):
    coord = await region.coordinator()
    await region.ready(0)
    fz = WordedFuzzer(region.nc, REGION, random.Random(1))
    seq0, term = await _log_seq(region), coord.state.term
    bomb_pools = "pools:\n  /a: {description: &d " + "d" * MAX_DESCRIPTION + "}\n"
    bomb_pools += "".join(f"  /b{i}: {{description: *d}}\n" for i in range(4000))
    wide = "name: x\ntasks: [" + ",".join(["a"] * (MAX_YAML_NODES + 1)) + "]\n"
    cases = [
        ("job.submit", b"\x80" * (MAX_REQUEST + 1), "TOO_LARGE", "exceeds"),
        ("pool.apply", b"\x80" * (MAX_REQUEST + 1), "TOO_LARGE", "exceeds"),
        ("job.submit", b"\xc1", "BAD_REQUEST", "not valid msgpack"),
        # msgpack's own texts were `ExtraData: unpack(b) received extra data.` and an
        # empty `StackError:`; each reads as what is wrong now
        ("job.get", b"\x80\x80", "BAD_REQUEST", "extra bytes after the first value"),
        ("job.get", b"\x91" * 5000, "BAD_REQUEST", "nested too deeply"),
        ("job.get", b"\x81\xa6job_id", "BAD_REQUEST", "ends in the middle of a value"),
        ("job.get", b"\x81\xa6job_id\xa2\xff\xfe", "BAD_REQUEST", "not valid UTF-8"),
        ("job.get", b"\x81\x91\x01\x01", "BAD_REQUEST", "a map key that is a list"),
        ("job.get", b"", "BAD_REQUEST", "the message is empty"),
        ("job.get", b"\x05", "BAD_REQUEST", "request: expected a map, got an integer"),
        ("job.get", msgpack.packb({"job_id": None}), "BAD_REQUEST", "got nil"),
        ("job.get", b'{"job_id": ', "BAD_REQUEST", "not valid JSON"),
        ("job.get", b"[1]", "BAD_REQUEST", "not valid msgpack"),
        ("job.get", fuzz._nested_bytes(100_000), "BAD_REQUEST", "msgpack"),
        ("job.submit", _submit(fuzz._nested(random.Random(0), 40)), "BAD_REQUEST", "nested"),
        (
            "job.submit_many",
            msgpack.packb({"jobs": [{"client_id": "c", "spec": "x"}] * (MAX_BATCH + 1)}),
            "BAD_REQUEST",
            f"limit of {MAX_BATCH}",
        ),
        ("job.submit", _submit("[" * 5000), "INVALID_SPEC", "nesting"),
        # a str spec is not capped at 64 KiB by the codec (MAX_STR) any more: the spec's
        # own limits judge it, as they judge bytes
        ("job.submit", _submit(wide), "INVALID_SPEC", "MAX_YAML_NODES"),
        ("job.submit", _submit(wide.encode()), "INVALID_SPEC", "MAX_YAML_NODES"),
        ("job.submit", _submit(fuzz._BOMB_SLOTS_SPEC[1].format(b=fuzz._BOMB)), "INVALID_SPEC", ""),
        ("job.submit", _submit("name: x\npriority: " + "1" * 5000), "INVALID_SPEC", "YAML"),
        ("job.submit", _submit("name: x\npriority: 0x" + "f" * 5000), "INVALID_SPEC", ""),
        ("job.submit", _submit("name: x\nname: y\n"), "INVALID_SPEC", "duplicate"),
        ("job.submit", _submit({"name": "x", "tasks": [{"role": "a"}] * 10_001}), "", ""),
        (
            "job.submit",
            _submit({"name": "x", "tasks": [{"role": "a", "command": ["x"] * 70_000}]}),
            "",
            "",
        ),
        ("pool.apply", msgpack.packb({"source": "[" * 5000}), "INVALID_SPEC", "YAML"),
        (
            "pool.apply",
            msgpack.packb({"source": fuzz._BOMB_SLOTS_POOLS[0].format(b=fuzz._BOMB)}),
            "INVALID_SPEC",
            "type",
        ),
        (
            "pool.apply",
            msgpack.packb({"source": "pools:\n  /a: {share: 0x" + "f" * 5000 + "}\n"}),
            "INVALID_SPEC",
            "share",
        ),
        (
            "pool.apply",
            msgpack.packb({"source": "pools:\n  /a: {description: " + "d" * 2000 + "}\n"}),
            "INVALID_SPEC",
            "MAX_DESCRIPTION",
        ),
        # each description within its limit, but an alias repeats it: 4 MB as a log event
        (
            "pool.apply",
            msgpack.packb({"source": bomb_pools.encode()}, use_bin_type=True),
            "TOO_LARGE",
            "log entry",
        ),
    ]
    for endpoint, data, code, words in cases:
        reply = await fz.request(endpoint, data)
        assert reply["ok"] is False, (endpoint, words)
        err = reply["error"]
        # empty code: any clear one (the message decoder or the spec parser may refuse first)
        if code:
            assert err["code"] == code, (endpoint, words, err)
        else:
            assert err["code"] in ("BAD_REQUEST", "INVALID_SPEC", "TOO_LARGE"), err
        assert words in err["message"], (words, err["message"][:200])
        assert len(err["message"]) < 2000
        assert_readable(err["message"])
        assert await fz.alive()
    assert await _log_seq(region) == seq0
    assert coord.state.term == term  # no request held the event loop past the lease

    # a pool tree sent as bytes (msgpack bin) is applied: it was `dict(bytes)`, INTERNAL
    source = b"pools:\n  /x: {cpu: {reservation: 1}}\n"
    reply = await fz.request("pool.apply", msgpack.packb({"source": source}, use_bin_type=True))
    assert reply["ok"] is True and "/x" in reply["pools"], reply
    assert await _log_seq(region) == seq0 + 1


async def test_bad_states_and_events_are_dropped_and_counted(region):
    coord = await region.coordinator()
    await region.ready(0)
    nc = region.nc
    bad = [b"", b"\xc1", b"\x80", msgpack.packb([1, 2]), fuzz._nested_bytes(5000)]
    bad.append(encode(NodeState("n2", REGION, 1, 1.0)))  # speaks for another node
    for data in bad:
        await nc.publish(subjects.state(REGION, "n1"), data)
    events = bad[:-1] + [
        encode(TaskEvent("n2", "j", "t", 0)),
        encode(TaskEventBatch("n2", (TaskEvent("n2", "j", "t", 0),))),
    ]
    for data in events:
        await nc.publish(subjects.events(REGION, "n1"), data)
    await nc.flush()
    await eventually(lambda: coord.bad_states >= len(bad), timeout=10)
    await eventually(lambda: coord.leader.bad_events >= len(events), timeout=10)
    assert coord.cluster.nodes == {}
    assert coord.state.jobs == {}
    info = await region.client.cluster_info()
    assert info["leader"] and info["nodes"] == {}
