"""The spark adapter's argv and env, run for real without Mesh: a master, two workers and
a driver on 127.0.0.1 count the words of a generated file.

Each task is started as the agent would start it (agent/executor.py): its own process
group, PATH led by this interpreter's directory (where pyspark's scripts are), its
``Launch.files`` written to a files directory that replaces ``@files/``. The master
starts last, after the workers and the driver, so that their wait for it is exercised.
When the driver ends the cluster is stopped by its process groups, as Mesh stops a job's
other tasks when its primary task ends, and no process of them may be left.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads.frameworks import FILES_PREFIX, Launch, Peer, TaskContext
from workloads.frameworks.spark import (
    JAVA_TOOL_OPTIONS,
    MASTER_WAIT_S,
    WAIT_SCRIPT,
    ports_for,
    spark,
)
from workloads.resources import Resources
from workloads.spec import JobSpec, TaskGroup

MiB = 2**20
APP = Path(__file__).resolve().parents[2] / "examples" / "training" / "wordcount.py"
# 512 MiB heaps (Spark's floor is 450) and one core each: worker = heap + overhead + daemon.
WORKER = Resources(cpu=1000, memory=(512 + 384 + 256) * MiB)
DRIVER = Resources(cpu=1000, memory=(512 + 384) * MiB)
MASTER = Resources(cpu=500, memory=512 * MiB)
# Short-lived JVMs on 2 shared cores: C1 only and one GC thread halve their start's CPU.
# The group's own JAVA_TOOL_OPTIONS replaces the adapter's, so its flags are kept too.
FAST_JVM = (("JAVA_TOOL_OPTIONS", f"{JAVA_TOOL_OPTIONS} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"),)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _materialize(launch: Launch, root: Path) -> tuple[list[str], dict[str, str]]:
    """What the agent does with a Launch: write its files, put their directory in place
    of @files/, and give it the agent's base environment."""
    files = root / "files"
    files.mkdir(parents=True)
    for name, content in launch.files:
        (files / name).write_text(content)

    def sub(value: str) -> str:
        return str(files / value[len(FILES_PREFIX) :]) if value.startswith(FILES_PREFIX) else value

    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {"PATH": path, "HOME": os.environ.get("HOME", str(root)), "LANG": "C.UTF-8"}
    env.update({k: sub(v) for k, v in launch.env})
    env["MESH_FILES_DIR"] = str(files)
    return [sub(a) for a in launch.argv], env


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _procs() -> list[tuple[int, int, str]]:
    """(process group, resident bytes, command line) of every live process, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            out.append((int(fields[2]), int(fields[21]) * _PAGE, cmd[:120]))
    return out


def _working_in(root: Path) -> list[str]:
    """Live processes whose working directory is under root."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(os.readlink(f"/proc/{entry}/cwd")).is_relative_to(root):
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes()[:120].decode())
        except OSError:
            continue
    return found


# (phase, log, line that marks its end, how many of them)
_PHASES = (
    ("master up", "master-0", "Starting Spark master", 1),
    ("workers registered", "master-0", "Registering worker", 2),
    ("app registered", "master-0", "Registered app", 1),
    ("executors registered", "driver-0", "Registered executor", 2),
    ("job done", "driver-0", "Job 0 finished", 1),
)


def _watch(started: dict[str, subprocess.Popen[bytes]], logs: dict[str, Path], t0: float):
    """Wait for the driver to end, noting when each phase's log line first appeared and
    each task's peak resident memory (its process group's, as a cgroup would count it).
    A master or worker that exits first fails the test at once, with its log."""
    seen: dict[str, float] = {}
    peak = dict.fromkeys(started, 0)
    group = {proc.pid: name for name, proc in started.items()}
    driver = started["driver-0"]
    while driver.poll() is None and time.monotonic() < t0 + 120:
        for name, proc in started.items():
            if proc is not driver and proc.poll() is not None:
                tail = logs[name].read_text(errors="replace")[-3000:]
                pytest.fail(f"{name} exited {proc.returncode} before the driver:\n{tail}")
        for phase, name, line, n in _PHASES:
            if phase not in seen and logs[name].read_text(errors="replace").count(line) >= n:
                seen[phase] = time.monotonic() - t0
        rss: dict[str, int] = collections.Counter()
        for pgid, resident, _ in _procs():
            if pgid in group:
                rss[group[pgid]] += resident
        for name, total in rss.items():
            peak[name] = max(peak[name], total)
        time.sleep(0.1)
    if driver.poll() is None:
        driver.kill()
    driver.wait()
    seen["driver exit"] = time.monotonic() - t0
    return seen, peak


