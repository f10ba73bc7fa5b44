"""The request API's size limits and client-id rule on a live region (a real nats-server,
an in-process coordinator): one spec limit for the CLI, the server and the docs; a
client id reused for another spec is a CONFLICT; a request too large for the server's
max_payload is refused by the client with the limit named, and submit_many splits."""

from __future__ import annotations

import asyncio
import os

import msgpack
import pytest

from coordinator.api import ENDPOINTS
from mesh import subjects
from mesh.schema import MAX_REQUEST, MAX_SPEC_BYTES, ApiError, ErrorCode
from mesh.server import EmbeddedServer, ServerConfig
from tests.integration.conftest import Region, run_mesh
from workloads.spec import MAX_SOURCE_BYTES

R = "default"
HEAD = "name: big\ntasks:\n  - role: t\n    simulate: {duration: 0.1s}\n"


def padded(size: int) -> str:
    """A valid spec of exactly `size` bytes: a small job, then comment lines."""
    lines, rest = divmod(size - len(HEAD), 100)
    text = HEAD + ("#" + "x" * 98 + "\n") * lines
    return text + ("#" * (rest - 1) + "\n" if rest else "")


async def test_a_large_valid_spec_is_accepted_and_one_over_the_limit_is_too_large(region):
    assert MAX_SPEC_BYTES == MAX_SOURCE_BYTES  # the CLI's check (parse_job_spec) is the same
    await region.coordinator()
    await region.fleet(1)
    await region.ready(1)
    c = region.client
    for size in (100_000, MAX_SPEC_BYTES):  # 100 KB was refused by a 64 KiB string cap
        text = padded(size)
        assert len(text.encode()) == size
        job = await c.wait(await c.submit(text), timeout=20)
        assert job["state"] == "SUCCEEDED"
        # bytes, and the text in a JSON request, count the same
        assert await c.submit(text.encode())
    over = padded(MAX_SPEC_BYTES + 1)
    for spec in (over, over.encode()):
        with pytest.raises(ApiError) as err:
            await c.submit(spec)
        assert err.value.code == ErrorCode.TOO_LARGE
        assert f"spec of {MAX_SPEC_BYTES + 1} bytes" in err.value.message
        assert f"limit of {MAX_SPEC_BYTES} bytes" in err.value.message
    # in a batch, that item alone fails, with the same code
    results = await c.submit_many([over, HEAD])
    assert results[0]["error"]["code"] == "TOO_LARGE" and "job_id" in results[1]


async def test_a_reused_client_id_with_another_spec_is_a_conflict(region, tmp_path):
    await region.coordinator()
    await region.ready(0)
    c = region.client
    spec = "name: a\ntasks: [{role: t, simulate: {duration: 60s}, resources: {cpu: 1}}]\n"
    job_id = await c.submit(spec, client_id="cid-1")
    # the same spec, written otherwise, is the same job (a retry)
    same = {
        "tasks": [{"resources": {"cpu": "1000m"}, "simulate": {"duration": "1m"}, "role": "t"}],
        "name": "a",
    }
    reply = await c.request("job.submit", {"client_id": "cid-1", "spec": same})
    assert reply == {"ok": True, "job_id": job_id, "duplicate": True}
    other = spec.replace("cpu: 1", "cpu: 2")
    with pytest.raises(ApiError) as err:
        await c.submit(other, client_id="cid-1")
    assert err.value.code == ErrorCode.CONFLICT
    assert err.value.message.startswith(
        f"client id cid-1 was used for job {job_id} with a different spec"
    )

    # a retried submit_many: the same items are duplicates, a changed one a CONFLICT
    specs = [spec.replace("name: a", f"name: m{i}") for i in range(3)]
    first = await c.submit_many(specs, client_ids=["m0", "m1", "m2"])
    assert [r["duplicate"] for r in first] == [False, False, False]
    retry = await c.submit_many(specs, client_ids=["m0", "m1", "m2"])
    assert retry == [{"job_id": r["job_id"], "duplicate": True} for r in first]
    changed = await c.submit_many([specs[0], other, specs[2]], client_ids=["m0", "m1", "m2"])
    assert changed[0]["duplicate"] and changed[2]["duplicate"]
    assert changed[1]["error"]["code"] == "CONFLICT"
    assert f"used for job {first[1]['job_id']}" in changed[1]["error"]["message"]

    # two submits of one client id at once, different specs: one job, one CONFLICT
    a, b = await asyncio.gather(
        c.submit(spec, client_id="race"),
        c.submit(other, client_id="race"),
        return_exceptions=True,
    )
    outcomes = sorted([a, b], key=lambda x: isinstance(x, ApiError))
    assert isinstance(outcomes[0], str) and isinstance(outcomes[1], ApiError)
    assert outcomes[1].code == ErrorCode.CONFLICT
    assert (await c.job(outcomes[0]))["job_id"] == outcomes[0]
    assert len(await c.jobs(limit=100)) == 5

    # a new coordinator that folds the log (no process memory) says the same
    await region.coordinators[0].stop()
    region.coordinators.clear()
    await region.coordinator("c2")
    await region.ready(0)
    with pytest.raises(ApiError) as err:
        await c.submit(other, client_id="cid-1", retries=40)
    assert err.value.code == ErrorCode.CONFLICT
    assert await c.submit(spec, client_id="cid-1", retries=40) == job_id


