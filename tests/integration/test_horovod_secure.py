"""Horovod's discovery script on a secure mesh: TLS, a client certificate per component
(made by `mesh.security.pki`), the per-identity permissions `mesh certs nats-conf`
generates, signed assignments. Two real agents, each holding a task identity
(`worker:NODE`, as `mesh agent --task-identity DIR` does), and a real coordinator.

Task 0 of a horovod-elastic job asks for the task identity; its stand-in `horovodrun`
(tests/integration/test_horovod_discovery.py says why there is no real one) runs the
adapter's `discover_hosts.sh` from inside the task, whose `mesh job hosts` finds no
certificate directory and connects with the identity the agent handed over
(`MESH_TLS_*`, mesh.tls_env). What must hold: the script prints the job's workers,
`host:slots`, over TLS; with the same identity, from the same task, `mesh job kill` and
`mesh job list` are refused by the server (the worker identity may call job.hosts and
nothing else of the API) and the job runs on. And an agent without a task identity
refuses to start the launcher, saying how to fix it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import mesh
from mesh.connect import ClientTls
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.security.permissions import server_users
from mesh.server import EmbeddedServer, ServerConfig, TlsFiles
from tests.integration.conftest import eventually
from tests.integration.test_security import USER, SecureRegion

R = "default"
ADDRESSES = {"node-1": "127.0.0.2", "node-2": "127.0.0.3"}
SLOTS = 2
WHOLE_NODE = {"cpu": 2, "memory": "64Mi"}  # one worker per node (2 cores advertised)
MESH = str(Path(sys.executable).parent / "mesh")  # the venv's console script
CODE = str(Path(mesh.__file__).resolve().parents[1])  # the code under test, for the task

HOROVODRUN = """#!/bin/sh
# A stand-in for horovodrun: the discovery script's output every half second, and once
# what the same identity gets for calls it is not allowed, until told to stop.
out={out}
env | grep '^MESH_' | sort > $out/env.tmp && mv $out/env.tmp $out/env
while [ "$1" != "--host-discovery-script" ]; do shift; done
"$MESH_CLI" job kill "$MESH_JOB_ID" > $out/kill.tmp 2>&1
echo "exit $?" >> $out/kill.tmp && mv $out/kill.tmp $out/kill
"$MESH_CLI" job list > $out/list.tmp 2>&1
echo "exit $?" >> $out/list.tmp && mv $out/list.tmp $out/list
while [ ! -e $out/stop ]; do
  "$2" > $out/found.tmp 2>&1
  echo "exit $?" >> $out/found.tmp
  mv $out/found.tmp $out/found
  sleep 0.5
done
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki") / "certs"
    pki.init(d)  # CA, server, coordinator, user admin, the signing keys
    for node in ADDRESSES:
        pki.issue(d, Identity.agent(node))
        pki.issue(d, Identity.worker(node))
    pki.issue(d, USER)
    return d


@pytest.fixture
async def secure_region(tmp_path, certs):
    ca, cert, key = pki.server_files(certs)
    server = EmbeddedServer(
        ServerConfig(
            store_dir=str(tmp_path / "nats"),
            tls=TlsFiles(str(ca), str(cert), str(key)),
            users=server_users(R, pki.identities(certs)),  # what `certs nats-conf` writes
        )
    )
    server.start()
    r = SecureRegion(server.url, tmp_path, certs)
    r.server = server
    try:
        await r.connect_client()
        await r.coordinator()
        yield r
    finally:
        await r.close()
        server.stop()


def _task_identity(certs: Path, node: str) -> ClientTls:
    return ClientTls.for_identity(certs, Identity.worker(node))


