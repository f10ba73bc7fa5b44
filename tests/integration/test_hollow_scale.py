"""Hollow fleets at scale over a real nats-server: one assignment consumer per fleet,
spread heartbeats, concurrent events, and nothing run twice or lost."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter, defaultdict

import pytest
from nats.js.api import ConsumerConfig

import coordinator.leader as leader_module
from agent.hollow import GiB, HollowNode, Inventory, inventory_mix
from agent.link import EventPublisher, by_node
from mesh import subjects
from mesh.codec import decode, encode
from mesh.schema import (
    Assignment,
    NodeState,
    Resources,
    TaskEvent,
    TaskSpec,
    decode_task_events,
)
from mesh.streams import ensure_streams
from workloads.generator import WorkloadConfig, describe, generate
from workloads.lifecycle import TaskState
from workloads.spec import SimulatedRun

from .conftest import eventually

REGION = "default"


def test_encoded_heartbeat_is_what_the_codec_gives():
    mix = [*inventory_mix(8, seed=3), Inventory(2, 4 * GiB, edge=True)]
    mix += [Inventory(96, 1024 * GiB, "A100", 8, 80 * GiB, enforcement="mps")]
    for i, inv in enumerate(mix):
        node = HollowNode(f"hollow-{i:04d}", inv, busy=0.75)
        for n in range(4):
            if n:
                # only the keys matter to the tasks field; the grants move the GPU fields
                uuids = (node.gpu_uuid(n % inv.gpus),) if inv.gpus else ()
                spec = TaskSpec(
                    resources=Resources(gpu=250 * n, gpu_memory=n * GiB), gpu_uuids=uuids
                )
                node.start_run((f"job-{i}.w.{n}", n), spec, None)
            st = node.state(REGION)
            node.seq -= 1  # encode the same beat again, the cheap way
            raw = node.encode_state(REGION, st.ts)
            assert raw == encode(st)
            assert decode(NodeState, raw) == st
        assert sum(g.utilization for g in st.gpus) == (113 if inv.gpus else 0)  # 19 + 38 + 56


async def _assignment_consumers(nc) -> list:
    js = nc.jetstream()
    return await js.consumers_info(subjects.assign_stream(REGION))


async def test_fleet_of_300_runs_500_simulated_tasks_each_once(region, monkeypatch):
    # Reports are logged 7 at a time, so a fetch of several messages (each with a node's
    # events) is logged in parts, a part's messages acknowledged after its append, and
    # later fetches ask for fewer messages.
    monkeypatch.setattr(leader_module, "EVENTS_PER_APPEND", 7)
    coord = await region.coordinator()
    t0 = time.monotonic()
    fleet = await region.fleet(300)
    await region.ready(300)
    consumers = await _assignment_consumers(region.nc)
    assert [c.name for c in consumers] == ["fleet_hollow"]
    assert len(consumers[0].config.filter_subjects) == 300
    job_id = await region.client.submit(
        {
            "name": "wide",
            "tasks": [
                {
                    "role": "w",
                    "count": 500,
                    "simulate": {"duration": "0.5s"},
                    "resources": {"cpu": 1, "memory": "1Gi"},
                }
            ],
        }
    )
    job = await region.client.wait(job_id, timeout=60, poll=0.25)
    elapsed = time.monotonic() - t0
    assert job["state"] == "SUCCEEDED"
    tasks = job["task_list"]
    assert len(tasks) == 500
    assert all(t["state"] == "SUCCEEDED" and t["attempt"] == 1 for t in tasks)
    assert all(t["node_id"] in fleet.nodes for t in tasks)
    for t in tasks:
        states = [h["state"] for h in t["history"]]
        assert states.count("RUNNING") == 1 and states.count("SUCCEEDED") == 1, states
    assert fleet.counts["runs"] == 500 and fleet.counts["refused"] == 0
    assert fleet.events.pending == 0 and fleet.events.acked == 1000
    assert fleet.events.messages < 1000  # a node's ready events went together
    # and the leader asks for about 7 reports' worth of messages per fetch
    assert 1 <= coord.leader._events.batch <= 7
    assert elapsed < 30, f"took {elapsed:.1f} s"


class Harness:
    """Plays the coordinator's part on the wire: publishes assignments and reads events."""

    def __init__(self, nc) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=10.0)
        self.events: list[TaskEvent] = []
        self._n = 0

    async def start(self) -> None:
        await ensure_streams(self.js, REGION)
        self.psub = await self.js.pull_subscribe(
            subjects.events_all(REGION),
            durable="test_events",
            stream=subjects.events_stream(REGION),
            config=ConsumerConfig(ack_wait=5.0),
        )

    async def assign(
        self, node_id: str, task_id: str, *, attempt=1, kind="run", spec=None, grace_s=5.0
    ):
        self._n += 1  # a fresh message id: the server must not de-duplicate the resends
        a = Assignment(
            kind, node_id, "job-1", task_id, attempt, 1, time.time(), spec, grace_s=grace_s
        )
        await self.js.publish(
            subjects.assign(REGION, node_id),
            encode(a),
            stream=subjects.assign_stream(REGION),
            headers={"Nats-Msg-Id": f"test:{self._n}"},
        )

    async def drain(self) -> list[TaskEvent]:
        try:
            msgs = await self.psub.fetch(256, timeout=0.2)
        except Exception:
            return self.events
        for m in msgs:
            self.events.extend(decode_task_events(m.data)[1])
            await m.ack()
        return self.events

    def states(self, task_id: str) -> list[str]:
        return [str(e.state) for e in self.events if e.task_id == task_id]


