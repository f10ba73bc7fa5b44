"""Failures over real processes, each test asserting what the failure could break:
a NATS server of a 3-server cluster killed under load, an agent frozen past its down
deadline, the leader SIGKILLed during gang placement, an agent's store corrupted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest

from agent.service import Agent, AgentConfig
from coordinator.service import Coordinator, CoordinatorConfig
from mesh import subjects
from mesh.client import MeshClient
from mesh.connect import close_quietly, connect
from mesh.schema import ApiError, TaskPlaced, TaskUpdated
from mesh.server import EmbeddedServer, ServerConfig, free_port
from mesh.streams import ensure_streams

from .conftest import Region, eventually
from .test_fencing import elections, read_log

# The agent refuses to run task commands as root unless told to (CI may run as root).
ROOT = ("--allow-root",) if os.geteuid() == 0 else ()
SIM = {"name": "s", "tasks": [{"role": "w", "simulate": {"duration": "0.2s"}}]}


def placed_and_running(log):
    placed = Counter(ev.task_id for _, e in log for ev in e.events if isinstance(ev, TaskPlaced))
    running = Counter(
        (ev.task_id, ev.attempt)
        for _, e in log
        for ev in e.events
        if isinstance(ev, TaskUpdated) and ev.state == "RUNNING"
    )
    return placed, running


FIELDS = ("state", "node_id")


def history(log, counts: Counter) -> list[tuple]:
    """The log's events of the task counted most, to say how it came twice."""
    if not counts:
        return []
    (key, _), *_ = counts.most_common(1)
    task_id = key[0] if isinstance(key, tuple) else key
    return [
        (seq, e.term, type(ev).__name__, ev.attempt, *(getattr(ev, k, "") for k in FIELDS))
        for seq, e in log
        for ev in e.events
        if getattr(ev, "task_id", None) == task_id
    ]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def steady_submitter(client: MeshClient, acked: dict, stop: asyncio.Event, spec=SIM):
    while not stop.is_set():
        cid = uuid.uuid4().hex
        with contextlib.suppress(ApiError):
            acked[cid] = await client.submit(spec, client_id=cid, retries=60)
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------- a. NATS server killed


async def test_nats_server_of_three_killed_and_restarted_under_load(tmp_path):
    ports = [free_port() for _ in range(3)]
    servers = [
        EmbeddedServer(
            ServerConfig(
                store_dir=str(tmp_path / f"nats{i}"),
                server_name=f"n{i}",
                cluster_name="mesh",
                cluster_port=ports[i],
                cluster_routes=[f"nats://127.0.0.1:{p}" for j, p in enumerate(ports) if j != i],
            )
        )
        for i in range(3)
    ]
    for s in servers:
        await s.astart()
    urls = ",".join(s.url for s in servers)
    region = Region(urls, tmp_path)
    stop = asyncio.Event()
    try:
        # JetStream needs its meta leader before streams can be created.
        async def js_ready():
            with contextlib.suppress(Exception):
                nc = await connect(urls, name="probe")
                try:
                    await nc.jetstream().account_info()
                    return True
                finally:
                    await close_quietly(nc)
            return False

        await eventually(js_ready, timeout=20, interval=0.2)
        # An agent may start first and create the streams with 1 replica: the
        # coordinators (replicas=3) must raise it, or one server holds the region.
        nc0 = await connect(urls, name="early-agent")
        await ensure_streams(nc0.jetstream(), "default")
        await close_quietly(nc0)
        for cid in ("c1", "c2"):
            c = Coordinator(CoordinatorConfig(urls, candidate_id=cid, replicas=3))
            await c.start()
            region.coordinators.append(c)
        await region.fleet(4)
        await region.connect_client()
        region.client.timeout = 2.0
        await region.ready(4)
        js = region.nc.jetstream()
        for name in (subjects.log_stream("default"), f"KV_{subjects.lease_bucket('default')}"):
            assert (await js.stream_info(name)).config.num_replicas == 3, name
        info = await js.stream_info(subjects.log_stream("default"))
        assert info.config.num_replicas == 3 and str(info.config.storage) in (
            "file",
            "StorageType.FILE",
        )
        acked: dict[str, str] = {}
        task = asyncio.create_task(steady_submitter(region.client, acked, stop))
        await eventually(lambda: len(acked) >= 10, timeout=20)
        # Kill the server leading the job log's stream (the one that matters most).
        leader_name = info.cluster.leader
        victim = next(s for s in servers if s.config.server_name == leader_name)
        victim.kill()
        n_at_kill, killed_at = len(acked), time.monotonic()
        # Two servers of three are a quorum: writes resume once the streams' Raft groups
        # elect new leaders (seconds) and clients reconnect, with the third still down.
        await eventually(lambda: len(acked) > n_at_kill + 3, timeout=90)  # a hang guard
        gap = time.monotonic() - killed_at
        await asyncio.to_thread(victim.start)
        await asyncio.sleep(1.0)  # load goes on with the server back
        stop.set()
        await task
        # Assignments fetched on the dead server come again after the consumer's ack_wait
        # (30 s): every acknowledged job ends within that and a margin.
        deadline = time.monotonic() + 60
        stuck = []
        for job_id in acked.values():
            try:
                job = await region.client.wait(
                    job_id, timeout=max(1.0, deadline - time.monotonic())
                )
            except TimeoutError:
                stuck.append(await region.client.job(job_id))
                continue
            assert job["state"] == "SUCCEEDED", job
        log = await read_log(js)
        # Whatever else happened: every acknowledged job is in the log, nothing ran twice.
        jobs_logged = {
            ev.job_id for _, e in log for ev in e.events if type(ev).__name__ == "JobSubmitted"
        }
        assert set(acked.values()) <= jobs_logged
        placed, running = placed_and_running(log)
        assert max(placed.values(), default=1) == 1, history(log, placed)
        assert max(running.values(), default=1) == 1, history(log, running)
        assert not stuck, f"{len(stuck)} acknowledged jobs never ended: {stuck[:3]}"
        assert len(running) == len(placed)
        print(f"killed {leader_name}: writes resumed within {gap:.1f}s; {len(acked)} jobs")
    finally:
        stop.set()
        await region.close()
        for s in servers:
            s.stop()


