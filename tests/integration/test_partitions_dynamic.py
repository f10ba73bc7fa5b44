"""The partition controller at work on a real local mesh (nats-server, coordinator
candidates in-process or as processes, hollow fleets): a service's simulated load rises,
the leader borrows batch nodes for stateless, their batch tasks are preempted and
requeued (none lost, none run twice), the load falls and the nodes go home after their
cool-down; the same with the leader SIGKILLed while the controller's move drains (its
batch tasks take seconds to stop: `simulate.stop`), the new leader finishing it and
moving the node no second time; the controller held off while a break-glass made
through the `mesh` CLI is in force, hot or cold, and at work again after `mesh
partition restore`. Timings are compressed (1 s interval, 5 s window) so a whole day of
a region fits in well under a minute."""

from __future__ import annotations

import asyncio
import json
import re
import time

from nats.js.api import DeliverPolicy

from agent.hollow import GiB, Inventory
from mesh import subjects
from mesh.codec import decode
from mesh.schema import (
    BreakGlassEnded,
    LogEntry,
    NodePartitionChanged,
    NodePartitionSet,
    PartitionApplyRequest,
)

from .conftest import cli_env, eventually, leader_is, run_mesh

NODE = Inventory(4, 8 * GiB)
WEB = {"partition": "stateless"}
WINDOW_S = 5.0
RETURN_AFTER_S = 5.0
COOLDOWN_S = 5.0


def controller_config(borrow_after_s: float = 2.0, spike_fraction: float = 0.9) -> str:
    return f"""
partitions:
  stateless: {{min_nodes: 2}}
  batch: {{}}
interval_s: 1s
window_s: {WINDOW_S:g}s
stale_after_s: 3s
borrow_after_s: {borrow_after_s:g}s
spike_fraction: {spike_fraction:g}
return_after_s: {RETURN_AFTER_S:g}s
cooldown_s: {COOLDOWN_S:g}s
"""


CONFIG = controller_config()


class LogTap:
    """Every entry of the job log as it is appended, with who wrote it (a test reads
    the log itself: what the leader decided, when, and which leader it was)."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []
        self.sub = None

    async def start(self, nc, region: str = "default") -> LogTap:
        js = nc.jetstream()
        self.sub = await js.subscribe(
            subjects.job_log(region),
            stream=subjects.log_stream(region),
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            cb=self._on,
        )
        return self

    async def _on(self, msg) -> None:
        self.entries.append(decode(LogEntry, msg.data))

    def events(self, kind: type) -> list[tuple[str, object]]:
        return [(e.leader_id, ev) for e in self.entries for ev in e.events if isinstance(ev, kind)]

    def moves(self, node_id: str | None = None) -> list[NodePartitionSet]:
        return [
            ev
            for _, ev in self.events(NodePartitionSet)
            if node_id is None or ev.node_id == node_id
        ]

    def flips(self, node_id: str) -> list[NodePartitionChanged]:
        return [ev for _, ev in self.events(NodePartitionChanged) if ev.node_id == node_id]


def batch_job(name: str, count: int, seconds: float, stop_s: float = 0.0) -> dict:
    """`count` one-core tasks of `seconds`, each taking `stop_s` to stop once killed."""
    sim = {"duration": f"{seconds}s", **({"stop": f"{stop_s}s"} if stop_s else {})}
    task = {"role": "w", "count": count, "simulate": sim}
    return {
        "name": name,
        "placement": {"gang": False},  # a backlog: each task runs as a slot frees
        "tasks": [{**task, "resources": {"cpu": 1, "memory": "64Mi"}}],
    }


def service_job(
    origin: float,
    high_s: float | None,
    count: int = 2,
    cpu: int = 4,
    name: str = "web",
    labels: dict[str, str] | None = None,
) -> dict:
    """`count` replicas of `cpu` cores, each keeping 4 cores 95 % busy until `high_s`
    after `origin`, then 5 % (None: for good): stateless goes hot, then cold. `labels`:
    the nodes it may run on."""
    if high_s is None:
        load = {"curve": "flat", "peak": 0.95}
    else:
        load = {"curve": "step", "trough": 0.95, "step_at": f"{high_s}s", "step_to": 0.05}
    return {
        "name": name,
        "kind": "service",
        **({"placement": {"labels": labels}} if labels else {}),
        "tasks": [
            {
                "role": "replica",
                "count": count,
                "resources": {"cpu": cpu, "memory": "256Mi"},
                "simulate": {
                    "duration": "forever",
                    "load": {**load, "origin": origin, "cores": 4},
                },
            }
        ],
    }


def assert_each_ran_once(job: dict) -> int:
    """Every task SUCCEEDED exactly once; an attempt stopped by a move ended PREEMPTED
    (stopped and reported) before any later attempt of it began: never two at once.
    Returns how many attempts a move preempted."""
    assert job["state"] == "SUCCEEDED", job
    preempted = 0
    for t in job["task_list"]:
        hist = t["history"]
        assert t["state"] == "SUCCEEDED", t
        assert [h["state"] for h in hist].count("SUCCEEDED") == 1, hist
        for k, h in enumerate(hist):
            if h["state"] != "PREEMPTED":
                continue
            assert re.match(r"preempted: node \S+ moves from batch to stateless: ", h["message"])
            assert all(e["attempt"] <= h["attempt"] for e in hist[:k]), hist
            preempted += 1
    return preempted


async def partitions(client) -> dict[str, dict]:
    return {p["name"]: p for p in (await client.request("partition.list"))["partitions"]}


async def running(client, jobs: list[str], n: int) -> bool:
    """Whether exactly `n` of the jobs' tasks run."""
    found = [await client.job(j) for j in jobs]
    return sum(t["state"] == "RUNNING" for j in found for t in j["task_list"]) == n


