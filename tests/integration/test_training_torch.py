"""Torch training through Mesh, for real: a real nats-server, an in-process coordinator
and three in-process agents running torchrun and examples/training/tiny.py.

Elastic (`pytorch-elastic`, workers 2..3, pool /a): each agent offers the host's cores
and a worker asks for all of them, so the three nodes hold exactly three workers. A job
of pool /b holds the third node first: the job starts at 2; /b's job is killed and the
job grows to 3 (resize_every_s after its placement); a second /b job, /b being under its
entitlement and /a over, preempts one worker (the highest index, never task 0) and the
job shrinks to 2. Then the job is told to end (tiny's --stop-file) and ends SUCCEEDED
with its primary task, its steps continuous, its loss falling, the world sizes 2, 3, 2.
Static (`pytorch`, 2 workers): both ranks train, both tasks end SUCCEEDED.

The same resizes without Mesh: tests/integration/test_torchrun_adapter.py. Agents run
with limits "none": the rlimit fallback is an address-space limit, which torch's
virtual reservations do not fit (see the report of this test's commit).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from .conftest import eventually

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "training" / "tiny.py")
CORES = psutil.cpu_count(logical=True) or 1  # what each agent offers (agent/probe.py)
RESIZE_EVERY_S = 1.0
RESIZE_BOUND_S = 45.0  # decision -> first step at the new size, on 2 shared cores
POOLS = f"""
pools:
  /a: {{cpu: {{reservation: {CORES}}}}}
  /b: {{cpu: {{reservation: {2 * CORES}}}}}
