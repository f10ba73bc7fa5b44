"""GPU grants on this node: the environment a task gets, and how its grant is enforced.

The coordinator grants GPUs by UUID (``TaskSpec.gpu_uuids``) with an amount in
milli-GPUs and a memory grant in bytes. How much of that the node can hold a task
to depends on what the GPU offers, strongest first (``docs/gpu.md``):

- ``mig``: the GPU is partitioned in hardware;
- ``mps``: an MPS control daemon runs, and the driver caps each client's SM share
  and pinned memory from its environment;
- ``watchdog``: NVML works, so the agent measures each process's GPU memory and
  kills a task that holds more than its grant (after the fact, within a poll);
- ``none``: nothing but ``CUDA_VISIBLE_DEVICES``, which is placement, not a boundary.

Everything that decides is a pure function of its arguments (grant -> env,
usage -> verdict, probed facts -> level), so it is tested without a GPU. The I/O
is small and kept apart: ``mps_daemon_up`` looks at the MPS pipe directory, and
``GpuWatchdog`` polls an injected usage reader (NVML through ``probe.GpuProbe``
in the agent; nothing here imports pynvml).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import stat
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mesh.tasks import cancel_and_wait
from workloads.resources import gpu_share

__all__ = [
    "DEFAULT_MPS_PIPE_DIR",
    "Enforcement",
    "GpuGrant",
    "GpuGrantError",
    "GpuWatchdog",
    "NO_GPU",
    "Overuse",
    "UsageReader",
    "WatchedTask",
    "enforcement",
    "gpu_grant",
    "mps_daemon_up",
    "mps_pipe_dir",
    "over_grant",
    "task_env",
]

log = logging.getLogger("mesh.agent.gpu")

Enforcement = Literal["mig", "mps", "watchdog", "none"]
# uuid -> {pid: bytes of GPU memory it holds there}, as NVML reports it (host pids).
UsageReader = Callable[[], Mapping[str, Mapping[int, int]]]

DEFAULT_MPS_PIPE_DIR = "/tmp/nvidia-mps"
_MPS_PID_FILE = "nvidia-cuda-mps-control.pid"
_MILLI = 1000
_MIB = 1 << 20
_GIB = 1 << 30
# GPU-<uuid>, MIG-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>: nothing that could end the comma
# list of CUDA_VISIBLE_DEVICES or the k=v list of the MPS memory limit.
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}\Z")


class GpuGrantError(ValueError):
    """An assignment's GPU fields do not describe a grant the agent can honour."""


@dataclass(frozen=True, slots=True)
class GpuGrant:
    """The GPUs one task was granted, checked against the wire contract.

    ``milli`` below 1000 is a share of the single GPU in ``uuids``; otherwise the
    task has ``milli // 1000`` whole GPUs. ``memory`` is the total over them and is
    split evenly; 0 means no limit beyond the GPUs' own size.
    """

    milli: int
    uuids: tuple[str, ...]
    memory: int = 0

    @property
    def fractional(self) -> bool:
        return 0 < self.milli < _MILLI

    @property
    def memory_per_gpu(self) -> int:
        """Bytes the task may hold on each of its GPUs; 0 = no limit."""
        return gpu_share(0, self.memory, len(self.uuids))[1] if self.uuids else 0


NO_GPU = GpuGrant(0, ())


def gpu_grant(milli: int, memory: int, uuids: Iterable[str]) -> GpuGrant:
    """The grant an assignment carries; ``GpuGrantError`` when it is inconsistent.

    The agent never guesses a GPU: a task that asks for GPUs without naming them
    would otherwise see every GPU of the node, so it is refused instead.
    """
    uuids = tuple(uuids)
    if milli < 0 or memory < 0:
        raise GpuGrantError(f"negative GPU request (gpu={milli}, gpu_memory={memory})")
    for uuid in uuids:
        if not isinstance(uuid, str) or not _UUID.match(uuid):
            raise GpuGrantError(f"invalid GPU uuid {uuid!r}")
    if len(set(uuids)) != len(uuids):
        raise GpuGrantError(f"GPU uuids repeat: {', '.join(uuids)}")
    if milli == 0:
        return GpuGrant(0, uuids, memory) if uuids else NO_GPU
    if not uuids:
        raise GpuGrantError(
            f"the task asks for {_gpus(milli)} GPU but its assignment names none (no gpu_uuids)"
        )
    if milli < _MILLI:
        want = 1
    elif milli % _MILLI:
        raise GpuGrantError(f"{_gpus(milli)} GPUs: above one GPU only whole GPUs can be granted")
    else:
        want = milli // _MILLI
    if len(uuids) != want:
        raise GpuGrantError(
            f"the task asks for {_gpus(milli)} GPU, which takes {want} GPU uuid(s), "
            f"but its assignment names {len(uuids)}"
        )
    return GpuGrant(milli, uuids, memory)


def task_env(grant: GpuGrant, *, mps_pipe_dir: str | None = None) -> dict[str, str]:
    """The variables that put a task on its GPUs; they override the task's own env.

    ``mps_pipe_dir`` is set when every GPU of the grant is under MPS. The pipe
    directory is passed on so that a task cannot miss the daemon (and its limits)
    by bringing its own ``CUDA_MPS_PIPE_DIRECTORY``. MPS numbers devices as the
    process sees them, i.e. in ``CUDA_VISIBLE_DEVICES`` order, hence ``0=``, ``1=``.
    """
    if not grant.uuids:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": ",".join(grant.uuids)}
    if mps_pipe_dir is None:
        return env
    env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir
    if grant.fractional:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, math.ceil(grant.milli / 10)))
    if grant.memory_per_gpu:
        # Rounded down: the cap must never exceed the grant.
        mib = max(1, grant.memory_per_gpu // _MIB)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={mib}M" for i in range(len(grant.uuids))
        )
    return env


