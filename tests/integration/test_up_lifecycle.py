"""`mesh up` leaves nothing behind however it ends: a hangup (the terminal closed) stops
it as Ctrl-C does, and when it is SIGKILLed its nats-server, coordinators, agent and the
tasks the agent runs end with it (mesh.cli.tether). Real processes throughout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from mesh.cli.servers import ROOT_NOTE
from mesh.cli.tether import Reaper

from .conftest import run_mesh

LONG_JOB = """\
name: long
tasks:
  - role: main
    command: [sleep, "300"]
    resources: {cpu: 100m, memory: 64Mi}
"""


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _gone_within(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while (left := _alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _is_task(p: psutil.Process) -> bool:
    cmd = p.info_cmdline  # type: ignore[attr-defined]
    return len(cmd) == 2 and os.path.basename(cmd[0]) == "sleep" and cmd[1] == "300"


def _tree(pid: int) -> list[psutil.Process]:
    procs = psutil.Process(pid).children(recursive=True)
    for p in procs:
        try:
            p.info_cmdline = p.cmdline()  # type: ignore[attr-defined]
        except psutil.Error:
            p.info_cmdline = []  # type: ignore[attr-defined]
    return procs


@pytest.fixture
def up_with_task(tmp_path):
    """`mesh up` (its own session, as a terminal's job would be) running one task."""
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    env.pop("MESH_NATS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mesh.cli.main", "up", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    tree: list[psutil.Process] = []
    try:
        lines = [proc.stdout.readline()]
        if not lines[0].startswith("mesh is up"):
            pytest.fail(lines[0] + proc.stdout.read())
        lines.append(proc.stdout.readline())  # context written ...
        if os.geteuid() == 0:
            lines.append(proc.stdout.readline())
        spec = tmp_path / "long.yaml"
        spec.write_text(LONG_JOB)
        r = run_mesh("job", "run", str(spec), env=env)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            tree = _tree(proc.pid)
            if any(_is_task(p) for p in tree):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the task never started")
        yield proc, tree, lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        for p in _alive(tree):  # only where a test failed: leave nothing running
            p.kill()


def _kinds(tree: list[psutil.Process]) -> set[str]:
    kinds = set()
    for p in tree:
        cmd = " ".join(p.info_cmdline)  # type: ignore[attr-defined]
        for kind in ("nats-server", " coordinator ", " agent ", "sleep 300"):
            if kind in f"{cmd} ":
                kinds.add(kind.strip())
    return kinds


def test_sighup_stops_up_and_everything_it_started(up_with_task):
    proc, tree, lines = up_with_task
    # Run by root, `mesh up` says its agent runs tasks as root; otherwise it does not.
    assert (ROOT_NOTE + "\n" in lines) == (os.geteuid() == 0), lines
    assert _kinds(tree) == {"nats-server", "coordinator", "agent", "sleep 300"}
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(15) == 0  # the clean stop, as on Ctrl-C
    assert "mesh stopped" in proc.stdout.read()
    assert not _gone_within(tree, 15)


def test_sigkill_of_up_takes_its_children_and_tasks_with_it(up_with_task):
    proc, tree, _ = up_with_task
    assert _kinds(tree) == {"nats-server", "coordinator", "agent", "sleep 300"}
    proc.kill()
    proc.wait(5)
    left = _gone_within(tree, 15)
    assert not left, [(p.pid, p.info_cmdline) for p in left]  # type: ignore[attr-defined]


# The fallback where the kernel's death signal is not available (not Linux): a parent
# that only tells its reaper about its children, then dies by SIGKILL.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from mesh.cli.tether import Reaper
    reaper = Reaper()
    child = subprocess.Popen(
        ["sh", "-c", "setsid sleep 301 & sleep 302"], start_new_session=True
    )
    reaper.watch("agent", child.pid)
    if sys.argv[1] == "release":
        reaper.release()
    print(child.pid, flush=True)
    time.sleep(300)
    """
)


@pytest.mark.parametrize("release", [False, True], ids=["killed", "released"])
def test_reaper_ends_children_and_their_sessions_when_the_parent_dies(release):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, "release" if release else "keep"],
        stdout=subprocess.PIPE,
        text=True,
    )
    tree: list[psutil.Process] = []
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 10
        want = {"sleep 301", "sleep 302"}
        while time.monotonic() < deadline:  # `setsid sleep` reads so until it has exec'd
            tree = [child, *child.children()]
            with contextlib.suppress(psutil.Error):
                if {" ".join(p.cmdline()) for p in tree[1:]} >= want:
                    break
            time.sleep(0.05)
        assert {" ".join(p.cmdline()) for p in tree[1:]} >= want
        parent.kill()
        parent.wait(5)
        if release:
            time.sleep(2)
            assert len(_alive(tree)) == len(tree)  # a clean stop: the reaper touches nothing
        else:
            assert not _gone_within(tree, 15)
    finally:
        parent.kill()
        for p in _alive(tree):
            p.kill()


def test_reaper_release_is_idempotent():
    reaper = Reaper()
    reaper.release()
    reaper.release()
    assert reaper.proc.returncode == 0
