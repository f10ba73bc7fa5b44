"""Structured logs: one event per line, `key=value` pairs, to stderr."""

from __future__ import annotations

import json
import logging
import sys
import time


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} msg={json.dumps(record.getMessage())}"
        )
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
