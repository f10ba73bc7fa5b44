"""GPU grants without a GPU: env, watchdog verdicts, enforcement levels, and a real kill."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import time

import pytest

from agent.executor import ExecSpec, ProcessExecutor
from agent.gpu import (
    NO_GPU,
    GpuGrantError,
    GpuWatchdog,
    Overuse,
    WatchedTask,
    enforcement,
    gpu_grant,
    mps_daemon_up,
    mps_pipe_dir,
    over_grant,
    task_env,
)
from agent.probe import GpuInfo, GpuProbe, HostProbe, HostSample
from agent.service import Agent, AgentConfig, _outcome
from mesh import subjects
from mesh.codec import encode
from mesh.connect import connect
from mesh.schema import Assignment, Resources, TaskEvent, TaskSpec, decode_task_events
from workloads.lifecycle import ENDED

GiB = 1 << 30
MPS = "/run/mps"


async def eventually(pred, timeout: float = 10.0, interval: float = 0.02):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


# ---------------------------------------------------------------------- grants and env


def test_fractional_grant_without_mps_is_placement_only():
    g = gpu_grant(250, 10 * GiB, ["GPU-a"])
    assert g.fractional and g.memory_per_gpu == 10 * GiB
    assert task_env(g) == {"CUDA_VISIBLE_DEVICES": "GPU-a"}


def test_fractional_grant_under_mps_caps_threads_and_memory():
    env = task_env(gpu_grant(250, 10 * GiB, ["GPU-a"]), mps_pipe_dir=MPS)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_MPS_PIPE_DIRECTORY": MPS,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }


@pytest.mark.parametrize("milli, pct", [(1, "1"), (5, "1"), (333, "34"), (999, "100")])
def test_thread_percentage_rounds_up_and_is_at_least_one(milli, pct):
    env = task_env(gpu_grant(milli, 0, ["GPU-a"]), mps_pipe_dir=MPS)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == pct
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env  # 0: no memory limit to give


def test_whole_gpus_split_memory_per_device_ordinal():
    g = gpu_grant(2000, 20 * GiB, ["GPU-a", "GPU-b"])
    assert not g.fractional and g.memory_per_gpu == 10 * GiB
    env = task_env(g, mps_pipe_dir=MPS)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M,1=10240M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # whole GPUs: all their SMs
    assert task_env(g) == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


def test_memory_limit_rounds_down_never_above_the_grant():
    g = gpu_grant(2000, 3 * GiB + 3, ["GPU-a", "GPU-b"])  # 1.5 GiB + 1 byte each
    assert task_env(g, mps_pipe_dir=MPS)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1536M,1=1536M"
    tiny = gpu_grant(100, 1000, ["GPU-a"])
    assert task_env(tiny, mps_pipe_dir=MPS)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1M"


def test_whole_gpus_without_memory_limit():
    env = task_env(gpu_grant(1000, 0, ["GPU-a"]), mps_pipe_dir=MPS)
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-a", "CUDA_MPS_PIPE_DIRECTORY": MPS}


def test_no_gpu_no_env():
    assert gpu_grant(0, 0, []) is NO_GPU
    assert task_env(NO_GPU, mps_pipe_dir=MPS) == {}
    # uuids without an amount still pin the task to them
    assert task_env(gpu_grant(0, 0, ["GPU-a"])) == {"CUDA_VISIBLE_DEVICES": "GPU-a"}


def test_mig_device_uuid_is_accepted():
    g = gpu_grant(1000, 0, ["MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0"])
    assert task_env(g)["CUDA_VISIBLE_DEVICES"] == g.uuids[0]


@pytest.mark.parametrize(
    "milli, memory, uuids, match",
    [
        (250, 0, [], "names none"),
        (2000, 0, [], "names none"),
        (250, 0, ["GPU-a", "GPU-b"], "takes 1 GPU uuid"),
        (2000, 0, ["GPU-a"], "takes 2 GPU uuid"),
        (1500, 0, ["GPU-a", "GPU-b"], "only whole GPUs"),
        (1000, 0, ["GPU-a,GPU-b"], "invalid GPU uuid"),
        (1000, 0, ["GPU-a\n"], "invalid GPU uuid"),
        (1000, 0, [""], "invalid GPU uuid"),
        (2000, 0, ["GPU-a", "GPU-a"], "repeat"),
        (-1, 0, ["GPU-a"], "negative"),
    ],
)
def test_inconsistent_grants_are_refused(milli, memory, uuids, match):
    with pytest.raises(GpuGrantError, match=match):
        gpu_grant(milli, memory, uuids)


# ---------------------------------------------------------------------- watchdog verdicts


def watched(key, milli, memory, uuids, pids) -> WatchedTask:
    return WatchedTask(key, gpu_grant(milli, memory, uuids), frozenset(pids))


def test_verdict_flags_only_the_task_over_its_grant():
    tasks = [
        watched("over", 250, 10 * GiB, ["GPU-a"], [10, 11]),
        watched("under", 250, 10 * GiB, ["GPU-a"], [20]),
        watched("exact", 250, 10 * GiB, ["GPU-a"], [30]),
    ]
    usage = {"GPU-a": {10: 8 * GiB, 11: 4 * GiB, 20: 9 * GiB, 30: 10 * GiB, 99: 70 * GiB}}
    (found,) = over_grant(tasks, usage)
    assert found == Overuse("over", "GPU-a", 12 * GiB, 10 * GiB)  # summed over its processes
    assert found.message == "gpu memory 12.0 GiB on GPU-a exceeds its grant of 10.0 GiB"


def test_verdict_ignores_processes_of_no_task():
    tasks = [watched("t", 250, GiB, ["GPU-a"], [1])]
    assert over_grant(tasks, {"GPU-a": {2: 80 * GiB}, "GPU-b": {3: 80 * GiB}}) == []


def test_verdict_per_gpu_for_whole_gpus():
    tasks = [watched("t", 2000, 20 * GiB, ["GPU-a", "GPU-b"], [1, 2])]
    # 15 GiB in total would fit 20, but GPU-b holds 11 of its 10 GiB there
    assert over_grant(tasks, {"GPU-a": {1: 4 * GiB}, "GPU-b": {2: 11 * GiB}}) == [
        Overuse("t", "GPU-b", 11 * GiB, 10 * GiB)
    ]


def test_verdict_no_memory_limit_and_gpus_not_granted():
    tasks = [
        watched("whole", 1000, 0, ["GPU-a"], [1]),
        watched("cpu-only", 0, 0, [], [2]),
    ]
    found = over_grant(tasks, {"GPU-a": {1: 79 * GiB}, "GPU-b": {1: GiB, 2: GiB // 2}})
    assert found == [Overuse("whole", "GPU-b", GiB, 0), Overuse("cpu-only", "GPU-b", GiB // 2, 0)]
    assert found[1].message == "gpu memory 0.5 GiB on GPU-b, a GPU not granted to the task"
    # a process holding nothing (NVML could not tell) is no violation
    assert over_grant(tasks, {"GPU-b": {2: 0}}) == []


# ---------------------------------------------------------------------- enforcement level


@pytest.mark.parametrize(
    "mig, mps, nvml, level",
    [
        (True, True, True, "mig"),
        (True, False, False, "mig"),
        (False, True, True, "mps"),
        (False, True, False, "mps"),
        (False, False, True, "watchdog"),
        (False, False, False, "none"),
    ],
)
def test_enforcement_strongest_available_wins(mig, mps, nvml, level):
    assert enforcement(mig_enabled=mig, mps=mps, nvml=nvml) == level


def test_mps_pipe_dir_defaults_like_cuda():
    assert mps_pipe_dir({}) == "/tmp/nvidia-mps"
    assert mps_pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": ""}) == "/tmp/nvidia-mps"
    assert mps_pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": MPS}) == MPS


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_mps_daemon_detection(tmp_path):
    assert not mps_daemon_up(tmp_path / "absent")
    assert not mps_daemon_up(tmp_path)  # no control pipe
    (tmp_path / "control").write_text("")
    assert not mps_daemon_up(tmp_path)  # a plain file is no daemon's pipe
    (tmp_path / "control").unlink()
    os.mkfifo(tmp_path / "control")
    assert mps_daemon_up(tmp_path)  # no pid file: the pipe is all there is to go by
    pid_file = tmp_path / "nvidia-cuda-mps-control.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert mps_daemon_up(tmp_path)
    pid_file.write_text(f"{dead_pid()}\n")
    assert not mps_daemon_up(tmp_path)  # pipes a SIGKILLed daemon left behind
    pid_file.write_text("garbage")
    assert not mps_daemon_up(tmp_path)


def test_mps_daemon_detection_on_a_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "control"))
        assert mps_daemon_up(tmp_path)
    finally:
        sock.close()


def test_real_probe_here_reports_gpus_consistently(tmp_path):
    gpu = GpuProbe()
    if not gpu.open():  # this machine: no NVML, a normal CPU node
        assert gpu.error is not None and gpu.error.startswith("NVML unavailable: ")
        assert gpu.sample() == () and gpu.process_memory() == {}
        assert HostProbe(tmp_path, gpu).sample().gpus == ()
        return
    try:  # a GPU machine: the same facts through every path
        gpus = gpu.sample()
        assert all(isinstance(g.mig_enabled, bool) for g in gpus)
        assert set(gpu.process_memory()) <= {g.uuid for g in gpus}
    finally:
        gpu.close()


# ---------------------------------------------------------------------- watchdog service


async def test_watchdog_check_watches_only_the_gpus_it_is_given():
    usage = {"GPU-a": {1: 2 * GiB}, "GPU-b": {1: 2 * GiB}}
    reported: list[list[Overuse]] = []

    async def on_over(found):
        reported.append(found)

    watched_gpus = ["GPU-b"]
    dog = GpuWatchdog(
        lambda: usage,
        lambda: [watched("t", 250, GiB, ["GPU-a"], [1])],
        on_over,
        watched=lambda: watched_gpus,
    )
    assert await dog.check() == [Overuse("t", "GPU-b", 2 * GiB, 0)]  # GPU-a is MPS's to guard
    watched_gpus.clear()
    assert await dog.check() == []  # nothing left to watch: NVML is not even asked
    assert len(reported) == 1


async def test_watchdog_survives_a_failing_reader_and_stops_cleanly():
    calls = 0

    def read():
        nonlocal calls
        calls += 1
        raise RuntimeError("NVML went away")

    async def on_over(found):
        raise AssertionError("nothing to report")

    dog = GpuWatchdog(read, list, on_over, interval_s=0.01)
    await dog.start()
    await eventually(lambda: calls >= 3)
    assert dog.error == "NVML went away"
    await dog.stop()
    seen = calls
    await asyncio.sleep(0.05)
    assert calls == seen  # nothing polls after stop()
    await dog.stop()  # twice is fine
    with pytest.raises(ValueError):
        GpuWatchdog(read, list, on_over, interval_s=0)


async def test_watchdog_kills_a_real_process_over_its_grant(tmp_path):
    """The chain the agent runs: usage over grant -> kill with a reason -> FAILED, not KILLED."""
    ex = ProcessExecutor(tmp_path / "work")
    handle = await ex.start(ExecSpec("gpu-task#0", ("sleep", "30")))
    sleeper = await eventually(lambda: ex.processes(handle) - {handle.pid})
    usage = {"GPU-a": {next(iter(sleeper)): 12 * GiB, 4242: 60 * GiB}}
    grant = gpu_grant(250, 10 * GiB, ["GPU-a"])

    async def on_over(found):
        for over in found:
            reason = f"killed by the GPU watchdog: {over.message}"
            asyncio.ensure_future(ex.kill(handle, 1.0, reason=reason))

    dog = GpuWatchdog(
        lambda: usage,
        lambda: [WatchedTask("gpu-task#0", grant, ex.processes(handle))],
        on_over,
        interval_s=0.05,
    )
    await dog.start()
    try:
        status = await asyncio.wait_for(ex.wait(handle), 10)
    finally:
        await dog.stop()
    assert status.killed and status.signal == 15
    assert _outcome(status) == (
        "FAILED",
        "killed by the GPU watchdog: gpu memory 12.0 GiB on GPU-a exceeds its grant of 10.0 GiB",
    )
    # the reason is on disk, so an agent that restarts reads the same outcome back
    again = ex.adopt(handle.task_id, handle.pid, handle.start_time)
    assert again is not None and _outcome(await ex.wait(again))[0] == "FAILED"


async def test_a_plain_kill_is_still_killed(tmp_path):
    ex = ProcessExecutor(tmp_path / "work")
    handle = await ex.start(ExecSpec("k", ("sleep", "30")))
    await ex.kill(handle, 1.0)
    assert _outcome(await ex.wait(handle)) == ("KILLED", "killed")


# ---------------------------------------------------------------------- the agent, end to end


class FakeGpus(GpuProbe):
    """One watchdog-level GPU whose per-process memory the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.usage: dict[str, dict[int, int]] = {}

    @property
    def is_open(self) -> bool:
        return True

    def open(self) -> bool:
        return True

    def sample(self) -> tuple[GpuInfo, ...]:
        return (GpuInfo(0, "GPU-fake", "Fake GPU", 16 * GiB, 0, 0),)

    def process_memory(self) -> dict[str, dict[int, int]]:
        return self.usage

    def close(self) -> None:
        pass


