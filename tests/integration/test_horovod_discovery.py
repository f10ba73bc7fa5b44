"""The Horovod and MPI launch contracts through Mesh, on three real agents (in-process,
each advertising its own loopback address) and a real coordinator over a real nats-server.

Horovod has no wheel (PyPI's latest, 0.28.1 of 2023, is a source package compiled
against the installed framework with cmake; none is installed here), and there is no
`mpirun` either. So task 0's launcher is a
stand-in on the task's PATH, and what it does is what the real one would do with what
Mesh gives it: the `horovodrun` stand-in polls the discovery script the adapter wrote
(``--host-discovery-script @files/discover_hosts.sh``, resolved by the agent) as
elastic Horovod does, from inside the task, with the task's own env (the agent's
MESH_NATS_URL, MESH_CLI naming this venv's `mesh`); the `mpirun` stand-in keeps the
hostfile it was given. The contract asserted: the script exits 0 and prints
``host:slots`` for the job's holding workers, and its output follows the scheduler as
the job grows (capacity frees) and shrinks (`mesh job scale`); the mpi hostfile lists
``host slots=N`` summing to workers x slots.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from .conftest import cli_env, eventually, run_mesh

ADDRESSES = {"node-1": "127.0.0.2", "node-2": "127.0.0.3", "node-3": "127.0.0.4"}
MESH = str(Path(sys.executable).parent / "mesh")  # the venv's console script
SLOTS = 2
RESIZE_EVERY_S = 1.0
# One worker fills a node (the agents advertise this host's 2 cores).
WHOLE_NODE = {"cpu": 2, "memory": "64Mi"}

HOROVODRUN = """#!/bin/sh
# A stand-in for horovodrun: what it was given, then the discovery script's output every
# second (Horovod's own period), each result replacing the last, until told to stop.
out={out}
echo "$@" > $out/argv.tmp && mv $out/argv.tmp $out/argv
env | grep '^MESH_' | sort > $out/env.tmp && mv $out/env.tmp $out/env
while [ "$1" != "--host-discovery-script" ]; do shift; done
while [ ! -e $out/stop ]; do
  "$2" > $out/found.tmp 2>&1
  echo "exit $?" >> $out/found.tmp
  mv $out/found.tmp $out/found
  cat $out/found >> $out/history
  sleep 1
