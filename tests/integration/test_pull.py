"""`mesh.pull.PullLoop` against a real nats-server: it reads on through what ends a
naive fetch loop (no stream yet, a handler that raises, the stream deleted and made
again) and loses nothing."""

from __future__ import annotations

import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from mesh.pull import PullLoop

from .conftest import eventually

STREAM, SUBJECT = "PULLTEST", "pulltest.x"


def reader(js, got: list, handle=None, **kw) -> PullLoop:
    async def subscribe():
        return await js.pull_subscribe(
            SUBJECT, durable="r", stream=STREAM, config=ConsumerConfig(ack_wait=1.0)
        )

    async def default(msgs):
        for m in msgs:
            got.append(m.data)
            await m.ack()

    return PullLoop("test", subscribe, handle or default, batch=8, wait_s=0.5, linger_s=0.01, **kw)


async def test_it_subscribes_once_the_stream_exists(nc):
    js = nc.jetstream()
    got: list[bytes] = []
    loop = reader(js, got)
    await loop.start()  # no stream yet: start does not fail, the loop keeps trying
    try:
        assert loop.running and loop.subscriptions == 0
        await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT]))
        for i in range(20):
            await js.publish(SUBJECT, b"%d" % i)
        await eventually(lambda: len(got) == 20)
        assert got == [b"%d" % i for i in range(20)]
    finally:
        await loop.stop()
    assert not loop.running


async def test_a_handler_that_raises_does_not_end_the_loop(nc):
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT]))
    got: list[bytes] = []
    calls = 0

    async def flaky(msgs):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in the handler")  # nothing acknowledged
        for m in msgs:
            got.append(m.data)
            await m.ack()

    loop = reader(js, got, flaky)
    await loop.start()
    try:
        await js.publish(SUBJECT, b"a")
        # Redelivered after the consumer's ack_wait (1 s), to the same, still running loop.
        await eventually(lambda: got == [b"a"], timeout=10)
        assert loop.handler_errors == 1 and loop.running
    finally:
        await loop.stop()


async def test_it_resubscribes_when_the_stream_is_made_again(nc):
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT]))
    got: list[bytes] = []
    loop = reader(js, got, resubscribe_after_s=0.2)
    await loop.start()
    try:
        await js.publish(SUBJECT, b"before")
        await eventually(lambda: got == [b"before"])
        await js.delete_stream(STREAM)  # the consumer goes with it
        await eventually(lambda: loop.fetch_errors > 0, timeout=10)
        await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT]))
        await js.publish(SUBJECT, b"after")
        await eventually(lambda: got == [b"before", b"after"], timeout=10)
        assert loop.subscriptions >= 2
    finally:
        await loop.stop()


def test_batch_must_be_positive():
    with pytest.raises(ValueError, match="batch"):
        PullLoop("x", None, None, batch=0, wait_s=1, linger_s=0)  # type: ignore[arg-type]
