"""A TCP proxy for tests: a link between two processes that a test can cut and restore.

Killing a server is a region outage; a network partition is different: both ends keep
running and only the wire between them goes. `TcpProxy` stands in that wire (e.g. one
NATS gateway's connection to another region): it forwards every connection to its
target, `cut()` closes every connection it carries and refuses new ones (accepted and
closed at once, as a dead link looks to a dialer that retries), `restore()` forwards
again. It counts connections and bytes, so a test can show traffic really went through
it and not around it. `admit` checks the first line a client sends (e.g. the CONNECT of
a NATS gateway, which names the dialing gateway) and drops a connection it refuses.

Three kinds of cut (tests/integration/test_edge_link.py):
- *reset* (`cut()`): every connection closed at once (RST), new ones refused: a peer
  that died, a firewall that rejects.
- *black-hole* (`black_hole()`): connections stay open and every byte either way is
  dropped (counted); new connections are accepted and then hear nothing: a link gone
  dead under both ends, which only their pings can notice. On `restore()` the
  black-holed connections are reset, since the bytes they lost leave their streams
  corrupt (a real TCP would have retransmitted; the ends' pings have given up by then).
- *flap* (`flap(period_s)`): reset and restore by turns, `period_s` each, until
  `restore()`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ProxyStats:
    """What crossed the proxy: connections forwarded, refused while cut, bytes each way."""

    connections: int = 0
    refused: int = 0
    strangers: int = 0  # connections whose first line `admit` refused
    bytes_up: int = 0  # client -> target
    bytes_down: int = 0  # target -> client
    dropped_up: int = 0  # client -> target, dropped while black-holed
    dropped_down: int = 0  # target -> client, dropped while black-holed
    cuts: int = 0  # resets, flaps' included


@dataclass
class TcpProxy:
    """Forwards `host:port` (its own, chosen free when 0) to `target_host:target_port`.
    The target may be set after the proxy starts (`target_port`), as long as it is set
    before the first connection arrives."""

    target_port: int = 0
    target_host: str = "127.0.0.1"
    host: str = "127.0.0.1"
    port: int = 0
    admit: Callable[[bytes], bool] | None = None
    stats: ProxyStats = field(default_factory=ProxyStats)
    _server: asyncio.Server | None = None
    _cut: bool = False
    _holed: bool = False
    _flapper: asyncio.Task | None = None
    _pipes: set[asyncio.Task] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut or self._holed

    @property
    def mode(self) -> str:
        """ "pass", "reset", "black-hole" or "flap"."""
        if self._flapper is not None:
            return "flap"
        return "black-hole" if self._holed else "reset" if self._cut else "pass"

    @property
    def open_connections(self) -> int:
        """Connections carried now (each is two writers: the client's and the target's)."""
        return len(self._writers) // 2

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """The link goes (reset): every connection is closed and new ones are refused."""
        self._cut = True
        self.stats.cuts += 1
        self._abort_all()

    def black_hole(self) -> None:
        """The link goes dead: connections stay open, nothing crosses either way."""
        self._holed = True

    def flap(self, period_s: float) -> None:
        """Reset, restore, reset... every `period_s`, until `restore()`."""
        self._stop_flapping()
        self._flapper = asyncio.create_task(self._flap(period_s), name="tcpproxy-flap")

    def restore(self) -> None:
        """The link is back: new connections are forwarded again (black-holed ones are
        reset: their streams lost bytes)."""
        self._stop_flapping()
        if self._holed:
            self._holed = False
            self._abort_all()
        self._cut = False

    def _abort_all(self) -> None:
        for w in list(self._writers):
            _abort(w)
        self._writers.clear()

    def _stop_flapping(self) -> None:
        if self._flapper is not None:
            self._flapper.cancel()
            self._flapper = None

    async def _flap(self, period_s: float) -> None:
        while True:
            self._cut = True
            self.stats.cuts += 1
            self._abort_all()
            await asyncio.sleep(period_s)
            self._cut = False
            await asyncio.sleep(period_s)

    async def close(self) -> None:
        self._stop_flapping()
        self._holed = False
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._pipes):
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        if self._cut or not self.target_port:
            self.stats.refused += 1
            _abort(writer)
            return
        if self._holed:  # accepted, then silence: read and drop until restored
            self._writers.add(writer)
            task = asyncio.create_task(self._swallow(reader, writer))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            self.stats.refused += 1
            _abort(writer)
            return
        if self._cut:  # cut while dialing
            _abort(writer)
            _abort(up_writer)
            return
        self.stats.connections += 1
        self._writers.update((writer, up_writer))
        pair = (writer, up_writer)
        for src, dst, up in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.create_task(self._pipe(src, dst, up, pair))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src, dst, up: bool, pair) -> None:
        """Copies one direction until either end closes, then closes both."""
        try:
            if up and self.admit is not None:
                first = await src.readline()
                if not self.admit(first):
                    self.stats.strangers += 1
                    return
                self.stats.bytes_up += len(first)
                dst.write(first)
            while data := await src.read(65536):
                if self._holed:
                    if up:
                        self.stats.dropped_up += len(data)
                    else:
                        self.stats.dropped_down += len(data)
                    continue
                if up:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in pair:
                self._writers.discard(w)
                _abort(w)

    async def _swallow(self, reader, writer) -> None:
        """A connection made while black-holed: what it sends is dropped."""
        try:
            while data := await reader.read(65536):
                self.stats.dropped_up += len(data)
        except OSError:
            pass
        finally:
            self._writers.discard(writer)
            _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close at once (RST where the transport can), as a broken link does."""
    with contextlib.suppress(Exception):
        transport = writer.transport
        if hasattr(transport, "abort"):
            transport.abort()
        else:
            writer.close()


