"""`mesh context`: save, pick and inspect the regions the CLI talks to, so a real
region needs its URL, region, certificates and user typed once, not on every command.

    mesh context add NAME --nats URL [--region R] [--certs DIR] [--user U]
    mesh context use NAME          make NAME current
    mesh context list              every context, the current one marked *
    mesh context show [NAME]       what a command would use now (flags > env > context)
    mesh context remove NAME
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from mesh.cli import output
from mesh.cli.context import (
    DEFAULT_REGION,
    DEFAULT_USER,
    Context,
    ContextError,
    check_name,
    context_path,
    load_context,
    read_store,
    write_store,
)
from mesh.cli.exitcodes import EXIT_OK, EXIT_USAGE
from mesh.cli.render import table


def add_parser(sub: Any) -> None:
    ctx = sub.add_parser(
        "context", help="saved regions: add, use, list, show, remove"
    ).add_subparsers(dest="context_cmd", required=True)
    add = ctx.add_parser("add", help="save a context (replaces one of the same name)")
    add.add_argument("name")
    # Own dests: the global --nats/--region/--certs/--user choose where a command goes;
    # here they are the values being saved.
    add.add_argument("--nats", dest="ctx_nats", metavar="URL", required=True, help="NATS URL")
    add.add_argument("--region", dest="ctx_region", default=DEFAULT_REGION, help="region")
    add.add_argument("--certs", dest="ctx_certs", metavar="DIR", help="certificate directory")
    add.add_argument("--user", dest="ctx_user", default=DEFAULT_USER, help="user to act as")
    add.add_argument("--use", action="store_true", help="also make it the current context")
    use = ctx.add_parser("use", help="make a context current")
    use.add_argument("name")
    ctx.add_parser("list", help="saved contexts; the current one is marked *")
    show = ctx.add_parser("show", help="what commands use now: flags, env, then the context")
    show.add_argument("name", nargs="?")
    rm = ctx.add_parser("remove", help="forget a context")
    rm.add_argument("name")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ContextError as exc:
        print(f"mesh context: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    store = read_store()
    cmd = args.context_cmd
    if cmd == "list":
        rows = [
            ["*" if n == store.current else "", n, c.url, c.region, c.certs or "-", c.user]
            for n, c in sorted(store.contexts.items())
        ]
        data = [
            {"name": n, "current": n == store.current, **c.to_dict()}
            for n, c in sorted(store.contexts.items())
        ]
        human = (
            table(rows, ["", "NAME", "URL", "REGION", "CERTS", "USER"])
            if rows
            else f"no contexts in {context_path()} (`mesh context add` or `mesh up`)"
        )
        output.emit(args, data, human)
        return EXIT_OK
    if cmd == "show":
        name = args.name or getattr(args, "context", None)
        ctx = load_context(
            args.nats,
            args.region,
            args.certs,
            user_flag=args.user,
            insecure=args.insecure,
            name=name,
            store=store,
        )
        chosen = name or os.environ.get("MESH_CONTEXT") or store.current
        data = {"context": chosen, **ctx.to_dict()}
        human = "\n".join(
            [
                f"context  {chosen or '- (none: defaults)'}",
                f"url      {ctx.url}",
                f"region   {ctx.region}",
                f"certs    {ctx.certs or '- (no TLS)'}",
                f"user     {ctx.user}",
            ]
        )
        output.emit(args, data, human)
        return EXIT_OK
    name = check_name(args.name)
    if cmd == "add":
        certs = None
        if args.ctx_certs:
            d = Path(args.ctx_certs).expanduser()
            if not d.is_dir():
                raise ContextError(f"--certs {args.ctx_certs}: not a directory")
            certs = str(d.resolve())  # a command may run from anywhere
        store.contexts[name] = Context(args.ctx_nats, args.ctx_region, certs, args.ctx_user)
        if args.use or store.current is None:
            store.current = name
        path = write_store(store)
        now = " (current)" if store.current == name else f"; `mesh context use {name}`"
        print(f"context {name} saved in {path}{now}")
        return EXIT_OK
    if name not in store.contexts:
        known = ", ".join(sorted(store.contexts)) or "none saved"
        raise ContextError(f"no context {name!r} in {context_path()} (known: {known})")
    if cmd == "use":
        store.current = name
        write_store(store)
        c = store.contexts[name]
        print(f"using context {name}: {c.url}, region {c.region}")
        return EXIT_OK
    del store.contexts[name]
    if store.current == name:
        store.current = None
    write_store(store)
    print(f"context {name} removed")
    return EXIT_OK
