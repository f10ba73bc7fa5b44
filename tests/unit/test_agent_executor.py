"""ProcessExecutor with real processes: exit codes, logs, kill, limits, re-adoption."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import sys
import time
from pathlib import Path

import pytest

from agent.executor import ExecError, ExecSpec, ProcessExecutor, task_dir_name
from agent.probe import process_start_time


@pytest.fixture
def ex(tmp_path):
    return ProcessExecutor(tmp_path / "work")


def sh(task_id: str, script: str, **kw) -> ExecSpec:
    return ExecSpec(task_id=task_id, argv=("sh", "-c", script), **kw)


def gone(pid: int) -> bool:
    """Dead (a zombie left to a non-reaping init counts as dead)."""
    return process_start_time(pid) is None


async def wait_for_file(path: Path, timeout: float = 5.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


async def test_success(ex):
    h = await ex.start(sh("ok", "echo hello"))
    st = await ex.wait(h)
    assert (st.exit_code, st.signal, st.killed, st.timed_out) == (0, None, False, False)
    assert st.log_tail == "hello\n"  # stderr empty: stdout's tail
    assert ex.read_log("ok") == b"hello\n"
    assert Path(h.task_dir).parent == ex.work_dir


async def test_failure_has_stderr_tail(ex):
    h = await ex.start(sh("bad", "echo out; printf 'x%.0s' $(seq 3000) >&2; echo boom >&2; exit 3"))
    st = await ex.wait(h)
    assert st.exit_code == 3 and st.signal is None and not st.killed
    assert st.log_tail.endswith("boom\n") and 2000 <= len(st.log_tail) <= 2048
    assert ex.read_log("bad", "stdout") == b"out\n"
    assert ex.read_log("bad", "stderr", tail_bytes=5) == b"boom\n"
    with pytest.raises(ValueError):
        ex.read_log("bad", "../../etc/passwd")


async def test_command_not_found_is_exec_error(ex):
    with pytest.raises(ExecError, match="not found"):
        await ex.start(ExecSpec("nf", ("no-such-command-mesh",)))
    with pytest.raises(ExecError, match="not found"):
        await ex.start(ExecSpec("nf2", ("./missing.sh",)))


@pytest.mark.parametrize(
    "spec",
    [
        ExecSpec("e", ()),
        ExecSpec("e", ("",)),
        ExecSpec("e", ("echo", "a\0b")),
        ExecSpec("", ("true",)),
        ExecSpec("a\0b", ("true",)),
        ExecSpec("e", ("true",), env=(("BAD-NAME", "x"),)),
        ExecSpec("e", ("true",), env=(("1X", "x"),)),
        ExecSpec("e", ("true",), env=(("OK", "a\0b"),)),
        ExecSpec("e", ("true",), cwd="/nonexistent/dir"),
        ExecSpec("e", ("true",), memory_bytes=-1),
        ExecSpec("e", ("true",), max_run_time_s=0),
        ExecSpec("e", ("true",), max_run_time_s=float("nan")),
    ],
)
async def test_bad_specs_are_refused(ex, spec):
    with pytest.raises(ExecError):
        await ex.start(spec)


async def test_env_and_cwd(ex, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    h = await ex.start(
        sh(
            "env",
            'echo "$FOO|$MESH_TASK_ID|$PWD|${PATH:+path}|${SECRET_AGENT_VAR:-unset}"',
            env=(("FOO", "bar baz"), ("MESH_TASK_ID", "spoofed")),
            cwd=str(cwd),
        )
    )
    os.environ["SECRET_AGENT_VAR"] = "leak"
    try:
        assert (await ex.wait(h)).exit_code == 0
    finally:
        del os.environ["SECRET_AGENT_VAR"]
    assert ex.read_log("env") == f"bar baz|env|{cwd}|path|unset\n".encode()


async def test_default_cwd_is_the_task_work_dir(ex):
    h = await ex.start(sh("cwd", "pwd; touch made-here"))
    await ex.wait(h)
    work = Path(h.task_dir) / "work"
    assert ex.read_log("cwd").decode().strip() == str(work)
    assert (work / "made-here").exists()


async def test_kill_process_group(ex):
    h = await ex.start(sh("grp", "sleep 100 & echo $! > bg; sleep 100"))
    bg = int(await wait_for_file(Path(h.task_dir) / "work" / "bg"))
    assert not gone(bg)
    t0 = time.monotonic()
    await ex.kill(h, grace_s=5.0)
    assert time.monotonic() - t0 < 2.0  # everything obeyed SIGTERM
    st = await ex.wait(h)
    assert st.killed and not st.timed_out
    assert st.exit_code is None and st.signal == 15
    assert gone(bg) and gone(h.pid)


async def test_kill_escalates_to_sigkill(ex):
    h = await ex.start(sh("stubborn", "trap '' TERM; sleep 100 & echo $! > bg; sleep 100"))
    bg = int(await wait_for_file(Path(h.task_dir) / "work" / "bg"))
    t0 = time.monotonic()
    await ex.kill(h, grace_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 3.0
    st = await ex.wait(h)
    assert st.killed and st.exit_code is None and st.signal == 9
    assert gone(bg) and gone(h.pid)


async def test_stragglers_die_with_the_task(ex):
    h = await ex.start(sh("straggle", "sleep 100 & echo $! > bg"))
    st = await ex.wait(h)
    assert st.exit_code == 0 and not st.killed
    assert gone(int((Path(h.task_dir) / "work" / "bg").read_text()))


async def test_max_run_time(ex):
    h = await ex.start(sh("slow", "sleep 30", max_run_time_s=0.3))
    t0 = time.monotonic()
    st = await ex.wait(h)
    assert time.monotonic() - t0 < 3.0
    assert st.killed and st.timed_out and st.exit_code is None
    assert gone(h.pid)


async def test_adopt_from_a_fresh_executor(tmp_path):
    first = ProcessExecutor(tmp_path / "work")
    h = await first.start(sh("adopt", "sleep 0.5; echo done; exit 7"))
    second = ProcessExecutor(tmp_path / "work")  # as after an agent restart
    assert second.recorded("adopt") == h  # for an agent that died before storing the pid
    assert second.recorded("never-started") is None
    adopted = second.adopt("adopt", h.pid, h.start_time)
    assert adopted == h
    st = await second.wait(adopted)
    assert (st.exit_code, st.killed, st.log_tail) == (7, False, "done\n")
    # finished: still adoptable while its exit file exists, even under a wrong start time
    third = ProcessExecutor(tmp_path / "work")
    late = third.adopt("adopt", h.pid, h.start_time + 1000)
    assert late is not None and (await third.wait(late)).exit_code == 7


async def test_adopted_task_can_be_killed_and_times_out(tmp_path):
    first = ProcessExecutor(tmp_path / "work")
    h = await first.start(sh("adopt-slow", "sleep 30", max_run_time_s=0.5))
    second = ProcessExecutor(tmp_path / "work")
    adopted = second.adopt("adopt-slow", h.pid, h.start_time)
    st = await second.wait(adopted)
    assert st.timed_out and st.killed and gone(h.pid)


async def test_adopt_refuses_dead_or_reused_pids(tmp_path):
    ex = ProcessExecutor(tmp_path / "work")
    h = await ex.start(sh("live", "sleep 5"))
    try:
        assert ex.adopt("live", h.pid, h.start_time + 5) is None  # start time mismatch
        assert ex.adopt("live", os.getpid(), h.start_time) is None  # not its pid
        assert ex.adopt("unknown", h.pid, h.start_time) is None
    finally:
        await ex.kill(h, grace_s=1)
        await ex.wait(h)
    # it died of SIGTERM: the wrapper recorded that, so it is still adoptable
    assert ex.adopt("live", h.pid, h.start_time) == h
    os.unlink(Path(h.task_dir) / "status" / "exit")
    assert ex.adopt("live", h.pid, h.start_time) is None  # dead and no exit file


async def test_start_refuses_a_running_task(ex):
    h = await ex.start(sh("twice", "sleep 5"))
    try:
        with pytest.raises(ExecError, match="already running"):
            await ex.start(sh("twice", "true"))
        with pytest.raises(ExecError, match="already running"):
            await ProcessExecutor(ex.work_dir).start(sh("twice", "true"))
    finally:
        await ex.kill(h, grace_s=1)
        await ex.wait(h)
    h2 = await ex.start(sh("twice", "echo again"))  # a finished task id may run again
    assert (await ex.wait(h2)).exit_code == 0 and ex.read_log("twice") == b"again\n"


@pytest.mark.parametrize(
    "task_id", ["../../escape", "..", ".", "/etc", "a/../../b", "x\0y", "\udcff", "-rf", "é" * 500]
)
async def test_hostile_task_ids_stay_inside(ex, tmp_path, task_id):
    name = task_dir_name(task_id)
    assert "/" not in name and "\0" not in name and not name.startswith(".")
    assert (ex.work_dir / name).resolve().parent == ex.work_dir.resolve()
    assert ex.read_log(task_id) == b""
    assert ex.adopt(task_id, 1, 0.0) is None
    ex.cleanup(task_id)
    if "\0" not in task_id and "\udcff" not in task_id:
        h = await ex.start(ExecSpec(task_id, ("true",)))
        assert Path(h.task_dir).resolve().parent == ex.work_dir.resolve()
        assert (await ex.wait(h)).exit_code == 0
        ex.cleanup(task_id)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert list(ex.work_dir.iterdir()) == []


async def test_cleanup_removes_dir_and_kills(ex):
    h = await ex.start(sh("clean", "sleep 100"))
    ex.cleanup("clean")
    assert not Path(h.task_dir).exists()
    for _ in range(100):
        if gone(h.pid):
            break
        await asyncio.sleep(0.01)
    assert gone(h.pid)


async def test_limit_mode_is_reported(ex):
    assert ex.limit_mode in ("cgroup", "rlimit")
    assert ex.limit_detail
    assert ProcessExecutor(ex.work_dir, limits="none").limit_mode == "none"
    assert ProcessExecutor(ex.work_dir, limits="rlimit").limit_mode == "rlimit"
    with pytest.raises(ValueError):
        ProcessExecutor(ex.work_dir, limits="bogus")


HOG = "b = bytearray(512 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])"


@pytest.mark.parametrize("limits", ["auto", "rlimit"])
async def test_memory_hog_is_stopped(tmp_path, limits):
    ex = ProcessExecutor(tmp_path / "work", limits=limits)
    h = await ex.start(ExecSpec("hog", (sys.executable, "-c", HOG), memory_bytes=128 << 20))
    st = await ex.wait(h)
    assert st.exit_code != 0 and not st.killed  # None (OOM kill) or 1 (MemoryError)
    if ex.limit_mode == "cgroup":
        assert st.signal == 9 and "out of memory" in st.log_tail
    else:
        assert st.exit_code == 1 and "MemoryError" in st.log_tail
    ex.cleanup("hog")


async def test_cpu_quota_throttles(ex):
    if ex.limit_mode != "cgroup":
        pytest.skip(f"cpu is only enforced with cgroups ({ex.limit_mode} here)")
    h = await ex.start(sh("cpu", "while :; do :; done", cpu_milli=100, max_run_time_s=5))
    dirs = [Path(p) for p in json.loads((Path(h.task_dir) / "meta.json").read_text())["cgroups"]]
    cpu = [d for d in dirs if (d / "cpu.max").exists() or (d / "cpu.cfs_quota_us").exists()]
    if not cpu:
        await ex.kill(h, grace_s=0)
        await ex.wait(h)
        pytest.skip("no cpu controller here")
    throttled = 0
    for _ in range(40):  # a loaded machine may need a few quota periods
        await asyncio.sleep(0.05)
        stat = dict(line.split() for line in (cpu[0] / "cpu.stat").read_text().splitlines())
        throttled = int(stat["nr_throttled"])
        if throttled:
            break
    await ex.kill(h, grace_s=0)
    await ex.wait(h)
    assert throttled > 0


async def test_run_as_drops_privileges(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    ex = ProcessExecutor(tmp_path / "work", run_as="nobody")
    h = await ex.start(sh("who", "id -u; id -G; touch here && echo wrote"))
    st = await ex.wait(h)
    assert st.exit_code == 0
    lines = ex.read_log("who").decode().split()
    assert lines[0] == str(nobody.pw_uid) and "0" not in lines[1:-1] and lines[-1] == "wrote"


async def test_run_as_unknown_user():
    with pytest.raises(ExecError):
        ProcessExecutor("/tmp/mesh-never-created", run_as="no-such-user-mesh")


async def test_unreleased_wrapper_runs_nothing(ex, tmp_path, monkeypatch):
    """start() failing after the fork (start time unreadable) never runs the command."""
    import agent.executor as executor_module

    marker = tmp_path / "ran"
    monkeypatch.setattr(executor_module, "process_start_time", lambda pid: None)
    with pytest.raises(ExecError, match="released"):
        await ex.start(sh("gate", f"touch {marker}"))
    monkeypatch.undo()
    await asyncio.sleep(0.2)
    assert not marker.exists()
    assert ex.recorded("gate") is None
    h = await ex.start(sh("gate", f"touch {marker}"))  # and the task id is free to start again
    assert (await ex.wait(h)).exit_code == 0 and marker.exists()


async def test_start_overhead_is_small(ex):
    times = []
    for i in range(10):
        t0 = time.perf_counter()
        h = await ex.start(ExecSpec(f"fast-{i}", ("true",)))
        times.append(time.perf_counter() - t0)
        await ex.wait(h)
        ex.cleanup(f"fast-{i}")
    assert sorted(times)[5] < 0.05  # typically 3-5 ms; generous for loaded CI machines


# A task that says, on the monotonic clock the agent's executor also uses, when it began
# and when its SIGTERM came.
_CLOCKED = (
    "import signal, sys, time\n"
    "out = sys.argv[1]\n"
    "began = time.monotonic()\n"
    "def term(*_):\n"
    "    open(out, 'w').write(f'{began} {time.monotonic()}')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "time.sleep(30)\n"
)


@pytest.mark.parametrize("adopted", [False, True])
async def test_max_run_time_is_never_cut_short(tmp_path, adopted):
    """The limit counts from the release the executor recorded, on the monotonic clock:
    psutil's create_time (whole-second boot time) made a 1 s limit fire after 0.6 s."""
    first = ProcessExecutor(tmp_path / "work")
    out = tmp_path / "clock"
    h = await first.start(
        ExecSpec("clocked", (sys.executable, "-c", _CLOCKED, str(out)), max_run_time_s=1.0)
    )
    ex = ProcessExecutor(tmp_path / "work") if adopted else first
    if adopted:  # as after an agent restart: the deadline comes from what start() recorded
        h = ex.adopt("clocked", h.pid, h.start_time)
        assert h is not None
    st = await ex.wait(h)
    assert st.timed_out
    released = json.loads((Path(h.task_dir) / "meta.json").read_text())["started_mono"]
    began, termed = map(float, out.read_text().split())
    assert released <= began < released + 0.5  # the recorded start is the task's start
    assert termed >= released + 1.0, termed - released
    assert termed < released + 2.5, termed - released


