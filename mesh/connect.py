"""One way to connect to NATS, with the settings a long-lived mesh process needs.

nats-py's defaults give up reconnecting after ~2 minutes and notice a dead link only
after ~4 minutes of pings; an agent or coordinator must instead reconnect forever and
notice a dead server within seconds.

On a secure mesh a client presents its identity's certificate (`ClientTls`): the
server maps it to that identity's permissions, and the client takes its replies on the
identity's own inbox prefix (the only inboxes it may subscribe to).

Mistakes fail fast (see `mesh.refusals`): a request to a subject the server denies
raises `PermissionDenied` as soon as the server says so, not after the request's
timeout; a first connect the server refuses (identity not in its config, certificate
not trusted) raises `AuthorizationRefused` / `TlsRefused` even for a process that
otherwise reconnects for ever. Once connected, a process logs such refusals (one line,
then a rate-limited repeat) and keeps trying, backing off while the server says no.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.errors import AuthorizationError, StaleConnectionError, UnexpectedEOF

from mesh.logs import Throttle, fields
from mesh.refusals import (
    AuthorizationRefused,
    Denial,
    PermissionDenied,
    Refused,
    TlsRefused,
    is_authorization_failure,
    is_tls_failure,
    parse_denial,
    reconnect_delay,
    who,
)
from mesh.security.identity import CA_CERT, Identity

log = logging.getLogger("mesh.connect")


class _QuietTlsClose(logging.Filter):
    """asyncio warns on every TLS connection nats-py closes (the transport ignores the
    protocol's eof_received result under SSL): harmless, and noise in every CLI call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received()" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_QuietTlsClose())


class TlsConfigError(ValueError):
    """A client's TLS settings are incomplete or malformed, or its certificate files
    missing or unreadable."""


@dataclass(frozen=True)
class ClientTls:
    """A client's TLS identity: the CA that signed the server, its own certificate and
    key, the inbox prefix its permissions allow it to receive replies on, and its
    common name (what error messages call it)."""

    ca: str
    cert: str
    key: str
    inbox_prefix: str = "_INBOX"
    identity: str = ""

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
            identity.common_name,
        )
        return tls.require_files(
            f"identity {identity}; `mesh certs issue` makes client certificates"
        )

    def require_files(self, hint: str) -> ClientTls:
        """This, if its three files can be read; else `TlsConfigError` naming the first
        that cannot, with `hint` (where the files come from)."""
        for f in (self.ca, self.cert, self.key):
            if not os.access(f, os.R_OK):
                raise TlsConfigError(f"{f} is missing or unreadable ({hint})")
        return self

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def options(self) -> dict[str, Any]:
        """Keyword arguments for `connect`."""
        return {"tls": self}


@dataclass
class _Health:
    """What the error callback has seen: consecutive failed (re)connect attempts, how
    many of them the server refused, and whether this connection ever got through."""

    connected_once: bool = False
    failures: int = 0
    refused: int = 0
    rotation: int = 0
    throttle: Throttle = field(default_factory=Throttle)