# A URL no peer can dial (port 1 on loopback: refused at once), what every proxied
# region advertises: a peer adds every URL a gateway advertises to those it dials.
UNDIALABLE = "127.0.0.1:1"


def gateway_named(name: str) -> Callable[[bytes], bool]:
    """Admits a NATS gateway connection whose CONNECT says it comes from `name`."""

    def admit(line: bytes) -> bool:
        verb, _, body = line.partition(b" ")
        if verb != b"CONNECT":
            return False
        try:
            return json.loads(body).get("gateway") == name
        except ValueError:
            return False

    return admit


@dataclass
class GatewayLinks:
    """Every gateway link of a supercluster through proxies, so that a test can cut the
    link between two regions while every server keeps running.

    nats-server gateways connect both ways: each server dials every other and sends its
    own traffic on its outbound connection (a's messages to b ride a's connection, b's
    replies ride b's), so a link is two proxies, `(a, b)` for a's dial to b and `(b, a)`.
    Servers also tell each other gateway URLs (their own advertised one, and the ones
    they dial for others), and dial what they are told. So no server is told a real
    gateway URL: each advertises `UNDIALABLE`, each dials its peers through proxies, and
    a proxy carries only its own pair: a server that learned another pair's proxy and
    dials it is refused (its CONNECT names it), so a cut cannot be gone around."""

    proxies: dict[tuple[str, str], TcpProxy]

    @classmethod
    async def around(cls, configs: dict) -> GatewayLinks:
        """Proxies for every ordered pair of regions, and `configs`
        (mesh.server.supercluster_configs, not yet started) changed to dial them."""
        proxies = {}
        for a, ca in configs.items():
            ca.gateway_advertise = UNDIALABLE
            for b, cb in configs.items():
                if a != b:
                    proxy = TcpProxy(target_port=cb.gateway_port, admit=gateway_named(a))
                    proxies[(a, b)] = await proxy.start()
                    ca.gateways[b] = proxy.url
        return cls(proxies)

    def pair(self, a: str, b: str) -> tuple[TcpProxy, TcpProxy]:
        return self.proxies[(a, b)], self.proxies[(b, a)]

    def cut(self, a: str, b: str) -> None:
        for p in self.pair(a, b):
            p.cut()

    def restore(self, a: str, b: str) -> None:
        for p in self.pair(a, b):
            p.restore()

    async def close(self) -> None:
        for p in self.proxies.values():
            await p.close()
