"""Leader fencing over real processes: a leader frozen with SIGSTOP, replaced, then
thawed with SIGCONT, must not write to the job log again.

While the old leader is frozen, a client keeps submitting (some requests land in the
frozen process's socket): when it thaws, it may serve them as the leader it believes
it still is. Whichever notices first, its stale lease or its log writer, it must step
down with nothing from its term after the new leader's LeaderElected. The second test
drives the writer's fence directly against the real server, in the case the
expected-last-sequence header alone misses: a deposed leader whose follower has already
applied the new leader's entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections import Counter

import pytest
from nats.js.errors import NotFoundError

from coordinator.joblog import Fenced, LogWriter, Unavailable
from coordinator.state import RegionState
from mesh import subjects
from mesh.client import MeshClient
from mesh.codec import decode, encode
from mesh.connect import close_quietly, connect
from mesh.schema import (
    ApiError,
    JobKillRequested,
    LeaderElected,
    LogEntry,
    TaskPlaced,
    TaskUpdated,
)
from mesh.streams import ensure_streams

from .conftest import eventually

REGION = "default"
JOB = {"name": "f", "tasks": [{"role": "w", "simulate": {"duration": "0.1s"}}]}


async def read_log(js, start: int = 1) -> list[tuple[int, LogEntry]]:
    """Every entry of the region's job log from `start`, by direct get (no consumer)."""
    stream = subjects.log_stream(REGION)
    try:
        last = (await js.stream_info(stream)).state.last_seq
    except NotFoundError:
        return []  # not created yet
    out = []
    for seq in range(start, last + 1):
        msg = await js.get_msg(stream, seq)
        out.append((seq, decode(LogEntry, msg.data, max_size=8 * 1024 * 1024)))
    return out


def elections(log: list[tuple[int, LogEntry]]) -> list[tuple[int, LeaderElected]]:
    return [(seq, ev) for seq, e in log for ev in e.events if isinstance(ev, LeaderElected)]


async def test_frozen_leader_is_fenced_after_failover(region, procs, tmp_path):
    old = procs(region.url, "coordinator", "--id", "old", name="old")
    js = region.nc.jetstream()

    async def leader_is(cid):
        return any(ev.leader_id == cid for _, ev in elections(await read_log(js)))

    await eventually(lambda: leader_is("old"))
    procs(region.url, "coordinator", "--id", "new", name="new")
    await region.fleet(2)
    await region.ready(2)

    # A steady submitter with its own connection and short timeouts, retrying each job
    # with the same client id: acknowledged = a job id came back.
    nc2 = await connect(region.url, name="submitter")
    client = MeshClient(nc2, timeout=1.0)
    acked: dict[str, str] = {}
    stop = asyncio.Event()

    async def submitter():
        while not stop.is_set():
            cid = uuid.uuid4().hex
            with contextlib.suppress(ApiError):
                acked[cid] = await client.submit(JOB, client_id=cid, retries=40)
            await asyncio.sleep(0.05)

    sub_task = asyncio.create_task(submitter())
    await eventually(lambda: len(acked) >= 5)

    old_term = max(ev.term for _, ev in elections(await read_log(js)) if ev.leader_id == "old")
    os.kill(old.proc.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        await eventually(lambda: leader_is("new"), timeout=45)
        took = time.monotonic() - frozen_at
        # The new leader serves: a job submitted now runs to the end.
        job_id = await client.submit(JOB, retries=40)
        job = await client.wait(job_id, timeout=20)  # 1 s timeout: the frozen one may get it
        assert job["state"] == "SUCCEEDED", job
        await asyncio.sleep(1.0)  # more requests queue up in the frozen leader's socket
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)

    old_log = tmp_path / "old.log"
    await eventually(lambda: "stepped down" in old_log.read_text(), timeout=30)
    await asyncio.sleep(1.0)  # the thawed process serves what it had queued
    stop.set()
    await sub_task
    await close_quietly(nc2)
    assert old.proc.poll() is None, "the thawed leader must step down, not crash"

    log = await read_log(js)
    (new_seq, new_ev), *_ = [(s, ev) for s, ev in elections(log) if ev.leader_id == "new"]
    assert new_ev.term > old_term
    after = [(seq, e.term, e.leader_id) for seq, e in log if seq > new_seq]
    stale = [x for x in after if x[1] < new_ev.term or x[2] == "old"]
    assert not stale, f"old-term entries after the new LeaderElected (seq {new_seq}): {stale}"

    # Every acknowledged job exists and ends; no task placed twice, none run twice.
    for job_id in acked.values():
        job = await region.client.wait(job_id, timeout=20)
        assert job["state"] == "SUCCEEDED", job
    placed = Counter(ev.task_id for _, e in log for ev in e.events if isinstance(ev, TaskPlaced))
    assert placed and max(placed.values()) == 1, placed.most_common(3)
    running = Counter(
        ev.task_id
        for _, e in log
        for ev in e.events
        if isinstance(ev, TaskUpdated) and ev.state == "RUNNING"
    )
    assert max(running.values()) == 1, running.most_common(3)
    text = old_log.read_text()
    print(
        f"failover after SIGSTOP: {took:.2f}s; acked {len(acked)} jobs; thawed leader: "
        f"fenced={'fenced off the job log' in text} lease_lost={'lost the lease' in text}"
    )


