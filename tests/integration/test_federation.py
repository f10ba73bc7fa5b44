"""Forwarding jobs between regions (coordinator/federation/link.py) over a real NATS
supercluster: one nats-server per region joined by gateways, a coordinator and a hollow
fleet of one 4-core node in each. A job that waits too long in a full home spills to
the next region it names that fits, runs there once, and its home says how it ended;
a holder lost past the job's `lost_after` has the job placed elsewhere and, once back,
its stale run stopped; a nomination sent while the target is cut off arrives after."""

from __future__ import annotations

import asyncio
import time

from agent.hollow import GiB, Inventory
from coordinator.federation.board import BoardConfig
from coordinator.federation.model import FederationConfig
from mesh import subjects
from mesh.cli.render import job_detail
from mesh.fedschema import decode_fed_batch

from .conftest import eventually

FAST = BoardConfig(interval_s=0.5, check_s=0.25, max_age_s=2.0, unreachable_s=3.0)
TIMERS = FederationConfig(nominate_timeout_s=5.0, round_backoff_s=2.0, reserve_ttl_s=20.0)


def job(name: str, cpu: str, seconds: float, **fed) -> dict:
    spec = {
        "name": name,
        "tasks": [
            {"role": "w", "resources": {"cpu": cpu}, "simulate": {"duration": f"{seconds}s"}}
        ],
    }
    return {**spec, **fed}


async def start(fed, *, summaries=FAST, timers=TIMERS):
    for r in fed.values():
        await coordinator(r, summaries=summaries, timers=timers)
        await r.fleet(1, prefix=f"{r.name}-n", inventories=[Inventory(4, 16 * GiB)])
    for r in fed.values():
        await r.ready(1)


async def coordinator(r, cid="c1", *, summaries=FAST, timers=TIMERS):
    return await r.coordinator(f"{r.name}-{cid}", summaries=summaries, federation=timers)


async def fill(r) -> str:
    """The region's only node busy with a long job (it never ends within the test)."""
    j = await r.client.submit(job(f"blocker-{r.name}", "4", 600))
    await eventually(lambda: state_is(r, j, "RUNNING"), timeout=20)
    return j


async def state_is(r, job_id, state) -> bool:
    try:
        return (await r.client.job(job_id))["state"] == state
    except Exception:
        return False


async def fed_of(r, job_id) -> dict:
    try:
        return (await r.client.job(job_id)).get("federation") or {}
    except Exception:
        return {}


def runs(fleet, job_id) -> list[tuple[str, int]]:
    """The runs the fleet's nodes started of the job's tasks: their own record."""
    return [key for n in fleet.nodes.values() for key in n.seen if key[0].startswith(job_id)]


async def lose(r) -> None:
    """The region's coordinators and server die (its store dir is kept)."""
    for c in r.coordinators:
        await c.stop()
    r.coordinators.clear()
    r.server.kill()


async def revive(r, other) -> None:
    """The region's server starts again on its store dir and ports, and a coordinator."""
    await asyncio.to_thread(r.server.start)
    js = other.nc.jetstream()

    async def log_back():
        try:
            await js.stream_info(subjects.log_stream(r.name))
            return True
        except Exception:
            return False

    await eventually(log_back, timeout=30, interval=0.25)
    await coordinator(r, "c2")


async def test_a_job_spills_from_a_full_region_to_the_next_that_fits_and_runs_once(regions):
    fed = await regions("eu", "us", "ap")
    await start(fed)
    eu, us, ap = fed["eu"], fed["us"], fed["ap"]
    await asyncio.gather(fill(eu), fill(us))
    spec = job("spiller", "2", 1, regions=["eu", "us", "ap"], spill={"after": "1s"})
    j = await eu.client.submit(spec)
    await eventually(lambda: state_is(eu, j, "SUCCEEDED"), timeout=30)

    home = await eu.client.job(j)
    assert home["federation"]["phase"] == "done"
    assert home["federation"]["region"] == "ap"  # us is full too: the next that fits
    assert home["federation"]["outcome"] == "SUCCEEDED"
    assert "ran in   ap" in job_detail(home)
    assert all(t["state"] == "PENDING" for t in home["task_list"])  # never placed at home
    held = await ap.client.job(j)  # the holder keeps the home's job id, and its origin
    assert held["state"] == "SUCCEEDED"
    assert held["federation"]["origin"] == "eu"
    assert "origin   eu" in job_detail(held)
    # It ran once, in ap: the hollow nodes' own record of the runs they started.
    assert len(runs(ap.fleets[0], j)) == 1
    assert runs(eu.fleets[0], j) == [] and runs(us.fleets[0], j) == []
    assert ap.fleets[0].counts["kills"] == 0


