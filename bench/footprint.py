"""`python -m bench footprint`: memory and CPU of an idle real agent, measured from outside.

A local region (LocalMesh: embedded nats-server, 2 coordinator candidates, this
machine's real agent (`mesh agent`, heartbeat every 1 s), port 0, a temp state dir),
left idle: no jobs. After a settling pause (start-up excluded), every process is
sampled for `--seconds`: RSS and USS every second (psutil memory_full_info), CPU as
(user + system time at the end - at the start) / wall time, from psutil cpu_times:
percent of one core. CPU times come in clock ticks (10 ms): over 30 s one tick is 0.03 %.

Baselines, in the same run and window:
- `baseline_idle`: a bare `python -c 'import asyncio, nats; ...'` client connected to the
  same server and idling: what any Python NATS process costs;
- `baseline_publisher`: the same bare client publishing a message of the agent's state
  size every second: what the heartbeat alone costs, so the rest is the agent's probing
  and bookkeeping.
The coordinator leader and follower and nats-server are reported for context.

The region is secure, as `mesh up` runs it, and the baselines connect over the same TLS
with client certificates: the idle client as the region's user, the publisher as the
router identity (to a worker subject nobody listens on: no router or worker runs here).
`--insecure` runs all of it without TLS or permissions, as the first recorded runs did.

Targets (issue): agent RSS <= 60 MB, idle CPU <= 1 %. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import subprocess
import sys
import time
from pathlib import Path

from bench._util import (
    BARE_CONNECT,
    loadavg,
    machine,
    ratio,
    sample_processes,
    stop_process,
    survivors,
    tls_argv,
    with_state_dir,
)
from mesh import subjects
from mesh.cli.launcher import ROUTER_NAME, LocalMesh, LocalMeshConfig
from mesh.client import MeshClient
from mesh.connect import ClientTls, close_quietly, connect
from mesh.security.identity import Identity
from mesh.security.permissions import infer_worker_all

REGION = "bench"

BARE_CLIENT = (
    BARE_CONNECT
    + r"""
import asyncio, sys
async def main():
    nc = await bare_connect(sys.argv[1], sys.argv[4:])
    size = int(sys.argv[2])
    while True:
        if size:
            await nc.publish(sys.argv[3], b"x" * size)
        await asyncio.sleep(1.0)