def sim(duration: float | None, exit_code: int = 0, stop_s: float = 0.0) -> TaskSpec:
    return TaskSpec(simulate=SimulatedRun(duration, exit_code, stop_s=stop_s))


async def test_redelivered_assignment_never_runs_twice_and_commands_are_refused(region):
    h = Harness(region.nc)
    fleet = await region.fleet(5)
    await h.start()
    await h.assign("hollow-0001", "t-sim", spec=sim(0.3))
    await h.assign("hollow-0001", "t-sim", spec=sim(0.3))  # redelivered
    await h.assign("hollow-0002", "t-real", spec=TaskSpec(argv=("/bin/true",)))
    await h.assign("hollow-0003", "t-fail", spec=sim(0.0, exit_code=7))
    await h.assign("hollow-0004", "t-long", spec=sim(300.0))

    async def long_running():
        await h.drain()
        return "RUNNING" in h.states("t-long")

    await eventually(long_running)
    await h.assign("hollow-0004", "t-long", kind="kill")
    await h.assign("hollow-0001", "t-sim", spec=sim(0.3))  # after it ended, still not again

    async def settled():
        await h.drain()
        return (
            "SUCCEEDED" in h.states("t-sim")
            and h.states("t-real")
            and "FAILED" in h.states("t-fail")
            and "KILLED" in h.states("t-long")
        )

    await eventually(settled, timeout=10)
    await asyncio.sleep(0.5)
    await h.drain()
    assert h.states("t-sim") == ["RUNNING", "SUCCEEDED"]
    assert h.states("t-real") == ["FAILED"]
    (refusal,) = [e for e in h.events if e.task_id == "t-real"]
    assert "never runs a real command" in refusal.message
    assert h.states("t-fail") == ["RUNNING", "FAILED"]
    assert [e.exit_code for e in h.events if e.task_id == "t-fail"] == [None, 7]
    assert h.states("t-long") == ["RUNNING", "KILLED"]
    assert {e.node_id for e in h.events if e.task_id == "t-sim"} == {"hollow-0001"}
    assert fleet.counts["duplicates"] == 2
    assert not fleet.nodes["hollow-0004"].running


async def test_a_run_that_takes_time_to_stop_stops_within_the_kills_grace(region):
    h = Harness(region.nc)
    fleet = await region.fleet(2)
    await h.start()
    slow = TaskSpec(resources=Resources(cpu=1000), simulate=SimulatedRun(300.0, stop_s=1.5))
    await h.assign("hollow-0000", "t-slow", spec=slow)
    await h.assign("hollow-0001", "t-capped", spec=sim(None, stop_s=600.0))

    async def running():
        await h.drain()
        return "RUNNING" in h.states("t-slow") and "RUNNING" in h.states("t-capped")

    await eventually(running)
    killed_at = time.monotonic()
    await h.assign("hollow-0000", "t-slow", kind="kill")
    await h.assign("hollow-0001", "t-capped", kind="kill", grace_s=0.5)  # SIGKILL's time
    await asyncio.sleep(0.2)
    await h.assign("hollow-0000", "t-slow", kind="kill")  # again: changes nothing
    await asyncio.sleep(0.5)
    node = fleet.nodes["hollow-0000"]
    # still stopping: it runs, is busy, and has not been reported stopped
    assert ("t-slow", 1) in node.running and node.busy_at(time.time())[1] == 1.0
    assert node.live_tasks() == ["t-slow#1"]

    async def killed():
        await h.drain()
        return "KILLED" in h.states("t-slow") and "KILLED" in h.states("t-capped")

    await eventually(killed, timeout=10)
    assert time.monotonic() - killed_at >= 1.5
    await asyncio.sleep(0.3)
    await h.drain()
    assert h.states("t-slow") == h.states("t-capped") == ["RUNNING", "KILLED"]
    assert fleet.counts["kills"] == 2
    assert not node.running and not node.stopping and not node.stop_s
    assert node.busy_at(time.time())[1] == 0.0


