"""A site agent cut off from its region restarts a failing batch task in place, under
its restart policy; while the region is reachable the region decides retries as before.

On a real site (tests/integration/edgesite.py): a real `Agent` in site mode on the leaf,
the real site link beside it, the link to the hub cut at the TCP proxy. The agent learns
that the region is unreachable from the link's `SiteUplink`, as in `mesh edge up`.

Each task's command waits for a `go` file before it does anything, so that its first run
starts while the site is linked (the assignment must reach the agent) and fails only
once the test has cut the link and the agent has heard so."""

from __future__ import annotations

from agent.ledger import count_duplicates
from agent.store import read_ledger

from .conftest import eventually
from .edgesite import Site

NODE = "edge-1"


def _job(name: str, go, counter, retries: int) -> dict:
    # fails twice, then succeeds: the counter file lives outside the task's work dir,
    # which each run starts afresh
    cmd = f"until [ -f {go} ]; do sleep 0.05; done; echo x >> {counter}; "
    cmd += f"[ $(wc -l < {counter}) -ge 3 ]"
    return {
        "name": name,
        "tasks": [{"role": "main", "command": cmd}],
        "restart": {"max_retries": retries},
    }


async def _site(tmp_path) -> Site:
    return await Site(tmp_path, coordinator={}).start(nodes=0, agent=NODE)


def _runs(site: Site, task_id: str | None = None) -> list:
    runs = read_ledger(site.agent.data_dir / "agent.db")
    return [r for r in runs if task_id is None or r.task_id == task_id]


async def _running(site: Site, job_id: str) -> dict:
    async def check():
        (t,) = (await site.region.client.job(job_id))["task_list"]
        return t if t["state"] == "RUNNING" else None

    return await eventually(check, timeout=15)


async def _cut(site: Site) -> None:
    """The link reset; the agent hears from its link that the region is unreachable."""
    site.proxy.cut()
    await eventually(lambda: not site.agent.runs.uplink.reachable, timeout=10)


async def test_cut_off_agent_restarts_in_place_and_reports_one_outcome(tmp_path):
    site = await _site(tmp_path)
    try:
        go, counter = tmp_path / "go", tmp_path / "count"
        job_id = await site.region.client.submit(_job("cut", go, counter, 3))
        task_id = (await _running(site, job_id))["task_id"]
        await _cut(site)
        go.touch()
        # restarted twice in place while cut off: its third run succeeds at the site
        await eventually(
            lambda: [r.outcome for r in _runs(site, task_id)] == ["FAILED", "FAILED", "SUCCEEDED"],
            timeout=15,
        )
        (t,) = (await site.region.client.job(job_id))["task_list"]
        assert t["state"] == "RUNNING"  # the region has heard nothing of it yet
        site.proxy.restore()
        job = await site.region.client.wait(job_id, timeout=20)
    finally:
        await site.close()
    assert job["state"] == "SUCCEEDED"
    (task,) = job["task_list"]
    assert task["attempt"] == 1  # the region saw one attempt, not three
    assert "restarted in place 2 times while cut off" in task["message"]
    states = [h["state"] for h in task["history"]]
    assert states.count("SUCCEEDED") == 1 and "FAILED" not in states
    assert [h["attempt"] for h in task["history"] if h["state"] == "SUCCEEDED"] == [1]
    assert counter.read_text().count("x") == 3
    runs = _runs(site, task_id)
    assert [(r.attempt, r.run, r.outcome) for r in runs] == [
        (1, 1, "FAILED"),
        (1, 2, "FAILED"),
        (1, 3, "SUCCEEDED"),
    ]
    assert all(r.node_id == NODE and r.end is not None for r in runs)
    assert count_duplicates(runs).total == 0


async def test_cut_off_restarts_stop_at_the_restart_policy(tmp_path):
    site = await _site(tmp_path)
    try:
        go = tmp_path / "go"
        spec = {
            **_job("spent", go, tmp_path / "c", 1),
            "tasks": [{"role": "m", "command": f"until [ -f {go} ]; do sleep 0.05; done; exit 4"}],
        }
        job_id = await site.region.client.submit(spec)
        await _running(site, job_id)
        await _cut(site)
        go.touch()
        # max_retries 1: attempt 1 restarted once in place, which spends the retry it had
        await eventually(
            lambda: (
                [(r.attempt, r.run, r.outcome) for r in _runs(site)]
                == [(1, 1, "FAILED"), (1, 2, "FAILED")]
            ),
            timeout=15,
        )
        site.proxy.restore()
        job = await site.region.client.wait(job_id, timeout=20)
        runs = _runs(site)
    finally:
        await site.close()
    assert job["state"] == "FAILED"
    (task,) = job["task_list"]
    # the region then runs attempt 2 (it counts attempts), reachable again: no restart
    assert [(r.attempt, r.run, r.outcome) for r in runs] == [
        (1, 1, "FAILED"),
        (1, 2, "FAILED"),
        (2, 1, "FAILED"),
    ]
    assert task["attempt"] == 2


async def test_reachable_region_decides_retries(tmp_path):
    site = await _site(tmp_path)
    try:
        # the link says so: the hub answers it, and its agent heard it
        await eventually(lambda: site.uplinks and site.uplinks[-1][1].reachable)
        assert site.link.reachable and site.agent.runs.uplink.reachable
        go, counter = tmp_path / "go", tmp_path / "count"
        go.touch()
        job_id = await site.region.client.submit(_job("up", go, counter, 3))
        job = await site.region.client.wait(job_id, timeout=30)
        runs = _runs(site)
    finally:
        await site.close()
    assert job["state"] == "SUCCEEDED"
    (task,) = job["task_list"]
    assert task["attempt"] == 3  # the region retried, as without a site
    assert [(r.attempt, r.run, r.outcome) for r in runs] == [
        (1, 1, "FAILED"),
        (2, 1, "FAILED"),
        (3, 1, "SUCCEEDED"),
    ]
