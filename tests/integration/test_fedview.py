"""Region summaries and the global view over a real three-region supercluster: every
region hears every leader's summary, `mesh --region all job list` lists the jobs of all
regions tagged with theirs, `mesh job status ID` finds a job in another region, and a
region whose server is killed goes stale, is named, and does not hold up the others."""

from __future__ import annotations

import asyncio
import json
import time

from coordinator.federation.board import BoardConfig
from mesh.cli.fedview import REGION_TIMEOUT_S

from .conftest import cli_env, eventually, run_mesh

FAST = BoardConfig(interval_s=0.5, check_s=0.1, max_age_s=2.0, unreachable_s=4.0)


def job(name: str) -> dict:
    return {"name": name, "tasks": [{"role": "w", "count": 1, "simulate": {"duration": "60s"}}]}


async def statuses(client) -> dict[str, str]:
    try:
        reply = await client.request("region.list")
    except Exception:
        return {}
    return {r["region"]: r["status"] for r in reply["regions"]}


async def test_summaries_region_list_and_the_global_view(regions, tmp_path):
    fed = await regions("eu", "us", "ap")
    for r in fed.values():
        await r.coordinator(f"{r.name}-c1", summaries=FAST)
        await r.fleet(2, prefix=f"{r.name}-n")
    for r in fed.values():
        await r.ready(2)
    ids = {name: await r.client.submit(job(f"in-{name}")) for name, r in fed.items()}

    everyone = {"eu": "fresh", "us": "fresh", "ap": "fresh"}
    for r in fed.values():  # each region hears all three leaders, its own included
        await eventually(lambda r=r: _same(statuses(r.client), everyone), timeout=15)

    async def eu_row():
        rows = (await fed["us"].client.request("region.list"))["regions"]
        eu = next(row for row in rows if row["region"] == "eu")
        return eu if eu["capacity"]["cpu"] > eu["free"]["cpu"] else None

    eu = await eventually(eu_row, timeout=10)  # once its one job holds a share
    assert eu["leader"] == "eu-c1" and eu["nodes"] == {"ready": 2}
    assert eu["free"]["cpu"] > 0

    env = cli_env(tmp_path)
    base = ("--nats", fed["eu"].url, "--insecure")
    every = (*base, "--region", "all", "--json", "job", "list")
    r = await asyncio.to_thread(run_mesh, *every, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {(j["region"], j["job_id"]) for j in out["jobs"]} == {(n, i) for n, i in ids.items()}
    assert out["unreachable"] == [] and {p["region"] for p in out["regions"]} == set(fed)
    table = await asyncio.to_thread(run_mesh, *base, "--region", "all", "job", "list", env=env)
    assert table.returncode == 0, table.stderr
    line = next(ln for ln in table.stdout.splitlines() if ids["us"] in ln)
    assert line.split()[0] == "us"  # each row tagged with its region

    # a job of another region, asked for in eu: found there, and the region named
    r = await asyncio.to_thread(
        run_mesh, *base, "--region", "eu", "--json", "job", "status", ids["ap"], env=env
    )
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert (found["region"], found["job_id"], found["name"]) == ("ap", ids["ap"], "in-ap")
    r = await asyncio.to_thread(run_mesh, *base, "--region", "eu", "job", "status", "nope", env=env)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr

    fed["ap"].server.kill()  # the region is lost: its summary ages, the others serve on
    await eventually(
        lambda: _same(statuses(fed["eu"].client), {**everyone, "ap": "unreachable"}), timeout=15
    )
    started = time.monotonic()
    r = await asyncio.to_thread(run_mesh, *every, env=env)
    took = time.monotonic() - started
    assert r.returncode == 3, r.stderr  # not every region answered
    assert "region ap unreachable" in r.stderr
    out = json.loads(r.stdout)
    assert out["unreachable"] == ["ap"]
    assert {j["region"] for j in out["jobs"]} == {"eu", "us"}
    # not waited for beyond the per-region timeout (the rest is the CLI's start-up)
    assert took < REGION_TIMEOUT_S + 20


async def _same(got, want: dict[str, str]) -> bool:
    return await got == want
