"""The `mesh` command. Every client command talks only to the NATS request API.

Exit codes: 0 success; 1 the job or request failed (e.g. `job run --wait` of a job
that did not succeed); 2 bad usage or bad input (e.g. an invalid spec file);
3 the mesh could not be reached or did not answer in time.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace

from mesh import logs, subjects
from mesh.cli import (
    certs,
    completion,
    contexts,
    edge,
    fedview,
    infer,
    load,
    output,
    partition,
    servers,
)
from mesh.cli import install as agent_install
from mesh.cli import ledger as agent_ledger
from mesh.cli.context import LOCAL, ContextError, ContextStore, load_context, read_store
from mesh.cli.exitcodes import EXIT_OK, EXIT_USAGE
from mesh.cli.parser import build_parser
from mesh.connect import TlsConfigError
from mesh.refusals import Refused
from mesh.security.identity import IdentityError
from mesh.subjects import SubjectError
from workloads.model import parse_model_spec


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.log_level = args.log_level or logs.default_level(args.cmd)
    logs.setup(args.log_level)
    output.normalise(args)
    if args.cmd == "completion":
        print(completion.script(parser, args.shell))
        return EXIT_OK
    if args.cmd == "context":
        return contexts.run(args)
    insecure = args.insecure or getattr(args, "up_insecure", False)
    try:
        store = read_store()
        up = args.cmd == "up"
        if up:  # its own context `local`, not whichever region is current
            local = {k: v for k, v in store.contexts.items() if k == LOCAL}
            store = ContextStore(local, LOCAL if local else None)
        ctx = load_context(
            args.nats,
            args.region,
            args.certs,
            user_flag=args.user,
            insecure=insecure,
            name=None if up else args.context,
            store=store,
            env_context=not up,
        )
        if ctx.region == fedview.ALL:  # the global view: the context's region is the local one
            args.all_regions = True
            home = load_context(None, None, name=None if up else args.context, store=store)
            ctx = replace(ctx, region=home.region if home.region != fedview.ALL else "default")
    except ContextError as exc:
        print(f"mesh: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if fedview.usage_problem(args):
        print(f"mesh: {fedview.usage_problem(args)}", file=sys.stderr)
        return EXIT_USAGE
    if not subjects.is_token(ctx.region):  # one subject token: `a.b` would widen subjects
        print(
            f"mesh: region {ctx.region!r} (from --region, MESH_REGION or the context) must "
            "be 1-64 letters, digits, '_' or '-'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if args.cmd == "certs":
            return certs.run(args, args.certs, ctx.region)
        if args.cmd == "up":
            return servers.up(args, ctx)
        if args.cmd == "demo":
            from mesh.cli.demo import run_demo

            return run_demo(args.sim_nodes)
        if args.cmd == "agent" and getattr(args, "agent_cmd", None) == "ledger":
            return agent_ledger.run(args)
        if args.cmd == "edge":
            return edge.run(args, ctx)
        if args.cmd == "agent" and getattr(args, "agent_cmd", None):
            return agent_install.run(args, ctx)
        try:
            if args.cmd == "agent":
                return asyncio.run(servers.agent(args, ctx))
            if args.cmd == "coordinator":
                return asyncio.run(servers.coordinator(args, ctx))
        except (TlsConfigError, IdentityError, SubjectError) as exc:
            print(f"mesh {args.cmd}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except Refused as exc:  # permission, authorization or TLS: the fix is in the text
            print(f"mesh {args.cmd}: {exc.message}", file=sys.stderr)
            return EXIT_USAGE
        if args.cmd == "load":
            try:  # before connecting: a bad value needs no mesh to be reported
                args.workload = load.workload(args)
            except ValueError as exc:
                print(f"mesh load: {exc}", file=sys.stderr)
                return EXIT_USAGE
            if args.dry_run:
                from mesh.cli import commands

                summary = load.describe(args.workload)
                commands.out(args, summary, load.workload_line(summary))
                return EXIT_OK
        # Only client commands need this module and what it pulls in (the client, the
        # coordinator's pool and partition parsers): a long-running `mesh edge up` or
        # `mesh agent` does not carry them (edge sites are counted in megabytes).
        from mesh.cli import commands

        if not commands.read_inputs(args):  # before connecting, as for load above
            return EXIT_USAGE
        if args.cmd == "partition":
            problem = partition.check(args)
            if problem is not None:
                print(f"mesh partition: {problem}", file=sys.stderr)
                return EXIT_USAGE
        if args.cmd in ("model", "infer"):
            problem = infer.check_args(args)
            if problem is not None:
                print(f"mesh {args.cmd}: {problem}", file=sys.stderr)
                return EXIT_USAGE
            if args.cmd == "model" and args.model_cmd == "deploy":
                text = commands.read_checked(args.file, parse_model_spec)
                if text is None:
                    return EXIT_USAGE
                args.model_spec = parse_model_spec(text)
        return asyncio.run(commands.client_command(args, ctx))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
