"""Where the CLI finds the mesh: flags, then environment, then the context that
`mesh up` wrote under $MESH_HOME (like a kubeconfig or a NATS context).

On a secure mesh the context also names the certificate directory (`--certs`,
$MESH_CERTS) and the user the CLI acts as (`--user`, $MESH_USER; default `admin`);
each component finds its own identity's files there by convention
(see `mesh.security.identity`). `--insecure` ($MESH_INSECURE=1) ignores them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mesh.connect import ClientTls
from mesh.security.identity import Identity

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_USER = "admin"


def mesh_home() -> Path:
    return Path(os.environ.get("MESH_HOME") or Path.home() / ".mesh")


@dataclass(frozen=True)
class Context:
    url: str
    region: str
    certs: str | None = None  # certificate directory; None: connect without TLS
    user: str = DEFAULT_USER

    def tls(self, identity: Identity) -> ClientTls | None:
        """The identity's TLS files on a secure mesh, None on an insecure one."""
        return ClientTls.for_identity(self.certs, identity) if self.certs else None

    def connect_options(self, identity: Identity) -> dict:
        tls = self.tls(identity)
        return {"tls": tls} if tls is not None else {}


def context_path() -> Path:
    return mesh_home() / "context.json"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def load_context(
    url_flag: str | None,
    region_flag: str | None,
    certs_flag: str | None = None,
    *,
    user_flag: str | None = None,
    insecure: bool = False,
) -> Context:
    saved: dict = {}
    path = context_path()
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
    url = url_flag or os.environ.get("MESH_NATS_URL") or saved.get("url") or DEFAULT_URL
    region = region_flag or os.environ.get("MESH_REGION") or saved.get("region") or "default"
    certs = certs_flag or os.environ.get("MESH_CERTS") or saved.get("certs") or None
    if insecure or _truthy(os.environ.get("MESH_INSECURE")):
        certs = None
    user = user_flag or os.environ.get("MESH_USER") or saved.get("user") or DEFAULT_USER
    return Context(url, region, certs, user)


def save_context(ctx: Context) -> Path:
    path = context_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    data = {"url": ctx.url, "region": ctx.region}
    if ctx.certs:
        data |= {"certs": ctx.certs, "user": ctx.user}
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path