# ---------------------------------------------------------------------- enforcement level


def enforcement(*, mig_enabled: bool, mps: bool, nvml: bool) -> Enforcement:
    """What the agent can hold tasks on one GPU to, from facts probed about it."""
    if mig_enabled:
        return "mig"
    if mps:
        return "mps"
    if nvml:
        return "watchdog"
    return "none"


def mps_pipe_dir(environ: Mapping[str, str]) -> str:
    """Where the MPS control daemon's pipes are, for the agent's own environment."""
    return environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIR


def mps_daemon_up(pipe_dir: str | os.PathLike[str]) -> bool:
    """Is an MPS control daemon serving ``pipe_dir``?

    Its ``control`` pipe (a FIFO or socket) must be there and, when the daemon's
    pid file is there too, name a live process: a daemon killed with SIGKILL
    leaves its pipes behind, and claiming MPS then would promise limits that
    CUDA silently drops (a client that finds no daemon runs without MPS).
    """
    path = Path(pipe_dir)
    try:
        mode = os.lstat(path / "control").st_mode
    except OSError:
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False
    try:
        raw = (path / _MPS_PID_FILE).read_text()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        pid = int(raw.strip())
    except ValueError:
        return False
    return pid > 0 and os.path.exists(f"/proc/{pid}")


# ---------------------------------------------------------------------- watchdog verdict


@dataclass(frozen=True, slots=True)
class WatchedTask:
    """A running task as the watchdog sees it: its grant and its processes (host pids)."""

    key: Hashable
    grant: GpuGrant
    pids: frozenset[int]


@dataclass(frozen=True, slots=True)
class Overuse:
    """A task holding more GPU memory on one GPU than it was granted there."""

    key: Hashable
    uuid: str
    used: int  # bytes, over all of the task's processes on that GPU
    granted: int  # bytes; 0 on a GPU that is not the task's

    @property
    def message(self) -> str:
        if self.granted == 0:
            return f"gpu memory {_gib(self.used)} on {self.uuid}, a GPU not granted to the task"
        return (
            f"gpu memory {_gib(self.used)} on {self.uuid} exceeds its grant of {_gib(self.granted)}"
        )


def over_grant(
    tasks: Iterable[WatchedTask], usage: Mapping[str, Mapping[int, int]]
) -> list[Overuse]:
    """The tasks that hold more GPU memory than their grant, one entry per GPU.

    A task's use on a GPU is the sum over its processes. On its own GPUs it may
    hold ``memory_per_gpu`` (no limit when 0); on any other GPU, nothing.
    Processes that belong to no task (other users, the MPS server, the display)
    are none of the agent's business and are ignored.
    """
    found: list[Overuse] = []
    for task in tasks:
        own = set(task.grant.uuids)
        for uuid, procs in usage.items():
            used = sum(b for pid, b in procs.items() if pid in task.pids)
            if used <= 0:
                continue
            if uuid not in own:
                found.append(Overuse(task.key, uuid, used, 0))
            elif task.grant.memory_per_gpu and used > task.grant.memory_per_gpu:
                found.append(Overuse(task.key, uuid, used, task.grant.memory_per_gpu))
    return found


def _gib(n: int) -> str:
    return f"{n / _GIB:.1f} GiB"


def _gpus(milli: int) -> str:
    return f"{milli / _MILLI:g}"


# ---------------------------------------------------------------------- watchdog service


class GpuWatchdog:
    """Every ``interval_s``, measures GPU memory per process and reports tasks over grant.

    ``read_usage`` is called in the watchdog's own thread (NVML takes milliseconds
    per device), so ``stop()`` can wait for a read in flight before the caller
    shuts NVML down. ``tasks()`` and ``watched()`` run on the event loop: they
    read agent state. ``on_over`` gets each poll's findings and must not block on
    a kill's grace period: it decides, the next poll sees the result.
    """

    def __init__(
        self,
        read_usage: UsageReader,
        tasks: Callable[[], Iterable[WatchedTask]],
        on_over: Callable[[list[Overuse]], Awaitable[None]],
        *,
        watched: Callable[[], Collection[str]] | None = None,
        interval_s: float = 1.0,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, not {interval_s!r}")
        self.interval_s = interval_s
        self.error: str | None = None  # the last poll's failure, None once one succeeds
        self._read_usage = read_usage
        self._tasks = tasks
        self._on_over = on_over
        self._watched = watched
        self._pool: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-watchdog")
        self._task = asyncio.create_task(self._run(), name="gpu-watchdog")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        pool, self._pool = self._pool, None
        if pool is not None:  # a read still in its thread ends before NVML may be shut down
            await asyncio.to_thread(pool.shutdown, True)

    async def check(self) -> list[Overuse]:
        """One poll: measure, judge, report. Returns what it reported."""
        watched = None if self._watched is None else set(self._watched())
        if watched is not None and not watched:
            return []  # every GPU is covered by MIG or MPS: nothing to measure
        if self._pool is not None:
            usage = await asyncio.get_running_loop().run_in_executor(self._pool, self._read_usage)
        else:
            usage = self._read_usage()
        if watched is not None:
            usage = {uuid: procs for uuid, procs in usage.items() if uuid in watched}
        if not any(usage.values()):
            return []
        over = over_grant(self._tasks(), usage)
        if over:
            await self._on_over(over)
        return over

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
                self.error = None
            except Exception as exc:  # a failed poll must not end the watchdog
                if str(exc) != self.error:
                    log.warning("gpu watchdog poll failed: %s", exc)
                self.error = str(exc)
            await asyncio.sleep(self.interval_s)
