"""A `framework: spark` job through Mesh, for real: a real nats-server, an in-process
coordinator and two in-process agents running real processes (Spark's own daemons,
spark-submit and examples/training/wordcount.py), submitted through the API as a user
submits it.

What tests/integration/test_spark_adapter.py proves without Mesh (the adapter's argv and
env make a working cluster), this proves with it: the gang is placed in one decision, each
task is given its named ports from its agent's range, the agents write the wait script
and resolve ``@files/``, the driver's end ends the job (the primary rule: master and
workers KILLED, the job the driver's outcome) and the agents' kills leave no JVM behind,
executors included. One cluster per case: each costs ~20-35 s of JVM start on 2 cores.
"""

from __future__ import annotations

import collections
import json
import os
import random
from pathlib import Path

from workloads.frameworks.spark import JAVA_TOOL_OPTIONS

from .conftest import eventually

APP = Path(__file__).resolve().parents[2] / "examples" / "training" / "wordcount.py"
# Two agents on this host (127.0.0.1), each with its own range: the coordinator must give
# every task ports of its own node's range, distinct on the shared address. Above Linux's
# ephemeral range and outside the default one (20000-32000): a port held by another test's
# task (this suite's or a neighbour's, with a coordinator of its own) fails a start here,
# and the job has no restart to spend on it.
RANGES = {"node-1": (61100, 61199), "node-2": (61200, 61299)}
# Short-lived JVMs on 2 shared cores: C1 only and one GC thread halve their start's CPU
# (as in the adapter test); the adapter's own options are kept.
FAST_JVM = {"JAVA_TOOL_OPTIONS": f"{JAVA_TOOL_OPTIONS} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
JOB_TIMEOUT_S = 150


async def _cluster(region):
    """Both agents advertise 127.0.0.1 (their route to a loopback NATS) and the range
    named for them, set as `mesh agent --ports` sets it."""
    await region.coordinator()
    for node, ports in RANGES.items():
        await region.agent(node, port_range=ports)
    await region.ready(len(RANGES))


def _words(path: Path) -> collections.Counter[str]:
    rng = random.Random(2022)
    vocab = [f"w{i}" for i in range(30)] + ["spark", "mesh", "driver"]
    lines = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 10))) for _ in range(400)]
    path.write_text("\n".join(lines) + "\n")
    return collections.Counter(w for line in lines for w in line.split())


def _spec(name: str, app_args: list[str]) -> dict:
    """2 workers of one core; sizes from the adapter's memory rule (512 MiB heaps)."""
    return {
        "name": name,
        "framework": "spark",
        "workers": 2,
        "max_restarts": 0,  # a driver that fails fails the job at once
        "tasks": [
            {"role": "master", "env": FAST_JVM, "resources": {"cpu": "500m", "memory": "512Mi"}},
            {"role": "worker", "env": FAST_JVM, "resources": {"cpu": 1, "memory": "1152Mi"}},
            {
                "role": "driver",
                "command": [str(APP), *app_args],
                "env": FAST_JVM,
                "resources": {"cpu": "500m", "memory": "896Mi"},
            },
        ],
    }


def _outcomes(job: dict) -> str:
    """The job's state and each task's, with its last message: what a failure shows."""
    shown = [f"job {job['state']}: {job.get('kill_reason', '')}"]
    for t in job["task_list"]:
        shown.append(f"{t['role']}-{t['index']} {t['state']} on {t['node_id']}: {t['message']}")
        if t["state"] == "FAILED":
            shown.append(t["log_tail"][-1500:])
    return "\n".join(shown)