# ---------------------------------------------------------------- b. agent frozen


async def test_frozen_agent_kills_its_stale_copy_when_it_returns(region, procs, tmp_path):
    await region.coordinator(suspect_after=1.0, down_after=2.5)
    agents = {
        n: procs(region.url, "agent", "--node-id", n, "--heartbeat", "0.3", *ROOT, name=n)
        for n in ("a1", "a2")
    }
    await region.ready(2)
    beats, go = tmp_path / "beats", tmp_path / "go"
    beats.mkdir()
    cmd = f"while [ ! -e {go} ]; do date +%s.%N >> {beats}/$$; sleep 0.05; done; echo done"
    job_id = await region.client.submit(
        {"name": "dup", "tasks": [{"role": "main", "command": cmd}]}
    )

    async def task_on(attempt):
        t = (await region.client.job(job_id))["task_list"][0]
        return t if t["attempt"] == attempt and t["state"] == "RUNNING" else None

    first = await eventually(lambda: task_on(1))
    frozen = agents[first["node_id"]]
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        second = await eventually(lambda: task_on(2), timeout=20)
        assert second["node_id"] != first["node_id"]
        await asyncio.sleep(0.5)
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
        thawed = time.time()
    pids = sorted(int(p.name) for p in beats.iterdir())
    assert len(pids) == 2, pids
    # the stale copy is the one that started first (both may still be writing now)
    stale_pid = min(pids, key=lambda p: float((beats / str(p)).read_text().split()[0]))
    try:
        await eventually(lambda: not alive(stale_pid), timeout=10)
    except AssertionError:
        with contextlib.suppress(psutil.NoSuchProcess):
            pr = psutil.Process(stale_pid)
            print("STALE", pr.status(), pr.cmdline(), pr.ppid(), [c.pid for c in pr.children()])
        go.touch()
        raise
    gone = time.time() - thawed
    stale_beats = [float(x) for x in (beats / str(stale_pid)).read_text().split()]
    overlap = max(0.0, stale_beats[-1] - thawed)
    go.touch()
    job = await region.client.wait(job_id, timeout=20)
    assert job["state"] == "SUCCEEDED" and job["task_list"][0]["attempt"] == 2, job
    print(f"stale copy gone {gone:.2f}s after SIGCONT; both ran for {overlap:.2f}s after it")
    # Once back, the agent stops its stale copy promptly (the kill goes out on its
    # first heartbeat). Both copies DID run while it was frozen, and for `overlap`
    # after: the agent does not stop its tasks on its own (docs/reliability.md).
    assert gone < 5.0 and overlap < 5.0


# ---------------------------------------------------------------- c. gang, leader killed