done
"""

MPIRUN = """#!/bin/sh
# A stand-in for mpirun: keeps its argv and the hostfile it names.
out={out}
echo "$@" > $out/argv
while [ "$1" != "--hostfile" ]; do shift; done
cp "$2" $out/hostfile.tmp && mv $out/hostfile.tmp $out/hostfile
"""


async def _region(region):
    await region.coordinator(resize_every_s=RESIZE_EVERY_S)
    for node, address in ADDRESSES.items():
        await region.agent(node, address=address)
    await region.ready(len(ADDRESSES))


def _launcher(tmp_path: Path, name: str, text: str) -> tuple[Path, dict[str, str]]:
    """A stand-in launcher on a PATH of its own (the venv's `mesh` only via MESH_CLI)."""
    out = tmp_path / "out"
    out.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / name
    script.write_text(text.format(out=out))
    script.chmod(0o755)
    return out, {"PATH": f"{bin_dir}:/usr/bin:/bin", "MESH_CLI": MESH}


def _expected(job: dict, fmt: str) -> str:
    """What the job's holding workers are, in task order, as hostfile lines."""
    hosts = [
        ADDRESSES[t["node_id"]]
        for t in sorted(job["task_list"], key=lambda t: t["index"])
        if t["state"] in ("PLACED", "STARTING", "RUNNING")
    ]
    line = "{}:{}\n" if fmt == "horovod" else "{} slots={}\n"
    return "".join(line.format(h, SLOTS) for h in hosts)  # one task per node here


def _holding(job: dict) -> list[int]:
    return sorted(t["index"] for t in job["task_list"] if t["state"] == "RUNNING")


async def test_discovery_script_follows_the_job_as_it_grows_and_shrinks(region, tmp_path):
    await _region(region)
    client = region.client
    out, env = _launcher(tmp_path, "horovodrun", HOROVODRUN)
    # Two nodes taken: the elastic job starts at its min, one worker.
    blocker = await client.submit(
        {
            "name": "blocker",
            "tasks": [
                {"role": "b", "count": 2, "command": ["sleep", "300"], "resources": WHOLE_NODE}
            ],
        }
    )

    async def blocked():
        job = await client.job(blocker)
        return sum(t["state"] == "RUNNING" for t in job["task_list"]) == 2

    await eventually(blocked)
    job_id = await client.submit(
        {
            "name": "hvd",
            "framework": "horovod-elastic",
            "workers": {"min": 1, "max": 3},
            "slots_per_node": SLOTS,
            "tasks": [
                {
                    "role": "worker",
                    "command": ["python", "train.py"],
                    "env": env,
                    "resources": WHOLE_NODE,
                }
            ],
        }
    )

    async def found(indexes: list[int]) -> str | None:
        """The script's latest output once the job holds exactly `indexes` and the
        output says so (the script is run every second, from task 0)."""
        job = await client.job(job_id)
        if _holding(job) != indexes or not (out / "found").exists():
            return None
        text = (out / "found").read_text()
        return text if text == _expected(job, "horovod") + "exit 0\n" else None

    one = await eventually(lambda: found([0]), timeout=30)
    assert one.count(":") == 1 and one.endswith(f":{SLOTS}\nexit 0\n"), one
    argv = (out / "argv").read_text().split()
    assert argv[:6] == ["-np", "2", "--min-np", "2", "--max-np", "6"], argv
    assert argv[6] == "--host-discovery-script"
    told = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines())
    # How the script's `mesh` found the API: the agent's URL and region, given every task.
    assert (told["MESH_NATS_URL"], told["MESH_REGION"]) == (region.url, "default")
    assert told["MESH_CLI"] == MESH
    files_dir = told["MESH_FILES_DIR"]
    assert argv[7] == f"{files_dir}/discover_hosts.sh"  # @files/ resolved by the agent
    assert argv[8:] == ["python", "train.py"]

    # Capacity frees: the job grows to its max (after resize_every_s), and so does the list.
    await client.kill(blocker)
    three = await eventually(lambda: found([0, 1, 2]), timeout=30)
    assert len(three.splitlines()) == 4 and len(set(three.splitlines())) == 4, three

    # Scaled down by hand, as a user does: the highest index goes, and the list follows.
    # (in a thread: the coordinator answering it runs on this test's event loop)
    scaled = await asyncio.to_thread(
        run_mesh,
        *("--nats", region.url, "job", "scale", job_id, "--workers", "2"),
        env=cli_env(tmp_path),
    )
    assert scaled.returncode == 0, scaled.stderr
    two = await eventually(lambda: found([0, 1]), timeout=30)
    assert two.splitlines()[:2] == three.splitlines()[:2]

    # Training ends (horovodrun exits 0): the job ends with its launcher.
    (out / "stop").touch()
    job = await client.wait(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED"
    history = (out / "history").read_text()
    assert "exit 0" in history and all(
        line.startswith("exit 0") or line.count(":") == 1 for line in history.splitlines()
    ), history  # every run of the script exited 0 and printed host:slots lines only


async def test_mpi_hostfile_lists_each_host_with_its_slots(region, tmp_path):
    await _region(region)
    out, env = _launcher(tmp_path, "mpirun", MPIRUN)
    job_id = await region.client.submit(
        {
            "name": "mpi",
            "framework": "mpi",
            "workers": 2,
            "slots_per_node": SLOTS,
            "tasks": [
                {
                    "role": "worker",
                    "command": ["./ring"],
                    "env": env,
                    "resources": WHOLE_NODE,
                }
            ],
        }
    )
    job = await region.client.wait(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED", job["task_list"]
    tasks = {t["index"]: t for t in job["task_list"]}
    assert tasks[1]["state"] == "KILLED"  # it held its slots until the launcher ended
    hostfile = (out / "hostfile").read_text()
    hosts = [ADDRESSES[tasks[i]["node_id"]] for i in (0, 1)]
    assert hostfile == f"{hosts[0]} slots={SLOTS}\n{hosts[1]} slots={SLOTS}\n"
    assert sum(int(line.split("slots=")[1]) for line in hostfile.splitlines()) == 2 * SLOTS
    argv = (out / "argv").read_text().split()
    assert argv[0] == "--hostfile" and argv[1].endswith("/files/hostfile")
    assert argv[2:] == ["-np", str(2 * SLOTS), "./ring"]
