"""The node's side of training tasks (agent/training.py): its port range and address,
the port check, the files directory and its `@files/` references, progress parsing and
its rate limit. Pure functions, plus real sockets and files where they touch the host."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest

from agent.executor import ExecError, ExecSpec, ProcessExecutor
from agent.link import _fast_event_encoder, event_id
from agent.training import (
    DEFAULT_PORT_RANGE,
    ProgressGate,
    check_address,
    expand_argv,
    expand_env,
    file_mode,
    file_name_problem,
    files_env,
    parse_port_range,
    parse_progress,
    port_problem,
    ports_problem,
    progress_loop,
    read_progress,
    route_address,
    write_files,
)
from mesh.codec import encode
from mesh.schema import TaskEvent
from workloads.frameworks import FILES_PREFIX
from workloads.lifecycle import TaskState

# ---------------------------------------------------------------- range and address


def test_port_range_parses_lo_hi():
    assert parse_port_range("20000-32000") == DEFAULT_PORT_RANGE == (20000, 32000)
    assert parse_port_range(" 1024-1024 ") == (1024, 1024)
    assert parse_port_range("40000-65535") == (40000, 65535)


@pytest.mark.parametrize(
    "text, says",
    [
        ("20000", "expected LO-HI"),
        ("a-b", "expected LO-HI"),
        ("", "expected LO-HI"),
        ("20000-", "expected LO-HI"),
        ("1000-2000", "1024 <= LO <= HI <= 65535"),
        ("30000-20000", "1024 <= LO <= HI <= 65535"),
        ("20000-70000", "1024 <= LO <= HI <= 65535"),
        ("-5-10", "expected LO-HI"),
    ],
)
def test_a_bad_port_range_is_refused_naming_the_flag(text, says):
    with pytest.raises(ValueError) as err:
        parse_port_range(text, "--ports")
    assert str(err.value).startswith("--ports ")
    assert says in str(err.value)


def test_address_is_checked():
    assert check_address(" 10.0.0.5 ") == "10.0.0.5"
    assert check_address("node-1.example") == "node-1.example"
    for bad in ("", "  ", "a b", "x" * 256):
        with pytest.raises(ValueError, match="--address"):
            check_address(bad)


def test_route_address_is_the_local_ip_or_loopback():
    assert route_address(("10.1.2.3", 51234)) == "10.1.2.3"
    assert route_address(("127.0.0.1", 51234)) == "127.0.0.1"
    assert route_address(("127.0.1.1", 1)) == "127.0.0.1"
    assert route_address(("::1", 1, 0, 0)) == "127.0.0.1"
    assert route_address(("::ffff:10.0.0.9", 1, 0, 0)) == "10.0.0.9"
    assert route_address(("fe80::1%eth0", 1, 0, 2)) == "fe80::1"
    assert route_address(("2001:db8::7", 1, 0, 0)) == "2001:db8::7"
    assert route_address(None) == "127.0.0.1"
    assert route_address(("not-an-ip", 1)) == "127.0.0.1"


# ---------------------------------------------------------------- ports


def _held_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_held_on_the_node_is_named():
    with _held_port() as held:
        port = held.getsockname()[1]
        rng = (1024, 65535)
        assert port_problem("master", port, rng) == f"port {port} (master) is in use on this node"
        assert ports_problem({"rdzv": port, "a": port}, rng).startswith(f"port {port} (a)")
    # free again once closed (SO_REUSEADDR: its TIME_WAIT, if any, does not count)
    assert port_problem("master", port, (1024, 65535)) == ""


def test_a_port_outside_the_range_is_named():
    assert port_problem("master", 5000, DEFAULT_PORT_RANGE) == (
        "port 5000 (master) is outside this node's port range 20000-32000"
    )
    assert ports_problem({}, DEFAULT_PORT_RANGE) == ""


# ---------------------------------------------------------------- files


@pytest.mark.parametrize("name", ["", "a/b", "/etc/passwd", "..", ".", "x\0y", "progress"])
def test_bad_file_names_are_refused(name):
    problem = file_name_problem(name)
    assert problem.startswith("TaskSpec.files")


def test_plain_file_names_pass():
    for name in ("hostfile", "discover_hosts.sh", ".hidden", "a..b"):
        assert file_name_problem(name) == ""
    assert file_mode("run.sh") == 0o755 and file_mode("hostfile") == 0o644


def test_files_are_written_with_their_modes(tmp_path):
    old = os.umask(0o077)  # the modes hold whatever the umask
    try:
        write_files(tmp_path, (("hostfile", "a slots=1\n"), ("go.sh", "#!/bin/sh\necho hi\n")))
    finally:
        os.umask(old)
    assert (tmp_path / "hostfile").read_text() == "a slots=1\n"
    assert stat.S_IMODE((tmp_path / "hostfile").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "go.sh").stat().st_mode) == 0o755
    with pytest.raises(ValueError, match="not a plain file name"):
        write_files(tmp_path, (("ok", "x"), ("../evil", "x")))
    assert not (tmp_path / "ok").exists()  # nothing written when one name is bad


def test_the_files_prefix_is_replaced_at_the_start_only():
    d = "/data/t/files"
    assert FILES_PREFIX == "@files/"
    argv = ("mpirun", "--hostfile", "@files/hostfile", "x@files/y", "@files/")
    assert expand_argv(argv, d) == (
        "mpirun",
        "--hostfile",
        "/data/t/files/hostfile",
        "x@files/y",
        "/data/t/files/",
    )
    assert expand_env({"A": "@files/a.sh", "B": "@file/b", "C": ""}, d + "/") == {
        "A": "/data/t/files/a.sh",
        "B": "@file/b",
        "C": "",
    }
    assert files_env(d) == {
        "MESH_FILES_DIR": d,
        "MESH_PROGRESS_FILE": "/data/t/files/progress",
    }


async def test_the_executor_writes_files_in_the_runs_files_dir(tmp_path):
    ex = ProcessExecutor(tmp_path / "tasks", limits="none", allow_root=True)
    files_dir = ex.files_dir("t#1")
    spec = ExecSpec(
        "t#1",
        (
            "sh",
            "-c",
            'cat "$1"; ls -l "$2" | cut -c1-10',
            "x",
            f"{files_dir}/a",
            f"{files_dir}/b.sh",
        ),
        files=(("a", "alpha"), ("b.sh", "echo b")),
    )
    h = await ex.start(spec)
    status = await ex.wait(h)
    assert status.exit_code == 0
    assert ex.read_log("t#1") == b"alpha-rwxr-xr-x\n"
    assert files_dir.parent == Path(h.task_dir)  # it goes with the run's other leftovers
    with pytest.raises(ExecError, match="not a plain file name"):
        await ex.start(ExecSpec("t#2", ("true",), files=(("a/b", "x"),)))


# ---------------------------------------------------------------- progress


def test_progress_parsing():
    assert parse_progress(b"42") == 42
    assert parse_progress(b"  17\n") == 17
    assert parse_progress(b"0") == 0
    for bad in (b"", b"  \n", b"-3", b"1.5", b"step 3", b"12 13", b"9" * 21, b"\xff"):
        assert parse_progress(bad) is None


def test_progress_is_reported_when_changed_and_at_most_every_two_seconds():
    gate = ProgressGate()
    assert gate.offer(None, 0.0) is None  # no file yet
    assert gate.offer(b"", 0.5) is None  # created, not written: not counted
    assert gate.offer(b"1\n", 1.0) == 1
    assert gate.offer(b"1\n", 4.0) is None  # unchanged
    assert gate.offer(b"2", 4.5) == 2
    assert gate.offer(b"3", 5.5) is None  # 1 s after the last report
    assert gate.offer(b"4", 6.4) is None
    assert gate.offer(b"4", 6.5) == 4  # the newest, once the gap is over
    assert gate.offer(b"junk", 9.0) is None and gate.ignored == 1
    assert gate.offer(b"2", 9.0) == 2  # a value going back (a restart) is news too
    assert gate.sent == 4


async def test_progress_loop_reads_the_file_and_sends_through_the_gate(tmp_path):
    path = tmp_path / "progress"
    sent: list[int] = []
    now = [0.0]

    async def send(value: int) -> None:
        sent.append(value)

    loop = asyncio.create_task(progress_loop(path, send, every_s=0.01, clock=lambda: now[0]))
    try:
        await asyncio.sleep(0.05)
        path.write_text("5\n")
        while not sent:
            await asyncio.sleep(0.01)
        path.write_text("6")
        await asyncio.sleep(0.1)
        assert sent == [5]  # no time passed on its clock
        now[0] = 2.0
        while len(sent) < 2:
            await asyncio.sleep(0.01)
        assert sent == [5, 6]
    finally:
        loop.cancel()


def test_a_progress_link_is_not_followed(tmp_path):
    (tmp_path / "secret").write_text("123")
    os.symlink(tmp_path / "secret", tmp_path / "progress")
    assert read_progress(tmp_path / "progress") is None
    (tmp_path / "p").write_text("7")
    assert read_progress(tmp_path / "p") == b"7"


# ---------------------------------------------------------------- on the wire


def _event(**kw) -> TaskEvent:
    return TaskEvent("n", "j", "t", 2, TaskState.RUNNING, 1.5, None, None, "", "", **kw)


def test_ports_and_progress_go_out_in_the_fast_encoding_too():
    fast = _fast_event_encoder()
    ev = _event(ports={"master": 20417, "rdzv": 20418}, progress=12)
    assert fast([ev]) == encode(ev)
    assert fast.__name__ == "fast"


def test_each_progress_report_is_its_own_stream_message():
    plain = event_id(_event(ports={"master": 20417}))
    assert plain == "n:t:2:RUNNING"
    a, b = event_id(_event(progress=3)), event_id(_event(progress=4))
    assert len({plain, a, b}) == 3
    again = TaskEvent("n", "j", "t", 2, TaskState.RUNNING, 9.5, None, None, "", "", progress=3)
    assert event_id(again) != a  # the same value later (after a restart) is not dropped
