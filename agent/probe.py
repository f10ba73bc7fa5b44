"""Host and GPU probes: what this node has and how busy it is.

This is the only module of the project that imports ``psutil`` and ``pynvml``
(house rule), so everything that inspects processes for the agent lives here
too (``process_start_time``, ``session_processes``): the executor asks this
module instead of importing psutil itself.

Every call is cheap and non-blocking except NVML queries, which take a few
milliseconds per device; an agent that samples often can run
``HostProbe.sample`` in a worker thread.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "GpuInfo",
    "GpuProbe",
    "GpuProcess",
    "HostProbe",
    "HostSample",
    "PressureProbe",
    "parse_pressure",
    "process_start_ticks",
    "process_start_time",
    "session_processes",
]


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU, as NVML sees it."""

    pid: int
    used_memory: int  # bytes; 0 when NVML cannot tell (e.g. without permission or under MIG)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU at one instant. Fields NVML refused to give are 0 / "unknown"."""

    index: int
    uuid: str
    model: str
    memory_total: int  # bytes
    memory_used: int  # bytes
    utilization: int  # percent of time a kernel ran over NVML's last sample period
    processes: tuple[GpuProcess, ...] = ()
    mig_enabled: bool = False  # MIG mode is on: the GPU is (or can be) cut into hardware slices


@dataclass(frozen=True, slots=True)
class HostSample:
    """One sample of the host: capacity and current use."""

    cpu_count: int
    cpu_percent: float  # busy share of all CPUs since the previous sample, 0..100
    load1: float
    memory_total: int  # bytes
    memory_used: int  # bytes not available to new work (total - available)
    disk_total: int  # bytes, of the file system holding the agent's data dir
    disk_used: int
    gpus: tuple[GpuInfo, ...] = ()
    # Linux PSI `some avg10` (percent of the last 10 s that some task waited for CPU /
    # memory); None where the kernel has no PSI (see PressureProbe)
    cpu_pressure: float | None = None
    mem_pressure: float | None = None


