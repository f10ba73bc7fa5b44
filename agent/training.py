"""What a training task needs from its node besides a process: the ports the coordinator
gave it (checked free here), the files its framework launcher reads, and a progress file
it may write. Pure parts, and the two small I/O helpers (a bind, a file read) the agent's
shell calls; nothing here knows NATS.

Why the agent checks ports instead of picking them: peers must know each other's ports
before any of them starts, so the coordinator picks them in the placement decision from
the range the node advertises (docs/training.md). The node still owns that range: a
port some other process holds now would make the task fail obscurely later, so the
attempt fails at once, naming the port, and the coordinator places it again.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from workloads.frameworks import FILES_PREFIX

# Nomad's dynamic port range: below Linux's ephemeral range (32768-60999), so a port the
# kernel hands to an outgoing connection is never one the coordinator gives a task.
DEFAULT_PORT_RANGE = (20000, 32000)
MIN_PORT = 1024  # below: privileged ports, never handed out
PROGRESS_FILE = "progress"
PROGRESS_EVERY_S = 1.0  # how often the agent reads a task's progress file
PROGRESS_MIN_GAP_S = 2.0  # the least time between two progress reports of one task
_MAX_PROGRESS_BYTES = 64

log = logging.getLogger("mesh.agent")


# ---------------------------------------------------------------- Mesh, for a task


def task_nats_url(url: str) -> str:
    """The agent's NATS URL(s) as its tasks are told them (MESH_NATS_URL: a horovod
    discovery script's `mesh job hosts`, an inference worker): any ``user:password@``
    dropped, since every task of the node reads it. A task that needs an identity asks
    for the task identity (MESH_TASK_IDENTITY); it never gets the agent's."""
    out = []
    for one in url.split(","):
        one = one.strip()
        scheme, sep, rest = one.rpartition("://")
        netloc, slash, path = rest.partition("/")
        host = netloc.rpartition("@")[2]
        out.append(f"{scheme}{sep}{host}{slash}{path}")
    return ",".join(u for u in out if u)


# ---------------------------------------------------------------- the node's range


def parse_port_range(text: str, flag: str = "--ports") -> tuple[int, int]:
    """`LO-HI` -> (lo, hi), with MIN_PORT <= LO <= HI <= 65535; ValueError naming `flag`."""
    lo_s, sep, hi_s = str(text).strip().partition("-")
    try:
        if not sep:
            raise ValueError
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected LO-HI, e.g. 20000-32000") from None
    check_port_range((lo, hi), flag)
    return lo, hi


def check_port_range(rng: tuple[int, int], name: str = "port_range") -> tuple[int, int]:
    lo, hi = rng
    if not (MIN_PORT <= lo <= hi <= 65535):
        raise ValueError(f"{name} {lo}-{hi}: need {MIN_PORT} <= LO <= HI <= 65535")
    return lo, hi


def check_address(address: str, name: str = "--address") -> str:
    """The address peers reach this node at, as given (an IP or a host name)."""
    address = address.strip()
    if not address or len(address) > 255 or any(c.isspace() for c in address):
        raise ValueError(f"{name} {address!r}: expected an IP address or a host name")
    return address


def route_address(sockname: object) -> str:
    """This node's address as its route to NATS shows it: the connected socket's local
    IP (`sockname`, from getsockname), 127.0.0.1 when that is a loopback address (NATS on
    this host: the peers are here too) or unknown."""
    host = sockname[0] if isinstance(sockname, tuple) and sockname else None
    if not isinstance(host, str):
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return "127.0.0.1"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return "127.0.0.1"
    return str(ip)


def connection_address(nc: object) -> str:
    """`route_address` of a nats-py client's current connection ("" when not connected).
    nats-py keeps its socket in a private transport: read defensively, so a client
    version that moved it costs the default address, not the agent."""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    get = getattr(writer, "get_extra_info", None)
    if get is None:
        return ""
    try:
        return route_address(get("sockname"))
    except Exception:
        return ""


# ---------------------------------------------------------------- ports


def port_problem(name: str, port: int, rng: tuple[int, int]) -> str:
    """Why the task cannot have `port` ("" when it can): outside this node's range, or
    held by someone on this node (a TCP bind on all interfaces, SO_REUSEADDR so a port
    left in TIME_WAIT by a previous attempt is free)."""
    lo, hi = rng
    if not (lo <= port <= hi):
        return f"port {port} ({name}) is outside this node's port range {lo}-{hi}"
    return "" if port_free(port) else f"port {port} ({name}) is in use on this node"


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def ports_problem(ports: dict[str, int], rng: tuple[int, int]) -> str:
    """The first port of `ports` (by name) the task cannot have; "" when all are fine."""
    for name in sorted(ports):
        problem = port_problem(name, ports[name], rng)
        if problem:
            return problem
    return ""