async def hollow_region(region, batch_nodes: int) -> LogTap:
    """Two stateless nodes (the services'), `batch_nodes` batch ones, all reporting
    every 0.25 s; the job log tapped from its start."""
    await region.fleet(2, prefix="web", inventories=[NODE] * 2, heartbeat_s=0.25, labels=WEB)
    await region.fleet(
        batch_nodes, prefix="bat", inventories=[NODE] * batch_nodes, heartbeat_s=0.25, seed=1
    )
    await region.ready(2 + batch_nodes)
    return await LogTap().start(region.nc)


async def test_load_rises_nodes_are_borrowed_then_returned_after_it_falls(region, tmp_path):
    await region.coordinator()
    client = region.client
    await client.request("partition.apply", PartitionApplyRequest(CONFIG), retries=30)
    tap = await hollow_region(region, 6)
    # a backlog of 32 one-core tasks for 24 batch cores (in jobs the region can hold),
    # the first 24 still running when the controller borrows
    batch = [await client.submit(batch_job(f"backlog-{i}", 8, 12.0)) for i in range(4)]

    await eventually(lambda: running(client, batch, 24), timeout=20)
    high_s = 14.0
    origin = round(time.time(), 3)
    service = await client.submit(service_job(origin, high_s))

    # stateless goes hot: the leader borrows batch nodes, drained first, and says why
    async def borrowed():
        moves = [m for m in tap.moves() if m.source == "batch" and m.desired == "stateless"]
        return moves if moves and all(tap.flips(m.node_id) for m in moves) else None

    lent = await eventually(borrowed, timeout=high_s)
    assert time.time() < origin + high_s  # moved while the load was high
    for m in lent:
        assert m.reason.startswith("stateless hot: "), m.reason
        assert "borrow from batch" in m.reason and m.node_id.startswith("bat-"), m
    # every web node 95 % busy: a spike, borrowed at once, sized from the load now
    assert "spike (100% hot > spike_fraction 90%" in lent[0].reason, lent[0].reason
    lent_ids = {m.node_id for m in lent}
    rows = await partitions(client)
    assert rows["stateless"]["nodes"] == 2 + len(lent_ids)
    assert rows["stateless"]["hotness"]["p90"] == 0.95 and rows["stateless"]["trend"] is not None
    node = await client.node(lent[0].node_id)
    assert node["partition"] == "stateless" and node["home"] == "batch"

    # the CLI shows each partition's hotness now and its trend
    env = cli_env(tmp_path)
    r = await asyncio.to_thread(
        lambda: run_mesh("--nats", region.url, "--insecure", "partition", "list", env=env)
    )
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("stateless")]
    assert "p90 0.95" in line and re.search(r"[+-]\d\.\d{4}/s", line), r.stdout
    assert "HOTNESS" in r.stdout and "TREND" in r.stdout

    # the load falls: every borrowed node goes home, none within its cool-down
    async def returned():
        for node_id in lent_ids:
            back = [m for m in tap.moves(node_id) if m.desired == "batch"]
            if not back or len(tap.flips(node_id)) < 2:
                return False
        return True

    await eventually(returned, timeout=high_s + 30)
    for node_id in lent_ids:
        moves, flips = tap.moves(node_id), tap.flips(node_id)
        assert [(m.source, m.desired) for m in moves] == [
            ("batch", "stateless"),
            ("stateless", "batch"),
        ]
        assert moves[1].ts >= origin + high_s  # returned once the load had fallen
        assert moves[1].reason.startswith("stateless cold: ") and "return to batch" in (
            moves[1].reason
        )
        assert moves[1].ts - flips[0].ts >= COOLDOWN_S  # not back within its cool-down
    rows = await partitions(client)
    assert rows["stateless"]["nodes"] == 2 and rows["batch"]["nodes"] == 6
    assert rows["stateless"]["draining"] == rows["batch"]["draining"] == 0
    for node_id in ("web-0000", "web-0001"):
        assert not tap.moves(node_id)  # the service's own nodes never moved

    # nothing lost, nothing run twice; the service kept its replicas where they were
    done = [await client.wait(j, timeout=90) for j in batch]
    assert sum(assert_each_ran_once(j) for j in done) >= 1
    job = await client.job(service)
    replicas = [t for t in job["task_list"] if t["state"] == "RUNNING"]
    assert sorted(t["node_id"] for t in replicas) == ["web-0000", "web-0001"]
    assert all(t["attempt"] == 1 for t in replicas), replicas


