"""Runs task commands as real processes, so that a restarted agent can take them back.

Each task gets a directory under the work dir (named from a hash of its id,
never from the raw id) holding its logs, a small ``meta.json`` and a
``status/exit`` file. The command runs under a tiny ``/bin/sh`` wrapper that
waits for a go signal on stdin, runs the command, and writes its exit status
to ``status/exit``. The file outlives the agent: an agent that restarts
cannot waitpid() a process it did not spawn, but it can read that file.

The go signal lets the agent put the wrapper in its cgroups and record its
pid and start time before the command runs: nothing runs unaccounted, and a
cancelled or failed ``start()`` never runs the command at all.

Linux only (process groups, /proc, cgroups). Every input is hostile: the
spec is validated, the task id only ever becomes a hashed directory name, and
files the task could tamper with are opened without following symlinks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workloads.model import TASK_IDENTITY_VAR, WORKER_IDENTITY

from .access import make_dirs, unreachable_dir
from .probe import process_start_ticks, process_start_time, session_processes
from .training import file_name_problem, write_files

__all__ = [
    "TASK_IDENTITIES",
    "TASK_IDENTITY_VAR",
    "ExecError",
    "ExecSpec",
    "ExitStatus",
    "ProcessExecutor",
    "ProcessHandle",
    "task_dir_name",
]

# $1: status dir, $2: address-space limit in KiB (0 = none), then the command.
# No trap: kill() spares the wrapper its SIGTERM instead, because a handler
# set here would be inherited by the forked command until its exec and could
# swallow a SIGTERM sent in that window.
_WRAPPER = r"""d=$1 mem=$2
shift 2
IFS= read -r go || exit 125
exec </dev/null
if [ "$mem" != 0 ]; then ulimit -v "$mem" || exit 125; fi
"$@"
rc=$?
echo "$rc" 2>/dev/null >"$d/exit" ||
  echo "[mesh] exit status $rc not recorded: $d is not writable by this user" >&2
exit "$rc"
"""
_SH = "/bin/sh"
_WRAPPER_SETUP_FAILED = 125
_MAX_SIGNAL = 64
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MAX_TASK_ID = 1024
_LOG_TAIL = 2048
_SAME_START_S = 1e-3  # create_time of one process never differs by more between reads
# psutil's create_time is boot time (whole seconds on some kernels) plus start ticks: it
# can read up to this much early, so a deadline measured from it is pushed back by it.
_CREATE_TIME_SLACK_S = 1.0
_STREAMS = ("stdout", "stderr")
_MAX_REASON = 1024
# A task that needs the agent's task identity (an inference worker connecting to NATS, a
# horovod launcher's `mesh job hosts`) says so in its env, MESH_TASK_IDENTITY=worker, as
# workloads.model's jobs and the horovod-elastic adapter's task 0 do.
TASK_IDENTITIES = (WORKER_IDENTITY,)
_Marker = Literal["kill", "timeout"]

LimitMode = Literal["cgroup", "rlimit", "none"]
ROOT_REFUSAL = "tasks would run as root: use --run-as USER or --allow-root"


class ExecError(Exception):
    """A task could not be started; the message says why (bad spec, no such command...)."""


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """What to run. Validated by start(): nothing in it is trusted."""

    task_id: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None  # None: the task's own work dir; relative: relative to it
    cpu_milli: int = 0  # 0 = no limit
    memory_bytes: int = 0  # 0 = no limit
    max_run_time_s: float | None = None
    # Written to the run's files dir (`files_dir`) before it starts (agent/training.py).
    files: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """A started task: enough to find the process again after an agent restart."""

    task_id: str
    pid: int  # the wrapper's pid; it leads the task's session and process group
    start_time: float  # psutil create_time of pid, to tell a re-used pid apart
    task_dir: str


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a task ended.

    A status of 128+N recorded by the wrapper is read as death by signal N
    (the shell convention), so a command that itself exits with 129..192
    is reported as signalled.
    """

    exit_code: int | None  # None if unknown (e.g. killed by signal)
    signal: int | None  # terminating signal if any
    killed: bool  # we killed it (kill() or max run time)
    timed_out: bool  # max_run_time_s exceeded
    log_tail: str  # last ~2 KiB of stderr, else stdout
    reason: str = ""  # why the agent killed it when it gave one (e.g. the GPU watchdog)


@dataclass(frozen=True, slots=True)
class _Meta:
    """What start() wrote about a run, read back by later calls and by a restarted agent."""

    pid: int
    start_time: float
    start_ticks: int | None  # boot-relative start, immune to wall-clock steps
    boot_id: str
    max_run_time_s: float | None
    memory_bytes: int
    cgroups: tuple[str, ...]
    # CLOCK_MONOTONIC (system-wide, so valid for a restarted agent of the same boot) when
    # the command was released: max_run_time_s counts from here. None in older records.
    started_mono: float | None = None