def _words(path: Path) -> collections.Counter[str]:
    rng = random.Random(22)
    vocab = [f"w{i}" for i in range(40)] + ["spark", "mesh", "gang"]
    lines = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 12))) for _ in range(500)]
    path.write_text("\n".join(lines) + "\n")
    return collections.Counter(w for line in lines for w in line.split())


def test_wait_script_waits_then_execs_or_names_the_master(tmp_path):
    spec = _spec(("app.py",))
    ctx = TaskContext("job-wc", "driver", 0, 1, _placed(spec, _free_ports(9)))
    script = tmp_path / WAIT_SCRIPT
    script.write_text(dict(spark(spec, spec.tasks[2], ctx).files)[WAIT_SCRIPT])
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        ok = subprocess.run(
            [sys.executable, script, "127.0.0.1", str(port), "5", "sh", "-c", "exit 7"],
            capture_output=True,
            timeout=30,
        )
    assert ok.returncode == 7  # it became the command
    closed = subprocess.run(
        [sys.executable, script, "127.0.0.1", str(port), "0.3", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert closed.returncode == 1
    assert f"Spark master at 127.0.0.1:{port}" in closed.stderr
    assert MASTER_WAIT_S >= 60  # the gang starts together: a JVM start is seconds, not minutes


def _spec(command: tuple[str, ...]) -> JobSpec:
    return JobSpec(
        name="wordcount",
        framework="spark",
        tasks=(
            TaskGroup("master", env=FAST_JVM, resources=MASTER),
            TaskGroup("worker", count=2, env=FAST_JVM, resources=WORKER),
            TaskGroup("driver", command=command, env=FAST_JVM, resources=DRIVER),
        ),
    )


def _placed(spec: JobSpec, free: list[int]) -> tuple[Peer, ...]:
    """Every task of the spec on 127.0.0.1, its named ports taken from ``free``."""
    it = iter(free)
    names = {g.role: g.ports + ports_for(spec, g, 0) for g in spec.tasks}
    return tuple(
        Peer(g.role, i, "127.0.0.1", tuple(sorted((n, next(it)) for n in names[g.role])))
        for g in spec.tasks
        for i in range(g.count)
    )


def test_master_two_workers_and_a_driver_count_words(tmp_path):
    expected = _words(tmp_path / "input.txt")
    target = tmp_path / "counts.json"
    spec = _spec((str(APP), str(tmp_path / "input.txt"), str(target)))
    groups = {g.role: g for g in spec.tasks}
    peers = _placed(spec, _free_ports(9))
    started: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    t0 = time.monotonic()
    try:
        # Workers and driver first: they must wait for the master, not fail or idle 10 s.
        for peer in (*peers[1:], peers[0]):
            name = f"{peer.role}-{peer.index}"
            ctx = TaskContext("job-wc", peer.role, peer.index, 1, peers)
            argv, env = _materialize(spark(spec, groups[peer.role], ctx), tmp_path / name)
            logs[name] = tmp_path / name / "out.log"
            with logs[name].open("wb") as log:
                started[name] = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=tmp_path / name,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if peer.role == "driver":
                time.sleep(0.5)  # the master comes up late
        phases, peak = _watch(started, logs, t0)
        rc = started["driver-0"].returncode
        driver_log = logs["driver-0"].read_text(errors="replace")
        assert rc == 0, driver_log[-4000:]
        result = json.loads(target.read_text())
        assert result["total"] == sum(expected.values())
        assert result["counts"] == dict(expected)
        assert result["distinct"] == len(expected)
        assert result["executors"] == 2  # both workers' executors, not just one
        for name in ("worker-0", "worker-1"):
            text = logs[name].read_text(errors="replace")
            assert "Successfully registered with master" in text, text[-3000:]
            assert "Retrying connection to master" not in text  # it waited, then connected
        for name, resident in peak.items():  # the memory rule holds with room to spare
            asked = groups[name.split("-")[0]].resources.memory
            assert 0 < resident < asked, f"{name}: {resident / MiB:.0f} of {asked / MiB:.0f} MiB"
    finally:
        t1 = time.monotonic()
        for proc in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    groups_ids = {p.pid for p in started.values()}
    deadline = time.monotonic() + 15
    while (left := [p for p in _procs() if p[0] in groups_ids]) and time.monotonic() < deadline:
        time.sleep(0.2)
    t_stop = time.monotonic() - t1
    assert not left, f"left behind after the cluster stopped: {left}"
    assert not _working_in(tmp_path)  # nothing escaped its group either (an executor's cwd)
    shown = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
    rss = ", ".join(f"{k} {v / MiB:.0f}" for k, v in peak.items())
    print(f"spark phases (s from the first start): {shown}; stop {t_stop:.1f}")
    print(f"spark peak resident MiB: {rss}")
