"""The pytorch and pytorch-elastic adapters: argv and env for given placements and
generations (tests/integration/test_torchrun_adapter.py runs them for real)."""

from __future__ import annotations

import pytest

from workloads.frameworks import Peer, TaskContext
from workloads.frameworks.torch import (
    RESIZE_ALLOWANCE,
    primary_task,
    pytorch,
    pytorch_elastic,
    pytorch_elastic_ports,
    pytorch_ports,
    rendezvous_task,
    torchrun_command,
)
from workloads.quantity import SpecError
from workloads.spec import JobSpec, TaskGroup

RUN = ("python", "-m", "torch.distributed.run")


def _spec(framework: str, count: int = 3, command=("python", "train.py", "--lr", "0.1"), **kw):
    group = TaskGroup(
        role="worker", count=count, command=command, env=(("A", "1"), ("RANK", "user"))
    )
    return JobSpec(name="t", tasks=(group,), framework=framework, **kw)


def _peers(n: int, port_name: str, port: int = 24000) -> tuple[Peer, ...]:
    return tuple(
        Peer("worker", i, f"10.0.0.{i + 1}", ((port_name, port),) if i == 0 else ())
        for i in range(n)
    )


def _flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_static_argv_names_the_master_and_this_node_rank() -> None:
    spec = _spec("pytorch", slots_per_node=2)
    ctx = TaskContext("job-1", "worker", 2, 1, _peers(3, "master"))
    launch = pytorch(spec, spec.tasks[0], ctx)
    assert launch.argv == (
        *RUN,
        "--nnodes", "3",
        "--nproc-per-node", "2",
        "--node-rank", "2",
        "--master-addr", "10.0.0.1",
        "--master-port", "24000",
        "--local-addr", "10.0.0.3",
        "--max-restarts", "0",
        "train.py", "--lr", "0.1",
    )  # fmt: skip
    env = dict(launch.env)
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "24000"
    assert env["WORLD_SIZE"] == "6" and env["RANK"] == "4" and env["NODE_RANK"] == "2"
    assert env["A"] == "1"  # the group's own env kept, the framework's wins
    assert env["MESH_WORKER_HOSTS"] == "10.0.0.1,10.0.0.2,10.0.0.3"
    assert env["MESH_TASK_INDEX"] == "2" and env["MESH_GENERATION"] == "1"
    assert [k for k, _ in launch.env] == sorted(k for k, _ in launch.env)
    assert not any(k.startswith("PET_") for k in env)


def test_elastic_argv_and_pet_env_agree() -> None:
    spec = _spec("pytorch-elastic", workers_min=2, workers_max=4, max_restarts=3)
    ctx = TaskContext("job-7", "worker", 1, 5, _peers(3, "rdzv", 25000))
    launch = pytorch_elastic(spec, spec.tasks[0], ctx)
    argv, env = launch.argv, dict(launch.env)
    assert argv[:3] == RUN and argv[-3:] == ("train.py", "--lr", "0.1")
    assert _flag(argv, "--nnodes") == env["PET_NNODES"] == "2:4"
    assert _flag(argv, "--nproc-per-node") == env["PET_NPROC_PER_NODE"] == "1"
    assert _flag(argv, "--rdzv-backend") == env["PET_RDZV_BACKEND"] == "c10d"
    assert _flag(argv, "--rdzv-endpoint") == env["PET_RDZV_ENDPOINT"] == "10.0.0.1:25000"
    assert _flag(argv, "--rdzv-id") == env["PET_RDZV_ID"] == "job-7"
    assert _flag(argv, "--local-addr") == env["PET_LOCAL_ADDR"] == "10.0.0.2"
    restarts = _flag(argv, "--max-restarts")
    assert restarts == env["PET_MAX_RESTARTS"] == str(3 + RESIZE_ALLOWANCE)
    conf = dict(kv.split("=") for kv in _flag(argv, "--rdzv-conf").split(","))
    assert conf == dict(kv.split("=") for kv in env["PET_RDZV_CONF"].split(","))
    assert conf["is_host"] == "false"  # only task 0 hosts the store
    assert conf["last_call_timeout"] == "1" and conf["keep_alive_interval"] == "1"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["MESH_GENERATION"] == "5" and env["MESH_WORKER_NUM"] == "3"
    assert "MASTER_ADDR" not in env  # torchrun's rendezvous gives the workers theirs


