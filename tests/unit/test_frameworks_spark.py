"""The spark adapter: each role's argv, env and files for given placements."""

from __future__ import annotations

import pytest

from workloads.frameworks import FILES_PREFIX, Peer, TaskContext
from workloads.frameworks.spark import (
    JAVA_TOOL_OPTIONS,
    MASTER_CLASS,
    PRIMARY,
    RENDEZVOUS,
    WAIT_SCRIPT,
    WORKER_CLASS,
    executor_memory,
    ports_for,
    primary,
    rendezvous,
    spark,
)
from workloads.resources import Resources
from workloads.spark_memory import MIN_DRIVER_MEMORY, MIN_HEAP, MIN_WORKER_MEMORY
from workloads.spec import JobSpec, TaskGroup

MiB = 2**20
GiB = 2**30


def _spec(worker_cpu=2500, worker_mem=4 * GiB, workers=2, env=(), command=("app.py", "in", "out")):
    return JobSpec(
        name="wc",
        framework="spark",
        tasks=(
            TaskGroup("master", env=env, resources=Resources(cpu=100, memory=64 * MiB)),
            TaskGroup(
                "worker",
                count=workers,
                env=env,
                resources=Resources(cpu=worker_cpu, memory=worker_mem),
            ),
            TaskGroup(
                "driver", command=command, env=env, resources=Resources(cpu=1000, memory=2 * GiB)
            ),
        ),
    )


PEERS = (
    Peer("master", 0, "10.0.0.1", (("spark", 20001), ("webui", 20002)), "n1"),
    Peer("worker", 0, "10.0.0.2", (("spark", 20010), ("webui", 20011)), "n2"),
    Peer("worker", 1, "10.0.0.3", (("spark", 20020), ("webui", 20021)), "n3"),
    Peer(
        "driver",
        0,
        "10.0.0.4",
        (("blockmanager", 20031), ("driver", 20030), ("webui", 20032)),
        "n4",
    ),
)


def _launch(spec, role, index=0, peers=PEERS, generation=1):
    group = next(g for g in spec.tasks if g.role == role)
    return spark(spec, group, TaskContext("job-1", role, index, generation, peers))


def _after(argv, flag):
    return argv[argv.index(flag) + 1]


def _confs(argv):
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")


def test_master_runs_the_daemon_on_its_host_and_ports():
    launch = _launch(_spec(), "master")
    assert launch.argv == (
        "spark-class",
        MASTER_CLASS,
        "--host",
        "10.0.0.1",
        "--port",
        "20001",
        "--webui-port",
        "20002",
    )
    env = dict(launch.env)
    assert env["SPARK_DAEMON_MEMORY"] == "128m"  # 64 MiB asked: the daemon's floor
    assert env["SPARK_LOCAL_IP"] == "10.0.0.1"
    assert env["SPARK_MASTER_URL"] == "spark://10.0.0.1:20001"
    assert env["MESH_TASK_ROLE"] == "master" and env["MESH_PORT_SPARK"] == "20001"
    assert env["MESH_WORKER_HOSTS"] == "10.0.0.2,10.0.0.3" and env["MESH_WORKER_NUM"] == "2"
    assert env["JAVA_TOOL_OPTIONS"] == JAVA_TOOL_OPTIONS
    assert launch.files == ()  # the master waits for nobody
    assert list(launch.env) == sorted(launch.env)


def test_worker_waits_for_the_master_then_offers_whole_cores_and_memory_less_overhead():
    spec = _spec(worker_cpu=2500, worker_mem=4 * GiB)
    launch = _launch(spec, "worker", 1)
    argv = launch.argv
    assert argv[:5] == ("python3", FILES_PREFIX + WAIT_SCRIPT, "10.0.0.1", "20001", "120")
    assert argv[5:8] == ("spark-class", WORKER_CLASS, "spark://10.0.0.1:20001")
    assert _after(argv, "--host") == "10.0.0.3"
    assert _after(argv, "--port") == "20020"
    assert _after(argv, "--webui-port") == "20021"
    assert _after(argv, "--cores") == "2"  # 2.5 cpu: whole cores only
    # 4 GiB - 256 MiB daemon = 3840 MiB, less max(384 MiB, 10%) = 3456 MiB.
    assert _after(argv, "--memory") == "3456m"
    assert WAIT_SCRIPT in dict(launch.files)
    env = dict(launch.env)
    assert env["SPARK_WORKER_DIR"] == FILES_PREFIX + "work"
    assert env["SPARK_LOCAL_DIRS"] == FILES_PREFIX + "local"
    assert env["SPARK_DAEMON_MEMORY"] == "128m"
    assert env["SPARK_LOCAL_IP"] == "10.0.0.3"
    assert env["MESH_TASK_INDEX"] == "1"


