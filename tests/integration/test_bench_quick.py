"""Every benchmark stays runnable: `python -m bench NAME --quick` for each bench the
runner lists, as a real process, ends 0 with its JSON as the last line, and writes
nothing into the repository (a bench writes into docs/ only when asked, e.g. `--plot`).

Figures are not asserted: a quick run on a shared machine measures nothing worth
comparing; what is checked is that the bench still runs and still reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import available

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".ruff_cache", ".pytest_cache", ".hypothesis"}


def _repo_files() -> dict[str, tuple[int, int]]:
    """Every file of the working tree but caches and the venv: (mtime_ns, size)."""
    out = {}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for f in files:
            p = Path(root, f)
            st = p.stat()
            out[str(p.relative_to(REPO))] = (st.st_mtime_ns, st.st_size)
    return out


def test_the_runner_lists_the_benches():
    names = available()
    some = {"api", "edge", "failover", "federation", "footprint", "inference", "placement"}
    some |= {"training"}
    assert some <= set(names)
    r = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and all(n in r.stdout for n in names)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("name", available())
def test_quick_run_ends_with_its_json(name, tmp_path):
    before = _repo_files()
    env = {**os.environ, "MESH_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    env.pop("MESH_NATS_URL", None)
    r = subprocess.run(
        [sys.executable, "-m", "bench", name, "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = (r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0, tail
    lines = r.stdout.strip().splitlines()
    assert lines, tail
    result = json.loads(lines[-1])
    assert isinstance(result, dict) and result["bench"] == name, tail
    targets = result["targets"]
    assert isinstance(targets, dict), targets
    assert all(isinstance(k, str) and isinstance(v, bool) for k, v in targets.items()), targets
    if not targets:  # only a baseline this machine cannot run, and the JSON says why
        assert result.get("not_run"), result
    after = _repo_files()
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert not changed, f"{name} --quick wrote into the repository: {sorted(changed)}"
