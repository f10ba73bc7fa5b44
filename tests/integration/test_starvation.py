"""Jobs that can never fit the region do not hold up the rest, and say so from submit
on; the README's own sequence (pools applied, then a job that names no pool) works."""

from __future__ import annotations

import json
import re
from pathlib import Path

from agent.hollow import GiB, Inventory

from .conftest import eventually, run_mesh
from .test_cli import mesh_up  # noqa: F401  (a fixture: `mesh up` in a child process)

ROOT = Path(__file__).resolve().parents[2]


def sim(name: str, count: int, cpu: str, seconds: float = 30.0) -> dict:
    return {
        "name": name,
        "tasks": [
            {
                "role": "w",
                "count": count,
                "resources": {"cpu": cpu},
                "simulate": {"duration": f"{seconds}s"},
            }
        ],
    }


async def test_gangs_larger_than_the_region_do_not_starve_a_small_job(region):
    """The report: 17 gangs of 200 one-core tasks on 118 cores kept a 100m job in the
    same pool PENDING for ever (admission's look-ahead of 16 was used up every round)."""
    await region.coordinator()
    await region.fleet(6, inventories=[Inventory(20, 64 * GiB)] * 5 + [Inventory(18, 64 * GiB)])
    await region.ready(6)
    client = region.client
    big = []
    for i in range(17):
        reply = await client.submit_reply(sim(f"big{i}", 200, "1"))
        assert reply["warning"].startswith(
            "accepted, but it can never fit the region as it is: needs 200 cpu in one gang; "
            "the region has 118 cpu in 6 ready nodes"
        ), reply
        big.append(reply["job_id"])
    reply = await client.submit_reply(sim("small", 1, "100m", 0.2))
    assert "warning" not in reply
    job = await client.wait(reply["job_id"], timeout=15)
    assert job["state"] == "SUCCEEDED", job
    for job_id in (big[0], big[-1]):
        job = await client.job(job_id)
        assert job["state"] == "PENDING"
        assert job["pending_reason"].startswith(
            "can never fit the region as it is: needs 200 cpu in one gang"
        ), job["pending_reason"]


async def test_an_unfit_gang_runs_once_enough_nodes_join(region):
    await region.coordinator()
    await region.fleet(2, inventories=[Inventory(4, 16 * GiB)] * 2)
    await region.ready(2)
    job_id = await region.client.submit(sim("wide", 3, "4", 0.2))

    async def reason():
        return (await region.client.job(job_id))["pending_reason"]

    assert "can never fit the region as it is" in await eventually(reason)
    await region.fleet(1, prefix="more", inventories=[Inventory(4, 16 * GiB)])
    job = await region.client.wait(job_id, timeout=15)
    assert job["state"] == "SUCCEEDED", job


def readme_pools() -> str:
    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "# pools.yaml" in b]
    return block


def test_the_readme_sequence_pools_then_a_job_that_names_no_pool(mesh_up, tmp_path):  # noqa: F811
    """`mesh pool apply pools.yaml` (README's), then `mesh job run docs/examples/hello.yaml`
    and `mesh load`, which name no pool: they run in /default."""
    env, _ = mesh_up
    pools = tmp_path / "pools.yaml"
    pools.write_text(readme_pools())
    r = run_mesh("pool", "apply", str(pools), env=env)
    assert r.returncode == 0, r.stderr
    r = run_mesh("--json", "pool", "list", env=env)
    rows = {p["path"]: p for p in json.loads(r.stdout)}
    assert {"/ml", "/ml/vision", "/ml/nlp", "/web", "/default"} <= set(rows)
    assert rows["/default"]["leaf"] and not rows["/"]["leaf"]
    r = run_mesh("job", "run", str(ROOT / "docs/examples/hello.yaml"), "--wait", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCEEDED" in r.stdout
    r = run_mesh("load", "--jobs", "3", "--median", "0.2", "--sigma", "0", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_mesh("--json", "job", "list", env=env)
    jobs = json.loads(r.stdout)
    assert len(jobs) == 4 and {j["pool"] for j in jobs} == {"/default"}, jobs
    # A job too big for the region is accepted, with a warning on stderr.
    huge = tmp_path / "huge.yaml"
    huge.write_text(
        "name: huge\ntasks:\n  - role: w\n    count: 5000\n"
        "    resources: {cpu: 1}\n    simulate: {duration: 1s}\n"
    )
    r = run_mesh("job", "run", str(huge), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(
        "warning: accepted, but it can never fit the region as it is: needs 5000 cpu, "
    ), r.stderr
    assert "in 3 ready nodes" in r.stderr and r.stderr.count("\n") == 1, r.stderr