async def test_assignment_for_another_node_is_refused(region):
    h = Harness(region.nc)
    fleet = await region.fleet(2)
    await h.start()
    # On hollow-0000's subject, but addressed to hollow-0001: a node speaks only for itself.
    a = Assignment("run", "hollow-0001", "job-1", "t-x", 1, 1, time.time(), sim(0.1))
    await h.js.publish(subjects.assign(REGION, "hollow-0000"), encode(a))
    await eventually(lambda: fleet.feed.rejected == 1)
    await asyncio.sleep(0.3)
    assert fleet.counts["runs"] == 0 and await h.drain() == []


async def test_legacy_per_node_consumers_hand_over_their_backlog(region):
    """Per-node consumers of an older fleet own the subjects on the work-queue stream:
    the fleet removes them, and what they had not acknowledged still runs."""
    h = Harness(region.nc)
    await h.start()
    for node in ("hollow-0000", "hollow-0001"):
        await h.js.pull_subscribe(
            subjects.assign(REGION, node),
            durable=subjects.agent_consumer(node),
            stream=subjects.assign_stream(REGION),
        )
    await h.assign("hollow-0001", "t-old", spec=sim(0.1))
    fleet = await region.fleet(3)
    assert fleet.feed.migrated == 2
    assert [c.name for c in await _assignment_consumers(region.nc)] == ["fleet_hollow"]

    async def done():
        await h.drain()
        return "SUCCEEDED" in h.states("t-old")

    await eventually(done, timeout=10)
    assert h.states("t-old") == ["RUNNING", "SUCCEEDED"]


async def test_restart_reuses_the_consumer_and_a_grown_fleet_updates_it(region):
    fleet = await region.fleet(4)
    await fleet.stop()
    region.fleets.remove(fleet)
    h = Harness(region.nc)
    await h.start()
    await h.assign("hollow-0002", "t-while-away", spec=sim(0.1))  # no one listening
    fleet = await region.fleet(6)
    (c,) = await _assignment_consumers(region.nc)
    assert len(c.config.filter_subjects) == 6

    async def done():
        await h.drain()
        return "SUCCEEDED" in h.states("t-while-away")

    await eventually(done, timeout=10)


async def test_a_deleted_consumer_is_put_back(region):
    h = Harness(region.nc)
    fleet = await region.fleet(3)
    await h.start()
    await h.js.delete_consumer(subjects.assign_stream(REGION), fleet.feed.durable)
    await h.assign("hollow-0001", "t-after", spec=sim(0.1))

    async def done():
        await h.drain()
        return "SUCCEEDED" in h.states("t-after")

    await eventually(done, timeout=15)
    assert h.states("t-after") == ["RUNNING", "SUCCEEDED"]


def test_ready_attempts_go_by_node_in_order_a_message_s_worth_at_a_time():
    keys = [("a", "t1", 1), ("b", "t2", 1), ("a", "t3", 1), ("a", "t1", 1), ("a", "t4", 2)]
    assert by_node(keys, 2) == [
        [("a", "t1", 1), ("a", "t3", 1)],
        [("a", "t4", 2)],
        [("b", "t2", 1)],
    ]
    assert by_node([], 64) == []


async def test_events_wait_for_the_stream_in_order_per_attempt(nc):
    """Nothing takes the events at first (no stream): they are retried, and each
    attempt's events are stored in the order they were sent, a node's ready events
    together in one message."""
    js = nc.jetstream(timeout=5.0)
    pub = EventPublisher(js, REGION, retry_s=0.1)
    pub.start()
    order = (TaskState.RUNNING, TaskState.SUCCEEDED)
    for i in range(200):
        for state in order:
            pub.send(TaskEvent(f"n-{i % 7}", "job-1", f"t-{i}", 1, state, time.time()))
    await asyncio.sleep(0.4)
    assert pub.pending == 400 and pub.retries > 0 and pub.acked == 0
    await ensure_streams(js, REGION)
    assert await pub.flush(15)
    assert pub.acked == 400
    psub = await js.pull_subscribe(
        subjects.events_all(REGION), durable="check", stream=subjects.events_stream(REGION)
    )
    stored, messages = [], 0
    while len(stored) < 400:
        for m in await psub.fetch(400, timeout=2):
            node_id, events = decode_task_events(m.data)
            assert {ev.node_id for ev in events} == {node_id}
            stored.extend(events)
            messages += 1
            await m.ack()
    assert len(stored) == 400 and messages < 100  # 7 nodes: a message per node per wave
    by_task = defaultdict(list)
    for ev in stored:
        by_task[ev.task_id].append(ev.state)
    assert len(by_task) == 200 and all(tuple(s) == order for s in by_task.values())
    await pub.stop()