def _reachable_dir(tmp_path: Path) -> Path:
    """A directory every user can traverse (pytest's tmp_path sits under a 0700 dir)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="mesh-exec-"))
    d.chmod(0o711)
    return d


@pytest.fixture
def nobody():
    if os.geteuid() != 0:
        pytest.skip("needs root")  # run as root in CI containers, where it matters
    return pwd.getpwnam("nobody")


async def test_task_user_problem_names_the_blocking_dir(tmp_path, nobody):
    import shutil

    base = _reachable_dir(tmp_path)
    try:
        private = base / "private"
        private.mkdir(mode=0o700)
        ex = ProcessExecutor(private / "agent" / "tasks", run_as="nobody")
        problem = ex.task_user_problem()
        assert problem == f"task user 'nobody' cannot traverse or write {private}"
        assert list((private / "agent" / "tasks").iterdir()) == []  # the probe left nothing
        private.chmod(0o711)
        assert ex.task_user_problem() == ""
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_run_as_task_exit_status_is_recorded_for_a_restarted_agent(tmp_path, nobody):
    import shutil

    base = _reachable_dir(tmp_path)
    old = os.umask(0o077)  # a hardened root: what the executor makes must still be usable
    try:
        first = ProcessExecutor(base / "agent" / "tasks", run_as="nobody")
        assert first.task_user_problem() == ""
        h = await first.start(sh("as-nobody", "id -u"))
        while not gone(h.pid):
            await asyncio.sleep(0.02)
        later = ProcessExecutor(base / "agent" / "tasks", run_as="nobody")
        adopted = later.adopt("as-nobody", h.pid, h.start_time)
        assert adopted is not None  # its exit file is there
        st = await later.wait(adopted)
        assert st.exit_code == 0 and later.read_log("as-nobody") == f"{nobody.pw_uid}\n".encode()
    finally:
        os.umask(old)
        shutil.rmtree(base, ignore_errors=True)


async def test_unwritable_exit_file_is_said_in_the_task_log(tmp_path, nobody):
    """Under a dir the task user cannot traverse (what the agent refuses at start) the
    wrapper still says why no exit status was recorded."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    ex = ProcessExecutor(private / "tasks", run_as="nobody")
    h = await ex.start(sh("lost-exit", "exit 0"))
    st = await ex.wait(h)  # the agent is its parent: it still knows
    assert st.exit_code == 0
    assert "exit status 0 not recorded" in ex.read_log("lost-exit", "stderr").decode()


async def test_adopted_task_without_exit_file_is_unknown_not_failed(tmp_path, nobody):
    """A restarted agent that finds no exit status says so, rather than reporting a
    task that may have succeeded as terminated."""
    from agent.service import _outcome

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    first = ProcessExecutor(private / "tasks", run_as="nobody")
    h = await first.start(sh("unknown", "sleep 0.5; exit 0"))
    later = ProcessExecutor(private / "tasks", run_as="nobody")  # the agent restarted
    adopted = later.adopt("unknown", h.pid, h.start_time)
    assert adopted is not None  # still running
    st = await later.wait(adopted)
    assert (st.exit_code, st.signal) == (None, None)
    assert _outcome(st) == ("FAILED", "exit status unknown: the task left no exit file")