async def test_deposed_writer_is_fenced_on_the_real_log(nc):
    """The writer's fence, on the real server, in both shapes a deposed leader meets:
    its follower has not applied the new leader's entries (the server refuses: wrong
    last sequence) or has (the writer refuses: a higher term is on the log)."""
    js = nc.jetstream()
    await ensure_streams(js, REGION)
    first = LogWriter(js, REGION, RegionState(), 1, "old", _noop)
    first.start()
    await first.append([LeaderElected(1, "old", time.time())])
    await first.stop()
    behind = _replayed(await read_log(js))
    newer = LogWriter(js, REGION, _replayed(await read_log(js)), 2, "newer", _noop)
    newer.start()
    await newer.append([LeaderElected(2, "newer", time.time())])
    await newer.stop()
    caught_up = _replayed(await read_log(js))
    assert caught_up.term == 2 and behind.term == 1

    for name, state in (("behind", behind), ("caught up", caught_up)):
        fenced = asyncio.Event()

        async def on_fenced(ev=fenced):
            ev.set()

        w = LogWriter(js, REGION, state, 1, "old", on_fenced)
        w.start()
        with pytest.raises(Fenced):
            await w.append([LeaderElected(1, "old", time.time())])
        assert fenced.is_set(), name
        await w.stop()
    log = await read_log(js)
    assert [e.leader_id for _, e in log] == ["old", "newer"]


def _replayed(log) -> RegionState:
    s = RegionState()
    for seq, e in log:
        s.apply(seq, e)
    return s


async def _noop() -> None:
    return None


async def _writer_and_its_late_append(nc):
    """A writer of term 1 that has appended its LeaderElected, and an entry of its own
    term put on the log behind its back: what an append whose ack timed out leaves."""
    js = nc.jetstream()
    await ensure_streams(js, REGION)
    state = RegionState()
    w = LogWriter(js, REGION, state, 1, "me", _noop)
    w.start()
    await w.append([LeaderElected(1, "me", time.time())])
    ghost = LogEntry(term=1, leader_id="me", events=(JobKillRequested("x", 0.0, "r"),))
    ack = await js.publish(subjects.job_log(REGION), encode(ghost))
    return js, state, w, ghost, ack


async def test_an_own_append_that_landed_after_a_timeout_does_not_fence_the_writer(nc):
    """An append whose acknowledgement was lost may still land; the follower then applies
    it. The log moved past the writer's last append, but by the writer itself: it must go
    on writing, not step down. What was queued meanwhile was decided without the late
    entry (a task placed again), so that append is refused as Unavailable, for the
    caller to decide again; the next one goes after the late entry."""
    js, state, w, ghost, ack = await _writer_and_its_late_append(nc)
    # What a timed-out append of ours leaves: on the log, applied by the follower.
    state.apply(ack.seq, ghost)
    with pytest.raises(Unavailable, match="decide again"):
        await w.append([JobKillRequested("y", 0.0, "r")])
    assert not w.fenced
    seq = await w.append([JobKillRequested("y", 0.0, "r")])
    assert seq == ack.seq + 1 and not w.fenced
    assert [e.events for _, e in await read_log(js)][-2:] == [
        ghost.events,
        (JobKillRequested("y", 0.0, "r"),),
    ]
    await w.stop()


async def test_an_own_late_append_the_follower_has_not_applied_yet_does_not_fence(nc):
    """The append is refused for a wrong last sequence because our own timed-out entry
    landed and the follower has not applied it yet: the writer reads it back, sees its
    own term, applies it, and has the caller decide again. Had another leader written,
    it would fence."""
    js, state, w, ghost, ack = await _writer_and_its_late_append(nc)
    asyncio.get_running_loop().call_later(0.3, state.apply, ack.seq, ghost)  # a late follower
    with pytest.raises(Unavailable, match="decide again"):
        await w.append([JobKillRequested("y", 0.0, "r")])
    assert state.last_seq == ack.seq and not w.fenced  # the writer applied it itself
    seq = await w.append([JobKillRequested("y", 0.0, "r")])
    assert seq == ack.seq + 1 and not w.fenced
    # Now another leader's entry, applied late as well: that one fences.
    other = LogEntry(term=2, leader_id="them", events=(LeaderElected(2, "them", time.time()),))
    ack2 = await js.publish(subjects.job_log(REGION), encode(other))
    asyncio.get_running_loop().call_later(0.3, state.apply, ack2.seq, other)
    with pytest.raises(Fenced):
        await w.append([JobKillRequested("z", 0.0, "r")])
    assert w.fenced
    await w.stop()
