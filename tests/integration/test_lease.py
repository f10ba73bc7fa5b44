"""Lease election over a real nats-server: one leader, expiry on a dead holder, hand-over."""

from __future__ import annotations

import asyncio
import time

from mesh.connect import close_quietly, connect
from mesh.lease import Lease, LeaseThread


async def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_one_leader_then_graceful_handover(nats_server, nc):
    js = nc.jetstream()
    events = []

    async def elected(term, who):
        events.append(("elected", who, term))

    a = Lease(js, "lease_t1", "leader", "a", ttl=2.0, on_elected=lambda t: elected(t, "a"))
    b = Lease(js, "lease_t1", "leader", "b", ttl=2.0, on_elected=lambda t: elected(t, "b"))
    try:
        await a.start()
        assert await _wait(lambda: a.is_leader)
        await b.start()
        await asyncio.sleep(2.5)  # longer than the TTL: renewals keep a's lease alive
        assert a.is_leader and not b.is_leader
        assert await a.current_holder() == "a"
        term_a = a.term
        t0 = time.monotonic()
        await a.stop()  # deletes the key: b takes over at once, not after a TTL
        # Sooner than the key could have expired on its own (the watch, not the TTL).
        assert await _wait(lambda: b.is_leader, timeout=a.ttl)
        assert time.monotonic() - t0 < a.ttl
        assert b.term > term_a
    finally:
        await a.stop()
        await b.stop()


async def test_dead_holder_expires_and_renewal_failure_steps_down(nats_server):
    nc1 = await connect(nats_server.url, name="a")
    nc2 = await connect(nats_server.url, name="b")
    lost = []

    async def on_lost(term):
        lost.append(term)

    a = Lease(nc1.jetstream(), "lease_t2", "leader", "a", ttl=1.0, on_lost=on_lost)
    b = Lease(nc2.jetstream(), "lease_t2", "leader", "b", ttl=1.0)
    await a.start()
    assert await _wait(lambda: a.is_leader)
    await b.start()
    # a's holder dies without a word: stop its tasks, do not delete the key.
    a._task.cancel()
    a._watch_task.cancel()
    t0 = time.monotonic()
    assert await _wait(lambda: b.is_leader, timeout=5.0)
    took = time.monotonic() - t0
    assert 0.5 < took < 3.5, took  # not before the TTL could expire, not long after it
    await b.stop()
    await close_quietly(nc1)
    await nc2.close()


async def test_leader_steps_down_when_server_goes_away(nats_server):
    nc1 = await connect(nats_server.url, name="a")
    lost = []

    async def on_lost(term):
        lost.append(term)

    a = Lease(nc1.jetstream(), "lease_t3", "leader", "a", ttl=1.0, on_lost=on_lost)
    await a.start()
    assert await _wait(lambda: a.is_leader)
    nats_server.kill()
    assert await _wait(lambda: not a.is_leader, timeout=3.0)
    assert lost == [a._rev] or len(lost) == 1
    await a.stop()
    await close_quietly(nc1)


async def test_a_lease_thread_holds_through_a_busy_loop_but_not_a_stalled_one(nats_server):
    """Renewed from its own thread, the lease outlives a loop blocked for longer than its
    TTL (a big placement round); a loop blocked past `stall_s` lets it go, and another
    candidate takes over."""
    events: list[tuple[str, str, int]] = []

    def thread_lease(who: str, stall_s: float) -> LeaseThread:
        async def elected(term: int) -> None:
            events.append(("elected", who, term))

        async def lost(term: int) -> None:
            events.append(("lost", who, term))

        return LeaseThread(
            lambda: connect(nats_server.url, name=who),
            "lease_t4",
            "leader",
            who,
            ttl=1.0,
            on_elected=elected,
            on_lost=lost,
            stall_s=stall_s,
        )

    # Both share this test's loop; b is told to tolerate any stall, so it stands for a
    # candidate in another, healthy process.
    a, b = thread_lease("a", stall_s=2.5), thread_lease("b", stall_s=60.0)
    try:
        await a.start()
        assert await _wait(lambda: a.is_leader)
        await b.start()
        term = a.term
        time.sleep(2.0)  # the loop blocked for twice the TTL: a still leads
        await asyncio.sleep(0.3)
        assert a.term == term and not b.is_leader
        assert ("elected", "a", term) in events and ("lost", "a", term) not in events
        time.sleep(5.0)  # past stall_s: a stops renewing, its key expires, b takes over
        assert b.is_leader  # while this loop was still blocked
        assert await _wait(lambda: b.is_leader, timeout=10.0)
        assert await _wait(lambda: ("lost", "a", term) in events, timeout=5.0)
        assert b.term > term and not a.is_leader
    finally:
        await a.stop()
        await b.stop()
    assert [e for e in events if e[1] == "b"][-1][0] == "lost"  # b handed over on stop
