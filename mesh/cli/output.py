"""How a command prints its result: `-o table|json|yaml|wide` (`--json` is `-o json`).

Commands hand over the data (what json and yaml print) and the human text (the
table); `wide` is a table with every column, where the command has one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import Any

import yaml


def normalise(args: argparse.Namespace) -> None:
    """Settle `args.output` from `-o` and `--json`; `args.json` then means any
    machine-readable format (progress and notes stay off stdout and stderr chatter)."""
    fmt = getattr(args, "output", None)
    if getattr(args, "json", False):
        fmt = "json"
    args.output = fmt or "table"
    args.json = args.output in ("json", "yaml")


def plain(data: Any) -> Any:
    """`data` as JSON types only (bytes, tuples, enums as JSON would print them)."""
    return json.loads(json.dumps(data, default=str))


def render(fmt: str, data: Any, human: str, wide: str | None = None) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, default=str)
    if fmt == "yaml":
        return yaml.safe_dump(plain(data), sort_keys=False, allow_unicode=True).rstrip("\n")
    if fmt == "wide" and wide is not None:
        return wide
    return human


def emit(args: argparse.Namespace, data: Any, human: str, wide: str | None = None) -> None:
    print(render(getattr(args, "output", "table"), data, human, wide))


def terminal_width() -> int | None:
    """The terminal's width when stdout is one; None (no wrapping) for a pipe or file,
    so `grep` sees each row whole on one line."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns
