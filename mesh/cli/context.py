"""Where the CLI finds the mesh: flags, then environment, then a saved context (like
a kubeconfig or a NATS context).

Contexts live in one file, $MESH_HOME/context.json (default ~/.mesh): named entries
(`mesh context add NAME ...`; `mesh up` writes one named `local`) and which one is
current (`mesh context use NAME`). `--context NAME` or $MESH_CONTEXT picks another for
one command. Each field still comes from its flag or environment variable first.

On a secure mesh the context also names the certificate directory (`--certs`,
$MESH_CERTS) and the user the CLI acts as (`--user`, $MESH_USER; default `admin`);
each component finds its own identity's files there by convention
(see `mesh.security.identity`). `--insecure` ($MESH_INSECURE=1) ignores them.

With no certificate directory at all, a client command connects with the TLS identity
its environment hands it, if any (`MESH_TLS_CA`, `MESH_TLS_CERT`, `MESH_TLS_KEY`,
`MESH_INBOX_PREFIX`: `mesh.tls_env`): what an agent gives a task that asks for its task
identity, so that `mesh job hosts` works from inside a task (a horovod-elastic job's
discovery script) on a secure mesh. A certificate directory found (flag, $MESH_CERTS
or the context) keeps priority.

A context file that cannot be read is refused, never skipped: falling back to
localhost:4222 could send a command to whichever region happens to listen there.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mesh import tls_env
from mesh.connect import ClientTls
from mesh.security.identity import Identity

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_USER = "admin"
DEFAULT_REGION = "default"
LOCAL = "local"  # the context `mesh up` writes
_FIX = " (fix it, or remove it to start again; `mesh up` writes a new one)"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def mesh_home() -> Path:
    return Path(os.environ.get("MESH_HOME") or Path.home() / ".mesh")


class ContextError(Exception):
    """The context file or a named context is unusable; the message says which and why."""


@dataclass(frozen=True)
class Context:
    url: str
    region: str
    certs: str | None = None  # certificate directory; None: connect without TLS
    user: str = DEFAULT_USER
    insecure: bool = False  # --insecure / $MESH_INSECURE: no TLS whatever is found

    def tls(self, identity: Identity) -> ClientTls | None:
        """The identity's TLS files on a secure mesh, None on an insecure one."""
        return ClientTls.for_identity(self.certs, identity) if self.certs else None

    def client_tls(self, environ: Mapping[str, str] | None = None) -> ClientTls | None:
        """What a client command connects with: the user's files in the certificate
        directory; without one, the TLS identity the environment hands over (a task's:
        `mesh.tls_env`); else none (an insecure mesh, or `--insecure`). Raises
        `TlsConfigError` (missing files, a partial or malformed environment) or
        `IdentityError` (a bad user name)."""
        if self.certs:
            return self.tls(Identity.user(self.user))
        if self.insecure:
            return None
        handed = tls_env.from_env(environ)
        if handed is None:
            return None
        return handed.require_files(
            f"${tls_env.CERT_VAR} and the rest: the task identity its agent handed over"
        )

    def connect_options(self, identity: Identity) -> dict:
        tls = self.tls(identity)
        return {"tls": tls} if tls is not None else {}

    def to_dict(self) -> dict:
        data: dict = {"url": self.url, "region": self.region}
        if self.certs:
            data |= {"certs": self.certs, "user": self.user}
        return data


@dataclass
class ContextStore:
    """Every saved context and the current one's name (None: no current context)."""

    contexts: dict[str, Context] = field(default_factory=dict)
    current: str | None = None

    def to_json(self) -> str:
        """The file's text. The current context's fields are also written at the top
        level, as the file held them before contexts had names, so scripts reading
        `.url` (or `.certs`) of context.json keep working; reading uses `contexts`."""
        current = self.contexts.get(self.current) if self.current else None
        data = {
            **(current.to_dict() if current else {}),
            "current": self.current,
            "contexts": {n: c.to_dict() for n, c in sorted(self.contexts.items())},
        }
        return json.dumps(data, indent=2) + "\n"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ContextError(
            f"context name {name!r}: use letters, digits, '_', '.', '-' (up to 63, "
            "starting with a letter or digit)"
        )
    return name


