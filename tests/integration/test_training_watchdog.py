"""The elastic-training watchdog (coordinator/elastic.py `stalled`), end to end: three
real agents (in-process, each advertising its own loopback address) and a real
coordinator over a real nats-server, with a small `resize_every_s` and
`progress_timeout_s`.

Two `horovod-elastic` jobs of 2..3 workers start at 2 beside a blocker and grow to 3
when it ends. Task 0 of each runs a stand-in `horovodrun` (no Horovod here, see
tests/integration/test_horovod_discovery.py):
- "hung" polls the adapter's discovery script, as elastic Horovod does, and writes a
  rising step count to $MESH_PROGRESS_FILE while the script lists the job's first
  membership; once it lists more workers (the grow), it stops writing and sleeps: a
  job hung after a resize. The leader must requeue its workers (every holding task
  stopped, PREEMPTED with the watchdog's reason, placed again as a new attempt), no
  sooner than `progress_timeout_s` after the change and no later than that plus the
  agent's reporting lag after the job stopped writing.
- "silent" never writes progress: it must be left alone, however long it sits after
  its resize.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import psutil

from agent.training import PROGRESS_EVERY_S, PROGRESS_MIN_GAP_S
from coordinator.elastic import WATCHDOG

from .conftest import eventually

ADDRESSES = {"node-1": "127.0.0.2", "node-2": "127.0.0.3", "node-3": "127.0.0.4"}
MESH = str(Path(sys.executable).parent / "mesh")  # the venv's console script
RESIZE_EVERY_S = 1.0
PROGRESS_TIMEOUT_S = 5.0  # well above the agent's 2-3 s between progress reports
# The most a step written to the progress file waits before the coordinator hears of it:
# the agent reads the file every PROGRESS_EVERY_S, reports at most every PROGRESS_MIN_GAP_S.
REPORT_LAG_S = PROGRESS_EVERY_S + PROGRESS_MIN_GAP_S
ROUND_S = 2.0  # a leader's round, the kill and its report: slack on the upper bound
# Each agent advertises this host's cores: two workers fill a node, the blocker one.
CORES = psutil.cpu_count(logical=True) or os.cpu_count() or 1
WORKER = {"cpu": f"{CORES * 500}m", "memory": "256Mi"}
WHOLE_NODE = {"cpu": f"{CORES * 1000}m", "memory": "256Mi"}
HOLDING = ("PLACED", "STARTING", "RUNNING")

HUNG = """#!/bin/sh
# A stand-in for elastic horovodrun that hangs at its first resize: its "workers" write
# a rising step count to $MESH_PROGRESS_FILE, every 0.2 s, while it polls the discovery
# script (as elastic Horovod does); once the script lists more slots than at the start
# (the grow), the workers go on to their next commit (1 s), then stop, and it sleeps:
# a job stuck in its re-rendezvous.
out={out}
p="$MESH_PROGRESS_FILE"
echo "start $(date +%s.%N)" >> $out/log
while [ "$1" != "--host-discovery-script" ]; do shift; done
slots() {{ "$1" 2>/dev/null | awk -F: 'NF == 2 {{ s += $2 }} END {{ print s + 0 }}'; }}
first=0
while [ "$first" -eq 0 ]; do first=$(slots "$2"); done
step=0
while [ ! -e "$p.stop" ]; do
  step=$((step + 1))
  echo $step > "$p.tmp" && mv "$p.tmp" "$p"
  sleep 0.2
