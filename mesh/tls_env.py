"""A TLS identity handed over in the environment: how an agent gives a task its task
identity, and how the task's programs read it back.

An agent holding a task identity (`mesh agent --task-identity DIR`, the `worker`
identity) gives its files to a task that asks for it (`MESH_TASK_IDENTITY=worker`) as

- `MESH_TLS_CA`, `MESH_TLS_CERT`, `MESH_TLS_KEY`: absolute paths of the CA certificate
  and the identity's certificate and key (`to_env`, called by the agent);
- `MESH_INBOX_PREFIX`: the identity's own inbox prefix, the only inboxes its NATS
  permissions let it receive replies on.

Two readers, one reading: the inference router, worker and load generator
(`inference.wire`, where a flag may replace each variable) and the `mesh` CLI run
inside a task (`mesh.cli.context.Context.client_tls`, when it finds no certificate
directory: a horovod-elastic job's discovery script). Both go through `client_tls`:
the three files go together, the prefix is a literal subject.

The identity's name is not in the environment; it is read off the prefix
(`_INBOX.worker.gpu-07` is `worker:gpu-07`) for error messages only. The server knows
who a client is from its certificate, never from this.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from mesh.connect import ClientTls, TlsConfigError
from mesh.security.identity import COORDINATOR, Identity, IdentityError

__all__ = [
    "CA_VAR",
    "CERT_VAR",
    "DEFAULT_INBOX_PREFIX",
    "ENV_VARS",
    "INBOX_VAR",
    "KEY_VAR",
    "TLS_VARS",
    "check_inbox_prefix",
    "client_tls",
    "from_env",
    "identity_of",
    "to_env",
]

CA_VAR, CERT_VAR, KEY_VAR = "MESH_TLS_CA", "MESH_TLS_CERT", "MESH_TLS_KEY"
INBOX_VAR = "MESH_INBOX_PREFIX"
TLS_VARS = (CA_VAR, CERT_VAR, KEY_VAR)
ENV_VARS = (*TLS_VARS, INBOX_VAR)
DEFAULT_INBOX_PREFIX = "_INBOX"  # nats-py's; an identity's own is `_INBOX.<kind>.<name>`
ENV_NAMES = f"${CA_VAR}, ${CERT_VAR} and ${KEY_VAR}"
_INBOX_RE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def check_inbox_prefix(prefix: str, name: str = f"${INBOX_VAR}") -> str:
    """`prefix` if it is a literal subject (tokens of letters, digits, `_`, `-` joined
    by `.`); else `TlsConfigError` naming where it came from."""
    if not _INBOX_RE.fullmatch(prefix):
        raise TlsConfigError(
            f"{name} {prefix!r} must be a subject of letters, digits, '_' or '-' tokens "
            "joined by '.', with no wildcard"
        )
    return prefix


def identity_of(inbox_prefix: str) -> str:
    """The common name an identity's inbox prefix names (`_INBOX.worker.n1` ->
    `worker:n1`), or "" for a prefix of no identity (`_INBOX`)."""
    head, _, rest = inbox_prefix.partition(".")
    if head != DEFAULT_INBOX_PREFIX or not rest:
        return ""
    kind, _, name = rest.partition(".")
    common_name = kind if kind == COORDINATOR and not name else f"{kind}:{name}"
    try:
        return Identity.parse(common_name).common_name
    except IdentityError:
        return ""


def client_tls(
    ca: str,
    cert: str,
    key: str,
    inbox_prefix: str = DEFAULT_INBOX_PREFIX,
    *,
    names: str = ENV_NAMES,
    inbox_name: str = f"${INBOX_VAR}",
) -> ClientTls | None:
    """The TLS identity of three file paths and an inbox prefix: None when no file is
    given (connect without TLS). `TlsConfigError` when only some are, or when the
    prefix is not a literal subject (checked with or without TLS: a client without TLS
    may still take its replies under a prefix). `names` and `inbox_name` say where the
    values came from, for the message (flags, variables)."""
    check_inbox_prefix(inbox_prefix, inbox_name)
    files = (ca, cert, key)
    if not any(files):
        return None
    if not all(files):
        raise TlsConfigError(f"{names} go together: set all three or none")
    return ClientTls(ca, cert, key, inbox_prefix, identity_of(inbox_prefix))


def from_env(environ: Mapping[str, str] | None = None) -> ClientTls | None:
    """The TLS identity the environment hands over (`os.environ` by default), or None
    when it hands none (no `MESH_TLS_*` set: `MESH_INBOX_PREFIX` alone is then not
    looked at). `TlsConfigError` for a partial or malformed one. The files are not
    opened here (`ClientTls.require_files` checks them)."""
    env = os.environ if environ is None else environ
    ca, cert, key = (env.get(v) or "" for v in TLS_VARS)
    if not (ca or cert or key):
        return None
    return client_tls(ca, cert, key, env.get(INBOX_VAR) or DEFAULT_INBOX_PREFIX)


def to_env(tls: ClientTls) -> dict[str, str]:
    """What `from_env` reads back as `tls`: the variables an agent gives a task, its
    paths made absolute (a task runs in a directory of its own)."""
    return {
        CA_VAR: os.path.abspath(tls.ca),
        CERT_VAR: os.path.abspath(tls.cert),
        KEY_VAR: os.path.abspath(tls.key),
        INBOX_VAR: tls.inbox_prefix,
    }
