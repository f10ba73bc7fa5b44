"""Helpers shared by the benchmarks: statistics, child processes, the job-log watcher,
and CPU/RSS sampling of processes from outside.

Nothing here asserts a timing: benchmarks measure and report.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from nats.js.api import DeliverPolicy

from mesh import subjects
from mesh.codec import WireError, decode
from mesh.connect import ClientTls
from mesh.schema import JobSubmitted, LeaderElected, LogEntry, TaskPlaced, TaskUpdated

# ---------------------------------------------------------------- statistics


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary_ms(seconds: Sequence[float], digits: int = 2) -> dict:
    """n, min, p50, p90, p99, max and mean of durations given in seconds, in milliseconds."""
    if not seconds:
        return {"n": 0}
    ms = [s * 1000.0 for s in seconds]
    out = {
        "n": len(ms),
        "min": min(ms),
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "max": max(ms),
        "mean": sum(ms) / len(ms),
    }
    return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in out.items()}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b rounded, or None where b is 0 or missing."""
    return round(a / b, 2) if a is not None and b else None


def fmt_ms(s: dict) -> str:
    if not s.get("n"):
        return "no samples"
    return (
        f"n={s['n']} p50={s['p50']:.2f} p90={s['p90']:.2f} p99={s['p99']:.2f} "
        f"max={s['max']:.2f} mean={s['mean']:.2f} ms"
    )


# ---------------------------------------------------------------- child processes


def with_state_dir(state_dir: str | None, prefix: str, run):
    """`run(path)` in the given state dir (kept, for inspection), or in a temporary one."""
    if state_dir:
        return run(Path(state_dir))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return run(Path(tmp))


def mesh_command(url: str, region: str, *args: str, log_level: str = "warning") -> list[str]:
    """The command line LocalMesh uses for a `mesh` server process."""
    return [
        sys.executable,
        "-m",
        "mesh.cli.main",
        "--nats",
        url,
        "--region",
        region,
        "--log-level",
        log_level,
        *args,
    ]


