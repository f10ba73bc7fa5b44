"""HostProbe and GpuProbe on this machine: real psutil, real (absent) NVML."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from agent.probe import (
    GpuProbe,
    HostProbe,
    HostSample,
    process_start_ticks,
    process_start_time,
    session_processes,
)


def test_host_sample_is_plausible(tmp_path):
    probe = HostProbe(tmp_path / "not-yet-created")  # falls back to the nearest existing parent
    sample = probe.sample()
    assert isinstance(sample, HostSample)
    assert sample.cpu_count >= 1
    assert 0.0 <= sample.cpu_percent <= 100.0
    assert sample.load1 >= 0.0
    assert 0 < sample.memory_used <= sample.memory_total
    assert 0 < sample.disk_used <= sample.disk_total
    assert sample.gpus == ()


def test_cpu_percent_sees_a_busy_cpu(tmp_path):
    probe = HostProbe(tmp_path)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # keep one CPU busy
        pass
    assert probe.sample().cpu_percent > 0.0


def test_sample_is_cheap(tmp_path):
    probe = HostProbe(tmp_path)
    start = time.perf_counter()
    for _ in range(20):
        probe.sample()
    assert (time.perf_counter() - start) / 20 < 0.05


def test_gpu_probe_fails_cleanly_without_nvml(tmp_path):
    gpu = GpuProbe()
    opened = gpu.open()
    if opened:  # a GPU machine: the real path must give consistent devices
        gpus = gpu.sample()
        assert all(g.uuid and g.memory_total >= g.memory_used >= 0 for g in gpus)
        gpu.close()
        return
    assert gpu.error is not None and gpu.error.startswith("NVML unavailable: ")
    assert gpu.sample() == ()
    gpu.close()
    gpu.close()  # twice is fine
    assert HostProbe(tmp_path, gpu).sample().gpus == ()


def test_sample_before_open_is_empty():
    gpu = GpuProbe()
    assert gpu.sample() == ()
    assert gpu.error is None


def test_process_identity_helpers():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(5)"], start_new_session=True
    )
    try:
        started = process_start_time(proc.pid)
        assert started is not None and abs(started - time.time()) < 5
        assert process_start_ticks(proc.pid) is not None
        assert session_processes(proc.pid) == (proc.pid,)
    finally:
        proc.kill()
        proc.wait()
    assert process_start_time(proc.pid) is None
    assert process_start_ticks(proc.pid) is None
    assert process_start_time(os.getpid()) is not None


class _FakeNvml:
    """Stands in for pynvml on this GPU-less machine, to drive GpuProbe's real code path
    (two devices; the second refuses utilization and reports a process with unknown memory)."""

    import pynvml as _real

    NVMLError = _real.NVMLError

    def __init__(self) -> None:
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i == 2:
            raise self._real.NVMLError(self._real.NVML_ERROR_GPU_IS_LOST)
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()  # old bindings return bytes

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h: int):
        return type("Mem", (), {"total": 80 << 30, "used": (1 << 30) * (h + 1)})()

    def nvmlDeviceGetUtilizationRates(self, h: int):
        if h == 1:
            raise self._real.NVMLError(self._real.NVML_ERROR_NOT_SUPPORTED)
        return type("Util", (), {"gpu": 42})()

    def nvmlDeviceGetComputeRunningProcesses(self, h: int):
        proc = type("Proc", (), {})
        a, b = proc(), proc()
        a.pid, a.usedGpuMemory = 100, 1 << 20
        b.pid, b.usedGpuMemory = 101, None
        return [a, b] if h == 1 else []


def test_gpu_probe_nvml_path(monkeypatch):
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = GpuProbe()
    assert gpu.open() is True and gpu.error is None
    g0, g1 = gpu.sample()  # the lost third device is skipped
    assert (g0.index, g0.uuid, g0.model, g0.utilization) == (0, "GPU-0", "NVIDIA H200", 42)
    assert (g0.memory_total, g0.memory_used, g0.processes) == (80 << 30, 1 << 30, ())
    assert g1.utilization == 0  # refused: that field only
    assert [(p.pid, p.used_memory) for p in g1.processes] == [(100, 1 << 20), (101, 0)]
    assert "gpu 1 utilization" in gpu.error and "gpu 2" in gpu.error
    gpu.close()
    gpu.close()
    assert fake.calls == ["init", "shutdown"]
    assert gpu.sample() == ()