async def test_a_lost_holder_keeps_the_job_until_lost_after_then_its_stale_run_is_stopped(
    regions,
):
    fed = await regions("eu", "us", "ap")
    await start(fed)
    eu, us, ap = fed["eu"], fed["us"], fed["ap"]
    await fill(eu)
    spec = job("lost", "2", 25, regions=["eu", "us", "ap"], spill={"after": "1s"}, lost_after="4s")
    j = await eu.client.submit(spec)
    await eventually(lambda: state_is(us, j, "RUNNING"), timeout=20)
    assert (await fed_of(eu, j))["phase"] == "held"

    await lose(us)
    board = eu.coordinators[0].board
    last_heard = board.latest["us"].ts
    # Not re-placed before lost_after (counted from when us was last heard) ...
    while time.time() < last_heard + 4.0 - 0.3:
        f = await fed_of(eu, j)
        assert (f["phase"], f["region"], f["epoch"]) == ("held", "us", 1), f
        await asyncio.sleep(0.2)
    # ... and re-placed elsewhere after it, at a new epoch.
    await eventually(lambda: state_is(ap, j, "RUNNING"), timeout=20)
    f = await fed_of(eu, j)
    assert f["region"] == "ap" and f["epoch"] > 1
    assert time.time() >= last_heard + 4.0
    # eu and ap kept serving while us was away.
    other = await eu.client.submit(job("meanwhile", "1", 0.2))
    assert (await ap.client.submit(job("meanwhile-ap", "1", 0.2))) != other

    await revive(us, eu)  # us comes back: its stale run of epoch 1 is revoked, stopped
    await eventually(lambda: state_is(us, j, "KILLED"), timeout=30)
    await eventually(lambda: state_is(eu, j, "SUCCEEDED"), timeout=40)
    assert (await fed_of(eu, j))["region"] == "ap"
    # No job completed twice: us started its run and was made to kill it; ap ran it once.
    assert len(runs(us.fleets[0], j)) == 1 and us.fleets[0].counts["kills"] == 1
    assert len(runs(ap.fleets[0], j)) == 1 and ap.fleets[0].counts["kills"] == 0
    assert ap.fleets[0].counts["ended"] == 2  # this job and `meanwhile-ap`, each once


async def test_a_nomination_sent_while_the_target_is_cut_off_arrives_after(regions):
    """The cut: the target's server is killed and restarted (from eu, its gateway goes
    away and comes back; publishes into its inbox fail meanwhile). eu is given a long
    summary age, so it still believes us fresh and nominates it while it is cut off."""
    fed = await regions("eu", "us")
    slow = BoardConfig(interval_s=0.5, check_s=0.25, max_age_s=30.0, unreachable_s=60.0)
    patient = FederationConfig(nominate_timeout_s=60.0, round_backoff_s=2.0, reserve_ttl_s=60.0)
    await start(fed, summaries=slow, timers=patient)
    eu, us = fed["eu"], fed["us"]
    await fill(eu)
    await eventually(lambda: "us" in eu.coordinators[0].board.latest, timeout=10)
    await lose(us)
    j = await eu.client.submit(job("cut", "2", 0.5, regions=["eu", "us"], spill={"after": "1s"}))
    link = eu.coordinators[0].link
    await eventually(lambda: any(k.startswith(f"nominate:{j}:") for k in link.outbox), timeout=20)
    await asyncio.sleep(2.0)  # a few ticks of failed sends: still owed, still nominated
    assert any(k.startswith(f"nominate:{j}:") for k in link.outbox)
    assert (await fed_of(eu, j))["phase"] == "nominated"

    await revive(us, eu)
    await eventually(lambda: state_is(eu, j, "SUCCEEDED"), timeout=40)
    f = await fed_of(eu, j)
    assert (f["region"], f["epoch"]) == ("us", 1)  # the nomination sent while cut off
    assert len(runs(us.fleets[0], j)) == 1
    # The nomination reached us's inbox once, however often eu sent it.
    js = eu.nc.jetstream()
    inbox = subjects.fed_stream("us")
    last = (await js.stream_info(inbox)).state.last_seq
    kinds = []
    for seq in range(1, last + 1):
        for m in decode_fed_batch((await js.get_msg(inbox, seq)).data):
            if m.job == j:
                kinds.append(m.kind)
    assert kinds.count("nominate") == 1, kinds
    assert kinds.count("confirm") == 1, kinds
