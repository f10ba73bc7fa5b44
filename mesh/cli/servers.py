"""The long-running commands: `mesh up`, `mesh agent` and `mesh coordinator`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import uuid
from pathlib import Path

from mesh import subjects
from mesh.cli import infer
from mesh.cli.context import Context, mesh_home, save_context
from mesh.cli.exitcodes import EXIT_OK, EXIT_USAGE
from mesh.cli.tether import UP_STOP_SIGNALS
from mesh.connect import ClientTls
from mesh.security.identity import Identity
from mesh.signing import KEY_FILE, PUB_FILE, key_path


def up(args: argparse.Namespace, ctx: Context) -> int:
    if args.regions is not None:
        from mesh.cli.federation_up import up_regions

        return up_regions(args, ctx)
    from mesh.cli.certs import site_nodes
    from mesh.cli.launcher import LocalMesh, LocalMeshConfig

    state_dir = Path(args.state_dir) if args.state_dir else mesh_home() / "up"
    mesh = LocalMesh(
        LocalMeshConfig(
            state_dir=state_dir,
            region=ctx.region,
            candidates=args.candidates,
            real_agent=not args.no_agent,
            sim_nodes=args.sim_nodes or 0,
            port=args.port,
            log_level=args.log_level,
            secure=not (args.insecure or args.up_insecure),
            nats_servers=args.nats_cluster,
            inference_workers=args.inference_workers,
            leaf_port=args.leafnodes,
            site_nodes=tuple(args.site_nodes),
        )
    )
    if args.site_nodes and args.leafnodes is None:
        print("mesh up: --site-nodes needs --leafnodes PORT", file=sys.stderr)
        return EXIT_USAGE
    try:
        site_nodes(args.site_nodes)
    except ValueError as exc:
        print(f"mesh up: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
        # SIGHUP: the terminal closed. Stopped as on Ctrl-C, or everything would be
        # left running with nobody to stop it.
        for sig in UP_STOP_SIGNALS:
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
        if mesh.leaf_url:
            print(
                f"edge sites: leaf connections at {mesh.leaf_url} (JetStream domain "
                f"{subjects.HUB_DOMAIN}); `mesh edge up --site S --hub {mesh.leaf_url}`"
            )
        if inference_job is not None:
            print(
                f"inference: router up; model {infer.DEFAULT_MODEL} served by "
                f"{args.inference_workers} worker{'s' if args.inference_workers > 1 else ''} "
                f"(job {inference_job}); "
                f"try `mesh infer load --rate 500`"
            )
        print(f"context written to {path}; logs in {state_dir / 'logs'}; Ctrl-C stops it all")
        if mesh.agent_allows_root:
            print(ROOT_NOTE, flush=True)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                mesh.check_children()
        return EXIT_OK

    try:
        return asyncio.run(run())
    finally:
        # A second hangup (or a terminal gone) must not cut the stop short.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        mesh.stop()
        with contextlib.suppress(OSError):  # stderr may be a closed terminal by now
            print("mesh stopped", file=sys.stderr)


ROOT_NOTE = (
    "mesh up: running as root, so this machine's agent runs tasks as root (--allow-root); "
    "run `mesh up` as an unprivileged user, or agents with `mesh agent --run-as USER`, "
    "to avoid it"
)


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def agent(args: argparse.Namespace, ctx: Context) -> int:
    if args.site and not subjects.is_token(args.site):
        print(f"--site {args.site!r}: expected letters, digits, '_' or '-'", file=sys.stderr)
        return EXIT_USAGE
    from agent.training import check_address, parse_port_range

    try:
        port_range = parse_port_range(args.ports, "--ports")
        address = check_address(args.address, "--address") if args.address else ""
    except ValueError as exc:
        print(f"mesh agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
            verify_key=key_path(args.verify_key, ctx.certs, PUB_FILE),
            prefix=args.prefix,
            tls=ctx.tls(Identity.fleet(args.prefix)),
            ledger_path=args.ledger,
            site=args.site,
        )
        await _start(fleet)
        try:
            await _until_signal()
        finally:
            await fleet.stop()
        return EXIT_OK
    from agent.service import Agent, AgentConfig, AgentStartError, default_node_id

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
            verify_key=key_path(args.verify_key, ctx.certs, PUB_FILE),
            limits=args.limits,
            tls=ctx.tls(Identity.agent(node_id)),
            task_tls=task_tls if ctx.certs else None,
            site=args.site,
            address=address,
            port_range=port_range,
        )
    )
    try:
        await _start(agent)
    except AgentStartError as exc:
        print(f"mesh agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        await _until_signal()
    finally:
        await agent.stop(kill_tasks=args.kill_tasks_on_exit)
    return EXIT_OK


async def coordinator(args: argparse.Namespace, ctx: Context) -> int:
    from coordinator.scheduling import PlacementConfig
    from coordinator.service import Coordinator, CoordinatorConfig

    if not 0 < args.suspect_after <= args.down_after:
        print("--suspect-after must be > 0 and <= --down-after", file=sys.stderr)
        return EXIT_USAGE
    for flag, value in (
        ("--resize-every", args.resize_every),
        ("--progress-timeout", args.progress_timeout),
    ):
        if not value >= 0:
            print(f"{flag} must be >= 0", file=sys.stderr)
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
            # The certs directory's key unless told otherwise: `mesh certs init` put it
            # there, and a coordinator that does not sign has its runs refused by every
            # agent that verifies (it says which it does at start).
            signing_key=key_path(args.signing_key, ctx.certs, KEY_FILE),
            replicas=args.replicas,
            placement=placement,
            suspect_after=args.suspect_after,
            down_after=args.down_after,
            resize_every_s=args.resize_every,
            progress_timeout_s=args.progress_timeout,
            connect_options=ctx.connect_options(Identity.coordinator()),
        )
    )
    await _start(coord)
    try:
        await _until_signal()
    finally:
        await coord.stop()
    return EXIT_OK


async def _start(service) -> None:
    """Start an agent or coordinator; if that fails, release what it had opened before
    the error goes up (to `main`, which prints it on one line and exits non-zero, so a
    supervisor restarts or reports the process)."""
    try:
        await service.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(service.stop(), 5.0)
        raise