# ---------------------------------------------------------------- files


def file_name_problem(name: object) -> str:
    """Why `name` cannot be a TaskSpec.files entry ("" when it can): a plain file name,
    so that what a job sends cannot land outside its attempt's files directory."""
    if not isinstance(name, str) or not name:
        return "TaskSpec.files: a file name is empty"
    if "/" in name or "\0" in name or name in (".", ".."):
        return f"TaskSpec.files: {name[:64]!r} is not a plain file name (no '/', '..' or NUL)"
    if name == PROGRESS_FILE:
        return f"TaskSpec.files: {name!r} is reserved for the task's progress"
    return ""


def file_mode(name: str) -> int:
    return 0o755 if name.endswith(".sh") else 0o644


def write_files(files_dir: Path, files: tuple[tuple[str, str], ...], owner=None) -> None:
    """Write each file with its mode (whatever the umask); `owner`: (uid, gid) to give
    them to (the --run-as user), None to keep the agent's. ValueError for a bad name."""
    for name, _ in files:
        problem = file_name_problem(name)
        if problem:
            raise ValueError(problem)
    for name, content in files:
        path = files_dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        if owner is not None:
            os.chown(path, *owner)
        os.chmod(path, file_mode(name))


def expand(value: str, files_dir: str) -> str:
    """`@files/x` -> `<files_dir>/x`; only at the start of the value."""
    if value.startswith(FILES_PREFIX):
        return f"{files_dir.rstrip('/')}/{value[len(FILES_PREFIX) :]}"
    return value


def expand_argv(argv: tuple[str, ...], files_dir: str) -> tuple[str, ...]:
    return tuple(expand(a, files_dir) for a in argv)


def expand_env(env: dict[str, str], files_dir: str) -> dict[str, str]:
    return {k: expand(v, files_dir) for k, v in env.items()}


def files_env(files_dir: str) -> dict[str, str]:
    return {
        "MESH_FILES_DIR": files_dir,
        "MESH_PROGRESS_FILE": f"{files_dir.rstrip('/')}/{PROGRESS_FILE}",
    }


# ---------------------------------------------------------------- progress


def parse_progress(data: bytes) -> int | None:
    """An integer step count (whitespace around it allowed), else None."""
    text = data.strip()
    if not text or len(text) > 20 or not text.isdigit():
        return None
    return int(text)


def read_progress(path: Path) -> bytes | None:
    """The file's first bytes; None when it is not there (yet). Not followed if a link:
    the task owns the directory, and the agent must not read what a link points at."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, _MAX_PROGRESS_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass
class ProgressGate:
    """Which readings of a task's progress file are reported: a value that differs from
    the last one reported, at least `min_gap_s` after that report (a task writing every
    step must not flood the events stream). A value written meanwhile is not lost: the
    next reading after the gap reports the newest one. Content that is not an integer
    is ignored and counted."""

    min_gap_s: float = PROGRESS_MIN_GAP_S
    reported: int = -1
    reported_at: float | None = None
    ignored: int = 0
    sent: int = 0  # reports so far

    def offer(self, data: bytes | None, now: float) -> int | None:
        """The value to report now, or None."""
        if data is None:
            return None
        value = parse_progress(data)
        if value is None:
            if data.strip():  # a file just created and not written yet is not an error
                self.ignored += 1
            return None
        if value == self.reported:
            return None
        if self.reported_at is not None and now - self.reported_at < self.min_gap_s:
            return None
        self.reported, self.reported_at = value, now
        self.sent += 1
        return value


async def progress_loop(
    path: Path,
    send,
    gate: ProgressGate | None = None,
    every_s: float = PROGRESS_EVERY_S,
    clock=None,
) -> None:
    """Read `path` every `every_s` until cancelled (the task ended); `await send(value)`
    for each reading `gate` lets through. A send that fails is logged by the caller's
    `send` and not retried: the next change is reported anyway."""
    gate = gate if gate is not None else ProgressGate()
    clock = clock or time.monotonic
    while True:
        await asyncio.sleep(every_s)
        ignored = gate.ignored
        value = gate.offer(read_progress(path), clock())
        if gate.ignored == 1 and ignored == 0:
            log.warning("%s holds no integer step count: ignored (and counted)", path)
        if value is not None:
            await send(value)