def _entry(raw: object, where: str) -> Context:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object")
    url = raw.get("url")
    if not isinstance(url, str) or not url:
        raise ValueError(f"{where}.url: expected a NATS URL")
    region = raw.get("region", DEFAULT_REGION)
    certs = raw.get("certs")
    user = raw.get("user") or DEFAULT_USER
    for key, value in (("region", region), ("user", user)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}.{key}: expected a string")
    if certs is not None and not isinstance(certs, str):
        raise ValueError(f"{where}.certs: expected a directory path")
    return Context(url, region, certs or None, user)


def parse_store(text: str, path: Path | str) -> ContextStore:
    """The contexts a file's text holds. The file `mesh up` wrote before named contexts
    existed (one flat object with a `url`) reads as context `local`, current."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        if "contexts" not in data and "url" in data:
            return ContextStore({LOCAL: _entry(data, "context")}, LOCAL)
        raw = data.get("contexts", {})
        if not isinstance(raw, dict):
            raise ValueError("contexts: expected an object of named contexts")
        contexts = {}
        for name, entry in raw.items():
            check_name(name)
            contexts[name] = _entry(entry, f"contexts.{name}")
        current = data.get("current")
        if current is not None and current not in contexts:
            raise ValueError(f"current: {current!r} is not one of the contexts")
        return ContextStore(contexts, current)
    except (ValueError, ContextError) as exc:
        raise ContextError(f"context file {path} is not usable: {exc}{_FIX}") from None


def context_path() -> Path:
    return mesh_home() / "context.json"


def read_store(path: Path | None = None) -> ContextStore:
    """The saved contexts; none when the file does not exist. Raises ContextError."""
    path = path or context_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ContextStore()
    except OSError as exc:
        raise ContextError(f"context file {path}: {exc.strerror}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None  # reported below, as every unusable file is
    if text is None:
        raise ContextError(f"context file {path} is not usable: not UTF-8 text{_FIX}")
    return parse_store(text, path)


def write_store(store: ContextStore, path: Path | None = None) -> Path:
    path = path or context_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(store.to_json())
    tmp.replace(path)
    return path


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def selected_name(store: ContextStore, name: str | None, *, env: bool = True) -> str | None:
    """Which saved context a command uses: `--context`, then $MESH_CONTEXT, then the
    current one. A name given that the store lacks is an error, not a silent default."""
    name = name or (os.environ.get("MESH_CONTEXT") if env else None) or None
    if name is None:
        return store.current
    if name not in store.contexts:
        known = ", ".join(sorted(store.contexts)) or "none saved"
        raise ContextError(f"no context {name!r} in {context_path()} (known: {known})")
    return name


def load_context(
    url_flag: str | None,
    region_flag: str | None,
    certs_flag: str | None = None,
    *,
    user_flag: str | None = None,
    insecure: bool = False,
    name: str | None = None,
    store: ContextStore | None = None,
    env_context: bool = True,
) -> Context:
    """The mesh a command talks to: each field from its flag, its environment variable,
    the selected context, then the default. Raises ContextError."""
    store = store if store is not None else read_store()
    chosen = selected_name(store, name, env=env_context)
    saved = store.contexts.get(chosen) if chosen else None
    url = url_flag or os.environ.get("MESH_NATS_URL") or (saved and saved.url) or DEFAULT_URL
    region = (
        region_flag or os.environ.get("MESH_REGION") or (saved and saved.region) or DEFAULT_REGION
    )
    certs = certs_flag or os.environ.get("MESH_CERTS") or (saved and saved.certs) or None
    insecure = insecure or _truthy(os.environ.get("MESH_INSECURE"))
    if insecure:
        certs = None
    user = user_flag or os.environ.get("MESH_USER") or (saved and saved.user) or DEFAULT_USER
    return Context(url, region, certs, user, insecure)


def save_context(ctx: Context, name: str = LOCAL) -> Path:
    """Save `ctx` as context `name` (others kept) and make it current, as `mesh up`
    does with `local`. Raises ContextError when the existing file is not usable."""
    store = read_store()
    store.contexts[check_name(name)] = ctx
    store.current = name
    return write_store(store)
