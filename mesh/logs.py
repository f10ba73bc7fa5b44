"""Structured logs: one event per line, `key=value` pairs, to stderr.

A call may add its own pairs with `extra=fields(k=v, ...)`; they follow `msg=`, so an
operator can grep `identity=agent:n1` or `event=leader` across processes.

Long-running processes (agent, coordinator, `mesh up`) log at `info` by default, so
they say what they are, where they connected and who leads; client commands log at
`warning` (their output is the answer, not a log).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

LONG_RUNNING = frozenset({"agent", "coordinator", "up"})
_BARE = re.compile(r"[A-Za-z0-9_.:/@+-]+")


def default_level(command: str) -> str:
    return "info" if command in LONG_RUNNING else "warning"


def fields(**pairs: Any) -> dict[str, Any]:
    """`extra=` for a log call: these pairs are appended to its line."""
    return {"fields": pairs}


def _value(v: Any) -> str:
    s = str(v)
    return s if _BARE.fullmatch(s) else json.dumps(s)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} msg={json.dumps(record.getMessage())}"
        )
        for k, v in (getattr(record, "fields", None) or {}).items():
            line += f" {k}={_value(v)}"
        if record.exc_info:
            line += f" exc={json.dumps(self.formatException(record.exc_info))}"
        return line


def setup(level: str = "warning", process: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("nats").setLevel(logging.CRITICAL)  # reconnect chatter; we log our own


@dataclass
class Throttle:
    """At most one line per key every `every_s` seconds, for events that can repeat
    many times a second (a denied heartbeat, a refused reconnect): the first is logged,
    then one line per period saying how many were held back."""

    every_s: float = 30.0
    _last: dict[str, float] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)

    def allow(self, key: str, now: float) -> int | None:
        """None: hold this one back. Otherwise log it, with the count held back since."""
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)

    def reset(self, key: str) -> None:
        """The condition cleared: its next occurrence is news again."""
        self._last.pop(key, None)
        self._held.pop(key, None)
