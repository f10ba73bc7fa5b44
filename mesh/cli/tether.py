"""Children that end with the process that started them, however it ends.

`mesh up` starts nats-server, coordinators and an agent, each in a session of its own
(so a Ctrl-C reaches only `mesh up`, which then stops them in order). A session of
their own also means nothing stops them when `mesh up` dies without running its clean
stop: SIGKILL, an out-of-memory kill, a crash. Two mechanisms, one inside each child
and one beside them, close that gap:

- Linux: `prctl(PR_SET_PDEATHSIG, SIGTERM)` in the child between fork and exec, so the
  kernel sends it SIGTERM when its parent dies: each child then stops as it does on a
  clean stop (the agent stopping its tasks first). The signal fires when the *thread*
  that forked the child exits, so it is only set for children spawned from the main
  thread; the others rely on the reaper alone.
- Anywhere: a reaper, a small process of its own that reads the pids of the children
  from a pipe. The parent holds the only write end, so the kernel closes it when the
  parent dies, by any means; the reaper then reads end-of-file, sends SIGTERM to every
  child still alive (agents first, so they stop their tasks while they can), waits, and
  SIGKILLs whatever is left of the children and of the processes they had started
  (tasks included: they run in sessions of their own, by design, so that a restarted
  real agent can re-adopt them). A clean stop writes `release` first: the reaper then
  exits without touching anything.

Pids are recorded with their start time, so a pid reused by an unrelated process is
never signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

PR_SET_PDEATHSIG = 1
RELEASE = "release"
FIRST = ("agent", "hollow")  # stopped first: they stop their tasks


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent (a forked child should only call it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return fn


def death_signal_preexec() -> Callable[[], None] | None:
    """A `preexec_fn` that asks the kernel for SIGTERM when this process dies, or None
    where that is not available (not Linux, or not called from the main thread)."""
    prctl = _prctl()
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass(frozen=True)
class Child:
    """One process the reaper answers for."""

    name: str
    pid: int
    started: float  # psutil create_time: tells a reused pid apart

    def line(self) -> str:
        return f"{self.pid} {self.started!r} {self.name}\n"

    @classmethod
    def parse(cls, line: str) -> Child:
        pid, started, name = line.split(" ", 2)
        return cls(name.strip(), int(pid), float(started))


def stop_order(children: Iterable[Child]) -> tuple[list[Child], list[Child]]:
    """(agents and fleets, everything else): the first stop their tasks before the
    server they report to goes away."""
    kids = list(children)
    first = [c for c in kids if c.name.startswith(FIRST)]
    return first, [c for c in kids if c not in first]


class Reaper:
    """The parent's side: a reaper process and the write end of its pipe."""

    def __init__(self) -> None:
        read, self._write = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mesh.cli.tether"],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # survives a signal sent to our process group
                close_fds=True,
            )
        finally:
            os.close(read)
        os.set_inheritable(self._write, False)  # no child of ours may keep the reaper waiting

    def watch(self, name: str, pid: int) -> None:
        """Answer for `pid` too, should this process die before `release()`."""
        try:
            started = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            return
        self._send(Child(name, pid, started).line())

    def release(self) -> None:
        """A clean stop: the reaper exits and signals nothing."""
        if self._write < 0:
            return
        with contextlib.suppress(OSError):
            self._send(RELEASE + "\n")
        os.close(self._write)
        self._write = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)

    def _send(self, text: str) -> None:
        if self._write >= 0:
            os.write(self._write, text.encode())


# ---------------------------------------------------------------- the reaper process


def _alive(child: Child) -> psutil.Process | None:
    try:
        p = psutil.Process(child.pid)
        if p.create_time() == child.started and p.status() != psutil.STATUS_ZOMBIE:
            return p
    except psutil.Error:
        pass
    return None


def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def reap(children: list[Child], grace: float = 10.0) -> None:
    """Stop what is left of `children` and of what they started: SIGTERM, agents first,
    then SIGKILL after `grace` seconds."""
    procs = {c: p for c in children if (p := _alive(c)) is not None}
    tree: list[psutil.Process] = []
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            tree += p.children(recursive=True)  # tasks, before an agent's death hides them
    first, rest = stop_order(procs)
    deadline = time.monotonic() + grace
    for group in (first, rest):
        members = [procs[c] for c in group]
        _signal(members, signal.SIGTERM)
        _wait(members, max(0.1, deadline - time.monotonic()))
    left = [p for p in [*procs.values(), *tree] if p.is_running()]
    _signal(left, signal.SIGKILL)


def main() -> int:
    """Read children until end of file; reap them unless released first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    children: list[Child] = []
    for line in sys.stdin:
        if line.strip() == RELEASE:
            return 0
        with contextlib.suppress(ValueError):
            children.append(Child.parse(line))
    reap(children)
    return 0


if __name__ == "__main__":
    sys.exit(main())


UP_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What ends `mesh up` (one region or several): Ctrl-C, a kill, or the terminal gone."""
