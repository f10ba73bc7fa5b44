"""One way to connect to NATS, with the settings a long-lived mesh process needs.

nats-py's defaults give up reconnecting after ~2 minutes and notice a dead link only
after ~4 minutes of pings; an agent or coordinator must instead reconnect forever and
notice a dead server within seconds.

On a secure mesh a client presents its identity's certificate (`ClientTls`): the
server maps it to that identity's permissions, and the client takes its replies on the
identity's own inbox prefix (the only inboxes it may subscribe to).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from mesh.security.identity import CA_CERT, Identity

log = logging.getLogger("mesh.connect")


class _QuietTlsClose(logging.Filter):
    """asyncio warns on every TLS connection nats-py closes (the transport ignores the
    protocol's eof_received result under SSL): harmless, and noise in every CLI call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received()" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_QuietTlsClose())


class TlsConfigError(ValueError):
    """A client's certificate files are missing or unreadable."""


@dataclass(frozen=True)
class ClientTls:
    """A client's TLS identity: the CA that signed the server, its own certificate and
    key, and the inbox prefix its permissions allow it to receive replies on."""

    ca: str
    cert: str
    key: str
    inbox_prefix: str = "_INBOX"

    @classmethod
    def for_identity(cls, certs_dir: str | Path, identity: Identity) -> ClientTls:
        """The identity's files in a certificate directory, by convention
        (DIR/ca.crt, DIR/agent-NODE.crt and .key, ...)."""
        d = Path(certs_dir)
        tls = cls(
            str(d / CA_CERT),
            str(identity.cert_path(d)),
            str(identity.key_path(d)),
            identity.inbox_prefix,
        )
        for f in (tls.ca, tls.cert, tls.key):
            if not os.access(f, os.R_OK):
                raise TlsConfigError(
                    f"{f} is missing or unreadable (identity {identity}; "
                    f"`mesh certs issue` makes client certificates)"
                )
        return tls

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def options(self) -> dict[str, Any]:
        """Keyword arguments for `connect`."""
        return {"tls": self}


async def connect(
    url: str | list[str],
    *,
    name: str,
    tls: ClientTls | ssl.SSLContext | None = None,
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
    extra: dict[str, Any] = {}
    if isinstance(tls, ClientTls):
        extra["inbox_prefix"] = tls.inbox_prefix
        tls = tls.context()
    if tls is not None:
        # nats-py upgrades to TLS only for tls:// URLs or when given a context; say so
        servers = [u.replace("nats://", "tls://", 1) for u in servers]
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
        **extra,
    )
    options.update(kwargs)
    return await nats.connect(**options)


async def close_quietly(nc: Client) -> None:
    """Close a connection whose server may already be gone (nats-py raises then)."""
    try:
        await asyncio.wait_for(nc.close(), 2.0)
    except Exception as exc:
        log.debug("close (%s): %s", nc.options.get("name"), exc)
