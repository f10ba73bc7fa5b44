"""The `mesh` command. Every client command talks only to the NATS request API.

Exit codes: 0 success; 1 the job or request failed (e.g. `job run --wait` of a job
that did not succeed); 2 bad usage or bad input (e.g. an invalid spec file);
3 the mesh could not be reached or did not answer in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from coordinator.pools import parse_pool_tree
from mesh import logs
from mesh.cli import certs, infer, load, render
from mesh.cli.context import Context, load_context, mesh_home, save_context
from mesh.client import MeshClient
from mesh.connect import ClientTls, TlsConfigError, close_quietly, connect
from mesh.schema import ApiError, ErrorCode
from mesh.security.identity import Identity, IdentityError
from workloads.model import parse_model_spec
from workloads.quantity import SpecError
from workloads.spec import parse_job_spec

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mesh", description="Mesh: schedule mixed work over NATS.")
    p.add_argument("--nats", help="NATS URL (env MESH_NATS_URL; default: the `mesh up` context)")
    p.add_argument("--region", help="region (env MESH_REGION; default: context or 'default')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--log-level", default="warning")
    p.add_argument(
        "--certs",
        help="certificate directory; each component uses its identity's files there "
        "(env MESH_CERTS; default: the `mesh up` context)",
    )
    p.add_argument("--user", help="user the CLI acts as (env MESH_USER; default admin)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS, no client certificate (development; env MESH_INSECURE=1)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="run a whole region on this machine until interrupted")
    up.add_argument("--sim-nodes", type=int, default=0, help="simulated nodes to add")
    up.add_argument("--candidates", type=int, default=2, help="coordinator candidates")
    up.add_argument("--port", type=int, default=4222, help="NATS port (0: any free port)")
    up.add_argument(
        "--state-dir", help="where NATS and the agent keep state (default $MESH_HOME/up)"
    )
    up.add_argument("--no-agent", action="store_true", help="no real agent for this machine")
    up.add_argument(
        "--insecure",
        dest="up_insecure",
        action="store_true",
        help="no TLS, no certificates, no permissions (development)",
    )
    up.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        choices=[1, 3],
        help="NATS servers clustered on loopback (3: streams with 3 replicas)",
    )
    up.add_argument(
        "--inference-workers",
        type=int,
        default=0,
        metavar="N",
        help="also start an inference router and serve the numpy model with N CPU "
        "worker replicas, placed by the coordinator on this machine's agent",
    )

    demo = sub.add_parser("demo", help="start a throwaway region, run sample jobs, summarise")
    demo.add_argument("--sim-nodes", type=int, default=4)

    ag = sub.add_parser("agent", help="run the node agent")
    ag.add_argument("--node-id", help="default: the host name")
    ag.add_argument("--data-dir", help="default: $MESH_HOME/agent/<node-id>")
    ag.add_argument("--zone", default="")
    ag.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    ag.add_argument("--heartbeat", type=float, default=1.0, help="seconds between heartbeats")
    ag.add_argument("--run-as", help="run task commands as this user")
    ag.add_argument(
        "--allow-root",
        action="store_true",
        help="let a root agent with no --run-as run task commands as root (refused otherwise)",
    )
    ag.add_argument(
        "--verify-key",
        metavar="PEM",
        help="coordinator's Ed25519 public key: refuse assignments whose signature fails",
    )
    ag.add_argument("--limits", default="auto", choices=["auto", "cgroup", "rlimit", "none"])
    ag.add_argument(
        "--task-identity",
        metavar="DIR",
        help="where the worker identity's files are (DIR/ca.crt, DIR/worker-NAME.crt and "
        ".key): handed to tasks that ask for it (inference workers), never the agent's own",
    )
    ag.add_argument(
        "--task-identity-name",
        metavar="NAME",
        help="with --task-identity: the worker identity's name (default: the node id)",
    )
    ag.add_argument(
        "--simulate",
        type=int,
        default=0,
        metavar="N",
        help="run N simulated (hollow) nodes instead of a real agent",
    )
    ag.add_argument("--seed", type=int, default=0, help="inventory mix seed for --simulate")
    ag.add_argument("--prefix", default="hollow", help="with --simulate: node ids PREFIX-NNNN")
    ag.add_argument(
        "--cpus",
        type=int,
        default=0,
        help="with --simulate: every node has this many cores (4 GiB each), no GPUs, "
        "instead of the standard mix (for like-for-like comparisons)",
    )
    ag.add_argument(
        "--kill-tasks-on-exit",
        action="store_true",
        help="stop running tasks when the agent stops (default: leave them to be re-adopted)",
    )

    co = sub.add_parser("coordinator", help="run a coordinator candidate")
    co.add_argument("--id", dest="candidate_id", default=None)
    co.add_argument("--lease-ttl", type=float, default=2.0)
    co.add_argument("--replicas", type=int, default=1, help="replicas of the region's streams")
    co.add_argument(
        "--suspect-after",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="a node silent this long gets no new placements",
    )
    co.add_argument(
        "--down-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a node silent this long is down: its tasks are LOST and placed again",
    )
    co.add_argument(
        "--starve-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a gang that has waited this long holds the line until it fits (starvation "
        "guard; default 30)",
    )
    co.add_argument(
        "--signing-key", metavar="PEM", help="Ed25519 private key: sign every assignment"
    )

    job = sub.add_parser("job", help="submit and manage jobs").add_subparsers(
        dest="job_cmd", required=True
    )
    run = job.add_parser("run", help="submit a job spec (YAML)")
    run.add_argument("file", help="spec file, or - for stdin")
    run.add_argument("--wait", action="store_true", help="wait; exit 0 only if it SUCCEEDED")
    run.add_argument("--timeout", type=float, default=3600.0)
    run.add_argument("--client-id", help="idempotency key (default: random)")
    st = job.add_parser("status", help="a job's state, tasks and why it waits")
    st.add_argument("job_id")
    ls = job.add_parser("list", help="recent jobs")
    ls.add_argument("--state")
    ls.add_argument("--pool")
    ls.add_argument("--limit", type=int, default=50)
    kill = job.add_parser("kill", help="kill a job")
    kill.add_argument("job_id")
    kill.add_argument("--reason", default="")
    lg = job.add_parser("logs", help="a task's log, from the agent that ran it")
    lg.add_argument("job_id")
    lg.add_argument("--task")
    lg.add_argument("--stderr", action="store_true")
    lg.add_argument("--tail", type=int, default=64 * 1024, help="bytes from the end")

    pool = sub.add_parser("pool", help="resource pools").add_subparsers(
        dest="pool_cmd", required=True
    )
    pa = pool.add_parser("apply", help="replace the pool tree with a YAML file's")
    pa.add_argument("file", help="pools file, or - for stdin")
    pool.add_parser(
        "list", help="pools with reservation, limit, share, demand, allocation, entitlement"
    )
    pg = pool.add_parser("get", help="one pool")
    pg.add_argument("path")

    node = sub.add_parser("node", help="nodes").add_subparsers(dest="node_cmd", required=True)
    node.add_parser("list", help="nodes with capacity and load")
    ng = node.add_parser("get", help="one node")
    ng.add_argument("node_id")

    cl = sub.add_parser("cluster", help="region").add_subparsers(dest="cluster_cmd", required=True)
    cl.add_parser("info", help="leader, term, node and job counts")

    load.add_parser(sub)
    certs.add_parser(sub)
    infer.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup(args.log_level)
    insecure = args.insecure or getattr(args, "up_insecure", False)
    ctx = load_context(args.nats, args.region, args.certs, user_flag=args.user, insecure=insecure)
    try:
        if args.cmd == "certs":
            return certs.run(args, args.certs, ctx.region)
        if args.cmd == "up":
            return _up(args, ctx)
        if args.cmd == "demo":
            from mesh.cli.demo import run_demo

            return run_demo(args.sim_nodes)
        try:
            if args.cmd == "agent":
                return asyncio.run(_agent(args, ctx))
            if args.cmd == "coordinator":
                return asyncio.run(_coordinator(args, ctx))
        except (TlsConfigError, IdentityError) as exc:
            print(f"mesh {args.cmd}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if args.cmd == "load":
            try:  # before connecting: a bad value needs no mesh to be reported
                args.workload = load.workload(args)
            except ValueError as exc:
                print(f"mesh load: {exc}", file=sys.stderr)
                return EXIT_USAGE
            if args.dry_run:
                summary = load.describe(args.workload)
                _out(args, summary, load.workload_line(summary))
                return EXIT_OK
        if args.cmd in ("model", "infer"):
            problem = infer.check_args(args)
            if problem is not None:
                print(f"mesh {args.cmd}: {problem}", file=sys.stderr)
                return EXIT_USAGE
            if args.cmd == "model" and args.model_cmd == "deploy":
                text = _read_checked(args.file, parse_model_spec)
                if text is None:
                    return EXIT_USAGE
                args.model_spec = parse_model_spec(text)
        return asyncio.run(_client_command(args, ctx))
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------- servers


def _up(args: argparse.Namespace, ctx: Context) -> int:
    from mesh.cli.launcher import LocalMesh, LocalMeshConfig

    state_dir = Path(args.state_dir) if args.state_dir else mesh_home() / "up"
    mesh = LocalMesh(
        LocalMeshConfig(
            state_dir=state_dir,
            region=ctx.region,
            candidates=args.candidates,
            real_agent=not args.no_agent,
            sim_nodes=args.sim_nodes,
            port=args.port,
            log_level=args.log_level,
            secure=not (args.insecure or args.up_insecure),
            nats_servers=args.nats_cluster,
            inference_workers=args.inference_workers,
        )
    )
    if args.inference_workers < 0 or (args.inference_workers and args.no_agent):
        print(
            "mesh up: --inference-workers must be 0 or more, and needs this machine's agent "
            "(not --no-agent) to run the workers",
            file=sys.stderr,
        )
        return EXIT_USAGE
    stop = asyncio.Event()

    async def run() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        mesh.start()
        info = await mesh.wait_ready()
        inference_job = await mesh.deploy_inference() if args.inference_workers else None
        path = save_context(mesh.context())
        print(
            f"mesh is up: {mesh.url} (region {ctx.region}, leader {info['leader']}, "
            f"{info['nodes'].get('ready', 0)} nodes, "
            f"{'TLS, certificates in ' + str(mesh.certs_dir) if mesh.certs_dir else 'INSECURE'})"
        )
        if inference_job is not None:
            print(
                f"inference: router up; model {infer.DEFAULT_MODEL} served by "
                f"{args.inference_workers} worker{'s' if args.inference_workers > 1 else ''} "
                f"(job {inference_job}); "
                f"try `mesh infer load --rate 500`"
            )
        print(f"context written to {path}; logs in {state_dir / 'logs'}; Ctrl-C stops it all")
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                mesh.check_children()
        return EXIT_OK

    try:
        return asyncio.run(run())
    finally:
        mesh.stop()
        print("mesh stopped", file=sys.stderr)


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _agent(args: argparse.Namespace, ctx: Context) -> int:
    if args.simulate:
        from agent.hollow import GiB, HollowFleet, Inventory

        uniform = [Inventory(args.cpus, args.cpus * 4 * GiB)] * args.simulate if args.cpus else None
        fleet = HollowFleet(
            ctx.url,
            ctx.region,
            args.simulate,
            seed=args.seed,
            heartbeat_s=args.heartbeat,
            inventories=uniform,
            verify_key=args.verify_key,
            prefix=args.prefix,
            tls=ctx.tls(Identity.fleet(args.prefix)),
        )
        await fleet.start()
        try:
            await _until_signal()
        finally:
            await fleet.stop()
        return EXIT_OK
    from agent.service import Agent, AgentConfig, default_node_id

    node_id = args.node_id or default_node_id()
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"--label {item!r}: expected KEY=VALUE", file=sys.stderr)
            return EXIT_USAGE
        labels[key] = value
    task_tls = None
    if args.task_identity:
        name = args.task_identity_name or node_id
        task_tls = ClientTls.for_identity(Path(args.task_identity).resolve(), Identity.worker(name))
    agent = Agent(
        AgentConfig(
            nats_url=ctx.url,
            region=ctx.region,
            node_id=node_id,
            zone=args.zone,
            labels=labels,
            data_dir=args.data_dir or str(mesh_home() / "agent" / node_id),
            heartbeat_s=args.heartbeat,
            run_as=args.run_as,
            allow_root=args.allow_root,
            verify_key=args.verify_key,
            limits=args.limits,
            tls=ctx.tls(Identity.agent(node_id)),
            task_tls=task_tls if ctx.certs else None,
        )
    )
    await agent.start()
    try:
        await _until_signal()
    finally:
        await agent.stop(kill_tasks=args.kill_tasks_on_exit)
    return EXIT_OK


async def _coordinator(args: argparse.Namespace, ctx: Context) -> int:
    from coordinator.scheduling import PlacementConfig
    from coordinator.service import Coordinator, CoordinatorConfig

    if not 0 < args.suspect_after <= args.down_after:
        print("--suspect-after must be > 0 and <= --down-after", file=sys.stderr)
        return EXIT_USAGE
    placement = PlacementConfig()
    if args.starve_after is not None:
        try:
            placement = PlacementConfig(starve_after_s=args.starve_after)
        except ValueError as exc:
            print(f"--starve-after: {exc}", file=sys.stderr)
            return EXIT_USAGE

    coord = Coordinator(
        CoordinatorConfig(
            nats_url=ctx.url,
            region=ctx.region,
            candidate_id=args.candidate_id or f"coordinator-{uuid.uuid4().hex[:6]}",
            lease_ttl=args.lease_ttl,
            signing_key=args.signing_key,
            replicas=args.replicas,
            placement=placement,
            suspect_after=args.suspect_after,
            down_after=args.down_after,
            connect_options=ctx.connect_options(Identity.coordinator()),
        )
    )
    await coord.start()
    try:
        await _until_signal()
    finally:
        await coord.stop()
    return EXIT_OK


# ---------------------------------------------------------------- client commands


async def _client_command(args: argparse.Namespace, ctx: Context) -> int:
    try:
        options = ctx.connect_options(Identity.user(ctx.user))
    except (TlsConfigError, IdentityError) as exc:
        print(f"mesh: {exc} (or --insecure for a mesh without TLS)", file=sys.stderr)
        return EXIT_USAGE
    try:
        nc = await connect(
            ctx.url, name="mesh-cli", reconnect=False, connect_timeout=2.0, **options
        )
    except Exception as exc:
        print(
            f"cannot reach NATS at {ctx.url}: {exc or type(exc).__name__} "
            "(is `mesh up` running? set --nats or MESH_NATS_URL)",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    client = MeshClient(nc, ctx.region)
    try:
        if args.cmd == "infer":
            return await _infer(args, client, ctx.url, options.get("tls"))
        return await _dispatch(args, client)
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


def _out(args: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else human)


async def _dispatch(args: argparse.Namespace, client: MeshClient) -> int:
    if args.cmd == "load":
        summary = await load.run_load(args, client, args.workload)
        _out(args, summary, load.human(summary))
        return EXIT_OK if not summary["errors"] else EXIT_FAILED
    if args.cmd == "job":
        return await _job(args, client)
    if args.cmd == "pool":
        return await _pool(args, client)
    if args.cmd == "model":
        if args.model_cmd == "deploy":
            job_id = await infer.deploy(client, args.model_spec, client_id=args.client_id)
            _out(args, {"job_id": job_id, "model": args.model_spec.name}, job_id)
            return EXIT_OK
        rows = await infer.model_jobs(client, active_only=not args.all, limit=args.limit)
        data = [{"model": name, **job} for name, job in rows]
        _out(args, data, infer.models_table(rows))
        return EXIT_OK
    if args.cmd == "node":
        if args.node_cmd == "list":
            nodes = await client.nodes()
            _out(args, nodes, render.nodes_table(nodes))
        else:
            node = await client.node(args.node_id)
            _out(args, node, json.dumps(node, indent=2))
        return EXIT_OK
    info = await client.cluster_info()
    human = "\n".join(f"{k:10} {v}" for k, v in info.items() if k != "ok")
    _out(args, info, human)
    return EXIT_OK


async def _infer(
    args: argparse.Namespace, client: MeshClient, url: str, tls: ClientTls | None
) -> int:
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    if args.infer_cmd == "load":
        result = await infer.run_load(args, url, client.region, tls)
        _out(args, result, infer.load_line(result))
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
        _out(args, reply, human)
        return EXIT_OK
    if args.json:
        _out(args, reply, "")
    print(f"error: {reply['error']['code']}: {reply['error']['message']}", file=sys.stderr)
    return EXIT_FAILED


def _read_checked(path: str, check) -> str | None:
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
        text = _read_checked(args.file, parse_pool_tree)
        if text is None:
            return EXIT_USAGE
        paths = await client.pool_apply(text)
        _out(args, {"pools": paths}, f"applied {len(paths)} pools: {', '.join(paths)}")
        return EXIT_OK
    if args.pool_cmd == "list":
        pools = await client.pools()
        _out(args, pools, render.pools_table(pools))
        return EXIT_OK
    pool = await client.pool(args.path)
    human = (
        render.pools_table([pool])
        + "\njobs: "
        + (", ".join(f"{k.lower()} {v}" for k, v in sorted(pool["jobs"].items())) or "none")
    )
    _out(args, pool, human)
    return EXIT_OK


async def _job(args: argparse.Namespace, client: MeshClient) -> int:
    if args.job_cmd == "run":
        text = _read_checked(args.file, parse_job_spec)
        if text is None:
            return EXIT_USAGE
        job_id = await client.submit(text, client_id=args.client_id)
        if not args.wait:
            _out(args, {"job_id": job_id}, job_id)
            return EXIT_OK
        if not args.json:
            print(f"submitted {job_id}; waiting", file=sys.stderr)
        job = await client.wait(job_id, timeout=args.timeout, poll=0.1)
        _out(args, job, render.job_detail(job))
        return EXIT_OK if job["state"] == "SUCCEEDED" else EXIT_FAILED
    if args.job_cmd == "status":
        job = await client.job(args.job_id)
        _out(args, job, render.job_detail(job))
        return EXIT_OK
    if args.job_cmd == "list":
        jobs = await client.jobs(args.state, args.pool, args.limit)
        _out(args, jobs, render.jobs_table(jobs) if jobs else "no jobs")
        return EXIT_OK
    if args.job_cmd == "kill":
        await client.kill(args.job_id, args.reason)
        _out(
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
        _out(args, reply, "")
    else:
        sys.stdout.write(reply["data"].decode(errors="replace"))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