done &
workers=$!
now=$first
while [ "$now" -le "$first" ]; do sleep 0.2; now=$(slots "$2"); done
sleep 1
touch "$p.stop" && wait $workers
echo "hung $(date +%s.%N) $first $now $(cat "$p")" >> $out/log
exec sleep 600
"""

SILENT = """#!/bin/sh
# A stand-in for horovodrun that never reports progress.
echo "start $(date +%s.%N)" >> {out}/log
exec sleep 600
"""

# elastic.stalled's reason, as the tasks' history shows it.
REASON = re.compile(
    rf"^{re.escape(WATCHDOG)}: no progress in (\d+)s "
    rf"\(its last membership change (\d+)s ago; "
    rf"progress_timeout_s {PROGRESS_TIMEOUT_S:g}\)$"
)


def _launcher(tmp_path: Path, job: str, text: str) -> tuple[Path, dict[str, str]]:
    """A stand-in `horovodrun` on a PATH of its own (the venv's `mesh` via MESH_CLI)."""
    out = tmp_path / job / "out"
    out.mkdir(parents=True)
    bin_dir = tmp_path / job / "bin"
    bin_dir.mkdir()
    script = bin_dir / "horovodrun"
    script.write_text(text.format(out=out))
    script.chmod(0o755)
    return out, {"PATH": f"{bin_dir}:/usr/bin:/bin", "MESH_CLI": MESH}


def _spec(name: str, env: dict[str, str]) -> dict:
    return {
        "name": name,
        "framework": "horovod-elastic",
        "workers": {"min": 2, "max": 3},
        "tasks": [
            {"role": "worker", "command": ["python", "train.py"], "env": env, "resources": WORKER}
        ],
    }


def _by_index(job: dict) -> dict[int, dict]:
    return {t["index"]: t for t in job["task_list"]}


def _log(out: Path) -> list[list[str]]:
    path = out / "log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _requeues(task: dict) -> list[dict]:
    return [h for h in task["history"] if h["message"].startswith(WATCHDOG)]


async def test_a_job_hung_after_a_resize_is_requeued_and_a_silent_one_is_left_alone(
    region, tmp_path
):
    await region.coordinator(resize_every_s=RESIZE_EVERY_S, progress_timeout_s=PROGRESS_TIMEOUT_S)
    for node, address in ADDRESSES.items():
        await region.agent(node, address=address)
    await region.ready(len(ADDRESSES))
    client = region.client
    hung_out, hung_env = _launcher(tmp_path, "hung", HUNG)
    silent_out, silent_env = _launcher(tmp_path, "silent", SILENT)

    # One node taken: each job starts at its min, two workers, on the other two.
    blocker = await client.submit(
        {
            "name": "blocker",
            "tasks": [{"role": "b", "command": ["sleep", "300"], "resources": WHOLE_NODE}],
        }
    )

    async def running(job_id: str, indexes: tuple[int, ...], attempt: int = 1):
        job = await client.job(job_id)
        tasks = _by_index(job)
        ok = all(tasks[i]["state"] == "RUNNING" and tasks[i]["attempt"] == attempt for i in indexes)
        return job if ok else None

    await eventually(lambda: running(blocker, (0,)))
    hung = await client.submit(_spec("hung", hung_env))
    silent = await client.submit(_spec("silent", silent_env))

    async def training(steps: int):
        job = await running(hung, (0, 1))
        return job if job is not None and _by_index(job)[0]["progress"] >= steps else None

    # Training at its first membership, reported more than once: steps 1..10 written
    # in 2 s, the agent reports at most every 2 s.
    job = await eventually(lambda: training(10), timeout=20)
    assert _by_index(job)[2]["state"] == "PENDING"  # still at its first membership
    job = await eventually(lambda: running(silent, (0, 1)))
    assert _by_index(job)[2]["state"] == "PENDING"

    # Capacity frees: both grow to 3 (a membership change); "hung" stops at it.
    await client.kill(blocker)
    reported: dict[int, float] = {}  # hung's task 0, attempt 1: step -> when the log had it

    def note(job: dict) -> dict:
        task0 = _by_index(job)[0]
        if task0["attempt"] == 1 and task0["progress_at"] is not None:
            reported[task0["progress"]] = task0["progress_at"]
        return job

    async def grown(job_id: str):
        note(await client.job(hung))
        return await running(job_id, (0, 1, 2))

    grown_hung = await eventually(lambda: grown(hung), timeout=20)
    grown_silent = await eventually(lambda: grown(silent), timeout=20)
    grow_at = _by_index(grown_hung)[2]["placed_at"]
    assert grown_hung["training"]["resizes"] == 1
    assert grown_silent["training"]["resizes"] == 1

    # The watchdog: every holding worker of "hung" stopped with its reason, then placed
    # again as a new attempt (a requeue: not a failure).
    async def requeued():
        job = note(await client.job(hung))
        tasks = _by_index(job)
        return job if all(_requeues(tasks[i]) for i in (0, 1, 2)) else None

    bound = PROGRESS_TIMEOUT_S + REPORT_LAG_S + 2 * ROUND_S + 4.0  # (the script's notice)
    try:
        job = await eventually(requeued, timeout=bound)
    except AssertionError:
        raise AssertionError(
            f"not requeued: grown at {grow_at}, steps reported {reported}, "
            f"the launcher's log {_log(hung_out)}"
        ) from None
    (hung_line,) = [line for line in _log(hung_out) if line[0] == "hung"]
    hung_at, first, now, last_step = float(hung_line[1]), *map(int, hung_line[2:5])
    assert (first, now) == (2, 3)  # it stopped writing at the grow, not before
    assert hung_at > grow_at  # (the script's clock is this host's, as the log's is)
    # What makes the watchdog's work hard: the steps written until the workers stopped
    # reached the log after the change, so progress moved after it.
    last_at = max(reported.values())
    assert last_at > grow_at and max(reported) == last_step, (grow_at, reported, hung_line)
    for i, task in _by_index(job).items():
        (stop,) = _requeues(task)
        assert stop["state"] == "PREEMPTED" and stop["attempt"] == 1, stop
        m = REASON.match(stop["message"])
        assert m is not None, stop["message"]
        silent_s, since_change_s = int(m[1]), int(m[2])
        assert silent_s >= PROGRESS_TIMEOUT_S and since_change_s >= silent_s, stop
        # No sooner than progress_timeout_s after its last progress; no later than that
        # after the last step it wrote, once the agent's lag and a round or two passed.
        assert last_at + PROGRESS_TIMEOUT_S <= stop["ts"], (i, last_at, stop)
        assert stop["ts"] <= hung_at + PROGRESS_TIMEOUT_S + REPORT_LAG_S + 2 * ROUND_S, (
            i,
            hung_at,
            stop,
        )

    # Placed again: task 0 (the launcher, started afresh) and task 1 as a gang of min;
    # the requeue spent one restart of the job's max_restarts (one, however many tasks
    # it stopped).
    job = await eventually(lambda: running(hung, (0, 1), attempt=2), timeout=10)
    assert job["state"] == "RUNNING" and job["training"]["restarts"] == 1
    assert [line[0] for line in _log(hung_out)][:3] == ["start", "hung", "start"]

    # "silent" sat through the same time after its own resize, with no progress ever
    # reported: still its first attempts, never requeued. Held past two timeouts.
    silent_grow_at = _by_index(grown_silent)[2]["placed_at"]

    async def sat_out():
        job = await client.job(silent)
        tasks = _by_index(job)
        assert all(t["attempt"] == 1 and t["state"] == "RUNNING" for t in tasks.values()), tasks
        assert not any(_requeues(t) for t in tasks.values()), tasks
        return job if time.time() >= silent_grow_at + 2 * PROGRESS_TIMEOUT_S else None

    job = await eventually(sat_out, timeout=2 * PROGRESS_TIMEOUT_S + 2 * ROUND_S + 5.0)
    assert job["training"]["progress_at"] is None
    assert job["training"]["resizes"] == 1 and job["training"]["generation"] == 2
    assert [line[0] for line in _log(silent_out)] == ["start"]
