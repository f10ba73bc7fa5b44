"""`mesh up --regions a,b` as a user runs it (a real child process, secure by default):
each region takes a job through the CLI at the URL `mesh up` printed for it, the
gateway carries a service-discovery request from one region to the other's
coordinators and their answers back, and Ctrl-C stops every process it started."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from functools import partial

import psutil
import pytest

from mesh.connect import ClientTls, close_quietly, connect
from mesh.security.identity import Identity

from .conftest import cli_env, eventually, run_mesh

JOB = """\
name: hello-{region}
tasks:
  - role: w
    count: 1
    simulate: {{duration: 0.2s}}
"""
REGION_LINE = re.compile(r"  region (\w+): .*; mesh --nats (\S+) --region \1 --certs (\S+) ")


@pytest.fixture
def up_regions(tmp_path):
    env = {**cli_env(tmp_path), "PYTHONUNBUFFERED": "1"}
    argv = ["up", "--regions", "a,b", "--port", "0", "--sim-nodes", "1", "--candidates", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mesh.cli.main", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    tree: list[psutil.Process] = []
    try:
        lines = [proc.stdout.readline()]
        if not lines[0].startswith("mesh is up: 2 regions, a, b (TLS"):
            pytest.fail(lines[0] + proc.stdout.read())
        while not lines[-1].startswith("contexts written"):
            lines.append(proc.stdout.readline())
            assert lines[-1], lines
        tree = psutil.Process(proc.pid).children(recursive=True)
        yield proc, env, lines, tree
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        for p in tree:  # only where a test failed: leave nothing running
            if p.is_running():
                p.kill()


async def _ping_regions(url: str, certs: str) -> set[str]:
    """The regions whose coordinators answer a `$SRV.PING` sent in the region at `url`."""
    tls = ClientTls.for_identity(certs, Identity.user("admin"))
    nc = await connect(url, name="ping", tls=tls)
    seen: set[str] = set()
    try:
        inbox = nc.new_inbox()

        async def on_reply(msg):
            seen.add(json.loads(msg.data).get("metadata", {}).get("region", ""))

        await nc.subscribe(inbox, cb=on_reply)
        await nc.publish("$SRV.PING", b"", reply=inbox)
        await asyncio.sleep(0.5)
    finally:
        await close_quietly(nc)
    return seen


def _status(env: dict, context: str, job_id: str) -> subprocess.CompletedProcess:
    return run_mesh("--context", context, "job", "status", job_id, "-o", "json", env=env)


def _succeeded(env: dict, context: str, job_id: str) -> dict | None:
    r = _status(env, context, job_id)
    assert r.returncode == 0, r.stdout + r.stderr
    job = json.loads(r.stdout)
    return job if job["state"] == "SUCCEEDED" else None


async def test_up_regions_runs_a_job_in_each_region_and_stops_it_all(up_regions, tmp_path):
    proc, env, lines, tree = up_regions
    urls = {}
    for line in lines[1:3]:
        m = REGION_LINE.match(line)
        assert m, line
        urls[m[1]] = (m[2], m[3])
    assert set(urls) == {"a", "b"} and urls["a"][0] != urls["b"][0]
    assert all(url.startswith("tls://") for url, _ in urls.values())  # secure by default

    for region, (url, certs) in urls.items():
        spec = tmp_path / f"{region}.yaml"
        spec.write_text(JOB.format(region=region))
        r = run_mesh(
            "--nats",
            url,
            "--region",
            region,
            "--certs",
            certs,
            "job",
            "run",
            str(spec),
            "--wait",
            env=env,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        job_id = re.search(rf"hello-{region}-[0-9a-f]+", r.stdout)[0]

        # the region's saved context finds it, and it ran (on that region's hollow node)
        done = await eventually(partial(_succeeded, env, f"local-{region}", job_id), timeout=20)
        tasks = done["task_list"]
        assert {t["node_id"] for t in tasks} == {f"hollow-{region}-0000"}
        other = "b" if region == "a" else "a"
        assert _status(env, f"local-{other}", job_id).returncode != 0  # its own log

    # the gateway is up: region a's request reaches region b's coordinator and back
    url, certs = urls["a"]

    async def both() -> bool:
        return await _ping_regions(url, certs) >= {"a", "b"}

    await eventually(both, timeout=15)

    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert "mesh stopped" in proc.stdout.read()
    gone, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, [p.pid for p in alive]
    assert len(gone) == len(tree) >= 6  # two servers, two coordinators, two fleets