asyncio.run(main())
"""
)
# A worker's batch subject, which the router identity may publish to.
PUBLISH_TO = infer_worker_all(REGION).rsplit(".", 1)[0] + ".footprint"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench footprint", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seconds", type=float, default=30.0, help="sampling window")
    p.add_argument("--settle", type=float, default=5.0, help="idle seconds before sampling")
    p.add_argument("--quick", action="store_true", help="3 s window, 1 s settle")
    p.add_argument("--state-dir", help="keep state and logs here (default: a temp dir)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="the region and the baselines without TLS or permissions (`mesh up --insecure`; "
        "how the figures before the secure default were taken)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.settle = 3.0, 1.0
    return args


def main(argv: list[str]) -> dict:
    args = parse(argv)
    return with_state_dir(args.state_dir, "mesh-bench-footprint-", lambda d: _main(args, d))


def _bare(url: str, size: int, tls: ClientTls | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", BARE_CLIENT, url, str(size), PUBLISH_TO, *tls_argv(tls)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _main(args: argparse.Namespace, state_dir: Path) -> dict:
    mesh = LocalMesh(
        LocalMeshConfig(
            state_dir=state_dir,
            region=REGION,
            candidates=2,
            real_agent=True,
            port=0,
            secure=not args.insecure,
        )
    )
    bare: list[subprocess.Popen[bytes]] = []
    pids: list[int] = []
    try:
        mesh.start()
        pids = [mesh.server.proc.pid, *(p.pid for p in mesh.children.values())]
        result = asyncio.run(_run(args, mesh, bare))
    finally:
        for proc in bare:
            stop_process(proc)
        mesh.stop()
    left = survivors(pids + [p.pid for p in bare])
    print(f"stopped everything; processes left behind: {left or 'none'}")
    result["left_behind"] = len(left)
    return result


async def _state_size(nc, node_id: str) -> int:
    sub = await nc.subscribe(subjects.state(REGION, node_id))
    try:
        return len((await sub.next_msg(5.0)).data)
    finally:
        await sub.unsubscribe()


async def _run(args: argparse.Namespace, mesh: LocalMesh, bare: list) -> dict:
    load_start = loadavg()
    info = await mesh.wait_ready()
    # The agent's state messages are the coordinators' to read; the API is the user's.
    nc = await connect(mesh.url, name="bench-footprint", tls=mesh.tls(Identity.coordinator()))
    try:
        size = await _state_size(nc, mesh.node_id)
    finally:
        await close_quietly(nc)
    nc = await connect(mesh.url, name="bench-footprint", **mesh.client_options())
    try:
        leader = (await MeshClient(nc, REGION).cluster_info())["leader"]
    finally:
        await close_quietly(nc)
    user, router = mesh.tls(Identity.user(mesh.config.user)), mesh.tls(Identity.router(ROUTER_NAME))
    bare += [_bare(mesh.url, 0, user), _bare(mesh.url, size, router)]
    print(
        f"{machine()}, load {load_start}; mesh ready (leader {leader}, nodes {info['nodes']}); "
        f"agent state message {size} B; settling {args.settle}s, sampling {args.seconds}s; "
        + ("secure region, baselines over the same TLS" if mesh.certs_dir else "INSECURE region")
    )
    await asyncio.sleep(args.settle)
    procs = {
        "agent": mesh.children["agent"].pid,
        "baseline_idle": bare[0].pid,
        "baseline_publisher": bare[1].pid,
        "leader": mesh.children[leader].pid,
        "follower": next(
            p.pid for n, p in mesh.children.items() if n.startswith("coordinator") and n != leader
        ),
        "nats-server": mesh.server.proc.pid,
    }
    t0 = time.monotonic()
    samples = await sample_processes(procs, args.seconds)
    mesh.check_children()
    out = {n: s.as_dict() for n, s in samples.items()}
    for n, d in out.items():
        print(
            f"{n:19} CPU {d['cpu_percent']:6.3f}% of one core  RSS max {d['rss_mib_max']:7.2f} "
            f"MiB (mean {d['rss_mib_mean']:.2f}, USS max {d['uss_mib_max']:.2f})"
        )
    agent, base, pub = out["agent"], out["baseline_idle"], out["baseline_publisher"]
    mib = 1024 * 1024
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "loadavg_1m": {"start": load_start, "end": loadavg()},
        "params": {
            "seconds": round(time.monotonic() - t0, 1),
            "settle_s": args.settle,
            "heartbeat_s": 1.0,
            "state_message_bytes": size,
            "secure": mesh.certs_dir is not None,
        },
        "processes": out,
        "agent_rss_mib": agent["rss_mib_max"],
        "agent_rss_mb": round(agent["rss_mib_max"] * mib / 1e6, 2),
        "agent_cpu_percent": agent["cpu_percent"],
        "ratio_rss_agent_over_idle_client": ratio(agent["rss_mib_max"], base["rss_mib_max"]),
        "ratio_cpu_agent_over_idle_client": ratio(agent["cpu_percent"], base["cpu_percent"]),
        "ratio_cpu_agent_over_publisher": ratio(agent["cpu_percent"], pub["cpu_percent"]),
        "agent_minus_idle_client": {
            "rss_mib": round(agent["rss_mib_max"] - base["rss_mib_max"], 2),
            "uss_mib": round(agent["uss_mib_max"] - base["uss_mib_max"], 2),
            "cpu_percent": round(agent["cpu_percent"] - base["cpu_percent"], 3),
        },
        "targets": {
            "agent_rss_le_60mb": bool(agent["rss_mib_max"] * mib <= 60e6),
            "agent_cpu_le_1pct": bool(agent["cpu_percent"] <= 1.0),
        },
    }
