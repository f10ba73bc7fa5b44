"""Can the task user reach the agent's data directory? Asked once, at start.

A root agent that runs tasks as another user (``--run-as``) keeps each task's exit
file under its data directory, and the task's wrapper, running as that user, writes
it there. If the user cannot traverse a directory on the way (root's ``~/.mesh``
under a 0700 ``/root``), no exit file is ever written: the agent still sees the exit
of a task it spawned, but after a restart every task that ended meanwhile has no
recorded outcome. So the agent asks the kernel, as the task user, before it takes a
single task, and refuses to start otherwise.

The question is put to a real process running as that user (``test -x`` on every
directory, then a write where the wrapper writes), so ACLs, mount options and
user namespaces answer for themselves rather than being guessed from mode bits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["make_dirs", "unreachable_dir"]

# Every argument must be a directory the user can traverse; the last one, a directory
# it owns, must take a file. Prints the first that fails.
_PROBE = r"""last=
for d do
  [ -x "$d" ] || { printf %s "$d"; exit 1; }
  last=$d
done
: >"$last/exit" || { printf %s "$last"; exit 1; }
"""
_PROBE_TIMEOUT_S = 10.0


def make_dirs(path: Path, mode: int = 0o711) -> None:
    """``mkdir -p`` whose new directories get ``mode`` whatever the umask: a root
    agent with umask 077 would otherwise make its own data dir one the task user
    cannot traverse. Directories that already exist are left as they are."""
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs, not ours to chmod
        os.chmod(d, mode)


def unreachable_dir(work_dir: Path, uid: int, gid: int, groups: Sequence[int]) -> str | None:
    """The first directory on the way to a task's status dir under ``work_dir`` that
    the user cannot traverse (or, last, write in); None if the user gets through.

    It lays out a throwaway task directory as ``ProcessExecutor.start`` does (root's,
    0711, with a ``status`` dir owned by the user) and runs the probe as the user.
    """
    probe_dir = work_dir / f".access-probe-{os.getpid()}"
    shutil.rmtree(probe_dir, ignore_errors=True)
    probe_dir.mkdir(mode=0o711)
    try:
        os.chmod(probe_dir, 0o711)
        status = probe_dir / "status"
        status.mkdir(mode=0o755)
        os.chown(status, uid, gid)
        chain = [*reversed(status.parents), status]
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", _PROBE, "mesh-access-probe", *map(str, chain)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                user=uid,
                group=gid,
                extra_groups=list(groups),
                timeout=_PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{work_dir} (the probe could not run: {exc})"
        if done.returncode == 0:
            return None
        return done.stdout.decode(errors="replace") or str(work_dir)
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
