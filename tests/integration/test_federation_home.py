"""A job submitted to a region its spec does not name is made in the first region it names
(coordinator/federation/forward.py), over a real two-region supercluster: submitted in
eu naming `[us]`, it runs in us (the hollow nodes' own record) and never in eu, `mesh job
run` says where it went, `mesh job status` in us shows it, a retry with the same client
id is the same job; with us gone, the submit fails with a clear error (exit 3) and no
job is made in eu."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent.hollow import GiB, Inventory
from mesh.schema import ApiError, ErrorCode

from .conftest import cli_env, eventually, run_mesh


def job(name: str, seconds: float, **fed) -> dict:
    return {
        "name": name,
        "tasks": [
            {"role": "w", "resources": {"cpu": "1"}, "simulate": {"duration": f"{seconds}s"}}
        ],
        **fed,
    }


async def state_is(r, job_id, state) -> bool:
    try:
        return (await r.client.job(job_id))["state"] == state
    except ApiError:
        return False


def runs(fleet, job_id) -> list[tuple[str, int]]:
    """The runs the fleet's nodes started of the job's tasks: their own record."""
    return [key for n in fleet.nodes.values() for key in n.seen if key[0].startswith(job_id)]


async def names(r) -> list[str]:
    return [j["name"] for j in await r.client.jobs(None, None, 1000)]


async def test_a_job_naming_another_region_is_made_and_runs_there_once(regions, tmp_path):
    fed = await regions("eu", "us")
    eu, us = fed["eu"], fed["us"]
    for r in fed.values():
        await r.coordinator(f"{r.name}-c1")
        await r.fleet(1, prefix=f"{r.name}-n", inventories=[Inventory(4, 16 * GiB)])
    for r in fed.values():
        await r.ready(1)

    spec = job("abroad", 0.5, regions=["us"])
    reply = await eu.client.submit_reply(spec, client_id="cid-abroad")
    j = reply["job_id"]
    assert reply["home"] == "us" and reply["duplicate"] is False, reply
    await eventually(lambda: state_is(us, j, "SUCCEEDED"), timeout=20)
    assert len(runs(us.fleets[0], j)) == 1 and runs(eu.fleets[0], j) == []
    with pytest.raises(ApiError) as err:  # eu keeps no copy of it
        await eu.client.job(j)
    assert err.value.code == ErrorCode.NOT_FOUND

    again = await eu.client.submit_reply(spec, client_id="cid-abroad")  # a retry
    assert (again["job_id"], again["duplicate"], again["home"]) == (j, True, "us")
    assert await names(us) == ["abroad"] and await names(eu) == []

    # The CLI: says where the job went, and `job status` in us shows it.
    env = cli_env(tmp_path)
    path = tmp_path / "cli.yaml"
    path.write_text(json.dumps(job("by-cli", 0.2, regions=["us"])))
    base = ("--nats", eu.url, "--insecure")
    r = await asyncio.to_thread(
        run_mesh, *base, "--region", "eu", "--json", "job", "run", str(path), env=env
    )
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    assert made["region"] == "us", made
    assert f"job {made['job_id']} is in region us" in r.stderr
    assert f"mesh --region us job status {made['job_id']}" in r.stderr
    r = await asyncio.to_thread(
        run_mesh, *base, "--region", "us", "--json", "job", "status", made["job_id"], env=env
    )
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert (shown["job_id"], shown["name"], shown["region"]) == (made["job_id"], "by-cli", "us")
    assert await names(eu) == []

    # us gone: a clear error, nothing made in eu (from the API, then from the CLI).
    for c in us.coordinators:
        await c.stop()
    us.coordinators.clear()
    us.server.kill()
    with pytest.raises(ApiError) as err:
        await eu.client.submit_reply(job("stranded", 0.2, regions=["us"]), retries=0)
    assert err.value.code == ErrorCode.UNAVAILABLE
    assert "home region us" in err.value.message, err.value.message
    path.write_text(json.dumps(job("stranded-cli", 0.2, regions=["us"])))
    r = await asyncio.to_thread(run_mesh, *base, "--region", "eu", "job", "run", str(path), env=env)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "UNAVAILABLE" in r.stderr and "home region us" in r.stderr, r.stderr
    assert await names(eu) == []
    # eu still makes the jobs that are its own.
    mine = await eu.client.submit(job("at-home", 0.2, regions=["eu", "us"]))
    await eventually(lambda: state_is(eu, mine, "SUCCEEDED"), timeout=20)
