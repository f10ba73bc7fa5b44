"""Jobs end to end over a real nats-server: submit, run real processes, fail, kill."""

from __future__ import annotations

import logging
import time

import psutil
import pytest

from agent.hollow import GiB, Inventory
from mesh.codec import encode
from mesh.schema import MAX_REQUEST, ApiError, ErrorCode, SubmitRequest

from .conftest import eventually


def spec(name: str, command: str, **extra) -> dict:
    task = {"role": "main", "command": command, **extra}
    return {"name": name, "tasks": [task]}


async def test_submit_runs_a_real_process_to_success(region, tmp_path):
    await region.coordinator()
    await region.agent()
    await region.ready(1)
    marker = tmp_path / "ran"
    job_id = await region.client.submit(spec("ok", f"echo hello; touch {marker}"))
    job = await region.client.wait(job_id, timeout=20)
    assert job["state"] == "SUCCEEDED"
    (task,) = job["task_list"]
    assert task["exit_code"] == 0 and task["attempt"] == 1 and task["node_id"] == "node-1"
    assert marker.exists()
    states = [h["state"] for h in task["history"]]
    assert states[0] == "PLACED" and states[-1] == "SUCCEEDED" and "RUNNING" in states
    logs = await region.client.logs(job_id)
    assert logs["data"] == b"hello\n"


async def test_failing_command_reports_exit_code_and_log_tail(region):
    await region.coordinator()
    await region.agent()
    await region.ready(1)
    job_id = await region.client.submit(spec("bad", "echo 'it broke' >&2; exit 3"))
    job = await region.client.wait(job_id, timeout=20)
    assert job["state"] == "FAILED"
    (task,) = job["task_list"]
    assert task["exit_code"] == 3
    assert "it broke" in task["log_tail"]
    assert "exited with code 3" in task["message"]