async def test_leader_sigkilled_during_gang_placement_runs_no_half_gang(region, procs):
    c1 = procs(region.url, "coordinator", "--id", "g1", name="g1")
    js = region.nc.jetstream()

    async def leads(cid):
        return any(ev.leader_id == cid for _, ev in elections(await read_log(js)))

    await eventually(lambda: leads("g1"))
    procs(region.url, "coordinator", "--id", "g2", name="g2")
    await region.fleet(6)
    await region.ready(6)
    gang = {
        "name": "gang",
        "tasks": [{"role": "w", "count": 4, "simulate": {"duration": "0.3s"}}],
        "placement": {"gang": True, "strategy": "spread"},
    }
    jobs = []
    for i in range(12):
        jobs.append(await region.client.submit(gang, client_id=f"gang-{i}", retries=60))
        if i == 5:
            c1.kill9()  # mid-stream: some gangs placed, some not yet, some in flight
    for job_id in jobs:
        job = await region.client.wait(job_id, timeout=30)
        assert job["state"] == "SUCCEEDED", job
    log = await read_log(js)
    assert any(ev.leader_id == "g2" for _, ev in elections(log))
    by_job: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for seq, e in log:
        for ev in e.events:
            if isinstance(ev, TaskPlaced):
                by_job[ev.job_id].append((seq, ev.task_id, ev.attempt))
    for job_id in jobs:
        placements = by_job[job_id]
        # all four tasks placed in one log entry (all or nothing), once each
        assert len({seq for seq, _, _ in placements}) == 1, placements
        assert sorted(t for _, t, _ in placements) == sorted({t for _, t, _ in placements})
        assert len(placements) == 4
    _, running = placed_and_running(log)
    assert max(running.values()) == 1


# ---------------------------------------------------------------- d. store corrupted


async def test_agent_store_corrupted_while_stopped_reports_and_keeps_track(region, procs, tmp_path):
    await region.coordinator(suspect_after=1.0, down_after=3.0)
    data = tmp_path / "agent-data"
    args = ("agent", "--node-id", "disk", "--data-dir", str(data), "--heartbeat", "0.3", *ROOT)
    agent = procs(region.url, *args, name="disk1")
    await region.ready(1)
    go, runs = tmp_path / "go", tmp_path / "runs"
    cmd = f"echo $$ >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done"
    job_id = await region.client.submit({"name": "c", "tasks": [{"role": "m", "command": cmd}]})

    async def task_at(attempt):
        t = (await region.client.job(job_id))["task_list"][0]
        return t if t["attempt"] == attempt and t["state"] == "RUNNING" else None

    await eventually(lambda: task_at(1))
    agent.kill9()
    db = data / "agent.db"
    for sidecar in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        sidecar.unlink(missing_ok=True)
    db.write_bytes(b"this is not an sqlite database" * 200)
    procs(region.url, *args, name="disk2")

    async def noted():
        node = await region.client.node("disk")
        return node if "corrupt" in str(node.get("note", "")) else None

    try:
        await eventually(noted, timeout=15)
        assert list(data.glob("agent.db.corrupt-*")), "the corrupt file is kept for inspection"
        # The task must not be silently forgotten: the node's heartbeats no longer list
        # attempt 1, so after FORGOTTEN_AFTER_S it is declared LOST and runs again.
        await eventually(lambda: task_at(2), timeout=30)
        first_pid = int(runs.read_text().split()[0])
        orphan = alive(first_pid)
    finally:
        go.touch()
    job = await region.client.wait(job_id, timeout=20)
    assert job["state"] == "SUCCEEDED", job
    # The attempt-1 process the agent lost with its store was found in its work dir and
    # stopped when it started again: it does not run on, unmanaged, beside attempt 2.
    assert not orphan, f"pid {first_pid} of attempt 1 still runs"


async def test_agent_disk_full_reports_and_recovers(region, tmp_path):
    """The agent's data dir on a 4 MiB tmpfs. A task fills it: the task fails and is
    reported; the next one cannot be recorded, so it is not started, and is reported as
    such, and the node says why; once space is freed, tasks run again and the note
    clears. Nothing is left RUNNING that is not."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        await region.coordinator()
        agent = Agent(
            AgentConfig(
                region.url,
                node_id="full",
                data_dir=str(mnt / "agent"),
                allow_root=True,
                heartbeat_s=0.3,
            )
        )
        await agent.start()
        region.agents.append(agent)
        await region.ready(1)

        def job(name, cmd):
            return {"name": name, "tasks": [{"role": "m", "command": cmd}]}

        filler = await region.client.submit(job("fill", "head -c 8000000 /dev/zero"))
        done = await region.client.wait(filler, timeout=30)
        assert done["state"] == "FAILED" and done["task_list"][0]["exit_code"] != 0, done
        blocked = await region.client.wait(
            await region.client.submit(job("blocked", "echo hi")), timeout=30
        )
        assert blocked["state"] == "FAILED"
        assert "cannot record it" in blocked["task_list"][0]["message"]

        async def note():
            n = (await region.client.node("full"))["note"]
            return n if "task store not writable" in n else None

        assert "full" in await eventually(note)
        for f in (mnt / "agent").rglob("*"):  # the operator frees space
            if f.is_file() and f.stat().st_size > 1_000_000:
                f.unlink()
        ok = await region.client.wait(
            await region.client.submit(job("after", "echo hi")), timeout=30
        )
        assert ok["state"] == "SUCCEEDED", ok["task_list"]
        await eventually(lambda: _note_cleared(region))
        assert not agent.handles  # nothing it thinks is running
    finally:
        await region.close()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def _note_cleared(region) -> bool:
    return "task store" not in (await region.client.node("full"))["note"]
