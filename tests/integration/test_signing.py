"""Signed assignments over a real nats-server: a signing coordinator and a verifying
agent run jobs; forged, unsigned, stale and replayed assignments run nothing; env values
never come back out; a root agent runs nothing as root unless told to. A coordinator
given --certs signs with the key there; one that cannot satisfy a verifying node places
nothing on it and says why; a refused run fails its attempt with the reason, unless the
refused one was a forgery."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time

import pytest

from mesh import subjects
from mesh.client import MeshClient
from mesh.codec import encode
from mesh.connect import ClientTls, close_quietly, connect
from mesh.schema import Assignment, AssignmentBatch, TaskSpec, decode_assignments
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.security.permissions import server_users
from mesh.server import EmbeddedServer, ServerConfig, TlsFiles
from mesh.signing import generate_keypair, load_signing_key, sign
from workloads.spec import SimulatedRun

from .conftest import eventually

ROOT = os.geteuid() == 0

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


# ---------------------------------------------------------------- signer and verifiers agree


@pytest.fixture
def secure_certs(tmp_path):
    d = tmp_path / "certs"
    pki.init(d)  # CA, server, coordinator, user admin, assignments.key/.pub
    pki.issue(d, Identity.agent("node-a"))
    return d


@pytest.fixture
def secure_server(tmp_path, secure_certs):
    ca, cert, key = pki.server_files(secure_certs)
    server = EmbeddedServer(
        ServerConfig(
            store_dir=str(tmp_path / "nats"),
            tls=TlsFiles(str(ca), str(cert), str(key)),
            users=server_users("default", pki.identities(secure_certs)),
        )
    )
    server.start()
    yield server
    server.stop()


async def test_a_coordinator_given_certs_signs_with_their_key_by_default(
    secure_server, secure_certs, procs, tmp_path
):
    """As docs/security.md deploys a region: separate processes, the coordinator given
    only --certs, the agent --certs and --verify-key. Its runs verify; the job runs."""
    certs = str(secure_certs)
    coord = procs(secure_server.url, "--certs", certs, "coordinator", "--id", "c1", name="c1")
    nc = await connect(
        secure_server.url,
        name="admin",
        tls=ClientTls.for_identity(secure_certs, Identity.user("admin")),
    )
    try:
        client = MeshClient(nc)
        await eventually(lambda: _leader(client), timeout=30)  # streams made by it first
        pub = str(pki.verify_key_path(secure_certs))
        procs(
            secure_server.url,
            *["--certs", certs, "agent", "--node-id", "node-a", "--verify-key", pub],
            *["--data-dir", str(tmp_path / "agent-a")],
            *(["--allow-root"] if ROOT else []),
            name="agent-a",
        )
        await eventually(lambda: _ready(client, 1), timeout=30)
        marker = tmp_path / "ran"
        job_id = await client.submit(
            {"name": "signed", "tasks": [{"role": "main", "command": f"touch {marker}"}]}
        )
        job = await client.wait(job_id, timeout=30)
        assert job["state"] == "SUCCEEDED", job["task_list"]
        assert marker.exists()
        node = await client.node("node-a")
        assert node["verify_key"] and node["barred"] == "" and "refused" not in node["note"]
    finally:
        await close_quietly(nc)
    log = coord.log.read_text()
    assert "signing assignments with " + str(secure_certs / "assignments.key") in log
    assert "NOT signed" not in log


async def _leader(client) -> bool:
    try:
        return bool((await client.cluster_info())["leader"])
    except Exception:
        return False


async def _ready(client, n: int) -> bool:
    return (await client.cluster_info())["nodes"].get("ready", 0) >= n


async def test_an_unsigned_coordinator_and_a_verifying_agent_say_why_nothing_runs(
    region, tmp_path, caplog
):
    """Nothing is placed where it would be refused; the job says why, and so does the
    coordinator's log, within seconds (not PLACED with an empty message)."""
    caplog.set_level(logging.INFO)
    _, pub_path = generate_keypair(tmp_path / "keys")
    await region.coordinator()  # no signing key
    await region.agent(verify_key=str(pub_path))
    await region.ready(1)
    started = time.monotonic()
    job_id = await region.client.submit(
        {"name": "waits", "tasks": [{"role": "main", "command": "true"}]}
    )

    async def named():
        job = await region.client.job(job_id)
        return job if "verifies assignment signatures" in (job["pending_reason"] or "") else None

    job = await eventually(named, timeout=15)
    assert time.monotonic() - started < 15
    assert job["state"] == "PENDING"
    assert [t["state"] for t in job["task_list"]] == ["PENDING"]
    assert "--signing-key" in job["pending_reason"] and "node-1" in job["pending_reason"]
    node = await region.client.node("node-1")
    assert node["status"] == "ready" and "no signing key" in node["barred"]
    assert "assignments are NOT signed" in caplog.text
    assert "placing nothing on node node-1" in caplog.text
    # `mesh job status`, as the user reads it (the coordinator runs in this loop).
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "mesh.cli.main", "--nats", region.url, "job", "status", job_id],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "verifies assignment signatures" in out.decode()


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "other-key"])
async def test_a_refused_run_fails_its_attempt_with_the_reason(region, tmp_path, signed):
    """A run queued for a node that then restarts verifying (with a key this coordinator
    does not sign with) is refused there: the refusal comes back as the attempt's failure
    with the reason and the fix, and the job ends FAILED with it, not PLACED for ever."""
    key_path, _ = generate_keypair(tmp_path / "coordinator")
    _, other_pub = generate_keypair(tmp_path / "agents")
    signing = {"signing_key": str(key_path)} if signed else {}
    await region.coordinator(suspect_after=60.0, down_after=120.0, **signing)
    agent = await region.agent()  # verifies nothing yet
    await region.ready(1)
    await agent.stop()
    region.agents.remove(agent)
    job_id = await region.client.submit(
        {
            "name": "refused",
            "restart": {"max_retries": 0},
            "tasks": [{"role": "main", "command": "true"}],
        }
    )

    async def placed():
        job = await region.client.job(job_id)
        return job["task_list"][0]["state"] == "PLACED"

    await eventually(placed, timeout=10)  # its run waits in the node's queue
    await region.agent(verify_key=str(other_pub))  # the operator adds a key, restarts
    job = await region.client.wait(job_id, timeout=15)
    (task,) = job["task_list"]
    assert job["state"] == "FAILED", task
    assert "refused by node node-1" in task["message"]
    if signed:
        assert "bad-signature" in task["message"] and "give both halves" in task["message"]
    else:
        assert "unsigned" in task["message"] and "--signing-key" in task["message"]


