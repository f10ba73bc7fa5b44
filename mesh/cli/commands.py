"""The client commands: each talks only to the region's NATS request API."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from coordinator.partitions.config import parse_partitions_config
from coordinator.pools import parse_pool_tree
from mesh.cli import fedview, infer, jobs, load, output, partition, render, sites
from mesh.cli.context import Context
from mesh.cli.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from mesh.client import MeshClient
from mesh.connect import ClientTls, TlsConfigError, close_quietly, connect
from mesh.refusals import Refused
from mesh.schema import ApiError, ErrorCode
from mesh.security.identity import IdentityError
from workloads.quantity import SpecError
from workloads.spec import parse_job_spec


async def client_command(args: argparse.Namespace, ctx: Context) -> int:
    try:
        tls = ctx.client_tls()  # the user's; in a task without certs, the handed identity
    except (TlsConfigError, IdentityError) as exc:
        print(f"mesh: {exc} (or --insecure for a mesh without TLS)", file=sys.stderr)
        return EXIT_USAGE
    options = {"tls": tls} if tls is not None else {}
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
    args.acting_user = ctx.user  # who a partition move or break-glass is recorded as
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


def out(args: argparse.Namespace, data: Any, human: str, wide: str | None = None) -> None:
    """Print a result in the format `-o`/`--json` asked for (see mesh.cli.output)."""
    output.emit(args, data, human, wide)


def _view(args: argparse.Namespace, fn, data: Any) -> tuple[str, str]:
    """A render function's table and its wide form, wrapped to the terminal."""
    width = output.terminal_width()
    return fn(data, width=width), fn(data, wide=True, width=width)


async def _dispatch(args: argparse.Namespace, client: MeshClient) -> int:
    if fedview.serves(args):  # region list, --region all, job status found anywhere
        return await fedview.run(args, client)
    if args.cmd == "load":
        summary = await load.run_load(args, client, args.workload)
        out(args, summary, load.human(summary))
        return EXIT_OK if not summary["errors"] else EXIT_FAILED
    if args.cmd == "job":
        return await _job(args, client)
    if args.cmd == "pool":
        return await _pool(args, client)
    if args.cmd == "site":
        return await sites.run(args, client)
    if args.cmd == "partition":
        return await partition.run(args, client, getattr(args, "texts", []))
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
            out(args, nodes, *_view(args, render.nodes_table, nodes))
        else:
            node = await client.node(args.node_id)
            out(args, node, json.dumps(node, indent=2))
        return EXIT_OK
    info = await client.cluster_info()
    out(args, info, render.cluster_lines(info))
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


def read_inputs(args: argparse.Namespace) -> bool:
    """Read and check the files `job run` and `pool apply` send, into `args.texts`
    as (path, text) pairs; False (the error printed) when one is unreadable or bad."""
    kind = (args.cmd, getattr(args, f"{args.cmd}_cmd", None))
    check = {
        ("job", "run"): parse_job_spec,
        ("job", "update"): parse_job_spec,
        ("pool", "apply"): parse_pool_tree,
        ("partition", "apply"): parse_partitions_config,
    }.get(kind)
    if check is None:
        return True
    files = args.file if isinstance(args.file, list) else [args.file]
    args.texts = []
    for path in files:
        text = read_checked(path, check)
        if text is None:
            return False
        args.texts.append((path, text))
    return True


