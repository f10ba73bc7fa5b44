"""The client commands: each talks only to the region's NATS request API."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from coordinator.pools import parse_pool_tree
from mesh.cli import infer, load, render
from mesh.cli.context import Context
from mesh.cli.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from mesh.client import MeshClient
from mesh.connect import ClientTls, TlsConfigError, close_quietly, connect
from mesh.refusals import Refused
from mesh.schema import ApiError, ErrorCode
from mesh.security.identity import Identity, IdentityError
from workloads.quantity import SpecError
from workloads.spec import parse_job_spec


async def client_command(args: argparse.Namespace, ctx: Context) -> int:
    try:
        options = ctx.connect_options(Identity.user(ctx.user))
    except (TlsConfigError, IdentityError) as exc:
        print(f"mesh: {exc} (or --insecure for a mesh without TLS)", file=sys.stderr)
        return EXIT_USAGE
    try:
        nc = await connect(
            ctx.url, name="mesh-cli", reconnect=False, connect_timeout=2.0, **options
        )
    except Refused as exc:  # a configuration mistake: the message says which and its fix
        print(f"mesh: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        print(
            f"cannot reach NATS at {ctx.url}: {exc or type(exc).__name__} "
            "(is `mesh up` running? set --nats or MESH_NATS_URL, or `mesh context use NAME`)",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    client = MeshClient(nc, ctx.region)
    try:
        if args.cmd == "infer":
            return await _infer(args, client, ctx.url, options.get("tls"))
        return await _dispatch(args, client)
    except Refused as exc:
        print(f"mesh: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return (
            EXIT_UNREACHABLE
            if exc.code == ErrorCode.UNAVAILABLE
            else (
                EXIT_USAGE
                if exc.code in (ErrorCode.INVALID_SPEC, ErrorCode.BAD_REQUEST, ErrorCode.TOO_LARGE)
                else EXIT_FAILED
            )
        )
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await close_quietly(nc)


def out(args: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else human)


async def _dispatch(args: argparse.Namespace, client: MeshClient) -> int:
    if args.cmd == "load":
        summary = await load.run_load(args, client, args.workload)
        out(args, summary, load.human(summary))
        return EXIT_OK if not summary["errors"] else EXIT_FAILED
    if args.cmd == "job":
        return await _job(args, client)
    if args.cmd == "pool":
        return await _pool(args, client)
    if args.cmd == "model":
        if args.model_cmd == "deploy":
            job_id = await infer.deploy(client, args.model_spec, client_id=args.client_id)
            out(args, {"job_id": job_id, "model": args.model_spec.name}, job_id)
            return EXIT_OK
        rows = await infer.model_jobs(client, active_only=not args.all, limit=args.limit)
        data = [{"model": name, **job} for name, job in rows]
        out(args, data, infer.models_table(rows))
        return EXIT_OK
    if args.cmd == "node":
        if args.node_cmd == "list":
            nodes = await client.nodes()
            out(args, nodes, render.nodes_table(nodes))
        else:
            node = await client.node(args.node_id)
            out(args, node, json.dumps(node, indent=2))
        return EXIT_OK
    info = await client.cluster_info()
    human = "\n".join(f"{k:10} {v}" for k, v in info.items() if k != "ok")
    out(args, info, human)
    return EXIT_OK


async def _infer(
    args: argparse.Namespace, client: MeshClient, url: str, tls: ClientTls | None
) -> int:
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    if args.infer_cmd == "load":
        result = await infer.run_load(args, url, client.region, tls)
        out(args, result, infer.load_line(result))
        return EXIT_OK if result["good"] else EXIT_FAILED
    values = getattr(args, "values", None) or [0.0] * infer.MLP_IN_DIM
    timeout = args.deadline_ms / 1000 + 5.0
    try:
        reply = await infer.request_once(
            client.nc, client.region, args.model, values, args.deadline_ms, timeout
        )
    except NoRespondersError:
        print(
            "no inference router answers in this region "
            "(start one: `mesh up --inference-workers N`)",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    except NatsTimeout:
        print(f"no answer in {timeout:g}s", file=sys.stderr)
        return EXIT_FAILED
    if reply["ok"]:
        human = f"{' '.join(f'{x:.6g}' for x in reply['output'])}  (worker {reply['worker']})"
        out(args, reply, human)
        return EXIT_OK
    if args.json:
        out(args, reply, "")
    print(f"error: {reply['error']['code']}: {reply['error']['message']}", file=sys.stderr)
    return EXIT_FAILED


def read_checked(path: str, check) -> str | None:
    """A spec file's text (or stdin's, for '-'), checked here first so a mistake is
    reported with the same message the server would give, without a round trip."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        print(f"cannot read {path}: {exc.strerror}", file=sys.stderr)
        return None
    try:
        check(text)
    except SpecError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return None
    return text


async def _pool(args: argparse.Namespace, client: MeshClient) -> int:
    if args.pool_cmd == "apply":
        text = read_checked(args.file, parse_pool_tree)
        if text is None:
            return EXIT_USAGE
        paths = await client.pool_apply(text)
        out(args, {"pools": paths}, f"applied {len(paths)} pools: {', '.join(paths)}")
        return EXIT_OK
    if args.pool_cmd == "list":
        pools = await client.pools()
        out(args, pools, render.pools_table(pools))
        return EXIT_OK
    pool = await client.pool(args.path)
    human = (
        render.pools_table([pool])
        + "\njobs: "
        + (", ".join(f"{k.lower()} {v}" for k, v in sorted(pool["jobs"].items())) or "none")
    )
    out(args, pool, human)
    return EXIT_OK


async def _job(args: argparse.Namespace, client: MeshClient) -> int:
    if args.job_cmd == "run":
        text = read_checked(args.file, parse_job_spec)
        if text is None:
            return EXIT_USAGE
        job_id = await client.submit(text, client_id=args.client_id)
        if not args.wait:
            out(args, {"job_id": job_id}, job_id)
            return EXIT_OK
        if not args.json:
            print(f"submitted {job_id}; waiting", file=sys.stderr)
        job = await client.wait(job_id, timeout=args.timeout, poll=0.1)
        out(args, job, render.job_detail(job))
        return EXIT_OK if job["state"] == "SUCCEEDED" else EXIT_FAILED
    if args.job_cmd == "status":
        job = await client.job(args.job_id)
        out(args, job, render.job_detail(job))
        return EXIT_OK
    if args.job_cmd == "list":
        jobs = await client.jobs(args.state, args.pool, args.limit)
        out(args, jobs, render.jobs_table(jobs) if jobs else "no jobs")
        return EXIT_OK
    if args.job_cmd == "kill":
        await client.kill(args.job_id, args.reason)
        out(
            args,
            {"job_id": args.job_id, "kill_requested": True},
            f"kill requested for {args.job_id}",
        )
        return EXIT_OK
    reply = await client.logs(
        args.job_id, args.task, "stderr" if args.stderr else "stdout", args.tail
    )
    if args.json:
        reply["data"] = reply["data"].decode(errors="replace")
        out(args, reply, "")
    else:
        sys.stdout.write(reply["data"].decode(errors="replace"))
    return EXIT_OK
