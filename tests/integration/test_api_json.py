"""The request API in JSON, as `nats req` or a client in another language speaks it: plain
nats-py requests with JSON bodies (no MeshClient, no msgpack) on every endpoint of a
live region, a real nats-server and a hollow fleet, and JSON replies back."""

from __future__ import annotations

import base64
import json

from coordinator.api import ENDPOINTS
from mesh import subjects

from .conftest import eventually

R = "default"
SPEC = (
    "name: from-json\n"
    "tasks:\n"
    "  - role: t\n"
    "    count: 2\n"
    "    simulate: {duration: 0.2s}\n"
    "    resources: {cpu: 1}\n"
)
LONG = "name: long\ntasks: [{role: t, simulate: {duration: 60s}, resources: {cpu: 1}}]\n"


async def ask(nc, endpoint: str, body, headers=None) -> dict:
    """One raw request; the reply must be JSON (a JSON object, not msgpack)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(subjects.api(R, endpoint), data, timeout=10, headers=headers)
    assert msg.data[:1] == b"{", msg.data[:80]
    return json.loads(msg.data)


async def test_every_endpoint_answers_json(region):
    await region.coordinator()
    await region.fleet(2)
    await region.ready(2)
    nc = region.nc  # a plain nats-py connection
    seen: set[str] = set()

    async def call(endpoint, body, headers=None):
        seen.add(endpoint)
        return await ask(nc, endpoint, body, headers)

    info = await call("cluster.info", {})
    assert info["ok"] is True and info["leader"] and info["nodes"] == {"ready": 2}

    nodes = await call("node.list", {})
    assert sorted(n["node_id"] for n in nodes["nodes"]) == ["hollow-0000", "hollow-0001"]
    node = await call("node.get", {"node_id": "hollow-0000"})
    assert node["ok"] and node["node"]["node_id"] == "hollow-0000"

    applied = await call("pool.apply", {"source": "pools:\n  /batch: {cpu: {reservation: 1}}\n"})
    assert applied == {"ok": True, "pools": ["/", "/batch", "/default"]}
    pools = await call("pool.list", {})
    assert [p["path"] for p in pools["pools"]] == ["/", "/batch", "/default"]
    pool = await call("pool.get", {"path": "/batch"})
    assert pool["ok"] and pool["pool"]["path"] == "/batch"

    # a job from JSON runs to SUCCEEDED on the fleet; its spec as YAML text
    spec = SPEC + "pool: /batch\n"
    sub = await call("job.submit", {"client_id": "json-1", "spec": spec})
    assert sub["ok"] is True and sub["duplicate"] is False, sub
    job_id = sub["job_id"]

    async def succeeded():
        job = await call("job.get", {"job_id": job_id})
        return job if job["job"]["state"] == "SUCCEEDED" else None

    job = await eventually(succeeded, timeout=20)
    assert [t["state"] for t in job["job"]["task_list"]] == ["SUCCEEDED", "SUCCEEDED"]
    again = await call("job.submit", {"client_id": "json-1", "spec": spec})
    assert again == {"ok": True, "job_id": job_id, "duplicate": True}

    # a spec as a JSON object, and one as base64 UTF-8 (`spec_b64`), in one submit_many
    as_object = {
        "name": "obj",
        "pool": "/batch",
        "tasks": [{"role": "t", "simulate": {"duration": "60s"}, "resources": {"cpu": 1}}],
    }
    many = await call(
        "job.submit_many",
        {
            "jobs": [
                {"client_id": "json-2", "spec": as_object},
                {
                    "client_id": "json-3",
                    "spec_b64": base64.b64encode((LONG + "pool: /batch\n").encode()).decode(),
                },
                {"client_id": "json-4", "spec": "name: bad\n"},
            ]
        },
    )
    assert many["ok"] is True
    first, second, bad = many["results"]
    assert first["duplicate"] is False and second["duplicate"] is False
    assert bad["error"]["code"] == "INVALID_SPEC", bad

    listed = await call("job.list", {"pool": "/batch", "limit": 10})
    assert {j["job_id"] for j in listed["jobs"]} == {job_id, first["job_id"], second["job_id"]}
    assert listed["total"] == 3
    running = await call("job.list", {"state": "SUCCEEDED"})
    assert [j["job_id"] for j in running["jobs"]] == [job_id]

    killed = await call("job.kill", {"job_id": second["job_id"], "reason": "json kill"})
    assert killed == {"ok": True, "job_id": second["job_id"]}

    async def ended():
        job = await call("job.get", {"job_id": second["job_id"]})
        return job["job"]["state"] == "KILLED"

    await eventually(ended, timeout=20)

    # job.update is for services: a batch job's is refused, in JSON
    upd = await call("job.update", {"job_id": job_id, "spec": spec})
    assert upd["ok"] is False and upd["error"]["code"] == "CONFLICT", upd
    # partitions (docs/partitions.md)
    conf = await call("partition.apply", {"source": "partitions: {stateless: {}, batch: {}}\n"})
    assert conf == {"ok": True, "partitions": ["stateless", "batch"]}
    listed = await call("partition.list", {})
    assert {p["name"]: p["nodes"] for p in listed["partitions"]} == {"stateless": 0, "batch": 2}
    got = await call("partition.get", {"name": "batch"})
    assert {n["node_id"] for n in got["partition"]["node_list"]} == {"hollow-0000", "hollow-0001"}
    move = {"nodes": ["hollow-0001"], "to": "stateless", "reason": "json", "by": "t"}
    moved = await call("partition.move", move)
    assert moved["ok"] and moved["moves"][0]["to"] == "stateless", moved
    glass = {"to": "stateless", "count": 1, "ttl_s": 60, "reason": "drill", "by": "t"}
    broke = await call("partition.break_glass", glass)
    assert broke["ok"] and broke["break_glass"]["by"] == "t", broke
    restored = await call("partition.restore", {"reason": "done", "by": "t"})
    assert restored["ok"], restored

    # training (docs/training.md): a batch job is not elastic, and has no hosts held
    scaled = await call("job.scale", {"job_id": job_id, "workers": 2})
    assert scaled["ok"] is False and scaled["error"]["code"] == "BAD_REQUEST", scaled
    assert "not elastic" in scaled["error"]["message"]
    hosts = await call("job.hosts", {"job_id": job_id, "format": "mpi"})
    assert hosts == {"ok": True, "job_id": job_id, "format": "mpi", "hosts": []}

    # the regions heard from (docs/federation.md): this one, from its leader's summary
    heard = await call("region.list", {})
    assert [(r["region"], r["status"]) for r in heard["regions"]] == [("default", "fresh")]

    # edge sites (docs/api.md): none has beaten here
    assert await call("site.list", {}) == {"ok": True, "sites": []}

    # errors come back as JSON too, with the documented shape
    missing = await call("job.get", {"job_id": "nope"})
    assert missing == {"ok": False, "error": {"code": "NOT_FOUND", "message": "no job 'nope'"}}
    assert seen == set(ENDPOINTS)


async def test_json_by_header_and_by_first_byte(region):
    await region.coordinator()
    await region.ready(0)
    nc = region.nc
    # leading white space, as `nats req` users paste it
    info = await ask(nc, "cluster.info", b"  \n {}")
    assert info["ok"] is True
    # the header alone makes it JSON: an empty body is `{}`
    for body in (b"", b"{}"):
        reply = await ask(nc, "node.list", body, {"Content-Type": "application/json"})
        assert reply == {"ok": True, "nodes": []}
    # the header with a body that is no JSON: a JSON error, in words
    reply = await ask(nc, "job.get", b"\x81\xa6job_id\xa1x", {"content-type": "application/json"})
    assert reply["ok"] is False and reply["error"]["code"] == "BAD_REQUEST"
    assert "not valid JSON" in reply["error"]["message"]
    # msgpack still answers msgpack
    msg = await nc.request(subjects.api(R, "cluster.info"), b"\x80", timeout=10)
    assert msg.data[:1] != b"{"


async def test_bad_json_gets_clear_json_errors(region):
    await region.coordinator()
    await region.ready(0)
    nc = region.nc
    cases = [
        (b"{", "not valid JSON: expecting property name enclosed in double quotes"),
        (b'{"job_id": "a"} {}', "extra text after the object"),
        (b'{"job_id": "a", "job_id": "b"}', "appears twice"),
        (b'{"limit": NaN}', "NaN is not a JSON number"),
        (b'{"limit": ' + b"9" * 30 + b"}", "out of range"),
        (b'{"limit": "x"}', "request field limit: expected an integer, got a string"),
        (b'{"state": "NOPE"}', "state: 'NOPE' is not one of"),
        (b'{"spec_b64": "***"}', "not valid base64"),
        (b"{" * 5000, "not valid JSON"),
        (b'{"a": \xff}', "not UTF-8"),
    ]
    for body, words in cases:
        endpoint = "job.list" if b"limit" in body or b"state" in body else "job.submit"
        reply = await ask(nc, endpoint, body)
        assert reply["ok"] is False, body
        assert reply["error"]["code"] == "BAD_REQUEST", reply
        assert words in reply["error"]["message"], (words, reply["error"]["message"])


async def test_a_follower_forwards_a_json_write_and_answers_in_json(region):
    """A write that reaches a follower goes to the leader as msgpack; the reply comes back
    to the client in JSON either way."""
    await region.coordinator("c1")
    await region.ready(0)
    follower = await region.coordinator("c2")

    def follower_submits() -> int:
        stats = follower.api.service.stats()
        return next(e.num_requests for e in stats.endpoints if e.name == "job_submit")

    for i in range(40):  # the micro service's queue group spreads requests over both
        sub = await ask(region.nc, "job.submit", {"client_id": f"f{i}", "spec": LONG})
        assert sub["ok"] is True and sub["duplicate"] is False, sub
        if follower_submits() >= 3:
            break
    assert follower_submits() >= 3
    assert follower.leader is None  # it did not answer them itself