def _text(value: Any) -> str:
    """NVML returns bytes in old bindings and str in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class GpuProbe:
    """NVML wrapper that never raises: a node without GPUs is a normal node.

    ``open()`` initialises NVML once; ``sample()`` queries every device, and a
    query NVML refuses (unsupported on this GPU, lost device, no permission)
    costs only that field or that device, with the reason kept in ``error``.
    """

    def __init__(self) -> None:
        self.error: str | None = None
        self._nvml: Any = None  # the pynvml module once NVML is initialised
        # What one NVML call may raise: NVMLError, or a binding/driver mismatch.
        self._errors: tuple[type[BaseException], ...] = ()

    @property
    def is_open(self) -> bool:
        return self._nvml is not None

    def open(self) -> bool:
        """Initialise NVML; False (and ``error`` says why) when it is not usable here."""
        if self._nvml is not None:
            return True
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py missing: still a valid CPU node
            self.error = f"NVML unavailable: {exc}"
            return False
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as exc:  # LibraryNotFound, DriverNotLoaded, ...
            self.error = f"NVML unavailable: {exc}"
            return False
        self._nvml = pynvml
        self._errors = (pynvml.NVMLError, OSError, AttributeError, TypeError, ValueError)
        self.error = None
        return True

    def sample(self) -> tuple[GpuInfo, ...]:
        """All devices now; () when NVML is not open or cannot count devices."""
        nvml = self._nvml
        if nvml is None:
            return ()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._errors as exc:
            self.error = f"nvmlDeviceGetCount: {exc}"
            return ()
        errors: list[str] = []
        gpus: list[GpuInfo] = []
        for index in range(count):
            info = self._device(nvml, index, errors, self._errors)
            if info is not None:
                gpus.append(info)
        self.error = "; ".join(errors) if errors else None
        return tuple(gpus)

    @staticmethod
    def _device(
        nvml: Any, index: int, errors: list[str], nvml_errors: tuple[type[BaseException], ...]
    ) -> GpuInfo | None:
        """One device; None if it cannot even be identified (no handle or no UUID)."""
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml_errors as exc:
            errors.append(f"gpu {index}: {exc}")
            return None
        model = "unknown"
        memory_total = memory_used = utilization = 0
        processes: tuple[GpuProcess, ...] = ()
        mig_enabled = False
        try:
            model = _text(nvml.nvmlDeviceGetName(handle))
        except nvml_errors as exc:
            errors.append(f"gpu {index} name: {exc}")
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            memory_total, memory_used = int(mem.total), int(mem.used)
        except nvml_errors as exc:
            errors.append(f"gpu {index} memory: {exc}")
        try:
            utilization = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml_errors as exc:  # NOT_SUPPORTED on MIG-enabled GPUs
            errors.append(f"gpu {index} utilization: {exc}")
        try:
            processes = tuple(
                GpuProcess(pid=int(p.pid), used_memory=int(p.usedGpuMemory or 0))
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
        except nvml_errors as exc:
            errors.append(f"gpu {index} processes: {exc}")
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            mig_enabled = current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        except nvml_errors as exc:
            if not _not_supported(nvml, exc):  # a GPU without MIG says NOT_SUPPORTED: no error
                errors.append(f"gpu {index} mig mode: {exc}")
        return GpuInfo(
            index=index,
            uuid=uuid,
            model=model,
            memory_total=memory_total,
            memory_used=memory_used,
            utilization=utilization,
            processes=processes,
            mig_enabled=mig_enabled,
        )

    def process_memory(self) -> dict[str, dict[int, int]]:
        """GPU memory each compute process holds, per GPU uuid: {uuid: {pid: bytes}}.

        Only what the GPU watchdog needs, so a poll costs one NVML call per
        device. Pids are as NVML sees them (the host's pid namespace). A device
        NVML refuses is left out and named in ``error``; {} when NVML is not open.
        """
        nvml = self._nvml
        if nvml is None:
            return {}
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._errors as exc:
            self.error = f"nvmlDeviceGetCount: {exc}"
            return {}
        usage: dict[str, dict[int, int]] = {}
        errors: list[str] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except self._errors as exc:
                errors.append(f"gpu {index} processes: {exc}")
                continue
            held: dict[int, int] = {}
            for p in procs:
                # The larger of repeated entries, not their sum: a process listed twice
                # must not look twice as big and be killed for it.
                pid = int(p.pid)
                held[pid] = max(held.get(pid, 0), int(p.usedGpuMemory or 0))
            usage[uuid] = held
        if errors:
            self.error = "; ".join(errors)
        return usage

    def close(self) -> None:
        """Shut NVML down; safe to call twice or when never opened."""
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except self._errors as exc:
                self.error = f"nvmlShutdown: {exc}"


def _not_supported(nvml: Any, exc: BaseException) -> bool:
    return getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)


def _busy_and_total(times: Any) -> tuple[float, float]:
    """Busy and total CPU seconds, counted the way psutil.cpu_percent counts them.

    guest time is already included in user time on Linux, so it is left out of
    the total; idle and iowait are the idle part.
    """
    total = sum(times)
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def parse_pressure(text: str) -> float | None:
    """The `some avg10` figure of a PSI file (`some avg10=1.23 avg60=... total=...`),
    clamped to 0..100; None when the text has none (a format this does not know)."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "some":
            continue
        for item in rest.split():
            name, _, value = item.partition("=")
            if name == "avg10":
                try:
                    x = float(value)
                except ValueError:
                    return None
                return min(100.0, max(0.0, x)) if x == x else None  # x != x: nan
    return None


class PressureProbe:
    """Linux pressure stall information (PSI): how much of the last 10 s tasks waited for
    CPU and for memory, read from `<proc_root>/pressure/{cpu,memory}`.

    Busy alone cannot tell a node at 100 % that keeps up from one whose work queues;
    PSI can (docs: the kernel's Documentation/accounting/psi.rst). Two small reads of
    procfs per sample, no psutil. Where the kernel has no PSI (before 4.20, built without
    it, booted with psi=0: the read fails with EOPNOTSUPP) or a container hides
    /proc/pressure, a resource reads None, and once a file is known to be absent it is
    not tried again. `proc_root` lets tests give it a directory of their own."""

    def __init__(self, proc_root: str | os.PathLike[str] = "/proc") -> None:
        base = Path(proc_root) / "pressure"
        self._paths: dict[str, Path | None] = {"cpu": base / "cpu", "memory": base / "memory"}

    def read(self, resource: str) -> float | None:
        path = self._paths[resource]
        if path is None:
            return None
        try:
            text = path.read_text(encoding="ascii", errors="replace")
        except OSError as exc:
            if isinstance(exc, FileNotFoundError | NotADirectoryError) or exc.errno in (
                errno.EOPNOTSUPP,
                errno.ENOTSUP,
            ):
                self._paths[resource] = None  # not this kernel's: not worth a syscall a beat
            return None
        return parse_pressure(text)

    def sample(self) -> tuple[float | None, float | None]:
        """(cpu, memory) `some avg10` now, percent, or None each."""
        return self.read("cpu"), self.read("memory")


class HostProbe:
    """Samples CPU, load, memory and disk without blocking.

    CPU use is the busy share since this probe's previous sample, kept per
    instance (not psutil's module-wide ``cpu_percent`` state), so two probes
    in one process do not skew each other.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        gpu_probe: GpuProbe | None = None,
        proc_root: str | os.PathLike[str] = "/proc",
    ):
        self._data_dir = Path(data_dir)
        self._gpu_probe = gpu_probe
        self._pressure = PressureProbe(proc_root)
        self._cpu_count = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        self._last_cpu = _busy_and_total(psutil.cpu_times())  # primes cpu_percent

    def _cpu_percent(self) -> float:
        busy, total = _busy_and_total(psutil.cpu_times())
        last_busy, last_total = self._last_cpu
        self._last_cpu = (busy, total)
        d_total = total - last_total
        if d_total <= 0:
            return 0.0
        return round(min(100.0, max(0.0, 100.0 * (busy - last_busy) / d_total)), 1)

    def _disk_path(self) -> Path:
        """The data dir, or its nearest existing parent before the agent created it."""
        path = self._data_dir.absolute()
        while not path.exists() and path.parent != path:
            path = path.parent
        return path

    def sample(self) -> HostSample:
        try:
            load1 = os.getloadavg()[0]
        except OSError:  # not available on this platform
            load1 = 0.0
        memory = psutil.virtual_memory()
        disk = psutil.disk_usage(str(self._disk_path()))
        gpus = self._gpu_probe.sample() if self._gpu_probe is not None else ()
        cpu_pressure, mem_pressure = self._pressure.sample()
        return HostSample(
            cpu_count=self._cpu_count,
            cpu_percent=self._cpu_percent(),
            load1=float(load1),
            memory_total=int(memory.total),
            memory_used=int(memory.total - memory.available),
            disk_total=int(disk.total),
            disk_used=int(disk.used),
            gpus=gpus,
            cpu_pressure=cpu_pressure,
            mem_pressure=mem_pressure,
        )


def process_start_time(pid: int) -> float | None:
    """psutil's create_time of a live process; None if it is gone or a zombie.

    The (pid, start time) pair names a process across pid reuse: the executor
    stores it and later compares, so a recycled pid is never mistaken for a task.
    """
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc.create_time()
    except (psutil.Error, ValueError, OSError):
        return None


def process_start_ticks(pid: int) -> int | None:
    """Start of a live process in clock ticks since boot; None if gone or a zombie.

    Unlike create_time (boot time from the wall clock, which moves when the
    clock is stepped), this never changes for a process, so the executor uses
    it, with the boot id, to recognise its task after an agent restart.
    """
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # the command name may hold spaces and ')'
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def session_processes(leader: int) -> tuple[int, ...]:
    """Live pids whose session or process group is ``leader``'s (zombies excluded).

    A task is started as a session leader, so this finds everything it spawned
    that did not call setsid() itself (only a cgroup catches those).
    """
    found: list[int] = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) != leader and os.getpgid(pid) != leader:
                continue
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                continue
        except (OSError, psutil.Error):  # exited meanwhile
            continue
        found.append(pid)
    return tuple(found)