async def test_a_node_s_events_with_long_texts_go_in_parts_within_the_message_limit(nc):
    """64 events whose texts are as long as allowed, in 3-byte characters (32 KiB each
    as UTF-8), would be 1.5 MiB in one message: the publisher sends them in parts, and
    every one is stored."""
    js = nc.jetstream(timeout=5.0)
    await ensure_streams(js, REGION)
    pub = EventPublisher(js, REGION)
    text = "€" * 4096
    for i in range(64):
        pub.send(TaskEvent("n-1", "job-1", f"t-{i}", 1, TaskState.FAILED, 1.0, 1, None, text, text))
    pub.start()
    assert await pub.flush(15) and pub.acked == 64 and pub.retries == 0
    psub = await js.pull_subscribe(
        subjects.events_all(REGION), durable="check", stream=subjects.events_stream(REGION)
    )
    stored, sizes = [], []
    while len(stored) < 64:
        for m in await psub.fetch(64, timeout=2):
            stored.extend(decode_task_events(m.data)[1])
            sizes.append(len(m.data))
            await m.ack()
    assert sorted(ev.task_id for ev in stored) == sorted(f"t-{i}" for i in range(64))
    assert 1 < len(sizes) < 64 and max(sizes) <= 512 * 1024
    assert all(ev.log_tail == text and ev.message == text for ev in stored)
    await pub.stop()


@pytest.mark.slow
async def test_heartbeats_are_spread_over_the_period(region):
    seen: list[tuple[float, str]] = []

    async def on_state(msg):
        seen.append((time.monotonic(), decode(NodeState, msg.data).node_id))

    sub = await region.nc.subscribe(subjects.state_all(REGION), cb=on_state)
    fleet = await region.fleet(400, heartbeat_s=1.0)
    await asyncio.sleep(1.2)
    seen.clear()
    await asyncio.sleep(2.0)
    await sub.unsubscribe()
    per_node = Counter(n for _, n in seen)
    assert set(per_node) == set(fleet.nodes)
    assert all(1 <= k <= 3 for k in per_node.values()), per_node.most_common(3)
    # Spread: no 100 ms window holds much more than its share (40 of 400 per second;
    # a burst would put all 400 in one).
    buckets = defaultdict(int)
    t0 = seen[0][0]
    for t, _ in seen:
        buckets[int((t - t0) / 0.1)] += 1
    assert max(buckets.values()) <= 120, sorted(buckets.values())[-5:]
    # seq rises by one per beat
    beats = await _collect_seqs(region, "hollow-0007")
    assert beats == sorted(beats) and len(set(beats)) == len(beats)


async def _collect_seqs(region, node_id: str) -> list[int]:
    seqs: list[int] = []

    async def on_state(msg):
        seqs.append(decode(NodeState, msg.data).seq)

    sub = await region.nc.subscribe(subjects.state(REGION, node_id), cb=on_state)
    await asyncio.sleep(2.2)
    await sub.unsubscribe()
    return seqs


class StateWatch:
    """Every NodeState one node publishes, as decoded from the wire."""

    def __init__(self) -> None:
        self.beats: list[tuple[float, NodeState]] = []

    async def start(self, nc, node_id: str) -> StateWatch:
        async def on_state(msg):
            self.beats.append((time.monotonic(), decode(NodeState, msg.data)))

        self.sub = await nc.subscribe(subjects.state(REGION, node_id), cb=on_state)
        return self

    def last(self) -> NodeState | None:
        return self.beats[-1][1] if self.beats else None


