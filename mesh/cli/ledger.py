"""`mesh agent ledger`: a node's reliability ledger (agent/ledger.py), as JSON lines.

Read from the agent's store file, read-only, so it works beside a running agent and
after it stopped; one line per run: task_id, attempt, run, node_id, start, end,
outcome (end null while it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mesh.cli.exitcodes import EXIT_OK, EXIT_USAGE


def add_parser(sub) -> None:
    p = sub.add_parser(
        "ledger",
        help="every run this node's agent started (JSON lines), from its data directory",
    )
    p.add_argument("--data-dir", help="the agent's data dir (default: $MESH_HOME/agent/<node-id>)")
    p.add_argument("--node-id", help="with no --data-dir: whose default data dir (host name)")
    p.add_argument("--task", help="only this task's runs")


def run(args: argparse.Namespace) -> int:
    from agent.service import default_node_id
    from agent.store import LedgerError, read_ledger
    from mesh.cli.context import mesh_home

    data_dir = Path(args.data_dir or mesh_home() / "agent" / (args.node_id or default_node_id()))
    try:
        runs = read_ledger(data_dir / "agent.db")
    except LedgerError as exc:
        print(f"mesh agent ledger: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for r in runs:
        if args.task is None or r.task_id == args.task:
            print(json.dumps(r.to_json()))
    return EXIT_OK