async def test_retry_policy_reruns_a_failed_task(region, tmp_path):
    await region.coordinator()
    await region.agent()
    await region.ready(1)
    counter = tmp_path / "count"
    cmd = f"echo x >> {counter}; [ $(wc -l < {counter}) -ge 3 ]"
    job_id = await region.client.submit({**spec("retry", cmd), "restart": {"max_retries": 2}})
    job = await region.client.wait(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED"
    assert job["task_list"][0]["attempt"] == 3
    assert counter.read_text().count("x") == 3


async def test_kill_stops_the_whole_process_group(region, tmp_path):
    await region.coordinator()
    await region.agent()
    await region.ready(1)
    pids = tmp_path / "pids"
    cmd = f"sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    job_id = await region.client.submit(spec("long", cmd))
    await eventually(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    await eventually(lambda: _task_state(region, job_id, "RUNNING"))
    alive = [int(p) for p in pids.read_text().split()]
    assert all(psutil.pid_exists(p) for p in alive)
    await region.client.kill(job_id, "test kill")
    job = await region.client.wait(job_id, timeout=20)
    assert job["state"] == "KILLED"
    assert job["task_list"][0]["state"] == "KILLED"
    await eventually(lambda: not any(_running(p) for p in alive), timeout=10)
    with pytest.raises(ApiError) as err:
        await region.client.kill(job_id)
    assert err.value.code == ErrorCode.CONFLICT


async def _task_state(region, job_id, state):
    job = await region.client.job(job_id)
    return job["task_list"][0]["state"] == state


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_retried_submit_with_same_client_id_creates_one_job(region):
    await region.coordinator()
    await region.ready(0)
    s = spec("dup", "true")
    first = await region.client.submit(s, client_id="client-42")
    second = await region.client.submit(s, client_id="client-42")
    assert first == second
    jobs = await region.client.jobs()
    assert [j["job_id"] for j in jobs] == [first]


async def test_refused_requests_are_logged_one_line_each_not_a_flood(region, caplog):
    caplog.set_level(logging.WARNING, logger="mesh.api")
    await region.coordinator()
    await region.ready(0)
    bad = {"name": "x", "tasks": [{"role": "a", "command": "true", "resources": {"cpu": "x"}}]}
    for i in range(30):
        with pytest.raises(ApiError):
            await region.client.submit(bad, client_id=f"bad-{i}")
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert lines and len(lines) <= 3, lines  # one, then at most one per 10 s
    assert lines[0].startswith("api job.submit refused: INVALID_SPEC: tasks[0].resources.cpu")


async def test_bad_requests_get_clear_errors_and_change_nothing(region):
    await region.coordinator()
    await region.ready(0)
    before = await region.client.cluster_info()
    cases = [
        (b"\xc1\xff garbage", ErrorCode.BAD_REQUEST, "msgpack"),
        (encode({"client_id": 7, "spec": {}}), ErrorCode.BAD_REQUEST, "client_id"),
        (encode(SubmitRequest("c1", {"name": "x", "tasks": []})), ErrorCode.INVALID_SPEC, "tasks"),
        (
            encode(
                SubmitRequest(
                    "c2",
                    "name: x\ntasks:\n- role: a\n  command: echo\n  resources: {memory: lots}\n",
                )
            ),
            ErrorCode.INVALID_SPEC,
            "tasks[0].resources.memory",
        ),
        (encode(SubmitRequest("c3", "name: [unclosed")), ErrorCode.INVALID_SPEC, "YAML"),
        (
            encode(SubmitRequest("", {"name": "x", "tasks": [{"role": "a", "command": "true"}]})),
            ErrorCode.BAD_REQUEST,
            "client_id",
        ),
        (b"\x00" * (MAX_REQUEST + 1), ErrorCode.TOO_LARGE, "limit"),
    ]
    for data, code, words in cases:
        with pytest.raises(ApiError) as err:
            await region.client.request_raw("job.submit", data)
        assert err.value.code == code, (data[:40], err.value)
        assert words in err.value.message, err.value.message
    with pytest.raises(ApiError) as err:
        await region.client.job("no-such-job")
    assert err.value.code == ErrorCode.NOT_FOUND
    after = await region.client.cluster_info()
    assert after["log_seq"] == before["log_seq"]
    assert after["jobs"] == {}


async def test_simulated_tasks_only_on_hollow_nodes_and_real_only_on_real(region):
    await region.coordinator()
    await region.agent("real-1")
    await region.fleet(3)
    await region.ready(4)
    sim = await region.client.submit(
        {
            "name": "sim",
            "tasks": [
                {
                    "role": "w",
                    "count": 6,
                    "simulate": {"duration": "0.2s"},
                    "resources": {"cpu": 1, "memory": "1Gi"},
                }
            ],
        }
    )
    real = await region.client.submit(
        {
            "name": "real",
            "tasks": [{"role": "w", "count": 2, "command": "true", "resources": {"cpu": "100m"}}],
        }
    )
    sim_job = await region.client.wait(sim, timeout=20)
    real_job = await region.client.wait(real, timeout=20)
    assert sim_job["state"] == real_job["state"] == "SUCCEEDED"
    assert all(t["node_id"].startswith("hollow-") for t in sim_job["task_list"])
    assert all(t["node_id"] == "real-1" for t in real_job["task_list"])


async def test_unplaceable_job_waits_and_says_why(region):
    await region.coordinator()
    await region.agent()
    await region.fleet(2, inventories=[Inventory(16, 64 * GiB), Inventory(16, 64 * GiB)])
    await region.ready(3)
    huge = await region.client.submit(spec("huge", "true", resources={"cpu": 512}))
    wide = await region.client.submit({"name": "wide", "tasks": [
        {"role": "w", "simulate": {"duration": "1s"}, "resources": {"cpu": 20}}]})

    async def reason(job_id):
        job = await region.client.job(job_id)
        return job["pending_reason"]

    # More than any node, even idle: it can never fit the region as it is, and says why.
    why = await eventually(lambda: reason(huge))
    assert why.startswith("can never fit the region as it is: a task (cpu=512 "), why
    assert "1 node: insufficient cpu" in why, why
    # Fits the region's total but no single node.
    why = await eventually(lambda: reason(wide))
    assert "fits no node" in why and "2 nodes: insufficient cpu" in why, why
    assert "1 node: real node (task is simulated)" in why
    for job_id in (huge, wide):
        assert (await region.client.job(job_id))["state"] == "PENDING"


async def test_tasks_of_a_lost_node_are_rescheduled(region):
    await region.coordinator(down_after=2.0, suspect_after=1.0)
    doomed = await region.fleet(1, prefix="doomed")
    await region.ready(1)
    job_id = await region.client.submit(
        {"name": "moving", "tasks": [{"role": "w", "simulate": {"duration": "1s"}}]}
    )
    await eventually(lambda: _task_state(region, job_id, "RUNNING"))
    region.fleets.remove(doomed)
    await doomed.stop()  # the node vanishes without a word
    await region.fleet(1, prefix="spare")
    t0 = time.monotonic()
    job = await region.client.wait(job_id, timeout=20)
    assert job["state"] == "SUCCEEDED", job
    (task,) = job["task_list"]
    assert task["attempt"] == 2 and task["node_id"] == "spare-0000"
    assert any(h["state"] == "LOST" for h in task["history"])
    assert time.monotonic() - t0 < 15
