"""Inference served by placed tasks, end to end: `mesh up --inference-workers 2` (secure)
starts a router beside the coordinators and deploys the numpy model as an ordinary job;
the coordinator places its replicas on the machine's agent, which runs them with the
worker identity. What must hold: the replicas are that job's RUNNING tasks on the agent,
a request is answered by one of them with the model's true output, an impossible
deadline is answered DEADLINE, and the worker identity can do nothing else.

The task environment (interpreter on PATH, the agent's NATS and region, the identity
only for tasks that ask) is checked on the executor alone, without a mesh.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from agent.executor import ExecError, ExecSpec, ProcessExecutor
from inference.wire import DEADLINE, InferReply, decode, encode, id_token, infer_subject
from inference.worker import mlp
from mesh import subjects
from mesh.cli.context import Context
from mesh.cli.infer import model_jobs, request_once
from mesh.client import MeshClient
from mesh.connect import ClientTls, close_quietly, connect
from mesh.security.identity import Identity
from tests.integration.conftest import eventually, run_mesh
from workloads.model import TASK_IDENTITY_VAR, WORKER_IDENTITY, WORKER_ROLE

REPLICAS = 2
# Far beyond what a batch takes even on a loaded machine; not more, because the router
# holds a request up to about half its deadline to grow its batch (deferred batching).
GENEROUS_MS = 3000


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """One secure `mesh up` with the inference pool for the whole module (it is the
    expensive part: servers, coordinators, agent, router and two worker processes)."""
    tmp = tmp_path_factory.mktemp("infer-up")
    env = {**os.environ, "MESH_HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1"}
    for var in ("MESH_NATS_URL", "MESH_REGION", "MESH_CERTS", "MESH_INSECURE"):
        env.pop(var, None)
    args = ["up", "--port", "0", "--candidates", "1", "--inference-workers", str(REPLICAS)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mesh.cli.main", *args, "--state-dir", str(tmp / "state")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    # `mesh up` prints its first line once the pool serves, or exits on its own timeouts.
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    if not lines[0].startswith("mesh is up"):
        proc.kill()
        pytest.fail("".join(lines) + proc.stdout.read())
    assert lines[1].startswith("inference: router up"), lines
    ctx = json.loads((tmp / "home" / "context.json").read_text())
    yield env, proc, Context(ctx["url"], ctx["region"], ctx["certs"], ctx["user"]), tmp
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


async def user_client(ctx: Context):
    nc = await connect(
        ctx.url, name="test", reconnect=False, **ctx.connect_options(Identity.user(ctx.user))
    )
    return nc, MeshClient(nc, ctx.region, timeout=10.0)


async def ask(nc, region: str, x: np.ndarray, deadline_ms: float) -> InferReply:
    body = {
        "input": x.astype("<f4").tobytes(),
        "v": 1,
        "deadline_unix_ns": time.time_ns() + int(deadline_ms * 1e6),
    }
    msg = await nc.request(infer_subject(region, "mlp"), encode(body), timeout=30.0)
    return decode(InferReply, msg.data)


async def test_placed_replicas_serve_requests(pool):
    env, _, ctx, _ = pool
    assert ctx.url.startswith("tls://") and ctx.certs  # secure by default
    nc, client = await user_client(ctx)
    try:
        (node,) = [n for n in await client.nodes() if not n["simulated"]]
        jobs = [j for j in await client.jobs() if j["name"] == "mlp"]
        assert len(jobs) == 1, jobs
        job = await client.job(jobs[0]["job_id"])
        tasks = job["task_list"]
        # Ordinary tasks, placed by the coordinator on the agent and run there.
        assert job["state"] == "RUNNING" and len(tasks) == REPLICAS
        assert all(t["role"] == WORKER_ROLE and t["state"] == "RUNNING" for t in tasks), tasks
        assert {t["node_id"] for t in tasks} == {node["node_id"]}
        assert node["allocated"]["cpu"] >= REPLICAS * 500
        group = job["spec"]["tasks"][0]
        assert group["command"][:3] == ["python", "-m", "inference.worker"]
        assert group["env"] == {TASK_IDENTITY_VAR: "<redacted>"}  # env values never echoed

        # Answered with the model's true output, by one of those tasks (a worker's id is
        # its task id and attempt, made a subject token).
        served_by = {id_token(f"{t['task_id']}#{t['attempt']}") for t in tasks}
        x = np.random.default_rng(3).standard_normal((8, 32)).astype("<f4")
        replies = await asyncio.gather(*(ask(nc, ctx.region, row, GENEROUS_MS) for row in x))
        want = mlp(0).forward(x)
        for i, rep in enumerate(replies):
            assert rep.ok, rep.error
            assert rep.worker in served_by, (rep.worker, served_by)
            np.testing.assert_allclose(
                np.frombuffer(rep.output, "<f4"), want[i], rtol=1e-5, atol=1e-5
            )

        # A deadline no batch can meet is refused at once, never served late.
        rep = await ask(nc, ctx.region, x[0], 0.01)
        assert not rep.ok and rep.error.code == DEADLINE, rep
    finally:
        await close_quietly(nc)


def test_cli_model_list_request_and_load(pool):
    env, _, _, _ = pool
    r = run_mesh("--json", "model", "list", env=env)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["model"] == "mlp" and row["state"] == "RUNNING"

    r = run_mesh("--json", "infer", "request", "--deadline-ms", str(GENEROUS_MS), env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = mlp(0).forward(np.zeros((1, 32), "<f4"))[0]
    np.testing.assert_allclose(out["output"], want, rtol=1e-5, atol=1e-5)

    r = run_mesh("infer", "request", "--deadline-ms", "0.01", env=env)
    assert r.returncode == 1 and "DEADLINE" in r.stderr, r.stderr

    r = run_mesh("infer", "request", "--input", "1,x", env=env)
    assert r.returncode == 2 and "--input" in r.stderr

    # A short run with a generous deadline: the figures are reported (their values are
    # the bench's business, not a test's).
    r = run_mesh(
        "--json",
        "infer",
        "load",
        "--rate",
        "100",
        "--duration",
        "1",
        "--deadline-ms",
        "1000",
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert res["sent"] > 0 and res["good"] > 0
    assert {"goodput", "p50_ms", "p99_ms", "bad_rate"} <= set(res)


async def test_cli_model_deploy(pool):
    """A second model from a spec file: the `profile` runtime sleeps to its declared
    profile and echoes its input, so the answer shows which model served it."""
    env, _, ctx, tmp = pool
    bad = tmp / "bad.yaml"
    bad.write_text("name: echo\nmemory: 1Gi\nresources: {memory: 512Mi}\n")
    r = run_mesh("model", "deploy", str(bad), env=env)
    assert r.returncode == 2 and "resources.memory" in r.stderr, r.stderr

    spec = tmp / "echo.yaml"
    spec.write_text(
        "name: echo\nruntime: profile\nmemory: 1Mi\nmax_batch: 8\n"
        "resources: {cpu: 100m}\nprofiles: {cpu: {a_ms: 1, b_ms: 0.1}}\n"
    )
    r = run_mesh("model", "deploy", str(spec), env=env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    assert job_id.startswith("echo-")
    nc, client = await user_client(ctx)
    try:
        x = [float(i) for i in range(32)]  # a worker's default input: 32 floats

        async def served():
            rep = await request_once(nc, ctx.region, "echo", x, 1000, 30.0)
            if not rep["ok"] and rep["error"]["code"] == "NO_WORKERS":
                return None  # its replica is still starting
            return rep

        rep = await eventually(served, timeout=60.0, interval=0.2)  # hang guard
        assert rep["ok"] and rep["output"] == x, rep
        assert rep["worker"].startswith(job_id)
        assert sorted(name for name, _ in await model_jobs(client)) == ["echo", "mlp"]
    finally:
        await client.kill(job_id)
        await close_quietly(nc)


async def test_worker_identity_can_only_serve(pool):
    """The identity the agent hands its workers, tried on the real server: it may
    announce a worker, and nothing of the control plane."""
    _, _, ctx, tmp = pool
    d = tmp / "state" / "task-identity"
    (crt,) = d.glob("worker-*.crt")
    ident = Identity.worker(crt.stem.removeprefix("worker-"))
    # Its own files and the CA's certificate, and no other key.
    assert sorted(p.name for p in d.iterdir()) == sorted(
        ["ca.crt", crt.name, ident.key_path(d).name]
    )
    errors: list[str] = []

    async def on_error(exc):
        errors.append(str(exc))

    nc = await connect(
        ctx.url,
        name="as-worker",
        reconnect=False,
        error_cb=on_error,
        tls=ClientTls.for_identity(d, ident),
    )
    try:
        client = MeshClient(nc, ctx.region, timeout=0.5)
        with pytest.raises(Exception):  # noqa: B017 - denied: the request is dropped
            await client.submit(
                {"name": "x", "tasks": [{"role": "a", "command": "true"}]}, retries=0
            )
        await nc.publish(subjects.state(ctx.region, "node-x"), b"x")
        await nc.flush()
        await eventually(
            lambda: sum("permissions violation" in e.lower() for e in errors) >= 2, timeout=10.0
        )
    finally:
        await close_quietly(nc)


def test_sigint_stops_workers_too(pool):
    """Last in the module: stopping `mesh up` ends everything it started, the worker
    tasks the agent ran included."""
    _, proc, _, _ = pool
    children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    workers = [
        p
        for p in psutil.process_iter(["pid", "name", "cmdline"])
        if p.pid in children
        and p.info["name"] != "sh"  # the executor's wrapper carries the command too
        and "inference.worker" in (p.info["cmdline"] or ())
    ]
    assert len(workers) >= REPLICAS  # and the second model's, if not yet gone
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in children):
        time.sleep(0.1)
    assert not [p for p in children if psutil.pid_exists(p)]


# ---------------------------------------------------------------- the task environment


def _env_of(ex: ProcessExecutor, tmp_path, env: dict[str, str]) -> dict:
    script = "import json, os, sys; print(json.dumps({'exe': sys.executable, **os.environ}))"

    async def go():
        h = await ex.start(ExecSpec("t#1", ("python", "-c", script), tuple(env.items())))
        status = await ex.wait(h)
        assert status.exit_code == 0, status.log_tail
        return json.loads(ex.read_log("t#1"))

    return asyncio.run(go())


def test_task_environment(tmp_path):
    identity = {
        "MESH_TLS_CA": "/i/ca.crt",
        "MESH_TLS_CERT": "/i/w.crt",
        "MESH_TLS_KEY": "/i/w.key",
        "MESH_INBOX_PREFIX": "_INBOX.worker.n",
    }
    agent = {"MESH_NATS_URL": "tls://127.0.0.1:1", "MESH_REGION": "eu"}
    ex = ProcessExecutor(tmp_path / "w", limits="none", task_env=agent, task_identity=identity)
    # `python` is the interpreter the agent runs under; every task learns its NATS.
    env = _env_of(ex, tmp_path, {"MESH_REGION": "spoofed"})
    assert env["exe"] == sys.executable
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env["MESH_NATS_URL"] == agent["MESH_NATS_URL"] and env["MESH_REGION"] == "eu"
    assert not set(identity) & set(env)  # it did not ask for the identity
    ex.cleanup("t#1")
    env = _env_of(ex, tmp_path, {TASK_IDENTITY_VAR: WORKER_IDENTITY})
    assert {k: env[k] for k in identity} == identity


def test_task_identity_refused_clearly(tmp_path):
    secure_without = ProcessExecutor(tmp_path / "a", limits="none", task_identity=None)
    with pytest.raises(ExecError, match="--task-identity"):
        _env_of(secure_without, tmp_path, {TASK_IDENTITY_VAR: WORKER_IDENTITY})
    insecure = ProcessExecutor(tmp_path / "b", limits="none", task_identity={})
    assert "MESH_TLS_CERT" not in _env_of(insecure, tmp_path, {TASK_IDENTITY_VAR: "worker"})
    with pytest.raises(ExecError, match="only task identity"):
        _env_of(insecure, tmp_path, {TASK_IDENTITY_VAR: "agent"})