"""


def tiny_job(name: str, framework: str, workers, ckpt: Path, **kw) -> dict:
    command = ["python", TINY, "--step-sleep", "0.03", "--save-every", "10"]
    command += [str(x) for pair in kw.pop("flags", {}).items() for x in pair]
    task = {
        "role": "worker",
        "command": command,
        "env": {"MESH_CHECKPOINT_DIR": str(ckpt), "OMP_NUM_THREADS": "1"},
        "resources": {"cpu": str(CORES), "memory": "512Mi"},
    }
    return {"name": name, "framework": framework, "workers": workers, "tasks": [task], **kw}


def holder(name: str) -> dict:
    """A job of pool /b that fills one node until it is killed."""
    task = {"role": "w", "command": "exec sleep 600", "resources": {"cpu": str(CORES)}}
    return {"name": name, "pool": "/b", "tasks": [task]}


def lines(ckpt: Path) -> list[dict]:
    path = ckpt / "train.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def steps(ckpt: Path) -> list[dict]:
    return [x for x in lines(ckpt) if "event" not in x]


def first_at(ckpt: Path, world: int, after: float) -> dict | None:
    return next((x for x in steps(ckpt) if x["world_size"] == world and x["ts"] > after), None)


def stepped(ckpt: Path, n: int, since: dict):
    """n steps logged after the step line `since`."""
    return lambda: steps(ckpt)[-1]["step"] >= since["step"] + n


def history(job: dict, index: int, state: str) -> list[dict]:
    task = next(t for t in job["task_list"] if t["index"] == index)
    return [h for h in task["history"] if h["state"] == state]


async def running(client, job_id: str, n: int):
    job = await client.job(job_id)
    return job if job["task_states"].get("RUNNING", 0) >= n else None


async def agents(region, n: int) -> None:
    for i in range(n):
        await region.agent(f"node-{i}", limits="none")
    await region.ready(n)


@pytest.mark.timeout(240)
async def test_elastic_job_grows_when_capacity_frees_and_shrinks_when_preempted(region, tmp_path):
    await region.coordinator(resize_every_s=RESIZE_EVERY_S, preempt_every_s=0.25)
    await agents(region, 3)
    client = region.client
    await client.pool_apply(POOLS)
    ckpt, stop = tmp_path / "ckpt", tmp_path / "stop"

    b1 = await client.submit(holder("b1"))
    await eventually(lambda: running(client, b1, 1))
    spec = tiny_job(
        "tiny",
        "pytorch-elastic",
        {"min": 2, "max": 3},
        ckpt,
        pool="/a",
        flags={"--steps": 100_000, "--stop-file": stop},
    )
    t0 = time.time()
    job_id = await client.submit(spec)
    at2 = await eventually(lambda: first_at(ckpt, 2, t0), timeout=90)  # a cold torch import
    job = await client.job(job_id)
    tr = job["training"]
    assert (tr["size"], tr["target"], tr["generation"], tr["resizes"]) == (2, 3, 1, 0), tr
    assert [t["state"] for t in sorted(job["task_list"], key=lambda t: t["index"])] == [
        "RUNNING",
        "RUNNING",
        "PENDING",
    ]
    await eventually(stepped(ckpt, 10, at2), timeout=30)

    # /b's job ends: its node is free, and the job grows into it.
    await client.kill(b1, "make room")
    at3 = await eventually(lambda: first_at(ckpt, 3, at2["ts"]), timeout=60)
    job = await client.job(job_id)
    (placed,) = history(job, 2, "PLACED")
    first_placed = max(h["ts"] for i in (0, 1) for h in history(job, i, "PLACED"))
    assert placed["ts"] - first_placed >= RESIZE_EVERY_S
    grow_s = at3["ts"] - placed["ts"]
    assert 0 < grow_s < RESIZE_BOUND_S, grow_s
    assert (job["training"]["size"], job["training"]["resizes"]) == (3, 1), job["training"]
    await eventually(stepped(ckpt, 10, at3), timeout=30)

    # /b, under its entitlement, claims a node: /a is over its own, and gives back its
    # elastic job's highest index.
    b2 = await client.submit(holder("b2"))
    job = await eventually(
        lambda: _with(client, job_id, lambda j: history(j, 2, "PREEMPTED")), timeout=30
    )
    (preempted,) = history(job, 2, "PREEMPTED")
    assert "/b" in preempted["message"], preempted
    back2 = await eventually(lambda: first_at(ckpt, 2, preempted["ts"]), timeout=60)
    shrink_s = back2["ts"] - preempted["ts"]
    assert 0 < shrink_s < RESIZE_BOUND_S, shrink_s
    await eventually(lambda: running(client, b2, 1), timeout=30)
    job = await client.job(job_id)
    tr = job["training"]
    assert (tr["size"], tr["target"], tr["resizes"], tr["restarts"]) == (2, 3, 2, 0), tr
    assert tr["generation"] == 3, tr
    for i in (0, 1):  # the survivors were never stopped
        assert len(history(job, i, "PLACED")) == 1 and not history(job, i, "PREEMPTED")
    await eventually(stepped(ckpt, 10, back2), timeout=30)

    stop.touch()
    job = await client.wait(job_id, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    assert job["task_list"][0]["exit_code"] == 0
    await client.kill(b2, "done")

    seen = [x["step"] for x in steps(ckpt)]
    assert seen == list(range(1, seen[-1] + 1)), "a step was skipped or trained twice"
    for start in (x for x in lines(ckpt) if x.get("event") == "start" and x["step"]):
        assert start["step"] in seen  # each generation resumed where the last stopped
    worlds: list[int] = []
    for x in steps(ckpt):
        if not worlds or worlds[-1] != x["world_size"]:
            worlds.append(x["world_size"])
    assert worlds == [2, 3, 2]
    loss = [x["loss"] for x in steps(ckpt)]
    assert sum(loss[-5:]) * 20 < sum(loss[:5]), (loss[:5], loss[-5:])
    print(
        f"\nthrough Mesh: grow 2->3 {grow_s:.1f}s (placement -> first step at 3), "
        f"shrink 3->2 {shrink_s:.1f}s (preemption -> first step at 2), steps {seen[-1]}; "
        f"{preempted['message']!r}"
    )


async def _with(client, job_id: str, pred):
    job = await client.job(job_id)
    return job if pred(job) else None


@pytest.mark.timeout(120)
async def test_static_ddp_job_trains_on_both_ranks(region, tmp_path):
    await region.coordinator()
    await agents(region, 2)
    ckpt = tmp_path / "ckpt"
    job_id = await region.client.submit(tiny_job("ddp", "pytorch", 2, ckpt, flags={"--steps": 40}))
    job = await region.client.wait(job_id, timeout=90)
    assert job["state"] == "SUCCEEDED", job
    tasks = sorted(job["task_list"], key=lambda t: t["index"])
    assert [(t["state"], t["exit_code"]) for t in tasks] == [("SUCCEEDED", 0)] * 2
    assert {t["node_id"] for t in tasks} == {"node-0", "node-1"}
    assert [x["step"] for x in steps(ckpt)] == list(range(1, 41))
    assert {x["world_size"] for x in steps(ckpt)} == {2}  # both ranks in every step
    (start,) = [x for x in lines(ckpt) if x.get("event") == "start"]
    assert (start["world_size"], start["step"]) == (2, 0)
    assert job["training"]["framework"] == "pytorch" and job["training"]["restarts"] == 0
