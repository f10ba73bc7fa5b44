"""Stopping asyncio tasks for certain."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("mesh.tasks")


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a task and wait until it has ended. On Python 3.11 `asyncio.wait_for` (which
    nats-py uses inside publish, fetch and request) can swallow a cancellation that lands
    as its inner future completes, and the task carries on; so cancel again until it is
    done rather than await it once and hang."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if not task.cancelled() and task.exception() is not None:
        log.debug("%s ended with %r", task.get_name(), task.exception())