def test_agent_claims_mps_only_while_its_daemon_is_up(tmp_path):
    agent = Agent(AgentConfig("nats://unused", data_dir=str(tmp_path / "a")), gpu_probe=FakeGpus())
    agent._mps_dir = str(tmp_path / "mps")
    sample = HostSample(8, 0.0, 0.0, 16 * GiB, GiB, 100 * GiB, GiB, agent.gpus.sample())
    grant = gpu_grant(500, 4 * GiB, ["GPU-fake"])
    assert [g.enforcement for g in agent.node_state(sample).gpus] == ["watchdog"]
    assert agent._gpu_env(grant) == {"CUDA_VISIBLE_DEVICES": "GPU-fake"}
    (tmp_path / "mps").mkdir()
    os.mkfifo(tmp_path / "mps" / "control")
    assert [g.enforcement for g in agent.node_state(sample).gpus] == ["mps"]
    assert agent._gpu_env(grant) == task_env(grant, mps_pipe_dir=str(tmp_path / "mps"))
    mig = dataclasses.replace(sample, gpus=(dataclasses.replace(sample.gpus[0], mig_enabled=True),))
    assert [g.enforcement for g in agent.node_state(mig).gpus] == ["mig"]


async def test_agent_reports_watchdog_sets_env_and_fails_an_overusing_task(nats_server, tmp_path):
    gpus = FakeGpus()
    agent = Agent(
        AgentConfig(
            nats_server.url,
            node_id="g1",
            data_dir=str(tmp_path / "a"),
            gpu_watchdog_s=0.05,
            allow_root=os.geteuid() == 0,
        ),
        gpu_probe=gpus,
    )
    agent._mps_dir = str(tmp_path / "no-mps")  # whatever this host runs, no daemon here
    nc = await connect(nats_server.url, name="test")
    events: list[TaskEvent] = []

    async def collect(msg) -> None:
        events.extend(decode_task_events(msg.data)[1])

    await nc.subscribe(subjects.events_all("default"), cb=collect)
    try:
        await agent.start()
        (status,) = agent.node_state(agent.probe.sample()).gpus
        assert status.enforcement == "watchdog"
        js = nc.jetstream()

        async def assign(task_id: str, spec: TaskSpec) -> None:
            a = Assignment("run", "g1", "j", task_id, 0, 1, time.time(), spec)
            await js.publish(
                subjects.assign("default", "g1"),
                encode(a),
                stream=subjects.assign_stream("default"),
            )

        def ended(task_id: str) -> TaskEvent | None:
            return next((e for e in events if e.task_id == task_id and e.state in ENDED), None)

        await assign(
            "hog",
            TaskSpec(
                argv=("sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"; exec sleep 30'),
                env={"CUDA_VISIBLE_DEVICES": "GPU-other"},  # the grant wins over the task's own
                resources=Resources(gpu=500, gpu_memory=4 * GiB),
                gpu_uuids=("GPU-fake",),
            ),
        )
        await assign("nameless", TaskSpec(argv=("true",), resources=Resources(gpu=1000)))
        refused = await eventually(lambda: ended("nameless"))
        assert refused.state == "FAILED" and "names none" in refused.message

        handle = await eventually(lambda: agent.handles.get(("hog", 0)))
        sleeper = await eventually(lambda: agent.executor.processes(handle) - {handle.pid})
        await eventually(lambda: agent.executor.read_log("hog#0") == b"GPU-fake\n")
        gpus.usage = {"GPU-fake": {next(iter(sleeper)): 5 * GiB}}
        failed = await eventually(lambda: ended("hog"))
        assert failed.state == "FAILED" and failed.signal == 15
        assert failed.message == (
            "killed by the GPU watchdog: "
            "gpu memory 5.0 GiB on GPU-fake exceeds its grant of 4.0 GiB"
        )
    finally:
        await agent.stop(kill_tasks=True)
        await nc.close()