def spawn(cmd: list[str], log_path: Path, **kw) -> subprocess.Popen[bytes]:
    """A child in its own session (so a Ctrl-C reaches only us), output to a log file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **kw,
        )


def stop_process(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it lingers; then SIGKILL any of its descendants left
    behind (by pid, each one we saw before stopping it)."""
    if proc is None:
        return
    kids = descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in survivors(kids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def survivors(pids: Iterable[int]) -> list[int]:
    """Which of these pids still run (zombies excluded)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# A bare nats-py client's connection options from argv: none, or CA, certificate, key
# and inbox prefix, for a secure region (the same TLS as `mesh.connect.ClientTls`).
BARE_CONNECT = r"""
import ssl, nats
def bare_connect(url, tls_args):
    if not tls_args:
        return nats.connect(url)
    ca, cert, key, inbox = tls_args
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return nats.connect(url.replace("nats://", "tls://"), tls=ctx, inbox_prefix=inbox)
"""

ECHO_SERVER = (
    BARE_CONNECT
    + r"""
import asyncio, sys
from inference.wire import run
async def main():
    nc = await bare_connect(sys.argv[1], sys.argv[4:])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe(sys.argv[2], cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
run(main(), sys.argv[3])
"""
)


def tls_argv(tls: ClientTls | None) -> list[str]:
    """The arguments a bare client script (`BARE_CONNECT`) takes for an identity."""
    return [] if tls is None else [tls.ca, tls.cert, tls.key, tls.inbox_prefix]


def start_echo(
    url: str, subject: str, event_loop: str = "asyncio", tls: ClientTls | None = None
) -> subprocess.Popen[bytes]:
    """A trivial request/reply responder in its own process (a bare nats-py client), on
    the event loop a compared process uses (`inference.wire.run`), over TLS as `tls`'s
    identity where the region is secure."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, url, subject, event_loop, *tls_argv(tls)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    line = proc.stdout.readline()  # blocks until it subscribed (or died)
    if line.strip() != b"ready":
        rest = proc.stdout.read(4000) if proc.poll() is not None else b""
        stop_process(proc)
        raise RuntimeError(f"echo responder did not start: {line + rest!r}")
    return proc


# ---------------------------------------------------------------- the job log


@dataclass
class LogWatcher:
    """Follows the region's job log (an ordered push consumer) and notes, per job, the
    local `time.perf_counter()` at which each of its events was first observed:
    SUBMITTED, PLACED, then each task state (STARTING, RUNNING, SUCCEEDED, ...).

    Stages are per job, first occurrence (benchmarks use single-task jobs). For each
    stage it also keeps, in wall-clock time (`time.time()`, one clock on one machine),
    when the entry was observed (`observed_wall`) and the `ts` its writer put in the
    event (`event_ts`: the leader's for SUBMITTED and PLACED, the agent's for task
    states), which splits a latency between processes."""

    js: object
    region: str
    stages: dict[str, dict[str, float]] = field(default_factory=dict)
    observed_wall: dict[str, dict[str, float]] = field(default_factory=dict)
    event_ts: dict[str, dict[str, float]] = field(default_factory=dict)
    elections: list[tuple[float, str, int]] = field(default_factory=list)  # (t, leader, term)
    entries: int = 0
    submit_entries: int = 0  # entries holding at least one JobSubmitted
    submit_events: int = 0  # JobSubmitted events in them (their ratio: batching)
    bad: int = 0

    def __post_init__(self) -> None:
        self._waiters: dict[tuple[str, str], list[asyncio.Future[float]]] = {}
        self._sub = None

    async def start(self, deliver: DeliverPolicy = DeliverPolicy.NEW) -> None:
        self._sub = await self.js.subscribe(
            subjects.job_log(self.region),
            stream=subjects.log_stream(self.region),
            ordered_consumer=True,
            deliver_policy=deliver,
            cb=self._on_msg,
        )

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg) -> None:
        now, wall = time.perf_counter(), time.time()
        try:
            entry = decode(LogEntry, msg.data, max_size=8 * 1024 * 1024)
        except WireError:
            self.bad += 1
            return
        self.entries += 1
        submits = sum(1 for ev in entry.events if isinstance(ev, JobSubmitted))
        if submits:
            self.submit_entries += 1
            self.submit_events += submits
        for ev in entry.events:
            if isinstance(ev, JobSubmitted):
                self._note(ev.job_id, "SUBMITTED", now, wall, ev.ts)
            elif isinstance(ev, TaskPlaced):
                self._note(ev.job_id, "PLACED", now, wall, ev.ts)
            elif isinstance(ev, TaskUpdated):
                self._note(ev.job_id, str(ev.state), now, wall, ev.ts)
            elif isinstance(ev, LeaderElected):
                self.elections.append((now, ev.leader_id, ev.term))

    def _note(self, job_id: str, stage: str, now: float, wall: float, ts: float) -> None:
        seen = self.stages.setdefault(job_id, {})
        if stage in seen:
            return
        seen[stage] = now
        self.observed_wall.setdefault(job_id, {})[stage] = wall
        self.event_ts.setdefault(job_id, {})[stage] = ts
        for fut in self._waiters.pop((job_id, stage), ()):
            if not fut.done():
                fut.set_result(now)

    async def wait(self, job_id: str, stage: str, timeout: float) -> float:
        """The time `stage` of `job_id` was observed (perhaps already); TimeoutError."""
        seen = self.stages.get(job_id, {})
        if stage in seen:
            return seen[stage]
        fut = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault((job_id, stage), [])
        waiters.append(fut)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            if fut in waiters:
                waiters.remove(fut)
            if not waiters and self._waiters.get((job_id, stage)) is waiters:
                del self._waiters[(job_id, stage)]

    async def wait_any(self, job_id: str, stages: Iterable[str], timeout: float) -> str:
        """Which of `stages` was observed first for the job."""
        futs = {s: asyncio.ensure_future(self.wait(job_id, s, timeout)) for s in stages}
        try:
            done, _ = await asyncio.wait(futs.values(), return_when=asyncio.FIRST_COMPLETED)
            for s, f in futs.items():
                if f in done and not f.cancelled() and f.exception() is None:
                    return s
            raise TimeoutError(f"job {job_id}: none of {sorted(futs)} in {timeout}s")
        finally:
            for f in futs.values():
                f.cancel()


# ---------------------------------------------------------------- process footprint


@dataclass
class ProcSample:
    """CPU and memory of one process over a window, measured from outside."""

    name: str
    pid: int
    cpu_s: float = 0.0  # user + system seconds in the window
    wall_s: float = 0.0
    rss: list[int] = field(default_factory=list)
    uss: list[int] = field(default_factory=list)

    @property
    def cpu_percent(self) -> float:
        """Share of one core, in percent."""
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s else math.nan

    def as_dict(self) -> dict:
        mib = 1024 * 1024
        return {
            "pid": self.pid,
            "cpu_percent": round(self.cpu_percent, 3),
            "cpu_s": round(self.cpu_s, 3),
            "wall_s": round(self.wall_s, 2),
            "rss_mib_max": round(max(self.rss) / mib, 2) if self.rss else None,
            "rss_mib_mean": round(sum(self.rss) / len(self.rss) / mib, 2) if self.rss else None,
            "uss_mib_max": round(max(self.uss) / mib, 2) if self.uss else None,
        }


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User plus system CPU seconds of a process so far, and of its children if asked
    (py-spy, when profiling, runs the coordinator as its child); 0 once it is gone."""
    try:
        proc = psutil.Process(pid)
        return sum(map(_cpu, (proc, *(proc.children(recursive=True) if children else ()))))
    except psutil.Error:
        return 0.0


def runq_wait_s(pid: int) -> float:
    """Seconds the process's threads have spent runnable but waiting for a CPU
    (/proc/<pid>/task/*/schedstat, field 2): how much other load delayed it."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
    return total / 1e9


class CpuWindow:
    """CPU seconds, and run-queue wait, of several processes between `start()` and
    `stop()`, each as a percent of the window's wall time (100 = one core)."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = {n: psutil.Process(pid) for n, pid in procs.items()}
        self._t0 = 0.0
        self._c0: dict[str, tuple[float, float]] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._c0 = {n: (_cpu(p), runq_wait_s(p.pid)) for n, p in self.procs.items()}

    def stop(self) -> dict[str, dict[str, float]]:
        wall = time.monotonic() - self._t0
        out = {}
        for n, p in self.procs.items():
            try:
                cpu, wait = _cpu(p), runq_wait_s(p.pid)
            except psutil.NoSuchProcess:
                continue
            out[n] = {
                "cpu": round(100.0 * (cpu - self._c0[n][0]) / wall, 1),
                "runq_wait": round(100.0 * (wait - self._c0[n][1]) / wall, 1),
            }
        return out


async def sample_processes(
    procs: dict[str, int], seconds: float, every: float = 1.0
) -> dict[str, ProcSample]:
    """Sample RSS/USS every `every` seconds and CPU time at both ends of the window."""
    ps = {n: psutil.Process(pid) for n, pid in procs.items()}
    out = {n: ProcSample(n, pid) for n, pid in procs.items()}
    t0 = time.monotonic()
    c0 = {n: _cpu(p) for n, p in ps.items()}
    while True:
        for n, p in ps.items():
            mem = p.memory_full_info()
            out[n].rss.append(mem.rss)
            out[n].uss.append(mem.uss)
        left = t0 + seconds - time.monotonic()
        if left <= 0:
            break
        await asyncio.sleep(min(every, left))
    wall = time.monotonic() - t0
    for n, p in ps.items():
        out[n].cpu_s = _cpu(p) - c0[n]
        out[n].wall_s = wall
    return out


def machine() -> str:
    vm = psutil.virtual_memory()
    return f"{os.cpu_count()} cores, {vm.total / 2**30:.0f} GiB, Python {sys.version.split()[0]}"


def loadavg() -> float:
    """The machine's 1-minute load average: other work on it skews every figure."""
    return round(os.getloadavg()[0], 2)


def simulated_job(name: str, duration: float, memory: str = "64Mi") -> dict:
    """A job of one simulated task of `duration` seconds (100m CPU): the unit of work the
    region-scale benches submit by the thousand."""
    return {
        "name": name,
        "tasks": [
            {
                "role": "main",
                "count": 1,
                "resources": {"cpu": "100m", "memory": memory},
                "simulate": {"duration": f"{duration:g}s"},
            }
        ],
    }