def test_elastic_task_zero_hosts_the_store_and_a_fixed_size_is_n_to_n() -> None:
    spec = _spec("pytorch-elastic", count=2)
    launch = pytorch_elastic(
        spec, spec.tasks[0], TaskContext("j", "worker", 0, 1, _peers(2, "rdzv"))
    )
    assert "is_host=true" in _flag(launch.argv, "--rdzv-conf")
    assert _flag(launch.argv, "--nnodes") == "2:2"


def test_a_generation_changes_only_what_it_should() -> None:
    """A newcomer at generation 2 of a 2..3 job gets the same rendezvous as the first two."""
    spec = _spec("pytorch-elastic", workers_min=2, workers_max=3)
    group = spec.tasks[0]
    first = pytorch_elastic(spec, group, TaskContext("j", "worker", 1, 1, _peers(2, "rdzv")))
    later = pytorch_elastic(spec, group, TaskContext("j", "worker", 2, 2, _peers(3, "rdzv")))
    a, b = dict(first.env), dict(later.env)
    assert {k for k in a if a[k] != b.get(k)} == {
        "MESH_GENERATION",
        "MESH_TASK_INDEX",
        "MESH_WORKER_HOSTS",
        "MESH_WORKER_NUM",
        "PET_LOCAL_ADDR",
    }


@pytest.mark.parametrize(
    ("command", "launcher", "target"),
    [
        (("python", "t.py", "-x"), RUN, ("t.py", "-x")),
        (("python3", "-u", "t.py"), ("python3", *RUN[1:]), ("t.py",)),
        (("/opt/v/bin/python3.11", "t.py"), ("/opt/v/bin/python3.11", *RUN[1:]), ("t.py",)),
        (("python", "-m", "pkg.train", "--a"), RUN, ("--module", "pkg.train", "--a")),
        (("t.py", "--a"), RUN, ("t.py", "--a")),
        (("/bin/sh", "-c", "python t.py"), RUN, ("--no-python", "/bin/sh", "-c", "python t.py")),
        (("./train",), RUN, ("--no-python", "./train")),
    ],
)
def test_commands_torchrun_accepts(command, launcher, target) -> None:
    assert torchrun_command(command) == (launcher, target)


@pytest.mark.parametrize(
    "command",
    [
        (),
        ("torchrun", "t.py"),
        ("python", "-m", "torch.distributed.run", "t.py"),
        ("python",),
        ("python", "-O", "t.py"),
        ("python", "-m"),
    ],
)
def test_commands_refused_name_the_field(command) -> None:
    with pytest.raises(SpecError) as err:
        torchrun_command(command)
    assert "command" in str(err.value)


def test_ports_and_roles() -> None:
    static, elastic = _spec("pytorch"), _spec("pytorch-elastic", workers_min=1, workers_max=3)
    group = TaskGroup(role="worker", count=3, command=("t.py",), ports=("metrics",))
    assert pytorch_ports(static, group, 0) == ("metrics", "master")
    assert pytorch_ports(static, group, 1) == ("metrics",)
    assert pytorch_elastic_ports(elastic, group, 0) == ("metrics", "rdzv")
    assert pytorch_elastic_ports(elastic, group, 2) == ("metrics",)
    assert rendezvous_task(static) == rendezvous_task(elastic) == ("worker", 0)
    assert primary_task(static) is None
    assert primary_task(elastic) == ("worker", 0)


def test_a_missing_task_zero_or_port_is_a_clear_error() -> None:
    spec = _spec("pytorch-elastic", workers_min=1, workers_max=3)
    peers = _peers(3, "rdzv")[1:]
    with pytest.raises(ValueError, match=r"worker\[0\] is not placed"):
        pytorch_elastic(spec, spec.tasks[0], TaskContext("j", "worker", 1, 1, peers))
    with pytest.raises(ValueError, match="no 'master' port"):
        pytorch(spec, spec.tasks[0], TaskContext("j", "worker", 0, 1, _peers(3, "rdzv")))
