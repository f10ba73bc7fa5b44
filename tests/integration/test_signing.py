"""Signed assignments over a real nats-server: a signing coordinator and a verifying
agent run jobs; forged, unsigned, stale and replayed assignments run nothing; env values
never come back out; a root agent runs nothing as root unless told to."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from mesh import subjects
from mesh.codec import encode
from mesh.schema import Assignment, AssignmentBatch, TaskSpec, decode_assignments
from mesh.signing import generate_keypair, load_signing_key, sign
from workloads.spec import SimulatedRun

from .conftest import eventually

SECRET = "s3cr3t-v4lue-7f3a9c"


async def publish(js, node_id: str, data: bytes) -> None:
    await js.publish(
        subjects.assign("default", node_id), data, stream=subjects.assign_stream("default")
    )


async def drained(js) -> bool:
    """Every assignment taken and acknowledged (the stream is a work queue)."""
    info = await js.stream_info(subjects.assign_stream("default"))
    return info.state.messages == 0


async def test_signed_region_runs_jobs_and_refuses_forged_stale_and_replayed(
    region, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    key_path, pub_path = generate_keypair(tmp_path / "keys")
    other_key = load_signing_key(generate_keypair(tmp_path / "other")[0])
    key = load_signing_key(key_path)
    await region.coordinator(signing_key=str(key_path))
    agent = await region.agent(verify_key=str(pub_path), allow_root=True)
    await region.ready(1)
    js = region.nc.jetstream()
    seen: list[bytes] = []

    async def capture(msg) -> None:
        seen.append(msg.data)

    await region.nc.subscribe(subjects.assign("default", "node-1"), cb=capture)

    # A genuine job runs; its run assignment went out signed.
    count = tmp_path / "count"
    job_id = await region.client.submit(
        {
            "name": "signed",
            "tasks": [
                {"role": "main", "command": f"echo run >> {count}", "env": {"API_TOKEN": SECRET}}
            ],
        }
    )
    job = await region.client.wait(job_id, timeout=20)
    assert job["state"] == "SUCCEEDED"
    await region.nc.flush()
    (original,) = seen
    batch = decode_assignments(original)  # a round's runs for a node: one signed batch
    assert isinstance(batch, AssignmentBatch) and len(batch.signature) == 64
    assert [a.job_id for a in batch.items] == [job_id]

    # Forged (another key), unsigned, and genuine-but-stale assignments; then a replay.
    forged_marker = tmp_path / "forged"
    evil = TaskSpec(argv=("sh", "-c", f"touch {forged_marker}"))
    now = time.time()
    forged = sign(Assignment("run", "node-1", "evil", "evil.main.0", 1, 99, now, evil), other_key)
    unsigned = Assignment("run", "node-1", "evil", "evil.main.1", 1, 99, now, evil)
    stale = sign(Assignment("run", "node-1", "old", "old.main.0", 1, 1, now - 3600, evil), key)
    forged_kill = sign(Assignment("kill", "node-1", "j", "x.main.0", 1, 99, now), other_key)
    for a in (forged, unsigned, stale, forged_kill):
        await publish(js, "node-1", encode(a))
    await publish(js, "node-1", original)  # the genuine run again, after it ended
    await eventually(lambda: drained(js), timeout=10)

    node = await eventually(lambda: _note_with(region, "refused 4 assignments"), timeout=10)
    assert "old.main.0#1 expired" in node["note"] or "x.main.0#1 bad-signature" in node["note"]
    assert not forged_marker.exists()
    assert count.read_text() == "run\n"  # the replayed run did not run twice
    assert await agent.store.get("evil.main.0", 1) is None  # a forgery leaves no trace
    assert await agent.store.get("evil.main.1", 1) is None
    stale_rec = await agent.store.get("old.main.0", 1)  # the coordinator's own, too old:
    assert stale_rec is not None and stale_rec.state == "FAILED"  # reported as failed
    assert agent.refused == 4

    # Env values never come back out: API, CLI, logs at DEBUG.
    listed = await region.client.jobs()
    detail = await region.client.job(job_id)
    assert detail["spec"]["tasks"][0]["env"] == {"API_TOKEN": "<redacted>"}
    # The coordinator runs in this loop: the CLI must not block it.
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "mesh.cli.main", "--nats", region.url, "--json"],
        *["job", "status", job_id],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    cli_out, cli_err = out.decode(), err.decode()
    assert proc.returncode == 0, cli_err
    assert "API_TOKEN" in cli_out
    for text in (json.dumps(listed), json.dumps(detail), cli_out, cli_err, caplog.text):
        assert SECRET not in text
    assert logging.getLogger("mesh.agent").isEnabledFor(logging.DEBUG)  # it was all captured


async def _note_with(region, text: str) -> dict | None:
    node = await region.client.node("node-1")
    return node if text in node["note"] else None


async def test_hollow_fleet_verifies_too(region, tmp_path):
    key_path, pub_path = generate_keypair(tmp_path / "keys")
    other_key = load_signing_key(generate_keypair(tmp_path / "other")[0])
    await region.coordinator(signing_key=str(key_path))
    fleet = await region.fleet(1, verify_key=str(pub_path))
    await region.ready(1)
    job_id = await region.client.submit(
        {"name": "sim", "tasks": [{"role": "w", "count": 2, "simulate": {"duration": "0.1s"}}]}
    )
    assert (await region.client.wait(job_id, timeout=20))["state"] == "SUCCEEDED"
    assert fleet.counts["runs"] == 2 and fleet.counts["unverified"] == 0
    spec = TaskSpec(simulate=SimulatedRun(0.1, 0))
    forged = sign(
        Assignment("run", "hollow-0000", "e", "e.w.0", 1, 9, time.time(), spec), other_key
    )
    js = region.nc.jetstream()
    await publish(js, "hollow-0000", encode(forged))
    await eventually(lambda: fleet.counts["unverified"] == 1, timeout=10)
    assert fleet.counts["runs"] == 2
