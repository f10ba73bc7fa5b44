"""One node's identity in one file: `mesh certs bundle DIR --agent NODE` packs it on the
operator's machine, `mesh agent install --bundle FILE` unpacks it on the node.

A bundle is a gzipped tar of exactly these regular files, flat (no directories):

    ca.crt            the region's CA certificate (to trust the server)
    agent-NODE.crt    the node's client certificate
    agent-NODE.key    its private key (0600 in the bundle and once unpacked)
    assignments.pub   the assignment verify key (`--verify-key`)
    bundle.json       {"kind": "agent", "node_id": NODE}

Why a file rather than four: one thing to copy (`scp`), one mode to get right, and the
node id travels with the key, so the installer cannot pair a key with the wrong node.
Unpacking trusts nothing in the archive: only these names, only regular files, each
under a size cap; anything else refuses the whole bundle before a byte is written.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from mesh import signing
from mesh.security.identity import CA_CERT, Identity, IdentityError

MANIFEST = "bundle.json"
MAX_MEMBER = 64 * 1024  # a PEM file is a few KiB; anything larger is not ours
PUBLIC_MODE, PRIVATE_MODE = 0o644, 0o600


class BundleError(ValueError):
    """A bundle that is missing, malformed, or would overwrite a file."""


@dataclass(frozen=True)
class Bundle:
    """A bundle's contents, by file name."""

    node_id: str
    files: dict[str, bytes]

    @property
    def identity(self) -> Identity:
        return Identity.agent(self.node_id)

    def names(self) -> list[str]:
        return sorted(self.files)


def member_names(node_id: str) -> tuple[str, ...]:
    ident = Identity.agent(node_id)
    return (
        CA_CERT,
        ident.cert_path(".").name,
        ident.key_path(".").name,
        signing.PUB_FILE,
        MANIFEST,
    )


def _mode(name: str) -> int:
    return PRIVATE_MODE if name.endswith(".key") else PUBLIC_MODE


def collect(certs_dir: str | Path, node_id: str) -> Bundle:
    """The bundle of agent `node_id` from a certificate directory (not yet written)."""
    d = Path(certs_dir)
    ident = Identity.agent(node_id)
    files: dict[str, bytes] = {}
    hints = {
        CA_CERT: f"run `mesh certs init {d}`",
        ident.cert_path(".").name: f"run `mesh certs issue {d} --agent {node_id}`",
        ident.key_path(".").name: f"run `mesh certs issue {d} --agent {node_id}`",
        signing.PUB_FILE: f"{d} predates signing keys: make a new region with `mesh certs init`",
    }
    for name, hint in hints.items():
        path = d / name
        if not path.is_file():
            raise BundleError(f"{path} is missing: {hint}")
        files[name] = path.read_bytes()
    files[MANIFEST] = json.dumps({"kind": "agent", "node_id": node_id}).encode() + b"\n"
    return Bundle(node_id, files)


def pack(bundle: Bundle) -> bytes:
    """The bundle as tar.gz bytes (members owned by 0:0, keys 0600)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in bundle.names():
            data = bundle.files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), _mode(name), 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write(bundle: Bundle, path: str | Path) -> Path:
    """Write the bundle to `path`, 0600, never over an existing file."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    except FileExistsError:
        raise BundleError(f"{p} already exists: remove it first to write a new bundle") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pack(bundle))
    os.chmod(p, PRIVATE_MODE)  # whatever the umask
    return p


def read(path: str | Path) -> Bundle:
    """A bundle file's contents, checked: exactly the expected members, nothing else."""
    p = Path(path)
    try:
        tar = tarfile.open(p, mode="r:gz")
    except FileNotFoundError:
        raise BundleError(f"{p}: no such file") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(
            f"{p} is not a bundle (a tar.gz from `mesh certs bundle`): {exc}"
        ) from None
    files: dict[str, bytes] = {}
    with tar:
        try:
            for info in tar:
                if not info.isreg() or "/" in info.name or info.name in ("", ".", ".."):
                    raise BundleError(f"{p}: unexpected member {info.name!r}")
                if info.size > MAX_MEMBER or info.name in files:
                    raise BundleError(f"{p}: member {info.name!r} too large or repeated")
                f = tar.extractfile(info)
                assert f is not None  # a regular file
                files[info.name] = f.read()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise BundleError(f"{p} is a damaged bundle: {exc}") from None
    try:
        manifest = json.loads(files[MANIFEST])
        node_id = manifest["node_id"]
        if manifest.get("kind") != "agent" or not isinstance(node_id, str):
            raise ValueError("not an agent bundle")
        expected = set(member_names(node_id))
    except (KeyError, ValueError, TypeError, IdentityError) as exc:
        raise BundleError(f"{p}: no valid {MANIFEST} ({exc})") from None
    if set(files) != expected:
        raise BundleError(f"{p}: expected members {sorted(expected)}, found {sorted(files)}")
    return Bundle(node_id, files)


def unpack(bundle: Bundle, config_dir: str | Path) -> list[Path]:
    """Write the bundle's certificate files into `config_dir` (made 0700): keys 0600,
    the rest 0644, each atomically (a temporary file renamed into place)."""
    d = Path(config_dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    written = []
    for name in bundle.names():
        if name == MANIFEST:
            continue
        target = d / name
        tmp = d / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _mode(name))
        with os.fdopen(fd, "wb") as f:
            f.write(bundle.files[name])
        os.chmod(tmp, _mode(name))
        tmp.replace(target)
        written.append(target)
    return written