def read_checked(path: str, check) -> str | None:
    """A spec file's text (or stdin's, for '-'), checked here first so a mistake is
    reported with the same message the server would give, without a round trip."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        print(f"cannot read {path}: {exc.strerror}", file=sys.stderr)
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8",
            file=sys.stderr,
        )
        return None
    try:
        check(text)
    except SpecError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return None
    return text


async def _pool(args: argparse.Namespace, client: MeshClient) -> int:
    if args.pool_cmd == "apply":
        ((_, text),) = args.texts  # read and checked by main, before connecting
        paths = await client.pool_apply(text)
        out(args, {"pools": paths}, f"applied {len(paths)} pools: {', '.join(paths)}")
        return EXIT_OK
    if args.pool_cmd == "list":
        pools = await client.pools()
        out(args, pools, *_view(args, render.pools_table, pools))
        return EXIT_OK
    pool = await client.pool(args.path)
    counts = ", ".join(f"{k.lower()} {v}" for k, v in sorted(pool["jobs"].items())) or "none"
    human, wide = _view(args, render.pools_table, [pool])
    out(args, pool, f"{human}\njobs: {counts}", f"{wide}\njobs: {counts}")
    return EXIT_OK


async def _job(args: argparse.Namespace, client: MeshClient) -> int:
    if args.job_cmd == "run":
        return await _run(args, client)
    if args.job_cmd == "status":
        job = await client.job(args.job_id)
        out(args, job, *_view(args, render.job_detail, job))
        return EXIT_OK
    if args.job_cmd == "list":
        found = await client.jobs(args.state, args.pool, args.limit)
        human, wide = _view(args, render.jobs_table, found) if found else ("no jobs", "no jobs")
        out(args, found, human, wide)
        return EXIT_OK
    if args.job_cmd == "kill":
        return await _kill(args, client)
    if args.job_cmd == "update":
        return await _update(args, client)
    if args.job_cmd == "scale":
        reply = await client.scale(args.job_id, args.workers, args.reason, _who())
        same = reply["workers"] == reply["was"]
        human = (
            f"{args.job_id} already has target {args.workers}"
            if same
            else f"{args.job_id}: target {reply['was']} -> {reply['workers']}"
        )
        out(args, reply, human)
        return EXIT_OK
    if args.job_cmd == "hosts":
        hosts = await client.hosts(args.job_id, args.format)
        out(args, {"job_id": args.job_id, "format": args.format, "hosts": hosts}, "\n".join(hosts))
        return EXIT_OK
    return await _logs(args, client)


def _who() -> str:
    """Who asked, for the log (JobScaled.by): the local user name."""
    import getpass

    try:
        return getpass.getuser()[:128]
    except (KeyError, OSError):
        return ""


async def _update(args: argparse.Namespace, client: MeshClient) -> int:
    """`mesh job update FILE [--job ID]`: the spec was read and checked by main."""
    ((path, text),) = args.texts
    job_id = args.job
    if job_id is None:
        name = parse_job_spec(text).name
        found = [
            j["job_id"]
            for j in await client.jobs(limit=10_000)
            if j["name"] == name
            and j.get("kind") == "service"
            and j["state"] in ("PENDING", "RUNNING")
            and not j["kill_requested"]
        ]
        if len(found) != 1:
            what = "no active service" if not found else f"{len(found)} active services"
            print(
                f"mesh job update: {what} named {name!r}; name one with --job ID", file=sys.stderr
            )
            return EXIT_USAGE
        job_id = found[0]
    reply = await client.update(job_id, text)
    if reply["changed"]:
        human = f"update of {job_id} requested from {path}: replicas are replaced one by one"
    else:
        human = f"{job_id} already runs this spec: nothing to update"
    out(args, {"job_id": job_id, "changed": reply["changed"]}, human)
    return EXIT_OK


async def _run(args: argparse.Namespace, client: MeshClient) -> int:
    """Every file was checked (by main, before connecting): one bad spec submits nothing."""
    texts = args.texts
    if len(texts) == 1:
        reply = await client.submit_reply(texts[0][1], client_id=args.client_id)
        if reply.get("warning"):
            print(f"warning: {reply['warning']}", file=sys.stderr)
        job_ids = [reply["job_id"]]
        homes = [reply.get("home") or client.region]
    else:
        results = await jobs.submit_files(client, texts, args.client_id)
        for r in results:
            if r.warning:
                print(f"{r.path}: warning: {r.warning}", file=sys.stderr)
        failed = [r for r in results if r.error]
        for r in failed:
            print(f"{r.path}: {r.error['code']}: {r.error['message']}", file=sys.stderr)
        job_ids = [r.job_id for r in results if r.job_id]
        homes = [r.home or client.region for r in results if r.job_id]
        if failed:
            if job_ids:
                print(f"submitted the other {len(job_ids)}: {' '.join(job_ids)}", file=sys.stderr)
            return EXIT_USAGE
    for job_id, home in zip(job_ids, homes, strict=True):
        if home != client.region:  # made in the first region its spec names
            print(jobs.went_elsewhere(job_id, home, client.region), file=sys.stderr)
    if not args.wait:
        if len(job_ids) == 1:
            out(args, {"job_id": job_ids[0], "region": homes[0]}, job_ids[0])
        else:
            data = [
                {"file": p, "job_id": j, "region": h}
                for (p, _), j, h in zip(texts, job_ids, homes, strict=True)
            ]
            out(args, data, "\n".join(job_ids))
        return EXIT_OK
    if not args.json:
        print(f"submitted {' '.join(job_ids)}; waiting", file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    done = await asyncio.gather(
        *(
            _wait(client if h == client.region else MeshClient(client.nc, h), j, deadline)
            for j, h in zip(job_ids, homes, strict=True)
        )
    )
    width = output.terminal_width()
    human = "\n\n".join(render.job_detail(j, width=width) for j in done)
    wide = "\n\n".join(render.job_detail(j, wide=True, width=width) for j in done)
    out(args, done[0] if len(done) == 1 else done, human, wide)
    late = [j for j in done if j["state"] not in FINISHED]
    for j in late:
        print(
            f"timed out after {args.timeout:g}s: job {j['job_id']} is still {j['state']}: "
            f"{render.waiting_reason(j)}",
            file=sys.stderr,
        )
    return EXIT_OK if all(j["state"] == "SUCCEEDED" for j in done) else EXIT_FAILED


FINISHED = frozenset({"SUCCEEDED", "FAILED", "KILLED"})


async def _wait(client: MeshClient, job_id: str, deadline: float, poll: float = 0.1) -> dict:
    """The job once it ends, or as it stands at the deadline (its waiting reason says
    why it has not ended)."""
    while True:
        job = await client.job(job_id)
        if job["state"] in FINISHED or time.monotonic() >= deadline:
            return job
        await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))


async def _kill(args: argparse.Namespace, client: MeshClient) -> int:
    picks = args.state is not None or args.pool is not None or args.all
    if args.job_id and picks:
        print("mesh job kill: give job ids or --state/--pool/--all, not both", file=sys.stderr)
        return EXIT_USAGE
    if not args.job_id and not picks:
        print(
            "mesh job kill: which jobs? give job ids, or --state S / --pool P, or --all",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.job_id:
        got = await jobs.kill_many(client, args.job_id, args.reason)
    else:
        got = await jobs.kill_selected(client, args.state, args.pool, args.reason)
    for job_id, exc in got.errors.items():
        print(f"error: {job_id}: {exc.code}: {exc.message}", file=sys.stderr)
    if args.job_id:  # named jobs that had ended are worth saying; a selector's race is not
        for job_id in got.already_ended:
            print(f"error: {job_id}: already ended", file=sys.stderr)
    n = len(got.requested)
    human = (
        f"kill requested for {got.requested[0]}"
        if n == 1 and len(args.job_id) == 1
        else f"kill requested for {n} job{'s' if n != 1 else ''}"
        + (f"; {len(got.already_ended)} had already ended" if got.already_ended else "")
    )
    out(args, got.to_dict(), human)
    if got.errors or (args.job_id and got.already_ended):
        return EXIT_FAILED
    return EXIT_OK


async def _logs(args: argparse.Namespace, client: MeshClient) -> int:
    job = await client.job(args.job_id)
    try:
        task = jobs.resolve_task(job["task_list"], args.task)
    except jobs.TaskChoiceError as exc:
        print(f"mesh job logs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if jobs.never_started(task):
        why = render.waiting_reason({**job, "task_list": [task]})
        if task["state"] not in render.ACTIVE_TASK:
            why = f"{task['state']}: {task['message'] or 'no message'}"
        print(
            f"task {task['task_id']} never started, so it has no log ({why})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    reply = await client.logs(
        args.job_id, task["task_id"], "stderr" if args.stderr else "stdout", args.tail
    )
    if args.json:
        reply["data"] = reply["data"].decode(errors="replace")
        out(args, reply, "")
    else:
        sys.stdout.write(reply["data"].decode(errors="replace"))
    return EXIT_OK