async def test_gpu_heartbeats_carry_utilization_from_grants_and_background(region):
    h = Harness(region.nc)
    a100 = Inventory(96, 1024 * GiB, "A100", 8, 80 * GiB, enforcement="watchdog")
    fleet = await region.fleet(
        2,
        inventories=[a100, Inventory(32, 128 * GiB)],
        gpu_background={"GPU-hollow-0000-5": 40},
        heartbeat_s=0.2,
    )
    await h.start()
    node = fleet.nodes["hollow-0000"]
    watch = await StateWatch().start(region.nc, "hollow-0000")
    await eventually(watch.last)
    gpus = watch.last().gpus
    assert [g.utilization for g in gpus] == [0, 0, 0, 0, 0, 40, 0, 0]
    assert {g.enforcement for g in gpus} == {"watchdog"} and {g.model for g in gpus} == {"A100"}
    spec = TaskSpec(
        resources=Resources(cpu=1000, gpu=2000, gpu_memory=30 * GiB),
        simulate=SimulatedRun(30.0),
        gpu_uuids=("GPU-hollow-0000-1", "GPU-hollow-0000-5"),
    )
    await h.assign("hollow-0000", "t-gpu", spec=spec)
    expect = round(100 * node.busy)

    def busy():
        st = watch.last()
        return st.tasks == ("t-gpu#1",) and st.gpus[1].utilization == expect

    await eventually(busy)
    gpus = watch.last().gpus
    assert gpus[5].utilization == min(100, 40 + expect)
    assert gpus[1].memory_used == gpus[5].memory_used == 15 * GiB
    await h.assign("hollow-0000", "t-gpu", kind="kill")

    def idle():
        st = watch.last()
        return not st.tasks and st.gpus[1].utilization == 0

    await eventually(idle)
    assert [g.memory_used for g in watch.last().gpus] == [0] * 8
    assert watch.last().gpus[5].utilization == 40


async def test_crash_stops_heartbeats_drops_runs_and_comes_back_empty(region):
    h = Harness(region.nc)
    fleet = await region.fleet(3, heartbeat_s=0.2)
    await h.start()
    await h.assign("hollow-0001", "t-long", spec=sim(300.0))
    watch = await StateWatch().start(region.nc, "hollow-0001")
    other = await StateWatch().start(region.nc, "hollow-0002")

    async def running():
        await h.drain()
        st = watch.last()
        return "RUNNING" in h.states("t-long") and st is not None and st.tasks == ("t-long#1",)

    await eventually(running)
    assert fleet.crash("hollow-0001", 1.5) == 1
    crashed_at = time.monotonic()
    assert not fleet.nodes["hollow-0001"].running and fleet.counts["dropped"] == 1
    await h.assign("hollow-0001", "t-while-down", spec=sim(0.2))  # waits for its return
    await h.assign("hollow-0001", "t-long", spec=sim(300.0))  # a redelivery: never again

    async def back():
        return any(t > crashed_at + 0.1 for t, _ in watch.beats)

    await eventually(back, timeout=10)
    first_back = next(t for t, _ in watch.beats if t > crashed_at + 0.1)
    assert first_back - crashed_at >= 1.4, first_back - crashed_at
    assert [t for t, _ in other.beats if t > crashed_at]  # the others never stopped

    async def ran_after():
        await h.drain()
        return "SUCCEEDED" in h.states("t-while-down")

    await eventually(ran_after, timeout=10)
    start = next(e.ts for e in h.events if e.task_id == "t-while-down")
    assert start >= time.time() - (time.monotonic() - crashed_at) + 1.4  # not before its return
    await asyncio.sleep(0.5)
    await h.drain()
    assert h.states("t-long") == ["RUNNING"]  # dropped silently, not run again
    later = [st for t, st in watch.beats if t > first_back + 0.5]
    assert later and all(st.tasks == () for st in later)
    assert fleet.counts["crashes"] == 1 and fleet.counts["duplicates"] == 1


async def test_mesh_load_submits_a_generated_workload(region):
    """`mesh load` end to end: the CLI generates, submits at the rate and summarises;
    the hollow fleet runs every task."""
    await region.coordinator()
    await region.fleet(40)
    await region.ready(40)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mesh.cli.main",
        "--nats",
        region.url,
        "load",
        "--jobs",
        "40",
        "--rate",
        "100",
        "--median",
        "0.5",
        "--sigma",
        "0",
        "--gpu-fraction",
        "0",
        "--concurrency",
        "8",
        "--seed",
        "3",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    summary = json.loads(out)
    expected = generate(
        WorkloadConfig(
            seed=3, jobs=40, rate=100.0, duration_median_s=0.5, duration_sigma=0.0, gpu_fraction=0.0
        )
    )
    assert summary["submitted_jobs"] == 40 and summary["errors"] == 0
    assert summary["submitted_tasks"] == sum(j.tasks for j in expected)
    assert summary["workload"] == describe(expected)
    assert summary["elapsed_s"] >= expected[-1].offset_s  # sent at the arrival times
    jobs = await region.client.jobs(limit=100)
    assert {j["name"] for j in jobs} == {j.spec["name"] for j in expected}

    async def all_done():
        states = [(await region.client.job(j["job_id"]))["state"] for j in jobs]
        return all(s == "SUCCEEDED" for s in states)

    await eventually(all_done, timeout=30, interval=0.5)