class Connection(Client):
    """nats-py's client, told what the server refused it.

    `request` fails with `PermissionDenied` the moment the server reports a denied
    publish of its subject (nats-py only passes that report to the error callback and
    lets the request time out). `check_permissions` turns any denial seen so far into
    that error: a process calls it at the end of its start-up, so a wrong region stops
    it there. An authorization violation on a live connection (the identity was removed
    and the server reloaded) makes nats-py close for good; here it reconnects instead,
    so the process recovers when the identity is added back.
    """

    MAX_DENIALS = 100

    def __init__(self, url: str, identity: str, checked_start: bool = False) -> None:
        super().__init__()
        self.url = url
        self.identity = identity
        self.denials: list[Denial] = []  # the first MAX_DENIALS, for start-up checks
        # Until check_permissions, denials are the start-up's error, not log lines.
        self.starting = checked_start
        self.closing = False  # close() was asked for: its disconnect is no news
        self.health = _Health()
        self._waiting: dict[asyncio.Task, str] = {}  # in-flight request -> its subject
        self._denied: dict[asyncio.Task, Denial] = {}

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ):
        call = asyncio.ensure_future(
            super().request(subject, payload, timeout, old_style=old_style, headers=headers)
        )
        self._waiting[call] = subject.casefold()
        try:
            return await call
        except asyncio.CancelledError:
            denial = self._denied.pop(call, None)
            if denial is None:
                raise
            raise PermissionDenied(denial, self.identity, subject) from None
        finally:
            self._waiting.pop(call, None)
            self._denied.pop(call, None)

    def note_denial(self, denial: Denial) -> bool:
        """Fail the requests the denial is about: those to its subject, or all of them
        when the server refused the subscription their replies come on. True if some
        request failed (its caller reports it)."""
        if len(self.denials) < self.MAX_DENIALS:
            self.denials.append(denial)
        subject = denial.subject.casefold()
        inbox = denial.operation == "subscribe" and subject.startswith(
            self._inbox_prefix.decode().casefold()
        )
        failed = False
        for call, waiting_on in list(self._waiting.items()):
            if (inbox or waiting_on == subject) and not call.done():
                self._denied[call] = denial
                call.cancel()
                failed = True
        return failed

    async def check_permissions(self, timeout: float = 5.0) -> None:
        """After a round trip (the server answers in order, so any denial of what was
        sent before has arrived), raise `PermissionDenied` for the first denial. Ends
        the start-up: later denials are logged."""
        await self.flush(timeout)
        if self.denials:
            raise PermissionDenied(self.denials[0], self.identity)
        self.starting = False

    async def close(self) -> None:
        self.closing = True
        await super().close()

    async def _process_err(self, err_msg: str) -> None:
        # nats-py closes the connection for good on an authorization violation; a
        # long-lived process must instead keep trying (see the class docstring).
        if (
            is_authorization_failure(Exception(err_msg))
            and self.is_connected
            and self.options.get("allow_reconnect")
        ):
            await self._process_op_err(AuthorizationError())  # now reconnecting
            if self._error_cb is not None:
                await self._error_cb(AuthorizationError())
            return
        await super()._process_err(err_msg)


class _Reporter:
    """The callbacks of one connection: they record what the server refused, turn a
    refusal at the first connect into `fatal`, and (for long-lived processes, which
    reconnect) log each failure as one line, repeats rate-limited."""

    def __init__(self, nc: Connection, name: str, has_cert: bool, log_them: bool) -> None:
        self.nc = nc
        self.name = name
        self.has_cert = has_cert
        self.log_them = log_them
        self.health = nc.health
        self.fatal: asyncio.Future[Refused] = asyncio.get_running_loop().create_future()
        self.user_error_cb: Any = None
        self.lost: Exception | None = None  # why the link went, for the disconnect line
        self.tag = fields(client=name, identity=nc.identity or "-", url=nc.url)

    def refusal(self, exc: BaseException) -> Refused | None:
        nc = self.nc
        if is_authorization_failure(exc):
            return AuthorizationRefused(nc.url, nc.identity)
        if is_tls_failure(exc) or (not self.has_cert and "ssl context" in str(exc)):
            return TlsRefused(nc.url, nc.identity, str(exc), self.has_cert)
        return None

    def warn(self, key: str, message: str, *args: Any) -> None:
        if not self.log_them:
            log.debug(message, *args)
            return
        held = self.health.throttle.allow(key, time.monotonic())
        if held is not None:
            suffix = f" ({held} more like it since the last report)" if held else ""
            log.warning(message + suffix, *args, extra=self.tag)

    async def on_error(self, exc: Exception) -> None:
        nc, health = self.nc, self.health
        denial = parse_denial(str(exc))
        if denial is not None:
            if not nc.note_denial(denial) and not nc.starting:
                msg = PermissionDenied(denial, nc.identity).message
                self.warn(f"denied:{denial.subject}", "%s", msg)
        elif not nc.is_connected:  # a failed connect or reconnect attempt
            refused = self.refusal(exc)
            if refused is not None and not health.connected_once:
                if not self.fatal.done():
                    self.fatal.set_result(refused)
            else:
                health.failures += 1
                if isinstance(refused, AuthorizationRefused):
                    health.refused += 1
                    self.warn("refused", "%s; retrying, less often while refused", refused)
                    return await self._pass_on(exc)
                if not isinstance(exc, BROKEN):  # (how a refusal may end, by a race)
                    health.refused = 0  # away, not refusing: try again soon
                if health.connected_once or health.failures >= 3:
                    what = exc or type(exc).__name__
                    self.warn("unreachable", "cannot reach NATS at %s: %s; retrying", nc.url, what)
        elif isinstance(exc, LINK_LOST):
            self.lost = exc  # the disconnect line says it
        else:
            self.warn(f"error:{type(exc).__name__}", "nats error: %s", exc or type(exc).__name__)
        await self._pass_on(exc)

    async def _pass_on(self, exc: Exception) -> None:
        if self.user_error_cb is not None:
            await self.user_error_cb(exc)

    async def on_disconnect(self) -> None:
        if self.log_them and self.health.connected_once and not self.nc.closing:
            why = f": {self.lost}" if self.lost else ""
            log.warning("nats disconnected (%s)%s; reconnecting", self.name, why, extra=self.tag)
        self.lost = None

    async def on_reconnect(self) -> None:
        health = self.health
        log.info(
            "nats reconnected (%s) after %d failed attempts",
            self.name,
            health.failures,
            extra=self.tag,
        )
        health.failures = health.refused = 0
        health.throttle = Throttle(health.throttle.every_s)

    async def on_closed(self) -> None:
        if self.log_them and self.health.connected_once and not self.nc.closing:
            log.warning("nats connection closed for good (%s): %s", self.name, self.nc.last_error)

    def next_server(self, candidates: list, _info: dict) -> tuple[Any, float]:
        """Round robin over the servers, waiting as `reconnect_delay` says."""
        health = self.health
        health.rotation += 1
        chosen = candidates[health.rotation % len(candidates)]
        return chosen, reconnect_delay(health.failures, health.refused)