STOP_S = 4.0  # how long a batch task takes to stop once killed: a drain takes that long


async def test_a_new_leader_finishes_a_controller_move_the_dead_one_started(region, procs):
    p1 = procs(region.url, "coordinator", "--id", "p1", name="p1")
    client = region.client
    await eventually(lambda: leader_is(client, "p1"), timeout=20)
    procs(region.url, "coordinator", "--id", "p2", name="p2")
    await client.request("partition.apply", PartitionApplyRequest(CONFIG), retries=30)
    tap = await hollow_region(region, 4)
    # 18 one-core tasks for 16 batch cores, each taking STOP_S to stop once killed
    jobs = [batch_job(f"backlog-{i}", 6, 12.0, stop_s=STOP_S) for i in range(3)]
    batch = [await client.submit(j, retries=30) for j in jobs]
    await eventually(lambda: running(client, batch, 16), timeout=20)
    high_s = 14.0
    origin = round(time.time(), 3)
    await client.submit(service_job(origin, high_s))

    # the controller's move is in the log, its drain waits for the tasks to stop: kill
    async def controller_moved():
        return [m for m in tap.moves() if m.reason.startswith("stateless hot: ")]

    first = await eventually(controller_moved, timeout=high_s)
    p1.kill9()
    moved = {m.node_id for m in first}
    assert all(m.source == "batch" and m.desired == "stateless" for m in first), first
    assert {who for who, ev in tap.events(NodePartitionSet) if ev in first} == {"p1"}
    await eventually(lambda: leader_is(client, "p2"), timeout=30)

    # the new leader finishes it: the nodes flip, in its term
    await eventually(lambda: all(tap.flips(n) for n in moved), timeout=30)
    flips = [(who, ev) for who, ev in tap.events(NodePartitionChanged) if ev.node_id in moved]
    assert sorted((who, ev.node_id, ev.partition) for who, ev in flips) == [
        ("p2", n, "stateless") for n in sorted(moved)
    ]

    # the load falls: the nodes go home, each moved once each way (the new leader never
    # moved them to stateless again), the way back decided by the new leader
    async def returned():
        return all(len(tap.flips(n)) == 2 for n in moved)

    await eventually(returned, timeout=high_s + 30)
    for node_id in moved:
        assert [(m.source, m.desired) for m in tap.moves(node_id)] == [
            ("batch", "stateless"),
            ("stateless", "batch"),
        ]
        sets = [(who, ev) for who, ev in tap.events(NodePartitionSet) if ev.node_id == node_id]
        who, back = sets[1]
        assert who == "p2" and back.reason.startswith("stateless cold: "), sets

    # the move's batch tasks were preempted there and requeued; none lost, none run twice
    done = [await client.wait(j, timeout=90) for j in batch]
    assert sum(assert_each_ran_once(j) for j in done) >= len(moved)
    stopped = [
        h for j in done for t in j["task_list"] for h in t["history"] if h["state"] == "PREEMPTED"
    ]
    # (the new leader may borrow more later, for its own reasons: stateless stays hot
    # while the moved node runs none of the service's load)
    lent = {m.node_id for m in tap.moves() if m.desired == "stateless"}
    assert moved <= {h["node_id"] for h in stopped} <= lent
    assert all("moves from batch to stateless: stateless hot: " in h["message"] for h in stopped)


