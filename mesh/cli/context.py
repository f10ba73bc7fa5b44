"""Where the CLI finds the mesh: flags, then environment, then the context that
`mesh up` wrote under $MESH_HOME (like a kubeconfig or a NATS context)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "nats://127.0.0.1:4222"


def mesh_home() -> Path:
    return Path(os.environ.get("MESH_HOME") or Path.home() / ".mesh")


@dataclass(frozen=True)
class Context:
    url: str
    region: str


def context_path() -> Path:
    return mesh_home() / "context.json"


def load_context(url_flag: str | None, region_flag: str | None) -> Context:
    saved: dict = {}
    path = context_path()
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
    url = url_flag or os.environ.get("MESH_NATS_URL") or saved.get("url") or DEFAULT_URL
    region = region_flag or os.environ.get("MESH_REGION") or saved.get("region") or "default"
    return Context(url, region)


def save_context(ctx: Context) -> Path:
    path = context_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": ctx.url, "region": ctx.region}, indent=2) + "\n")
    tmp.replace(path)
    return path