async def test_a_forged_refusal_does_not_fail_the_genuine_attempt(region, tmp_path, caplog):
    """A forgery naming a real attempt is refused by the node, and its report does not
    fail the attempt: this leader's own run of it verifies there."""
    caplog.set_level(logging.INFO)
    key_path, pub_path = generate_keypair(tmp_path / "keys")
    other_key = load_signing_key(generate_keypair(tmp_path / "other")[0])
    await region.coordinator(signing_key=str(key_path))
    agent = await region.agent(verify_key=str(pub_path))
    await region.ready(1)
    job_id = await region.client.submit(
        {
            "name": "real",
            "restart": {"max_retries": 0},
            "tasks": [{"role": "main", "command": "sleep 2"}],
        }
    )

    async def running():
        job = await region.client.job(job_id)
        return job["task_list"][0] if job["task_list"][0]["state"] == "RUNNING" else None

    task = await eventually(running, timeout=15)
    forged = sign(
        Assignment(
            "run", "node-1", job_id, task["task_id"], task["attempt"], 1, time.time(),
            TaskSpec(argv=("true",)),
        ),
        other_key,
    )  # fmt: skip
    await publish(region.nc.jetstream(), "node-1", encode(forged))
    await eventually(lambda: agent.refused == 1, timeout=10)
    job = await region.client.wait(job_id, timeout=20)
    (task,) = job["task_list"]
    assert job["state"] == "SUCCEEDED" and task["attempt"] == 1, task
    assert "this leader's run of it verifies there" in caplog.text
