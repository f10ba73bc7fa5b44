"""The reliability ledger on real nodes: a real agent's `runs` (read by `mesh agent
ledger`) and a hollow fleet's `ledger()`, across a crash."""

from __future__ import annotations

import json

from agent.ledger import DROPPED, count_duplicates

from .conftest import cli_env, eventually, run_mesh


async def test_agent_ledger_cli_lists_every_run(region, tmp_path):
    await region.coordinator()
    agent = await region.agent()
    await region.ready(1)
    job_id = await region.client.submit(
        {"name": "two", "tasks": [{"role": "m", "command": "true", "count": 2}]}
    )
    assert (await region.client.wait(job_id, timeout=20))["state"] == "SUCCEEDED"
    r = run_mesh("agent", "ledger", "--data-dir", str(agent.data_dir), env=cli_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 2
    assert all(x["node_id"] == "node-1" and x["outcome"] == "SUCCEEDED" for x in rows)
    assert all(x["attempt"] == 1 and x["run"] == 1 and x["end"] >= x["start"] for x in rows)
    bad = run_mesh("agent", "ledger", "--data-dir", str(tmp_path / "no"), env=cli_env(tmp_path))
    assert bad.returncode == 2 and "no agent store" in bad.stderr


async def test_hollow_ledger_records_a_crash_and_the_rerun(region):
    await region.coordinator(down_after=2.0, suspect_after=1.0)
    fleet = await region.fleet(1)
    await region.ready(1)
    job_id = await region.client.submit(
        {"name": "long", "tasks": [{"role": "w", "simulate": {"duration": "60s"}}]}
    )
    await eventually(lambda: len(fleet.ledger()) == 1)
    fleet.crash("hollow-0000", down_s=3.0)
    (dropped,) = fleet.ledger()
    assert dropped.outcome == DROPPED and dropped.end is not None
    await eventually(lambda: len(fleet.ledger()) == 2, timeout=30)  # LOST, placed again
    first, second = fleet.ledger()
    assert (second.attempt, second.end) == (2, None) and second.start >= first.end
    assert count_duplicates(fleet.ledger()).total == 0
    await region.client.kill(job_id)