LINK_LOST = (UnexpectedEOF, StaleConnectionError, OSError)  # followed by a disconnect
BROKEN = (BrokenPipeError, ConnectionResetError)  # how a refusal may look, by a race


async def connect(
    url: str | list[str],
    *,
    name: str,
    tls: ClientTls | ssl.SSLContext | None = None,
    connect_timeout: float = 2.0,
    reconnect: bool = True,
    checked_start: bool = False,
    **kwargs: Any,
) -> Connection:
    """Connect, or raise `Refused` if the server refuses this identity (whether or not
    `reconnect`); a server that is merely away is waited for when `reconnect`.

    `checked_start`: the caller ends its start-up with `nc.check_permissions()`, which
    raises any denial until then (so they are not logged as well)."""
    for attempt in range(3):
        try:
            return await _connect(url, name, tls, connect_timeout, reconnect, checked_start, kwargs)
        except BROKEN:
            # The server answers a refused CONNECT with -ERR and closes; nats-py may
            # hit the closed socket before it reads the -ERR. Ask again to read it.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


async def _connect(
    url: str | list[str],
    name: str,
    tls: ClientTls | ssl.SSLContext | None,
    connect_timeout: float,
    reconnect: bool,
    checked_start: bool,
    kwargs: dict[str, Any],
) -> Connection:
    servers = url if isinstance(url, list) else [u.strip() for u in url.split(",")]
    nc = Connection(
        ",".join(servers), tls.identity if isinstance(tls, ClientTls) else "", checked_start
    )
    report = _Reporter(nc, name, tls is not None, log_them=reconnect)
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
        error_cb=report.on_error,
        disconnected_cb=report.on_disconnect,
        reconnected_cb=report.on_reconnect,
        closed_cb=report.on_closed,
        pending_size=64 * 1024 * 1024,
        **extra,
    )
    if reconnect:
        options["reconnect_to_server_handler"] = report.next_server
    report.user_error_cb = kwargs.get("error_cb")
    options.update({k: v for k, v in kwargs.items() if k != "error_cb"})
    opening = asyncio.ensure_future(nc.connect(**options))
    try:
        await asyncio.wait({opening, report.fatal}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        opening.cancel()
        raise
    if not opening.done():  # refused, where nats-py would go on retrying for ever
        opening.cancel()
        with contextlib.suppress(BaseException):
            await opening
        await close_quietly(nc)
        raise report.fatal.result()
    report.fatal.cancel()
    try:
        opening.result()
    except Exception as exc:
        refused = report.refusal(exc)
        if refused is not None:
            raise refused from None
        raise
    report.health.connected_once = True
    return nc


def describe(nc: Client) -> str:
    """Where a connection went and as whom, for a process's start-up line."""
    identity = getattr(nc, "identity", "")
    return f"{nc.connected_url.geturl() if nc.connected_url else '?'} as {who(identity)}"


def endpoint(nc: Client) -> dict[str, str]:
    """The same as log fields: `url=...`, `identity=...`."""
    url = nc.connected_url.geturl() if nc.connected_url else "?"
    return {"url": url, "identity": getattr(nc, "identity", "") or "-"}


async def close_quietly(nc: Client) -> None:
    """Close a connection whose server may already be gone (nats-py raises then)."""
    try:
        await asyncio.wait_for(nc.close(), 2.0)
    except Exception as exc:
        log.debug("close (%s): %s", nc.options.get("name"), exc)
