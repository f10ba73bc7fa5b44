"""The torch adapters' argv and env, run for real without Mesh: torchrun agents on
127.0.0.1 started as the agent would start them (the adapter's exact argv and env, PATH
led by the interpreter's directory), running examples/training/tiny.py over gloo.

Elastic: 2 agents, a 3rd joins (scale up, a new round), the 3rd is SIGTERMed as Mesh
stops a task (its whole process group: scale down); the job completes with its steps
continuous, the loss falling and the world size 2 -> 3 -> 2. Static: 2 agents, then all
killed and 3 started at the new size from the checkpoint (the restart baseline a resize
is compared with). The resize times are printed (pytest -s) for docs/training.md.
slots_per_node > 1 (torchrun's --nproc-per-node) is covered by the unit tests only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mesh.server import free_port
from workloads.frameworks import Peer, TaskContext
from workloads.frameworks.torch import pytorch, pytorch_elastic
from workloads.spec import JobSpec, TaskGroup

TINY = Path(__file__).resolve().parents[2] / "examples" / "training" / "tiny.py"
HOST = "127.0.0.1"
SAVE_EVERY = 20


def _spec(framework: str, count: int, ckpt: Path, steps: int, **kw) -> JobSpec:
    group = TaskGroup(
        role="worker",
        count=count,
        command=(
            "python",
            str(TINY),
            "--steps",
            str(steps),
            "--step-sleep",
            "0.04",
            "--save-every",
            str(SAVE_EVERY),
        ),
        env=(("MESH_CHECKPOINT_DIR", str(ckpt)), ("OMP_NUM_THREADS", "1")),
    )
    return JobSpec(name="tiny", tasks=(group,), framework=framework, **kw)


class Agents:
    """torchrun agents as Mesh's agent runs tasks: each in its own session, stopped by
    SIGTERM to its process group."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, launch) -> None:
        env = dict(launch.env)
        bindir = os.path.dirname(sys.executable)
        env["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "/usr/bin:/bin")])
        env["MESH_PROGRESS_FILE"] = str(self.tmp / f"{name}.progress")
        env["LOGLEVEL"] = "INFO"  # torchrun's rendezvous steps, timed, in the task's log
        out = (self.tmp / f"{name}.log").open("w")
        self.procs[name] = subprocess.Popen(
            launch.argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def term(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGTERM)

    def wait(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running:\n{self.output(name)}") from None

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-4000:]

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _lines(ckpt: Path) -> list[dict]:
    path = ckpt / "train.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _steps(ckpt: Path) -> list[dict]:
    return [x for x in _lines(ckpt) if "event" not in x]


def _until(pred, timeout: float, what: str, agents: Agents):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    logs = "\n".join(f"--- {n}\n{agents.output(n)}" for n in agents.procs)
    raise AssertionError(f"not within {timeout}s: {what}\n{logs}")


def _first_at(ckpt: Path, world: int, after: float):
    """The first step line at `world` ranks logged after `after`."""
    return next((x for x in _steps(ckpt) if x["world_size"] == world and x["ts"] > after), None)


def _check_run(ckpt: Path, total: int) -> tuple[list[int], int]:
    """Every step 1..total trained, the loss falling; returns the world sizes in order
    (consecutive repeats folded) and how many steps were trained twice."""
    steps = _steps(ckpt)
    seen = [x["step"] for x in steps]
    assert set(seen) == set(range(1, total + 1)), "a step was skipped"
    repeats = len(seen) - len(set(seen))
    # A new generation resumes where the last one stopped: a start at step s follows a
    # logged step s (nothing skipped, nothing lost beyond what its checkpoint held).
    for start in (x for x in _lines(ckpt) if x.get("event") == "start" and x["step"]):
        assert start["step"] in seen
    loss = [x["loss"] for x in steps]
    assert sum(loss[-5:]) * 20 < sum(loss[:5]), (loss[:5], loss[-5:])
    worlds: list[int] = []
    for x in steps:
        if not worlds or worlds[-1] != x["world_size"]:
            worlds.append(x["world_size"])
    return worlds, repeats


def test_elastic_scale_up_and_down(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    total = 300
    spec = _spec("pytorch-elastic", 3, ckpt, total, workers_min=2, workers_max=3, min_tasks=2)
    group = spec.tasks[0]
    peers = tuple(
        Peer("worker", i, HOST, (("rdzv", free_port()),) if i == 0 else ()) for i in range(3)
    )

    def launch(index: int, generation: int, size: int):
        return pytorch_elastic(
            spec, group, TaskContext("job-tiny", "worker", index, generation, peers[:size])
        )

    agents = Agents(tmp_path)
    try:
        t0 = time.time()
        agents.start("w0", launch(0, 1, 2))
        agents.start("w1", launch(1, 1, 2))
        _until(lambda: _first_at(ckpt, 2, t0), 40, "training at 2", agents)
        first = _first_at(ckpt, 2, t0)["ts"] - t0
        _until(lambda: len(_steps(ckpt)) >= 20, 20, "20 steps at 2", agents)

        up = time.time()
        agents.start("w2", launch(2, 2, 3))
        at3 = _until(lambda: _first_at(ckpt, 3, up), 40, "training at 3", agents)
        _until(lambda: _steps(ckpt)[-1]["step"] >= at3["step"] + 20, 20, "20 at 3", agents)

        down = time.time()
        agents.term("w2")
        at2 = _until(lambda: _first_at(ckpt, 2, down), 40, "training at 2 again", agents)
        assert agents.wait("w2", 30) is not None  # it left (its code: a signal's)

        assert agents.wait("w0", 60) == 0, agents.output("w0")
        assert agents.wait("w1", 30) == 0, agents.output("w1")
    finally:
        agents.close()
    worlds, repeats = _check_run(ckpt, total)
    assert worlds == [2, 3, 2]
    # Both resizes stopped the workers gracefully (SIGTERM, a closed peer): each saved
    # the step it held, so no step ran twice.
    assert repeats == 0
    print(
        f"\nelastic: first step {first:.1f}s after start; scale-up 2->3 "
        f"{at3['ts'] - up:.1f}s; scale-down 3->2 {at2['ts'] - down:.1f}s; repeats {repeats}"
    )


def test_static_two_workers_and_restart_at_three(tmp_path: Path) -> None:
    """Static DDP; then every agent killed and the job started again at 3 from the
    checkpoint: what a resize costs without elasticity."""
    ckpt = tmp_path / "ckpt"
    total = 100
    agents = Agents(tmp_path)

    def start(size: int, generation: int) -> None:
        spec = _spec("pytorch", size, ckpt, total)
        port = free_port()
        peers = tuple(
            Peer("worker", i, HOST, (("master", port),) if i == 0 else ()) for i in range(size)
        )
        for i in range(size):
            ctx = TaskContext("job-static", "worker", i, generation, peers)
            agents.start(f"g{generation}w{i}", pytorch(spec, spec.tasks[0], ctx))

    try:
        t0 = time.time()
        start(2, 1)
        _until(lambda: _first_at(ckpt, 2, t0), 40, "training at 2", agents)
        _until(lambda: len(_steps(ckpt)) >= 20, 20, "20 steps at 2", agents)
        kill = time.time()
        for name in ("g1w0", "g1w1"):
            agents.term(name)
        for name in ("g1w0", "g1w1"):
            agents.wait(name, 30)
        start(3, 2)
        at3 = _until(lambda: _first_at(ckpt, 3, kill), 40, "training at 3", agents)
        for i in range(3):
            assert agents.wait(f"g2w{i}", 60) == 0, agents.output(f"g2w{i}")
    finally:
        agents.close()
    worlds, repeats = _check_run(ckpt, total)
    assert worlds == [2, 3]
    assert repeats == 0
    print(f"\nstatic restart 2->3 (kill all, start all): {at3['ts'] - kill:.1f}s")
