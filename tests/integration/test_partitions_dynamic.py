"""The partition controller at work on a real local mesh (nats-server, coordinator
candidates, hollow fleets, one real agent): a service's simulated load rises, the leader
borrows batch nodes for stateless, their batch tasks are preempted and requeued (none
lost, none run twice), the load falls and the nodes go home after their cool-down; the
same with the leader killed in the middle of a move; the controller held off while a
break-glass is in force. Timings are compressed (1 s interval, 5 s window) so a whole
day of a region fits in well under a minute."""

from __future__ import annotations

import asyncio
import os
import re
import time

from nats.js.api import DeliverPolicy

from agent.hollow import GiB, Inventory
from mesh import subjects
from mesh.codec import decode
from mesh.schema import LogEntry, NodePartitionChanged, NodePartitionSet, PartitionApplyRequest

from .conftest import eventually, run_mesh

NODE = Inventory(4, 8 * GiB)
COOLDOWN_S = 5.0
CONFIG = f"""
partitions:
  stateless: {{min_nodes: 2}}
  batch: {{}}
interval_s: 1s
window_s: 5s
stale_after_s: 3s
borrow_after_s: 2s
return_after_s: 5s
cooldown_s: {COOLDOWN_S:g}s
"""


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


def batch_job(name: str, count: int, seconds: float) -> dict:
    task = {"role": "w", "count": count, "simulate": {"duration": f"{seconds}s"}}
    return {
        "name": name,
        "placement": {"gang": False},  # a backlog: each task runs as a slot frees
        "tasks": [{**task, "resources": {"cpu": 1, "memory": "64Mi"}}],
    }


def service_job(origin: float, high_s: float, count: int = 2) -> dict:
    """`count` replicas, each keeping its 4 cores 95 % busy until `high_s` after
    `origin`, then 5 %: stateless goes hot, then cold."""
    load = {"curve": "step", "trough": 0.95, "step_at": f"{high_s}s", "step_to": 0.05}
    return {
        "name": "web",
        "kind": "service",
        "tasks": [
            {
                "role": "replica",
                "count": count,
                "resources": {"cpu": 4, "memory": "256Mi"},
                "simulate": {"duration": "forever", "load": {**load, "origin": origin}},
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


async def test_load_rises_nodes_are_borrowed_then_returned_after_it_falls(region, tmp_path):
    await region.coordinator()
    client = region.client
    await client.request("partition.apply", PartitionApplyRequest(CONFIG), retries=30)
    web = {"partition": "stateless"}
    await region.fleet(2, prefix="web", inventories=[NODE] * 2, heartbeat_s=0.25, labels=web)
    await region.fleet(6, prefix="bat", inventories=[NODE] * 6, heartbeat_s=0.25, seed=1)
    await region.ready(8)
    tap = await LogTap().start(region.nc)
    # a backlog of 32 one-core tasks for 24 batch cores (in jobs the region can hold),
    # the first 24 still running when the controller borrows
    batch = [await client.submit(batch_job(f"backlog-{i}", 8, 12.0)) for i in range(4)]

    async def batch_full():
        jobs = [await client.job(j) for j in batch]
        return sum(t["state"] == "RUNNING" for j in jobs for t in j["task_list"]) == 24

    await eventually(batch_full, timeout=20)
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
    lent_ids = {m.node_id for m in lent}
    rows = await partitions(client)
    assert rows["stateless"]["nodes"] == 2 + len(lent_ids)
    assert rows["stateless"]["hotness"]["p90"] == 0.95 and rows["stateless"]["trend"] is not None
    node = await client.node(lent[0].node_id)
    assert node["partition"] == "stateless" and node["home"] == "batch"

    # the CLI shows each partition's hotness now and its trend
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_")}
    env["MESH_HOME"] = str(tmp_path / "home")
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