def _launcher(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    out = tmp_path / "out"
    out.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "horovodrun"
    script.write_text(HOROVODRUN.format(out=out))
    script.chmod(0o755)
    (tmp_path / "task-home").mkdir()
    return out, {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "MESH_CLI": MESH,
        "PYTHONPATH": CODE,
        # No context, no certificate directory: only what the agent hands over.
        "MESH_HOME": str(tmp_path / "task-home"),
    }


def _job(env: dict[str, str], workers: int) -> dict:
    return {
        "name": "hvd",
        "framework": "horovod-elastic",
        "workers": workers,
        "slots_per_node": SLOTS,
        "max_restarts": 0,
        "tasks": [
            {
                "role": "worker",
                "command": ["python", "train.py"],
                "env": env,
                "resources": WHOLE_NODE,
            }
        ],
    }


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


async def test_discovery_over_tls_with_the_task_identity_and_nothing_more(
    secure_region, certs, tmp_path
):
    r = secure_region
    for node, address in ADDRESSES.items():
        await r.agent(node, address=address, task_tls=_task_identity(certs, node))
    await r.ready(len(ADDRESSES))
    out, env = _launcher(tmp_path)
    job_id = await r.client.submit(_job(env, workers=2))

    async def running() -> dict | None:
        job = await r.client.job(job_id)
        states = [t["state"] for t in job["task_list"]]
        return job if states == ["RUNNING", "RUNNING"] else None

    job = await eventually(running, timeout=30)
    tasks = sorted(job["task_list"], key=lambda t: t["index"])
    want = "".join(f"{ADDRESSES[t['node_id']]}:{SLOTS}\n" for t in tasks) + "exit 0\n"
    found = await eventually(lambda: _read(out / "found") == want and want, timeout=30)
    assert sorted(found.splitlines()[:2]) == ["127.0.0.2:2", "127.0.0.3:2"], found

    # The launcher held the task identity of its own node's agent, and no other key.
    launcher_node = tasks[0]["node_id"]
    mine = _task_identity(certs, launcher_node)
    told = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines())
    assert told["MESH_TASK_IDENTITY"] == "worker"
    assert (told["MESH_TLS_CA"], told["MESH_TLS_CERT"], told["MESH_TLS_KEY"]) == (
        mine.ca,
        mine.cert,
        mine.key,
    )
    assert told["MESH_INBOX_PREFIX"] == f"_INBOX.worker.{launcher_node}"
    assert [v for v in told.values() if v.endswith(".key")] == [mine.key], told

    # The same identity, from the same task: any other call of the API is refused by
    # the server, and says so (the job is not killed).
    for call in ("kill", "list"):
        text = await eventually(lambda call=call: _read(out / call), timeout=30)
        assert text.endswith("exit 2\n"), (call, text)  # a refusal: usage, not a failure
        flat = " ".join(text.split())
        assert "permission denied" in flat, (call, text)
        assert f"worker:{launcher_node}" in flat and f"mesh.{R}.api.job.{call}" in flat, text
    assert (await r.client.job(job_id))["state"] == "RUNNING"
    log = r.server.log_tail(200_000)
    for call in ("kill", "list"):  # refused at the server, named as the worker
        line = f'CN=worker:{launcher_node}" - Publish Violation - Subject "mesh.{R}.api.job.{call}"'
        assert line in log, log[-2000:]
    assert f"mesh.{R}.api.job.hosts" not in log  # the allowed call was never refused

    (out / "stop").touch()
    job = await r.client.wait(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED", job["task_list"]


async def test_an_agent_without_a_task_identity_refuses_the_launcher(secure_region, tmp_path):
    r = secure_region
    await r.agent("node-1", address=ADDRESSES["node-1"])  # secure, no task identity
    await r.ready(1)
    out, env = _launcher(tmp_path)
    job_id = await r.client.submit(_job(env, workers=1))
    job = await r.client.wait(job_id, timeout=30)
    assert job["state"] == "FAILED", job
    (task,) = job["task_list"]
    assert task["message"] == (
        "could not start: the task asks for the worker identity (MESH_TASK_IDENTITY) but "
        "this agent has none on a secure mesh: start it with --task-identity DIR"
    ), task
    assert not (out / "env").exists()  # the launcher never ran