def test_a_worker_under_a_core_still_offers_one():
    assert _after(_launch(_spec(worker_cpu=500), "worker").argv, "--cores") == "1"


def test_driver_submits_the_users_command_to_the_master_with_its_own_ports():
    spec = _spec(command=("--py-files", "deps.zip", "app.py", "in.txt", "out.json"))
    argv = _launch(spec, "driver").argv
    submit = argv.index("spark-submit")
    assert argv[:submit] == ("python3", FILES_PREFIX + WAIT_SCRIPT, "10.0.0.1", "20001", "120")
    assert _after(argv, "--master") == "spark://10.0.0.1:20001"
    assert argv[-5:] == ("--py-files", "deps.zip", "app.py", "in.txt", "out.json")
    conf = _confs(argv)
    assert conf["spark.driver.host"] == "10.0.0.4"
    assert conf["spark.driver.port"] == "20030"
    assert conf["spark.driver.blockManager.port"] == "20031"
    assert conf["spark.ui.port"] == "20032"
    assert conf["spark.port.maxRetries"] == "0"
    assert conf["spark.cores.max"] == "4"  # 2 workers of 2 whole cores
    assert conf["spark.scheduler.minRegisteredResourcesRatio"] == "1.0"
    assert _after(argv, "--driver-memory") == "1664m"  # 2 GiB less 384 MiB
    assert _after(argv, "--executor-memory") == "3456m"  # what each worker offers
    assert _after(argv, "--executor-memory") == f"{executor_memory(spec) // MiB}m"
    assert dict(_launch(spec, "driver").env)["SPARK_LOCAL_DIRS"] == FILES_PREFIX + "local"


def test_large_tasks_keep_ten_percent_for_the_jvm():
    spec = _spec(worker_mem=16 * GiB)
    offer = 16 * GiB - 256 * MiB
    assert executor_memory(spec) == (offer - offer // 10) // MiB * MiB


def test_memory_floors_match_sparks_own():
    assert executor_memory(_spec(worker_mem=MIN_WORKER_MEMORY)) == MIN_HEAP
    assert executor_memory(_spec(worker_mem=MIN_WORKER_MEMORY - MiB)) < MIN_HEAP
    assert MIN_DRIVER_MEMORY - 384 * MiB == MIN_HEAP


def test_spark_home_in_the_groups_env_names_its_scripts_and_its_java_options_stay():
    env = (("JAVA_TOOL_OPTIONS", "-Xss1m"), ("SPARK_HOME", "/opt/spark/"))
    spec = _spec(env=env)
    assert _launch(spec, "master").argv[0] == "/opt/spark/bin/spark-class"
    assert "/opt/spark/bin/spark-class" in _launch(spec, "worker").argv
    assert "/opt/spark/bin/spark-submit" in _launch(spec, "driver").argv
    launched = dict(_launch(spec, "driver").env)
    assert launched["JAVA_TOOL_OPTIONS"] == "-Xss1m"  # the user's own wins here
    assert launched["SPARK_HOME"] == "/opt/spark/"


def test_the_frameworks_variables_win_over_the_groups():
    spec = _spec(env=(("SPARK_LOCAL_IP", "0.0.0.0"), ("MESH_TASK_INDEX", "9")))
    env = dict(_launch(spec, "worker", 1).env)
    assert env["SPARK_LOCAL_IP"] == "10.0.0.3" and env["MESH_TASK_INDEX"] == "1"


def test_each_role_is_given_its_own_ports():
    spec = _spec()
    master, worker, driver = spec.tasks
    assert ports_for(spec, master, 0) == ("spark", "webui")
    assert ports_for(spec, worker, 3) == ("spark", "webui")
    assert ports_for(spec, driver, 0) == ("driver", "blockmanager", "webui")


def test_rendezvous_is_the_master_and_the_driver_ends_the_job():
    assert rendezvous(_spec()) == RENDEZVOUS == ("master", 0)
    assert primary(_spec()) == PRIMARY == ("driver", 0)


def test_missing_master_or_port_is_a_clear_error():
    with pytest.raises(ValueError, match="no placed master"):
        _launch(_spec(), "driver", peers=PEERS[1:])
    no_port = (Peer("master", 0, "10.0.0.1", (("webui", 1),)), *PEERS[1:])
    with pytest.raises(ValueError, match=r"master\[0\] was given no 'spark' port"):
        _launch(_spec(), "worker", peers=no_port)
    odd = JobSpec(name="x", framework="spark", tasks=(TaskGroup("ps"),))
    with pytest.raises(ValueError, match="no such role 'ps'"):
        spark(odd, odd.tasks[0], TaskContext("j", "ps", 0, 1, (*PEERS, Peer("ps", 0, "h"))))