@pytest.fixture
def small_server(tmp_path):
    """A nats-server with NATS's default max_payload (1 MiB), as an operator's own may be."""
    server = EmbeddedServer(ServerConfig(store_dir=str(tmp_path / "nats"), max_payload=1 << 20))
    server.start()
    yield server
    server.stop()


async def test_the_client_names_max_payload_and_splits_batches(small_server, tmp_path):
    r = Region(small_server.url, tmp_path)
    await r.connect_client()
    try:
        await r.coordinator()
        await r.ready(0)
        c = r.client
        assert r.nc.max_payload == 1 << 20 < MAX_REQUEST
        with pytest.raises(ApiError) as err:
            await c.submit(padded(MAX_SPEC_BYTES))  # within the spec limit, not the server's
        assert err.value.code == ErrorCode.TOO_LARGE
        assert f"max_payload of {1 << 20} bytes" in err.value.message
        # 600 specs of 4 KB: 2.4 MB, in one call; the client sends it in parts that fit
        specs = [padded(4000).replace("name: big", f"name: b{i}") for i in range(600)]
        results = await c.submit_many(specs)
        assert len(results) == 600 and all(res["duplicate"] is False for res in results)
        assert len({res["job_id"] for res in results}) == 600
        assert len(await c.jobs(limit=1000)) == 600
    finally:
        await r.close()


async def test_a_request_over_the_api_limit_is_too_large(region):
    """What a client that does not check (any language) gets from the server itself."""
    await region.coordinator()
    await region.ready(0)
    for endpoint in ENDPOINTS:
        msg = await region.nc.request(
            subjects.api(R, endpoint), b"\x80" * (MAX_REQUEST + 1), timeout=10
        )
        reply = msgpack.unpackb(msg.data)
        assert reply["error"]["code"] == "TOO_LARGE"
        assert f"the {MAX_REQUEST}-byte limit" in reply["error"]["message"]


async def test_the_cli_takes_a_large_spec_and_refuses_one_over_the_limit(region, tmp_path):
    """`mesh job run` checks the same limit as the server, before it sends."""
    await region.coordinator()
    await region.ready(0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_")}
    env.update(MESH_NATS_URL=region.url, MESH_INSECURE="1", MESH_HOME=str(tmp_path / "home"))
    spec = tmp_path / "big.yaml"
    spec.write_text(padded(100_000))
    ok = await asyncio.to_thread(run_mesh, "job", "run", str(spec), env=env)
    assert ok.returncode == 0, ok.stderr
    assert len(await region.client.jobs()) == 1
    spec.write_text(padded(MAX_SPEC_BYTES + 1))
    bad = await asyncio.to_thread(run_mesh, "job", "run", str(spec), env=env)
    assert bad.returncode == 2, bad.stderr
    assert str(MAX_SPEC_BYTES) in bad.stderr and str(MAX_SPEC_BYTES + 1) in bad.stderr
    assert len(await region.client.jobs()) == 1
