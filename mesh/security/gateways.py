"""The federation part of a region's server config (`mesh certs nats-conf --gateway`):
which gateways it dials, where it listens, and that every peer URL can pass the TLS
check. Pure functions; `mesh.cli.certs` builds the config from them.

Gateways and routes present `gateway.crt` (`mesh.security.pki.ensure_gateway`) and
verify their peer's against the one CA, and nats-server's
`verify_cert_and_check_known_urls` accepts an incoming peer only if its certificate
names (DNS) a host of a configured URL. So each URL's host must be a DNS name (not an
address) in gateway.crt: checked here, before a config that could never connect is
written. See docs/federation.md.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from mesh import subjects

SCHEMES = ("nats", "tls")


class GatewayError(ValueError):
    """A --gateway, --route or listen address that cannot work; the message says why."""


@dataclass(frozen=True)
class Peer:
    """One configured peer: a region's gateway, or a route within a region."""

    name: str  # the region (gateways) or "" (routes)
    url: str
    host: str
    port: int


def host_port(text: str, flag: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); an empty host means every interface."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise GatewayError(f"{flag} {text!r}: expected HOST:PORT")
    return host or "0.0.0.0", int(port)


def parse_url(url: str, flag: str, name: str = "") -> Peer:
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        port = None
        u = None
    if u is None or u.scheme not in SCHEMES or not u.hostname or port is None:
        raise GatewayError(f"{flag} {url!r}: expected nats://HOST:PORT (or tls://)")
    return Peer(name, url, u.hostname, port)


def parse_gateways(items: Sequence[str]) -> dict[str, Peer]:
    """`--gateway NAME=URL ...` -> {region: peer}; each region once."""
    out: dict[str, Peer] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep:
            raise GatewayError(f"--gateway {item!r}: expected REGION=nats://HOST:PORT")
        try:
            subjects.region_token(name)
        except subjects.SubjectError as exc:
            raise GatewayError(f"--gateway {item!r}: {exc}") from None
        if name in out:
            raise GatewayError(f"--gateway: region {name!r} is named twice")
        out[name] = parse_url(url, "--gateway", name)
    return out


def check_names(peers: Iterable[Peer], cert_names: Sequence[str], cert: str) -> None:
    """Every peer's host must be a DNS name the peer certificate holds."""
    for p in peers:
        if _is_address(p.host):
            raise GatewayError(
                f"{p.url}: use a DNS name, not an address: the servers check a peer's "
                f"certificate against the names in the URLs they are given (DNS only)"
            )
        if p.host not in cert_names:
            raise GatewayError(
                f"{p.url}: {p.host!r} is not a name in {cert} ({', '.join(cert_names)}); "
                f"remove {cert} and its key, then `mesh certs issue DIR --gateway --host "
                f"{p.host} ...` naming every server's host"
            )


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