def _left_behind(root: Path, ports: set[int]) -> list[str]:
    """Live processes of the job: a working directory under the agents' data dirs (every
    task and executor runs in its task dir) or a command line naming one of its ports."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = Path(os.readlink(f"/proc/{entry}/cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(root) or any(f"127.0.0.1:{p}" in cmd for p in ports):
            found.append(f"{entry} {cmd[:160]}")
    return found


def _check_cluster_stopped(job: dict, root: Path) -> dict[str, dict]:
    """Master and workers KILLED with the primary rule's reason, every task's ports
    distinct and in its node's range, no process of the job left."""
    tasks = {f"{t['role']}-{t['index']}": t for t in job["task_list"]}
    assert sorted(tasks) == ["driver-0", "master-0", "worker-0", "worker-1"]
    for name in ("master-0", "worker-0", "worker-1"):
        assert tasks[name]["state"] == "KILLED", (name, tasks[name])
    everyone: list[int] = []
    for name, t in tasks.items():
        lo, hi = RANGES[t["node_id"]]
        assert t["ports"], name
        assert all(lo <= p <= hi for p in t["ports"].values()), (name, t["node_id"], t["ports"])
        everyone.extend(t["ports"].values())
    assert len(set(everyone)) == len(everyone), everyone
    assert set(tasks["master-0"]["ports"]) == {"spark", "webui"}
    assert set(tasks["driver-0"]["ports"]) == {"driver", "blockmanager", "webui"}
    # The kills were reported (KILLED) only once nothing of a task was left: no wait here.
    assert not _left_behind(root, set(everyone))
    return tasks


async def test_spark_wordcount_job_ends_with_its_driver(region, tmp_path):
    await _cluster(region)
    expected = _words(tmp_path / "input.txt")
    target = tmp_path / "counts.json"
    job_id = await region.client.submit(
        _spec("wordcount", [str(tmp_path / "input.txt"), str(target)])
    )

    async def jvms_running():
        job = await region.client.job(job_id)
        if job["state"] in ("SUCCEEDED", "FAILED", "KILLED"):
            return _outcomes(job)  # ended first: the assertion below names how
        found = [p for p in _left_behind(tmp_path, set()) if "java" in p]
        return len(found) >= 4 and found  # master, 2 workers, driver (and executors)

    # While it runs the check below sees the cluster's JVMs: it can tell one left behind.
    seen = await eventually(jvms_running, timeout=JOB_TIMEOUT_S, interval=0.5)
    assert isinstance(seen, list), f"the job ended before its JVMs were seen: {seen}"
    job = await region.client.wait(job_id, timeout=JOB_TIMEOUT_S)
    tasks = {f"{t['role']}-{t['index']}": t for t in job["task_list"]}
    assert job["state"] == "SUCCEEDED", _outcomes(job)
    assert tasks["driver-0"]["state"] == "SUCCEEDED"
    assert job["kill_reason"] == f"primary task {job_id}.driver.0 succeeded: the job ends with it"
    result = json.loads(target.read_text())
    assert result["counts"] == dict(expected)
    assert result["total"] == sum(expected.values())
    assert result["executors"] == 2  # both workers' executors ran
    _check_cluster_stopped(job, tmp_path)


async def test_spark_driver_that_fails_fails_the_job_and_stops_the_cluster(region, tmp_path):
    await _cluster(region)
    missing = tmp_path / "no-such-input.txt"
    job_id = await region.client.submit(_spec("wc-bad", [str(missing), str(tmp_path / "x.json")]))
    job = await region.client.wait(job_id, timeout=JOB_TIMEOUT_S)
    tasks = {f"{t['role']}-{t['index']}": t for t in job["task_list"]}
    assert job["state"] == "FAILED", _outcomes(job)
    assert tasks["driver-0"]["state"] == "FAILED"
    assert job["kill_reason"] == f"primary task {job_id}.driver.0 failed: the job ends with it"
    assert tasks["driver-0"]["exit_code"] == 1
    assert not (tmp_path / "x.json").exists()
    # The cause is in the driver's stdout: spark-submit's PythonRunner copies the
    # Python process's stderr there, so the task's log tail (stderr's) is Spark's own.
    (stdout,) = tmp_path.glob("agent-*/tasks/wc-bad-*.driver.0_1-*/stdout.log")
    assert f"FileNotFoundError: [Errno 2] No such file or directory: '{missing}'" in (
        stdout.read_text(errors="replace")
    )
    _check_cluster_stopped(job, tmp_path)
