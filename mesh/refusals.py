"""What a NATS server's refusals mean, and what to tell the operator about them.

A NATS server refuses in three ways, none of which nats-py makes plain: a publish or
subscribe outside the identity's permissions is dropped and reported only to the
connection's error callback (a request then just times out); an identity the server
config lacks is answered `Authorization Violation` on every connect (nats-py retries
for ever); a certificate the server (or the client) does not trust fails the TLS
handshake. Each of these is a configuration mistake with a known fix, so each becomes a
typed error (`Refused`) whose message names the subject, the identity and that fix.

Pure functions only: `mesh.connect` wires them to a live connection.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass

from nats.errors import AuthorizationError
from nats.errors import Error as NatsError

_DENIAL = re.compile(
    r"permissions violation for (publish|subscription)"
    r"(?: to| with reply of)? \"?([^\"\s]+)\"?",
    re.IGNORECASE,
)
_REGION = re.compile(r"^mesh\.([^.]+)\.")
FIX = "`mesh certs nats-conf DIR --region R`, then reload nats-server"


@dataclass(frozen=True)
class Denial:
    """One publish or subscribe the server refused. The subject is as the server wrote
    it (nats-py lowercases the whole error line)."""

    operation: str  # "publish" or "subscribe"
    subject: str


def parse_denial(message: str) -> Denial | None:
    """The denial in a server error line, or None for any other error."""
    m = _DENIAL.search(message)
    if m is None:
        return None
    return Denial("subscribe" if m.group(1).lower() == "subscription" else "publish", m.group(2))


def is_authorization_failure(exc: BaseException) -> bool:
    """The server does not know this identity (nats-server logs `authentication error`)."""
    return isinstance(exc, AuthorizationError) or "authorization violation" in str(exc).lower()


def is_tls_failure(exc: BaseException) -> bool:
    """The TLS handshake failed on trust: the server's certificate is not signed by our
    CA (or we have none), or the server does not accept ours."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    text = str(exc).lower()
    return isinstance(exc, ssl.SSLError) and ("alert" in text or "certificate" in text)


def who(identity: str) -> str:
    """An identity as an operator finds it in the server config: `agent:n1` is the
    user `CN=agent:n1` there."""
    return f"{identity} (server user CN={identity})" if identity else "this client"


class Refused(NatsError):
    """The NATS server refused this client for a reason retrying will not fix. A nats-py
    error, so code that handles those (and the timeouts these used to be) still does."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PermissionDenied(Refused):
    """A publish or subscribe outside the identity's permissions."""

    def __init__(self, denial: Denial, identity: str, subject: str | None = None) -> None:
        self.denial = denial
        self.identity = identity
        self.subject = subject or denial.subject
        super().__init__(permission_message(denial.operation, self.subject, identity))


class AuthorizationRefused(Refused):
    """The server config has no user for this identity."""

    def __init__(self, url: str, identity: str) -> None:
        self.url = url
        self.identity = identity
        super().__init__(authorization_message(url, identity))


class TlsRefused(Refused):
    """The TLS handshake failed on trust (or the client offered no TLS)."""

    def __init__(self, url: str, identity: str, detail: str, has_cert: bool) -> None:
        self.url = url
        self.identity = identity
        self.has_cert = has_cert
        super().__init__(tls_message(url, identity, detail, has_cert))


def permission_message(operation: str, subject: str, identity: str) -> str:
    m = _REGION.match(subject)
    region = f" (region {m.group(1)})" if m else ""
    verb = "publish to" if operation == "publish" else "subscribe to"
    return (
        f"permission denied: nats-server does not let {who(identity)} {verb} "
        f'"{subject}"{region}. Likely fix: a wrong --region? (the server config permits '
        f"each identity only its own region's subjects); or a server config made for "
        f"another region, or without this identity's current permissions: regenerate it "
        f"with {FIX}"
    )


def authorization_message(url: str, identity: str) -> str:
    return (
        f"authorization refused: nats-server at {url} has no user for {who(identity)} "
        f"(it logs `authentication error`). Likely fix: add the identity to the server "
        f"config: issue its certificate (`mesh certs issue DIR ...`) if needed, regenerate "
        f"the config with {FIX}; or check --certs, --user and --node-id"
    )


def tls_message(url: str, identity: str, detail: str, has_cert: bool) -> str:
    if not has_cert:
        return (
            f"NATS at {url} requires TLS with a client certificate ({detail}). Give the "
            f"region's certificate directory: --certs DIR or MESH_CERTS=DIR, or save it "
            f"once in a context (`mesh context add NAME --nats URL --region R --certs DIR`, "
            f"then `mesh context use NAME`)"
        )
    return (
        f"TLS refused between {who(identity)} and NATS at {url} ({detail}). Likely fix: "
        f"--certs must be this region's certificate directory (its ca.crt signed the "
        f"server's certificate and this identity's)"
    )


RECONNECT_WAIT = 0.25  # seconds between attempts on a server that is away
REFUSED_BACKOFF_MAX = 10.0


def reconnect_delay(failures: int, refused: int) -> float:
    """Seconds to wait before the next reconnect attempt, given the consecutive failed
    attempts and how many of those the server refused (authorization). A server that is
    away is tried again soon (it is back within seconds after a restart); one that says
    no is asked less and less often, up to every REFUSED_BACKOFF_MAX seconds, so an
    identity removed from the config does not cost the server 4 handshakes a second."""
    if refused > 0:
        return min(REFUSED_BACKOFF_MAX, 0.5 * 2 ** (refused - 1))
    return RECONNECT_WAIT if failures > 0 else 0.0