@dataclass(frozen=True, slots=True)
class _RunAs:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def task_dir_name(task_id: str) -> str:
    """A directory name for any task id: a readable sanitised prefix plus a hash.

    The hash makes it unique and the prefix keeps only ``[A-Za-z0-9_.-]``
    with leading dots removed, so ``..``, ``/`` or NUL can never take it
    outside the work dir.
    """
    raw = task_id.encode("utf-8", errors="surrogatepass")
    digest = hashlib.sha256(raw).hexdigest()[:20]
    prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", task_id[:40]).lstrip(".")
    return f"{prefix}-{digest}" if prefix else digest


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _read_small(path: Path, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of a regular file, not following a symlink; None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not _is_regular(fd):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _read_tail(path: Path, tail_bytes: int) -> bytes:
    """The last ``tail_bytes`` of a file (b"" if absent), not following symlinks."""
    if tail_bytes <= 0:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not _is_regular(fd):
            return b""
        size = os.fstat(fd).st_size
        offset = max(0, size - tail_bytes)
        chunks: list[bytes] = []
        while offset < size:
            chunk = os.pread(fd, min(size - offset, 1 << 20), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _decode_tail(data: bytes) -> str:
    """Decode a tail cut at an arbitrary byte: drop a split UTF-8 sequence at its start."""
    start = 0
    while start < min(len(data), 3) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:].decode("utf-8", errors="replace")


def _same_start(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) < _SAME_START_S


def _resolve_run_as(run_as: str | None) -> _RunAs | None:
    """The user to drop to, or None when tasks run as the agent's own user."""
    if run_as is None:
        return None
    try:
        entry = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
    except (KeyError, ValueError) as exc:
        raise ExecError(f"run_as: no such user {run_as!r}") from exc
    if os.geteuid() != 0:
        if entry.pw_uid == os.geteuid():
            return None
        raise ExecError(f"run_as {run_as!r}: the agent is not root and cannot switch user")
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return _RunAs(
        name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir
    )


def _validate(spec: ExecSpec) -> None:
    """Refuse anything malformed before a single file is touched."""
    tid = spec.task_id
    if not isinstance(tid, str) or not tid or len(tid) > _MAX_TASK_ID or "\0" in tid:
        raise ExecError(f"task_id must be a non-empty str of <= {_MAX_TASK_ID} chars without NUL")
    if not isinstance(spec.argv, (tuple, list)) or not spec.argv:
        raise ExecError("argv is empty")
    for arg in spec.argv:
        if not isinstance(arg, str) or "\0" in arg:
            raise ExecError("argv items must be str without NUL")
    if not spec.argv[0]:
        raise ExecError("argv[0] is empty")
    for item in spec.env:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ExecError("env items must be (name, value) pairs")
        name, value = item
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ExecError(f"invalid env name {name!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ExecError(f"invalid value for env {name}")
    if spec.cwd is not None and (not isinstance(spec.cwd, str) or not spec.cwd or "\0" in spec.cwd):
        raise ExecError("cwd must be a non-empty str without NUL")
    for item in spec.files:
        problem = file_name_problem(item[0] if isinstance(item, (tuple, list)) else None)
        if problem:
            raise ExecError(problem)
    for field in ("cpu_milli", "memory_bytes"):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ExecError(f"{field} must be an int >= 0")
    mrt = spec.max_run_time_s
    if mrt is not None and (
        isinstance(mrt, bool)
        or not isinstance(mrt, (int, float))
        or not math.isfinite(mrt)
        or mrt <= 0
    ):
        raise ExecError("max_run_time_s must be a finite number > 0")


def _resolve_command(argv0: str, path: str, cwd: Path) -> str:
    """The path the wrapper will run: fail at start() rather than as exit 127 later.

    A bare name becomes an absolute path, which also keeps it from naming a
    shell builtin (``exit``, ``exec``, ``trap``...) of the wrapper.
    """
    if "/" in argv0:
        target = Path(argv0) if argv0.startswith("/") else cwd / argv0
        if target.is_file() and os.access(target, os.X_OK):
            return argv0
        raise ExecError(f"command not found or not executable: {argv0!r}")
    search = os.pathsep.join(p for p in path.split(os.pathsep) if p.startswith("/"))
    found = shutil.which(argv0, path=search) if search else None
    if found is None:
        # Not the PATH itself: it may come from the job's env, which is never echoed.
        raise ExecError(f"command not found in the task's PATH: {argv0!r}")
    return found


# ---------------------------------------------------------------------- cgroups

_CFS_PERIOD_US = 100_000


def _is_task_cgroup(path: str, task_dir: Path) -> bool:
    """Only a cgroup start() could have made for this task is ever signalled or removed."""
    p = Path(path)
    return p.is_absolute() and p.name == task_dir.name and p.parent.name.startswith("mesh-")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup_mounts() -> list[tuple[str, str, str, frozenset[str]]]:
    """(fstype, root within the hierarchy, mount point, super options) of cgroup mounts."""
    mounts = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3 or rf[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append((rf[0], _unescape(lf[3]), _unescape(lf[4]), frozenset(rf[2].split(","))))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller; key "" for the v2 hierarchy."""
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and not controllers:
            own[""] = path
        for controller in filter(None, controllers.split(",")):
            own[controller] = path
    return own


def _own_dir(fstype: str, controller: str) -> Path | None:
    """Where this process's cgroup of that hierarchy is visible in the file system."""
    path = _own_cgroups().get(controller)
    if path is None:
        return None
    for mount_type, root, mountpoint, options in _cgroup_mounts():
        if mount_type != fstype or (controller and controller not in options):
            continue
        if root == "/":
            rel = path
        elif path == root or path.startswith(root + "/"):
            rel = path[len(root) :]
        else:
            continue
        found = Path(mountpoint) / rel.lstrip("/")
        if found.is_dir():
            return found
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _try_rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class _Cgroups:
    """Per-task cgroups under the agent's own cgroup (never above it, so tasks stay
    inside whatever bounds the agent itself lives in).

    ``bases`` are (controller, dir) pairs: one ("unified", dir) for v2; for v1
    "memory" and, when writable, "cpu". The base dirs are created when a task
    starts and removed with the last task's cgroup.
    """

    version: int
    bases: tuple[tuple[str, Path], ...]

    @classmethod
    def detect(cls, base_name: str) -> tuple[_Cgroups | None, str]:
        """The usable hierarchy (v2 first, then v1) and a line on what was found."""
        found, v2_note = cls._detect_v2(base_name)
        if found is not None:
            return found, v2_note
        found, v1_note = cls._detect_v1(base_name)
        return found, f"{v2_note}; {v1_note}"

    @classmethod
    def _detect_v2(cls, base_name: str) -> tuple[_Cgroups | None, str]:
        own = _own_dir("cgroup2", "")
        if own is None:
            return None, "cgroup v2: not mounted"
        try:
            available = set((own / "cgroup.controllers").read_text().split())
        except OSError as exc:
            return None, f"cgroup v2 at {own}: unreadable ({exc.strerror})"
        if not {"memory", "cpu"} <= available:
            have = ",".join(sorted(available)) or "none"
            return None, f"cgroup v2 at {own}: memory/cpu not available (controllers: {have})"
        base = own / base_name
        try:
            enabled = set((own / "cgroup.subtree_control").read_text().split())
            if not {"memory", "cpu"} <= enabled:
                _write(own / "cgroup.subtree_control", "+memory +cpu")
            found = cls(2, (("unified", base),))
            probe = found.create(f"probe-{os.getpid()}", 100, 1 << 30)
            _Cgroups.remove(probe)
        except OSError as exc:
            _try_rmdir(base)
            return None, f"cgroup v2 at {own}: not delegated to the agent ({exc.strerror})"
        return found, f"cgroup v2 under {own}"

    @classmethod
    def _detect_v1(cls, base_name: str) -> tuple[_Cgroups | None, str]:
        bases: list[tuple[str, Path]] = []
        notes: list[str] = []
        for controller in ("memory", "cpu"):
            own = _own_dir("cgroup", controller)
            if own is None:
                notes.append(f"{controller} not mounted")
                continue
            base = own / base_name
            try:
                probe = cls(1, ((controller, base),)).create(f"probe-{os.getpid()}", 100, 1 << 30)
                _Cgroups.remove(probe)
            except OSError as exc:
                _try_rmdir(base)
                notes.append(f"{controller} at {own} not writable ({exc.strerror})")
                continue
            bases.append((controller, base))
            notes.append(f"{controller} under {own}")
        detail = "cgroup v1: " + ", ".join(notes)
        if not any(controller == "memory" for controller, _ in bases):
            return None, detail
        return cls(1, tuple(bases)), detail

    def create(self, name: str, cpu_milli: int, memory_bytes: int) -> tuple[Path, ...]:
        """Fresh cgroup dirs for a task, with its limits written; OSError if not possible."""
        made: list[Path] = []
        try:
            for controller, base in self.bases:
                base.mkdir(exist_ok=True)
                if self.version == 2:
                    _write(base / "cgroup.subtree_control", "+memory +cpu")
                path = base / name
                if path.exists():
                    path.rmdir()  # a finished run's leftover; EBUSY if it still holds processes
                path.mkdir()
                made.append(path)
                self._limit(controller, path, cpu_milli, memory_bytes)
        except OSError:
            _Cgroups.remove(tuple(made))
            raise
        return tuple(made)

    @staticmethod
    def _limit(controller: str, path: Path, cpu_milli: int, memory_bytes: int) -> None:
        quota = max(1000, cpu_milli * _CFS_PERIOD_US // 1000)
        if controller in ("unified", "memory") and memory_bytes:
            if controller == "unified":
                _write(path / "memory.max", str(memory_bytes))
                swap = path / "memory.swap.max"
            else:
                _write(path / "memory.limit_in_bytes", str(memory_bytes))
                swap = path / "memory.memsw.limit_in_bytes"
            with contextlib.suppress(OSError):  # absent without swap accounting
                _write(swap, "0" if controller == "unified" else str(memory_bytes))
        if controller == "unified" and cpu_milli:
            _write(path / "cpu.max", f"{quota} {_CFS_PERIOD_US}")
        elif controller == "cpu" and cpu_milli:
            _write(path / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
            _write(path / "cpu.cfs_quota_us", str(quota))

    @staticmethod
    def add(dirs: tuple[Path, ...], pid: int) -> None:
        for path in dirs:
            _write(path / "cgroup.procs", str(pid))

    @staticmethod
    def members(dirs: tuple[Path, ...]) -> list[int]:
        pids: list[int] = []
        for path in dirs:
            try:
                pids.extend(int(x) for x in (path / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return pids

    @staticmethod
    def oom_kills(dirs: tuple[Path, ...]) -> int:
        """OOM kills inside the task's memory cgroup (v1 memory.oom_control, v2 memory.events)."""
        for path in dirs:
            for name in ("memory.events", "memory.oom_control"):
                try:
                    text = (path / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
        return 0

    @staticmethod
    def remove(dirs: tuple[Path, ...]) -> bool:
        """rmdir the task's cgroups (and their base once empty); False if one is still busy."""
        removed = True
        for path in dirs:
            removed = _try_rmdir(path) and removed
            if path.parent.name.startswith("mesh-"):
                _try_rmdir(path.parent)
        return removed


class ProcessExecutor:
    """Starts, waits for, kills and re-adopts the tasks of one agent.

    ``limits``: "auto" (cgroup if writable here, else rlimit), "cgroup",
    "rlimit" or "none"; ``limit_mode`` says which is in force, and
    ``limit_detail`` what was found. ``kill_grace_s`` is the grace a task
    gets between SIGTERM and SIGKILL when it overruns its max run time.
    ``task_env`` is given to every task, ``task_identity`` only to tasks that ask for
    it (see ``_environment``).
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        run_as: str | None = None,
        limits: str = "auto",
        allow_root: bool = True,
        task_env: Mapping[str, str] | None = None,
        task_identity: Mapping[str, str] | None = None,
    ) -> None:
        if limits not in ("auto", "cgroup", "rlimit", "none"):
            raise ValueError(f"limits must be auto, cgroup, rlimit or none, not {limits!r}")
        self.work_dir = Path(work_dir).absolute()
        self._run_as = _resolve_run_as(run_as)
        if self._run_as is None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._open_work_dir()
        self.kill_grace_s = 5.0
        self.poll_interval_s = 0.1
        # Tasks would run as root (a root agent without run_as, or run_as root): allowed only
        # when asked for. The agent asks for it only with --allow-root; the default here is
        # permissive for direct use of the executor. Non-empty: why start() refuses, short
        # enough for a table cell (the agent also offers no capacity: see Agent.refusing).
        task_uid = self._run_as.uid if self._run_as is not None else os.geteuid()
        self.root_refusal = ROOT_REFUSAL if task_uid == 0 and not allow_root else ""
        self._task_env = dict(task_env or {})
        self._task_identity = None if task_identity is None else dict(task_identity)
        self._boot_id = _boot_id()
        # Wrappers this executor spawned: their exit can be waited for, not just polled.
        self._children: dict[str, tuple[ProcessHandle, subprocess.Popen[bytes]]] = {}
        self._cgroups: _Cgroups | None = None
        self.cgroup_version: int | None = None
        self.limit_detail = ""
        if limits in ("auto", "cgroup"):
            base = "mesh-" + hashlib.sha256(bytes(self.work_dir)).hexdigest()[:12]
            self._cgroups, self.limit_detail = _Cgroups.detect(base)
            if self._cgroups is None and limits == "cgroup":
                raise ExecError(f"cgroup limits requested but unusable: {self.limit_detail}")
        if self._cgroups is not None:
            self.limit_mode: LimitMode = "cgroup"
            self.cgroup_version = self._cgroups.version
        elif limits == "none":
            self.limit_mode = "none"
        else:
            self.limit_mode = "rlimit"
            if limits == "rlimit":
                self.limit_detail = "rlimit requested"

    def _open_work_dir(self) -> None:
        """Tasks run as another user walk through the work dir to their status dir:
        it is made (and, being the agent's own, kept) traversable by everyone."""
        make_dirs(self.work_dir)
        st = self.work_dir.stat()
        if st.st_uid == os.geteuid() and st.st_mode & 0o011 != 0o011:
            os.chmod(self.work_dir, stat.S_IMODE(st.st_mode) | 0o011)

    def task_user_problem(self) -> str:
        """Why the task user cannot record its tasks' exit status here ("" if it can):
        names the user and the first directory it cannot get through. Only a root agent
        with ``run_as`` another user can have the problem; the agent asks at start."""
        if self._run_as is None:
            return ""
        blocked = unreachable_dir(
            self.work_dir, self._run_as.uid, self._run_as.gid, self._run_as.groups
        )
        if blocked is None:
            return ""
        return f"task user {self._run_as.name!r} cannot traverse or write {blocked}"

    # ------------------------------------------------------------------ paths

    def _task_dir(self, task_id: str) -> Path:
        return self.work_dir / task_dir_name(task_id)

    def files_dir(self, task_id: str) -> Path:
        """Where a run's `ExecSpec.files` go (and its progress file): in its task dir, so
        it goes with the run's other leftovers, and known before it starts, so its argv
        and env can name it."""
        return self._task_dir(task_id) / "files"

    # ------------------------------------------------------------------ start

    async def start(self, spec: ExecSpec) -> ProcessHandle:
        """Start the task; returns once it runs. Raises ExecError if it cannot start."""
        _validate(spec)
        if self.root_refusal:
            raise ExecError(self.root_refusal)
        task_dir = self._task_dir(spec.task_id)
        if self._running_here(spec.task_id) or self._previous_alive(task_dir):
            raise ExecError(f"task {spec.task_id!r} is already running")
        self._reset_task_dir(task_dir)
        status_dir, work = task_dir / "status", task_dir / "work"
        files = self.files_dir(spec.task_id)
        for d in (status_dir, work, files):
            d.mkdir(mode=0o755)
            if self._run_as is not None:
                os.chown(d, self._run_as.uid, self._run_as.gid)
        owner = None if self._run_as is None else (self._run_as.uid, self._run_as.gid)
        try:
            write_files(files, spec.files, owner)
        except (ValueError, OSError) as exc:
            raise ExecError(f"cannot write the task's files: {exc}") from exc
        env = self._environment(spec)
        cwd = work if spec.cwd is None else work / spec.cwd  # an absolute cwd replaces work
        if not cwd.is_dir():
            raise ExecError(f"cwd is not a directory: {spec.cwd!r}")
        command = _resolve_command(spec.argv[0], env["PATH"], cwd)
        cgroup_dirs: tuple[Path, ...] = ()
        if self._cgroups is not None:
            try:
                cgroup_dirs = self._cgroups.create(task_dir.name, spec.cpu_milli, spec.memory_bytes)
            except OSError as exc:
                raise ExecError(f"cannot create the task's cgroup: {exc}") from exc
        mem_kib = 0
        if self.limit_mode == "rlimit" and spec.memory_bytes:
            mem_kib = max(1, -(-spec.memory_bytes // 1024))
        try:
            proc, gate = self._spawn(spec, command, task_dir, cwd, env, mem_kib)
        except BaseException:
            _Cgroups.remove(cgroup_dirs)
            raise
        released = False
        try:
            start_time = process_start_time(proc.pid)  # the wrapper waits at the gate
            ticks = process_start_ticks(proc.pid)
            if start_time is None:
                raise ExecError("the task wrapper died before it was released")
            if self._cgroups is not None:
                try:
                    self._cgroups.add(cgroup_dirs, proc.pid)
                except OSError as exc:
                    raise ExecError(f"cannot move the task into its cgroup: {exc}") from exc
            meta = _Meta(
                pid=proc.pid,
                start_time=start_time,
                start_ticks=ticks,
                boot_id=self._boot_id,
                max_run_time_s=spec.max_run_time_s,
                memory_bytes=spec.memory_bytes,
                cgroups=tuple(str(d) for d in cgroup_dirs),
                started_mono=time.monotonic(),  # the release follows: nothing ran before
            )
            _write_meta(task_dir, meta)
            handle = ProcessHandle(spec.task_id, proc.pid, start_time, str(task_dir))
            self._children[spec.task_id] = (handle, proc)
            os.write(gate, b"go\n")
            released = True
        finally:
            os.close(gate)  # unreleased: the wrapper reads EOF and exits 125, running nothing
            if not released:
                self._children.pop(spec.task_id, None)
                self._abandon(proc, cgroup_dirs)
        return handle

    def _user_kwargs(self) -> dict[str, Any]:
        """What subprocess needs to run a command as the --run-as user ({} without one)."""
        if self._run_as is None:
            return {}
        return {
            "user": self._run_as.uid,
            "group": self._run_as.gid,
            "extra_groups": list(self._run_as.groups),
        }

    async def check(self, spec: ExecSpec, timeout_s: float) -> tuple[bool, str]:
        """Run a task's health check once: `spec` is the task's own (its user, env and
        work dir) with the check's argv. True when it exits 0 within `timeout_s`; else
        False and why. Its own session, killed whole at the timeout; its output goes
        nowhere (a check that floods stdout must not fill the agent's disk)."""
        _validate(spec)
        task_dir = self._task_dir(spec.task_id)
        work = task_dir / "work"
        env = self._environment(spec)
        cwd = work if spec.cwd is None else work / spec.cwd
        if not cwd.is_dir():
            return False, f"cwd is not a directory: {spec.cwd!r}"
        try:
            command = _resolve_command(spec.argv[0], env["PATH"], cwd)
        except ExecError as exc:
            return False, str(exc)
        user = self._user_kwargs()
        try:
            proc = await asyncio.create_subprocess_exec(
                command,
                *spec.argv[1:],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=cwd,
                env=env,
                start_new_session=True,
                **user,
            )
        except OSError as exc:
            return False, f"cannot start the health check: {exc}"
        try:
            code = await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return False, f"health check timed out after {timeout_s:g}s"
        finally:
            if proc.returncode is None:  # cancelled: leave nothing behind
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        return code == 0, "" if code == 0 else f"health check exited with {code}"

    @staticmethod
    def _abandon(proc: subprocess.Popen[bytes], cgroup_dirs: tuple[Path, ...]) -> None:
        """Reap a wrapper that was never released (it runs nothing) and drop its cgroups."""
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        _Cgroups.remove(cgroup_dirs)

    def _environment(self, spec: ExecSpec) -> dict[str, str]:
        """A minimal base from the agent (PATH, HOME, LANG), the spec's env, then what the
        agent says about itself and the task (these win over the spec's):

        - PATH starts with the directory of the agent's own interpreter
          (``sys.executable``, symlinks not resolved), so ``python`` in a task command is
          the Python the agent runs under: in a virtual environment, that environment's,
          with Mesh and its dependencies importable, which is what ``python -m
          inference.worker`` needs. A spec that sets PATH replaces all of it.
        - ``task_env`` (the agent's MESH_NATS_URL and MESH_REGION) and MESH_TASK_ID.
        - ``task_identity`` (MESH_TLS_CA/CERT/KEY, MESH_INBOX_PREFIX: the files of the
          agent's task identity, never its own key) only to a task whose spec sets
          ``MESH_TASK_IDENTITY=worker``. Handing them to every task would give each
          batch job a NATS identity it has no use for, and its env to leak; a submitter
          can still ask for it, so this is least exposure, not a boundary against a
          hostile user (see docs/inference_deploy.md). ``task_identity=None`` means the
          agent has none on a secure mesh: such a task is refused with a clear error
          rather than left to fail its TLS handshake; ``{}`` means there is nothing to
          give (an insecure mesh).
        """
        interpreter_dir = os.path.dirname(sys.executable) if sys.executable else ""
        base_path = os.environ.get("PATH") or _DEFAULT_PATH
        if interpreter_dir.startswith("/"):
            rest = [p for p in base_path.split(os.pathsep) if p and p != interpreter_dir]
            base_path = os.pathsep.join([interpreter_dir, *rest])
        env = {"PATH": base_path}
        home = self._run_as.home if self._run_as is not None else os.environ.get("HOME")
        if home:
            env["HOME"] = home
        env["LANG"] = os.environ.get("LANG") or "C.UTF-8"
        env.update(dict(spec.env))
        env.update(self._task_env)
        env["MESH_TASK_ID"] = spec.task_id
        wanted = env.get(TASK_IDENTITY_VAR)
        if wanted is not None:
            if wanted not in TASK_IDENTITIES:
                raise ExecError(
                    f"{TASK_IDENTITY_VAR}={wanted[:64]!r}: the only task identity is "
                    f"{', '.join(TASK_IDENTITIES)}"
                )
            if self._task_identity is None:
                raise ExecError(
                    f"the task asks for the {wanted} identity ({TASK_IDENTITY_VAR}) but this "
                    "agent has none on a secure mesh: start it with --task-identity DIR"
                )
            env.update(self._task_identity)
        env.setdefault("PATH", _DEFAULT_PATH)
        return env

    def _spawn(
        self,
        spec: ExecSpec,
        command: str,
        task_dir: Path,
        cwd: Path,
        env: dict[str, str],
        mem_kib: int,
    ) -> tuple[subprocess.Popen[bytes], int]:
        """Fork the wrapper, held at its gate; returns it and the gate's write end.

        Plain Popen, not asyncio's subprocess: an asyncio transport kills its
        child when it is closed or collected, and tasks must outlive the agent.
        Fork and exec take a few milliseconds on the event loop.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(task_dir / "stdout.log", flags, 0o600)
        err = os.open(task_dir / "stderr.log", flags, 0o600)
        gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
        user = self._user_kwargs()
        try:
            proc = subprocess.Popen(
                [_SH, "-c", _WRAPPER, "mesh-task", str(task_dir / "status"), str(mem_kib)]
                + [command, *spec.argv[1:]],
                stdin=gate_r,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                **user,
            )
        except BaseException as exc:
            os.close(gate_w)
            if isinstance(exc, OSError):
                raise ExecError(f"cannot start {spec.argv[0]!r}: {exc}") from exc
            raise
        finally:
            for fd in (gate_r, out, err):
                os.close(fd)
        return proc, gate_w

    def _running_here(self, task_id: str) -> bool:
        child = self._children.get(task_id)
        return child is not None and child[1].poll() is None

    def _previous_alive(self, task_dir: Path) -> bool:
        meta = _read_meta(task_dir)
        return meta is not None and self._alive(meta.pid, meta.start_time, meta)

    def _reset_task_dir(self, task_dir: Path) -> None:
        """Remove what a previous (finished) run of this task id left behind."""
        meta = _read_meta(task_dir)
        if meta is not None and self._cgroups is not None:
            _Cgroups.remove(tuple(Path(p) for p in meta.cgroups))
        if task_dir.exists() or task_dir.is_symlink():
            shutil.rmtree(task_dir, ignore_errors=True)
        task_dir.mkdir(mode=0o711)
        os.chmod(task_dir, 0o711)  # whatever the umask: a run_as task walks through it

    # ------------------------------------------------------------------ liveness

    def _alive(self, pid: int, start_time: float, meta: _Meta | None) -> bool:
        """Is ``pid`` still the task's wrapper (not a zombie, not a re-used pid)?

        Prefer the boot-relative start ticks recorded at start: create_time
        moves with the wall clock, which may have been stepped since.
        """
        if meta is not None and meta.pid == pid and _same_start(meta.start_time, start_time):
            if meta.start_ticks is not None and meta.boot_id and meta.boot_id == self._boot_id:
                return process_start_ticks(pid) == meta.start_ticks
            if meta.boot_id and self._boot_id and meta.boot_id != self._boot_id:
                return False  # the host rebooted since
        return _same_start(process_start_time(pid), start_time)

    def _handle_alive(self, handle: ProcessHandle) -> bool:
        return self._alive(handle.pid, handle.start_time, _read_meta(Path(handle.task_dir)))

    def _session_is_ours(self, handle: ProcessHandle) -> bool:
        """Processes in session ``handle.pid`` belong to the task unless that pid was re-used.

        A pid is not handed out again while a session carries its number, so
        the only way the session is someone else's is a live, different
        process now holding that pid.
        """
        start = process_start_time(handle.pid)
        return start is None or _same_start(start, handle.start_time)

    def processes(self, handle: ProcessHandle) -> frozenset[int]:
        """The task's live pids: its session and process group, plus its cgroup.

        For whoever must tell the task's processes from others' (the GPU
        watchdog matching NVML's pids); the agent's own pid is never among them.
        """
        meta = _read_meta(Path(handle.task_dir))
        cgroup_dirs = tuple(Path(p) for p in meta.cgroups) if meta is not None else ()
        return frozenset(self._members(handle, cgroup_dirs))

    def _members(self, handle: ProcessHandle, cgroup_dirs: tuple[Path, ...]) -> set[int]:
        pids = set(_Cgroups.members(cgroup_dirs))
        if self._session_is_ours(handle):
            pids.update(session_processes(handle.pid))
        pids.discard(os.getpid())
        return pids

    @staticmethod
    def _sigkill(pids: set[int], leader: int) -> None:
        if pids:
            with contextlib.suppress(OSError):
                os.killpg(leader, signal.SIGKILL)  # atomic for the group: catches a fork in flight
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ adopt

    def adopt(self, task_id: str, pid: int, start_time: float) -> ProcessHandle | None:
        """Take back a task started by an earlier agent; None if it is gone without a trace.

        A dead wrapper (or a pid now used by another process) still yields a
        handle if it recorded its exit status: wait() then returns it at once.
        """
        if not isinstance(task_id, str) or not task_id:
            return None
        task_dir = self._task_dir(task_id)
        if not task_dir.is_dir() or task_dir.is_symlink():
            return None
        meta = _read_meta(task_dir)
        if meta is not None and meta.pid != pid:
            return None
        handle = ProcessHandle(task_id, pid, start_time, str(task_dir))
        if _read_exit(task_dir) is not None or self._alive(pid, start_time, meta):
            return handle
        return None

    def orphans(self, known: Iterable[str]) -> list[ProcessHandle]:
        """Runs recorded in the work dir, still alive, that are none of `known` (the
        task ids the agent's store has). After the store was lost (corrupt, deleted)
        nothing else would ever stop them: the coordinator runs the task again
        elsewhere, and this copy would run on unmanaged."""
        mine = {task_dir_name(t) for t in known}
        found = []
        with contextlib.suppress(OSError):
            for task_dir in sorted(self.work_dir.iterdir()):
                if task_dir.name in mine or task_dir.is_symlink() or not task_dir.is_dir():
                    continue
                meta = _read_meta(task_dir)
                if meta is None or _read_exit(task_dir) is not None:
                    continue
                if self._alive(meta.pid, meta.start_time, meta):
                    found.append(
                        ProcessHandle(task_dir.name, meta.pid, meta.start_time, str(task_dir))
                    )
        return found

    def recorded(self, task_id: str) -> ProcessHandle | None:
        """The handle start() wrote down for this task before releasing its command.

        For an agent that died between start() and storing the pid: pass the
        result to adopt(). None if start() never got that far.
        """
        if not isinstance(task_id, str) or not task_id:
            return None
        task_dir = self._task_dir(task_id)
        meta = _read_meta(task_dir)
        if meta is None:
            return None
        return ProcessHandle(task_id, meta.pid, meta.start_time, str(task_dir))

    # ------------------------------------------------------------------ wait

    async def wait(self, handle: ProcessHandle) -> ExitStatus:
        """Wait for the task to end (enforcing its max run time) and say how it ended.

        Whatever the command left running in its session or cgroup is
        SIGKILLed once it has exited: a task ends as a whole.
        """
        task_dir = Path(handle.task_dir)
        meta = _read_meta(task_dir)
        deadline = self._deadline(handle, meta)
        child = self._children.get(handle.task_id)
        returncode: int | None = None
        if child is not None and child[0] == handle:
            returncode = await self._wait_child(handle, child[1], deadline)
        else:
            await self._wait_adopted(handle, meta, deadline)
        cgroup_dirs = tuple(Path(p) for p in meta.cgroups) if meta is not None else ()
        await self._kill_stragglers(handle, cgroup_dirs)
        status = self._exit_status(task_dir, returncode, meta)
        _Cgroups.remove(cgroup_dirs)
        return status

    def _deadline(self, handle: ProcessHandle, meta: _Meta | None) -> float | None:
        """When the task's max run time is up, on the monotonic clock (None: no limit).

        Counted from the release start() recorded, never from psutil's create_time,
        whose whole-second boot time made 1 s limits fire after 0.6 s. A record
        without it (an older agent's) counts from create_time, pushed back by that
        rounding so the limit is never cut short.
        """
        if meta is None or meta.max_run_time_s is None:
            return None
        if meta.started_mono is not None and meta.boot_id == self._boot_id:
            return meta.started_mono + meta.max_run_time_s
        end_wall = handle.start_time + meta.max_run_time_s + _CREATE_TIME_SLACK_S
        return time.monotonic() + (end_wall - time.time())

    async def _wait_child(
        self, handle: ProcessHandle, proc: subprocess.Popen[bytes], deadline: float | None
    ) -> int:
        """Wait for our own wrapper: woken by its pidfd where the kernel has them, else polled."""
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(proc.pid)
            loop.add_reader(pidfd, exited.set)
        try:
            while (returncode := proc.poll()) is None:
                if deadline is not None and time.monotonic() >= deadline:
                    deadline = None
                    await self._expire(handle)
                    continue
                timeout = None if pidfd is not None else self.poll_interval_s
                if deadline is not None:
                    left = max(0.0, deadline - time.monotonic())
                    timeout = left if timeout is None else min(timeout, left)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(exited.wait(), timeout)
            return returncode
        finally:
            if pidfd is not None:
                loop.remove_reader(pidfd)
                os.close(pidfd)

    async def _wait_adopted(
        self, handle: ProcessHandle, meta: _Meta | None, deadline: float | None
    ) -> None:
        task_dir = Path(handle.task_dir)
        while True:
            alive = self._alive(handle.pid, handle.start_time, meta)
            if _read_exit(task_dir) is not None or not alive:
                return
            if deadline is not None and time.monotonic() >= deadline:
                deadline = None
                await self._expire(handle)
                continue
            left = self.poll_interval_s if deadline is None else deadline - time.monotonic()
            await asyncio.sleep(max(0.0, min(self.poll_interval_s, left)))

    async def _expire(self, handle: ProcessHandle) -> None:
        _mark(Path(handle.task_dir), "timeout")
        await self.kill(handle, self.kill_grace_s)

    async def _kill_stragglers(self, handle: ProcessHandle, cgroup_dirs: tuple[Path, ...]) -> None:
        for _ in range(100):
            pids = self._members(handle, cgroup_dirs)
            if not pids:
                return
            self._sigkill(pids, handle.pid)
            await asyncio.sleep(0.02)

    def _exit_status(
        self, task_dir: Path, returncode: int | None, meta: _Meta | None
    ) -> ExitStatus:
        rc = _read_exit(task_dir)
        exit_code: int | None = None
        sig: int | None = None
        if rc is not None:
            if 128 < rc <= 128 + _MAX_SIGNAL:
                sig = rc - 128
            else:
                exit_code = rc
        elif returncode is not None:  # the wrapper itself died, or failed its set-up
            if returncode < 0:
                sig = -returncode
            else:
                exit_code = returncode
        marker, reason = _read_marker(task_dir)
        stderr = _read_tail(task_dir / "stderr.log", _LOG_TAIL)
        tail = _decode_tail(stderr or _read_tail(task_dir / "stdout.log", _LOG_TAIL))
        if (
            meta is not None
            and meta.memory_bytes
            and _Cgroups.oom_kills(tuple(Path(p) for p in meta.cgroups))
        ):
            tail += f"\n[mesh] out of memory: the task exceeded its {meta.memory_bytes} byte limit"
        return ExitStatus(
            exit_code=exit_code,
            signal=sig,
            killed=marker is not None,
            timed_out=marker == "timeout",
            log_tail=tail,
            reason=reason,
        )

    # ------------------------------------------------------------------ kill

    async def kill(self, handle: ProcessHandle, grace_s: float = 5.0, *, reason: str = "") -> None:
        """SIGTERM the task's processes (group, session, cgroup), SIGKILL after ``grace_s``.

        ``reason`` (kept with the kill marker, so it survives an agent restart)
        comes back in ``ExitStatus.reason``: a kill the agent decided on, not the
        user, must tell the user why. The first recorded reason wins.

        The wrapper itself is spared the SIGTERM so it can record how the
        command ended; a process that appears during the grace (forked late,
        or the command not yet exec'd when kill() began) gets its SIGTERM
        when it is first seen. Returns once none is left (zombies aside).
        """
        task_dir = Path(handle.task_dir)
        meta = _read_meta(task_dir)
        cgroup_dirs = tuple(Path(p) for p in meta.cgroups) if meta is not None else ()
        if _read_exit(task_dir) is None and self._alive(handle.pid, handle.start_time, meta):
            _mark(task_dir, "kill", reason)
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, grace_s)
        termed: set[int] = {handle.pid}
        pids = self._members(handle, cgroup_dirs)
        while pids:
            for pid in pids - termed:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            termed |= pids
            if loop.time() >= end:
                break
            await asyncio.sleep(0.05)
            pids = self._members(handle, cgroup_dirs)
        end = loop.time() + 10.0
        while pids and loop.time() < end:
            self._sigkill(pids, handle.pid)
            await asyncio.sleep(0.02)
            pids = self._members(handle, cgroup_dirs)

    # ------------------------------------------------------------------ logs, cleanup

    def read_log(self, task_id: str, stream: str = "stdout", tail_bytes: int = 65536) -> bytes:
        """The last ``tail_bytes`` of a task's stdout or stderr; b"" for an unknown task."""
        if stream not in _STREAMS:
            raise ValueError(f"stream must be one of {_STREAMS}, not {stream!r}")
        if not isinstance(task_id, str):
            return b""
        return _read_tail(self._task_dir(task_id) / f"{stream}.log", tail_bytes)

    def running(self) -> list[ProcessHandle]:
        """The tasks this executor started and has not cleaned up (ended ones included)."""
        return [handle for handle, _ in self._children.values()]

    def cleanup(self, task_id: str) -> None:
        """Remove the task's dir and cgroups, SIGKILLing whatever of it still runs."""
        if not isinstance(task_id, str):
            return
        task_dir = self._task_dir(task_id)
        meta = _read_meta(task_dir)
        self._children.pop(task_id, None)
        if meta is not None:
            cgroup_dirs = tuple(Path(p) for p in meta.cgroups)
            for _ in range(50):
                pids = set(_Cgroups.members(cgroup_dirs))
                if self._alive(meta.pid, meta.start_time, meta):
                    pids.update(session_processes(meta.pid))
                if not pids:
                    break
                self._sigkill(pids, meta.pid)
                time.sleep(0.01)
            for _ in range(50):
                if _Cgroups.remove(cgroup_dirs):
                    break
                time.sleep(0.01)
        if task_dir.is_symlink():
            task_dir.unlink()
        elif task_dir.exists():
            shutil.rmtree(task_dir, ignore_errors=True)


# ---------------------------------------------------------------------- task dir files


def _read_exit(task_dir: Path) -> int | None:
    """The status the wrapper recorded, or None (not yet, or never)."""
    data = _read_small(task_dir / "status" / "exit", 16)
    if not data:
        return None
    try:
        rc = int(data.strip())
    except ValueError:
        return None
    return rc if 0 <= rc <= 255 else None


def _mark(task_dir: Path, marker: _Marker, reason: str = "") -> None:
    """Record that the agent is killing the task, unless a reason is already recorded.

    The marker is the first line; a reason, if any, the rest of the file.
    """
    text = marker + ("\n" + reason[:_MAX_REASON] if reason else "")
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        fd = os.open(task_dir / "killed", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, text.encode("utf-8", errors="replace"))
        finally:
            os.close(fd)


def _read_marker(task_dir: Path) -> tuple[_Marker | None, str]:
    """The kill marker (None if the agent never killed the task) and its reason."""
    data = _read_small(task_dir / "killed", 16 + 4 * _MAX_REASON)
    if data is None:
        return None, ""
    first, _, rest = data.partition(b"\n")
    marker: _Marker = "timeout" if first.strip() == b"timeout" else "kill"
    return marker, rest.decode("utf-8", errors="replace").strip()


def _write_meta(task_dir: Path, meta: _Meta) -> None:
    tmp = task_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(dataclasses.asdict(meta)))
    os.replace(tmp, task_dir / "meta.json")


def _read_meta(task_dir: Path) -> _Meta | None:
    data = _read_small(task_dir / "meta.json", 64 * 1024)
    if not data:
        return None
    try:
        raw = json.loads(data)
        mrt = raw["max_run_time_s"]
        ticks = raw["start_ticks"]
        mono = raw.get("started_mono")
        return _Meta(
            pid=int(raw["pid"]),
            start_time=float(raw["start_time"]),
            start_ticks=None if ticks is None else int(ticks),
            boot_id=str(raw["boot_id"]),
            max_run_time_s=None if mrt is None else float(mrt),
            memory_bytes=int(raw["memory_bytes"]),
            cgroups=tuple(p for p in map(str, raw["cgroups"]) if _is_task_cgroup(p, task_dir)),
            started_mono=None if mono is None else float(mono),
        )
    except (ValueError, KeyError, TypeError):
        return None