HELD_BORROW_S = 5.0  # time for an operator to break-glass before the controller borrows


async def test_the_controller_holds_off_during_break_glass_and_resumes_after_restore(
    region, tmp_path
):
    await region.coordinator()
    client = region.client
    # no spike rule here: it would borrow at once, and this test reads the dwell
    config = controller_config(borrow_after_s=HELD_BORROW_S, spike_fraction=1.0)
    await client.request("partition.apply", PartitionApplyRequest(config), retries=30)
    tap = await hollow_region(region, 4)
    env = cli_env(tmp_path)
    cli = ("--nats", region.url, "--insecure", "--user", "oncall")

    async def mesh(*args: str):  # off the loop: the coordinator answering it runs on it
        return await asyncio.to_thread(lambda: run_mesh(*cli, *args, env=env))

    async def stateless_is(state: str) -> bool:
        return (await partitions(client))["stateless"]["hotness"]["state"] == state

    # 3 of 4 cores of each service node, kept 95 % busy for high_s: stateless goes hot
    high_s = 8.0
    origin = round(time.time(), 3)
    await client.submit(service_job(origin, high_s, cpu=3))
    await eventually(lambda: stateless_is("hot"), timeout=high_s)
    r = await mesh("--json", "partition", "break-glass", "--to", "stateless", "--nodes", "1",
                   "--reason", "web is hot")  # fmt: skip
    assert r.returncode == 0, r.stderr
    glass_at = time.time()
    reply = json.loads(r.stdout)
    (glass,) = {m["node_id"] for m in reply["moves"]}
    assert glass.startswith("bat-") and reply["break_glass"]["by"] == "oncall"
    await eventually(lambda: tap.flips(glass), timeout=10)
    r = await mesh("partition", "list")
    assert r.returncode == 0 and "break-glass to stateless: 1 nodes, by oncall" in r.stdout

    # in force: stateless hot (2 of its 3 nodes) past the borrow dwell, then cold past
    # the return dwell and the glass node's cool-down, then hot again (a second service
    # on the service nodes): the controller moves nothing
    seen: list[str] = []

    async def cold_long_enough():
        rows = await partitions(client)
        seen.append(rows["stateless"]["hotness"]["state"])
        return time.time() >= origin + high_s + WINDOW_S + RETURN_AFTER_S + COOLDOWN_S + 2

    await eventually(cold_long_enough, timeout=high_s + 30, interval=0.5)
    assert "hot" in seen and seen[-1] == "cold", seen
    assert time.time() - glass_at > HELD_BORROW_S
    await client.submit(service_job(origin, None, cpu=1, name="web2", labels=WEB))
    await eventually(lambda: stateless_is("hot"), timeout=15)
    assert [m for m in tap.moves() if not m.break_glass] == []
    assert [m.node_id for m in tap.moves() if m.break_glass] == [glass]

    # restore: the glass node goes back where it came from, no longer lent
    r = await mesh("partition", "restore", "--reason", "fixed")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("stateless -> batch") == 1 and glass in r.stdout
    await eventually(lambda: len(tap.flips(glass)) == 2, timeout=10)
    (back,) = tap.moves(glass)[1:]
    assert (back.source, back.desired, back.break_glass) == ("stateless", "batch", False)
    assert back.reason == "break-glass ended (restored by oncall: fixed): back to batch"
    node = await client.node(glass)
    assert node["partition"] == "batch" and node["home"] == ""
    r = await mesh("partition", "list")
    assert r.returncode == 0 and "break-glass: none" in r.stdout

    # the controller is at work again, stateless still hot: it borrows, once it has
    # seen it hot for its whole dwell from the restore on (its timers were held)
    (ended,) = [ev for _, ev in tap.events(BreakGlassEnded)]

    async def borrowed():
        return [m for m in tap.moves() if m.ts > ended.ts and m.reason.startswith("stateless ")]

    lent = await eventually(borrowed, timeout=20)
    for m in lent:
        assert m.reason.startswith("stateless hot: ") and "borrow from batch" in m.reason, m
        assert m.source == "batch" and m.node_id.startswith("bat-"), m
        assert m.ts >= ended.ts + HELD_BORROW_S, (m.ts - ended.ts, m.reason)
