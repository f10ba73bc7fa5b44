"""One way to connect to NATS, with the settings a long-lived mesh process needs.

nats-py's defaults give up reconnecting after ~2 minutes and notice a dead link only
after ~4 minutes of pings; an agent or coordinator must instead reconnect forever and
notice a dead server within seconds.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import nats
from nats.aio.client import Client

log = logging.getLogger("mesh.connect")


async def connect(
    url: str | list[str],
    *,
    name: str,
    tls: ssl.SSLContext | None = None,
    connect_timeout: float = 2.0,
    reconnect: bool = True,
    **kwargs: Any,
) -> Client:
    async def on_error(exc: Exception) -> None:
        log.debug("nats error (%s): %s", name, exc)

    async def on_disconnect() -> None:
        log.info("nats disconnected (%s)", name)

    async def on_reconnect() -> None:
        log.info("nats reconnected (%s)", name)

    servers = url if isinstance(url, list) else [u.strip() for u in url.split(",")]
    options: dict[str, Any] = dict(
        servers=servers,
        name=name,
        tls=tls,
        connect_timeout=connect_timeout,
        allow_reconnect=reconnect,
        # nats-py only gives up on a server after max_reconnect_attempts > 0 tries.
        max_reconnect_attempts=-1 if reconnect else 1,
        reconnect_time_wait=0.25,
        ping_interval=5,
        max_outstanding_pings=3,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        pending_size=64 * 1024 * 1024,
    )
    options.update(kwargs)
    return await nats.connect(**options)


async def close_quietly(nc: Client) -> None:
    """Close a connection whose server may already be gone (nats-py raises then)."""
    try:
        await asyncio.wait_for(nc.close(), 2.0)
    except Exception as exc:
        log.debug("close (%s): %s", nc.options.get("name"), exc)
