"""The adapters' shared environment and the mpi / horovod-elastic adapters: argv, env
and files for given placements and generations (workloads/frameworks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.executor import ExecError, ExecSpec, ProcessExecutor
from workloads import parse_job_spec
from workloads.frameworks import (
    ADAPTERS,
    FILES_PREFIX,
    FRAMEWORKS,
    REGISTRY,
    Launch,
    Peer,
    TaskContext,
    common_env,
    launch,
    ports_for,
    primary_task,
    rendezvous_task,
)
from workloads.frameworks.horovod import DISCOVER, discover_script, horovod_hosts
from workloads.frameworks.mpi import HOLD_ARGV, HOSTFILE, host_slots, mpi_hostfile
from workloads.model import TASK_IDENTITY_VAR, WORKER_IDENTITY


def _spec(framework: str, workers, slots: int = 1, **group):
    return parse_job_spec(
        {
            "name": "t",
            "framework": framework,
            "workers": workers,
            "slots_per_node": slots,
            "tasks": [
                {"role": "worker", "command": ["python", "train.py", "--lr", "0.1"], **group}
            ],
        }
    )


def _peers(*hosts: str, role: str = "worker") -> tuple[Peer, ...]:
    return tuple(Peer(role, i, host, node_id=f"n{i}") for i, host in enumerate(hosts))


def _ctx(peers, index: int = 0, generation: int = 1, job: str = "job-7") -> TaskContext:
    return TaskContext(job, peers[index].role, index, generation, tuple(peers))


# --------------------------------------------------------------------------- common env


def test_common_env_names_every_role_and_own_ports():
    peers = (
        Peer("master", 0, "10.0.0.1", (("rpc", 7077), ("web", 8080))),
        Peer("shuffle-server", 0, "10.0.0.2", (("data", 20001),)),
        Peer("shuffle-server", 1, "10.0.0.3", (("data", 20002),)),
    )
    env = common_env(TaskContext("j1", "shuffle-server", 1, 4, peers))
    assert env == {
        "MESH_JOB_ID": "j1",
        "MESH_TASK_ROLE": "shuffle-server",
        "MESH_TASK_INDEX": "1",
        "MESH_GENERATION": "4",
        "MESH_MASTER_HOSTS": "10.0.0.1",
        "MESH_MASTER_NUM": "1",
        "MESH_SHUFFLE_SERVER_HOSTS": "10.0.0.2,10.0.0.3",
        "MESH_SHUFFLE_SERVER_NUM": "2",
        "MESH_PORT_DATA": "20002",  # its own port only
    }
    master = common_env(TaskContext("j1", "master", 0, 4, peers))
    assert (master["MESH_PORT_RPC"], master["MESH_PORT_WEB"]) == ("7077", "8080")
    assert "MESH_PORT_DATA" not in master


def test_batch_keeps_the_command_and_adds_the_env():
    spec = parse_job_spec(
        {"name": "b", "tasks": [{"role": "a", "command": "x", "env": {"MESH_TASK_INDEX": "9"}}]}
    )
    out = launch(spec, spec.tasks[0], _ctx(_peers("h1", role="a"), generation=2))
    assert out.argv == ("/bin/sh", "-c", "x") and out.files == ()
    env = dict(out.env)
    assert env["MESH_TASK_INDEX"] == "0"  # Mesh's own names win over the group's
    assert env["MESH_GENERATION"] == "2"
    assert list(out.env) == sorted(out.env)


# --------------------------------------------------------------------------- dispatch


def test_every_framework_has_hooks():
    assert set(REGISTRY) == set(FRAMEWORKS) == set(ADAPTERS)
    batch = parse_job_spec({"name": "b", "tasks": [{"role": "a", "command": "x"}]})
    assert rendezvous_task(batch) is None and primary_task(batch) is None
    for framework in ("mpi", "horovod-elastic"):
        spec = _spec(framework, 2)
        assert rendezvous_task(spec) == ("worker", 0)
        assert primary_task(spec) == ("worker", 0)


def test_ports_for_is_the_groups_then_the_frameworks():
    spec = _spec("mpi", 2, ports=["metrics", "debug"])
    assert ports_for(spec, spec.tasks[0], 0) == ("metrics", "debug")
    assert ports_for(spec, spec.tasks[0], 1) == ("metrics", "debug")


# --------------------------------------------------------------------------- hostfiles


def test_hostfiles_sum_the_slots_of_a_shared_host_in_peer_order():
    peers = _peers("10.0.0.2", "10.0.0.1", "10.0.0.2", "10.0.0.3")
    assert host_slots(peers, 4) == [("10.0.0.2", 8), ("10.0.0.1", 4), ("10.0.0.3", 4)]
    assert mpi_hostfile(peers, 4) == "10.0.0.2 slots=8\n10.0.0.1 slots=4\n10.0.0.3 slots=4\n"
    assert horovod_hosts(peers, 4) == "10.0.0.2:8\n10.0.0.1:4\n10.0.0.3:4\n"
    assert mpi_hostfile((), 4) == horovod_hosts((), 4) == ""


_hosts = st.lists(st.sampled_from(["10.0.0.1", "10.0.0.2", "node-3", "127.0.0.1"]), min_size=1)


@given(_hosts, st.integers(1, 256))
def test_a_hostfile_holds_every_slot_once(hosts, slots):
    peers = _peers(*hosts)
    lines = mpi_hostfile(peers, slots).splitlines()
    named = [line.split(" slots=")[0] for line in lines]
    assert named == list(dict.fromkeys(hosts))  # each host once, first-seen order
    assert sum(int(line.split("slots=")[1]) for line in lines) == len(hosts) * slots
    pairs = [line.rsplit(":", 1) for line in horovod_hosts(peers, slots).splitlines()]
    assert [h for h, _ in pairs] == named
    assert sum(int(n) for _, n in pairs) == len(hosts) * slots


# --------------------------------------------------------------------------- mpi


def test_mpi_task_0_runs_mpirun_over_every_slot():
    spec = _spec("mpi", 3, slots=2, env={"MESH_HOSTFILE": "mine", "OMP_NUM_THREADS": "1"})
    peers = _peers("10.0.0.1", "10.0.0.2", "10.0.0.1")
    out = launch(spec, spec.tasks[0], _ctx(peers, 0, generation=1))
    assert out.argv == (
        "mpirun", "--hostfile", "@files/hostfile", "-np", "6", "python", "train.py", "--lr", "0.1",
    )  # fmt: skip
    assert out.files == (("hostfile", "10.0.0.1 slots=4\n10.0.0.2 slots=2\n"),)
    env = dict(out.env)
    assert env["MESH_HOSTFILE"] == FILES_PREFIX + HOSTFILE  # the framework's wins
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["MESH_WORKER_HOSTS"] == "10.0.0.1,10.0.0.2,10.0.0.1"
    assert (env["MESH_WORKER_NUM"], env["MESH_GENERATION"]) == ("3", "1")


def test_mpi_other_tasks_hold_their_slots():
    spec = _spec("mpi", 2)
    peers = _peers("a", "b")
    out = launch(spec, spec.tasks[0], _ctx(peers, 1, generation=5))
    assert out.argv == HOLD_ARGV
    assert dict(out.files)["hostfile"] == "a slots=1\nb slots=1\n"
    env = dict(out.env)
    assert (env["MESH_TASK_INDEX"], env["MESH_GENERATION"]) == ("1", "5")


def test_the_holding_command_ends_cleanly_on_term():
    proc = subprocess.Popen(HOLD_ARGV)
    try:
        time.sleep(0.3)
        assert proc.poll() is None  # it holds
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- horovod


def test_horovod_task_0_runs_horovodrun_with_discovery():
    spec = _spec("horovod-elastic", {"min": 2, "max": 4}, slots=2)
    peers = _peers("10.0.0.1", "10.0.0.2")
    out = launch(spec, spec.tasks[0], _ctx(peers, 0, generation=1, job="j-42"))
    assert out.argv == (
        "horovodrun", "-np", "4", "--min-np", "4", "--max-np", "8",
        "--host-discovery-script", "@files/discover_hosts.sh",
        "python", "train.py", "--lr", "0.1",
    )  # fmt: skip
    files = dict(out.files)
    assert files[DISCOVER] == discover_script("j-42")
    assert files["hostfile"] == "10.0.0.1:2\n10.0.0.2:2\n"
    assert dict(out.env)["MESH_HOSTFILE"] == "@files/hostfile"


def test_horovod_after_a_resize():
    """A worker placed by a grow starts holding; the launcher's hostfile of a later
    generation lists the new host (Horovod itself follows the discovery script)."""
    spec = _spec("horovod-elastic", {"min": 1, "max": 3})
    peers = _peers("10.0.0.1", "10.0.0.2", "10.0.0.3")
    newcomer = launch(spec, spec.tasks[0], _ctx(peers, 2, generation=3))
    assert newcomer.argv == HOLD_ARGV
    assert dict(newcomer.env)["MESH_GENERATION"] == "3"
    again = launch(spec, spec.tasks[0], _ctx(peers, 0, generation=3))
    assert again.argv[:7] == ("horovodrun", "-np", "1", "--min-np", "1", "--max-np", "3")
    assert dict(again.files)["hostfile"].count("\n") == 3


def test_horovod_fixed_size():
    spec = _spec("horovod-elastic", 2, slots=3)
    out = launch(spec, spec.tasks[0], _ctx(_peers("a", "b"), 0))
    assert out.argv[:7] == ("horovodrun", "-np", "6", "--min-np", "6", "--max-np", "6")


def test_horovod_launcher_alone_asks_for_the_task_identity():
    """Task 0 runs the discovery script, which calls job.hosts: on a secure mesh it needs
    the identity its agent holds for tasks. The slot holders call nothing and get none."""
    spec = _spec("horovod-elastic", {"min": 1, "max": 3}, env={TASK_IDENTITY_VAR: "agent"})
    peers = _peers("10.0.0.1", "10.0.0.2")
    launcher = dict(launch(spec, spec.tasks[0], _ctx(peers, 0)).env)
    assert launcher[TASK_IDENTITY_VAR] == WORKER_IDENTITY  # the framework's wins
    holder = dict(launch(spec, spec.tasks[0], _ctx(peers, 1)).env)
    assert holder[TASK_IDENTITY_VAR] == "agent"  # the group's own, untouched
    plain = _spec("horovod-elastic", 2)
    assert TASK_IDENTITY_VAR not in dict(launch(plain, plain.tasks[0], _ctx(peers, 1)).env)
    mpi = _spec("mpi", 2)  # mpirun calls no API
    assert TASK_IDENTITY_VAR not in dict(launch(mpi, mpi.tasks[0], _ctx(peers, 0)).env)


def test_horovod_launcher_gets_the_identity_or_a_clear_refusal(tmp_path):
    """What the agent's executor does with the launcher's env: hands the task identity's
    files over, or, on a secure mesh without one, refuses to start it, saying why."""
    spec = _spec("horovod-elastic", 2)
    env = launch(spec, spec.tasks[0], _ctx(_peers("a", "b"), 0)).env
    run = ExecSpec("j#0", ("true",), env)
    handed = {"MESH_TLS_CA": "/i/ca.crt", "MESH_TLS_CERT": "/i/w.crt", "MESH_TLS_KEY": "/i/w.key"}
    with_identity = ProcessExecutor(tmp_path / "a", limits="none", task_identity=handed)
    assert with_identity._environment(run).items() >= handed.items()
    without = ProcessExecutor(tmp_path / "b", limits="none", task_identity=None)
    with pytest.raises(ExecError, match="asks for the worker identity.*--task-identity DIR"):
        without._environment(run)
    insecure = ProcessExecutor(tmp_path / "c", limits="none", task_identity={})
    assert "MESH_TLS_CERT" not in insecure._environment(run)


@pytest.mark.parametrize("job_id", ["j-42", "odd job 'id'; rm -rf /"])
def test_the_discovery_script_is_sh_that_asks_mesh(tmp_path, job_id):
    script = tmp_path / DISCOVER
    script.write_text(discover_script(job_id))
    script.chmod(0o755)
    subprocess.run(["sh", "-n", str(script)], check=True)
    # A stand-in `mesh` that prints its argv: the script must pass the job id whole.
    fake = tmp_path / "mesh"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\nprint(repr(sys.argv[1:]))\nprint('10.0.0.1:2')\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "MESH_CLI": str(fake)}
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=True)
    args, hosts = out.stdout.splitlines()
    assert args == repr(["job", "hosts", job_id, "--format", "horovod"])
    assert hosts == "10.0.0.1:2"
    # Without $MESH_CLI it runs `mesh` from the PATH.
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env.pop("MESH_CLI", None)
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == args


def test_a_launch_is_plain_data():
    spec = _spec("mpi", 1)
    out = launch(spec, spec.tasks[0], _ctx(_peers("a"), 0))
    assert isinstance(out, Launch) and out == launch(spec, spec.tasks[0], _ctx(_peers("a"), 0))
