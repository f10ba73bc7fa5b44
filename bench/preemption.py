"""`python -m bench preemption`: a starved pool's submit to its tasks RUNNING, on a full
simulated region.

A region of N hollow nodes (default 1,000; `mesh agent --simulate N`) and one
coordinator, both as processes. Two pools, /a and /b, each reserving a fifth of the
region's cores. /b fills every core with long simulated tasks while /a is idle, and
queues more. Then /a submits a gang; we time its submit to the moment every one of its
tasks is RUNNING on the job log. That needs /b to be preempted: two preemption cycles of
hysteresis (0.5 s each), the kills, and placement. The baseline, in the same run, is the
same gang submitted to the same region while it has free cores (no preemption needed).
Peloton, for scale, preempts after 5 cycles of 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from nats.js.api import DeliverPolicy

from bench._util import loadavg, machine, mesh_command, ratio, spawn, stop_process, summary_ms
from mesh import subjects
from mesh.client import MeshClient
from mesh.codec import WireError, decode
from mesh.connect import close_quietly, connect
from mesh.schema import LogEntry, TaskUpdated
from mesh.server import EmbeddedServer, ServerConfig

TASK_CPU = 4


class RunningWatch:
    """Per job, when each of its tasks was first seen RUNNING on the job log."""

    def __init__(self) -> None:
        self.running: dict[str, set[str]] = {}
        self.waiters: dict[str, tuple[int, asyncio.Future[float]]] = {}

    async def on_msg(self, msg) -> None:
        try:
            entry = decode(LogEntry, msg.data, max_size=8 * 1024 * 1024)
        except WireError:
            return
        now = time.perf_counter()
        for ev in entry.events:
            if isinstance(ev, TaskUpdated) and ev.state == "RUNNING":
                tasks = self.running.setdefault(ev.job_id, set())
                tasks.add(ev.task_id)
                want = self.waiters.get(ev.job_id)
                if want and len(tasks) >= want[0] and not want[1].done():
                    want[1].set_result(now)

    async def all_running(self, job_id: str, n: int, timeout: float) -> float:
        fut = asyncio.get_running_loop().create_future()
        self.waiters[job_id] = (n, fut)
        if len(self.running.get(job_id, ())) >= n:
            return time.perf_counter()
        return await asyncio.wait_for(fut, timeout)


def gang(name: str, pool: str, tasks: int, seconds: float) -> dict:
    return {
        "name": name,
        "pool": pool,
        "tasks": [
            {
                "role": "w",
                "count": tasks,
                "simulate": {"duration": f"{seconds}s"},
                "resources": {"cpu": TASK_CPU, "memory": "1Gi"},
            }
        ],
    }


async def run(args: argparse.Namespace, work: Path) -> dict:
    server = EmbeddedServer(ServerConfig(store_dir=str(work / "nats"))).start()
    procs = []
    try:
        url = server.url
        procs.append(
            spawn(
                mesh_command(url, "default", "coordinator", "--id", "c1"), work / "coordinator.log"
            )
        )
        procs.append(
            spawn(
                mesh_command(url, "default", "agent", "--simulate", str(args.nodes)),
                work / "hollow.log",
            )
        )
        nc = await connect(url, name="bench-preemption")
        client = MeshClient(nc, timeout=30.0)
        watch = RunningWatch()
        t0 = time.monotonic()
        while True:
            try:
                info = await client.cluster_info()
            except Exception:  # no coordinator answering yet
                info = {"leader": "", "nodes": {}}
            if info["leader"] and info["nodes"].get("ready", 0) >= args.nodes:
                break
            if time.monotonic() - t0 > 120:
                raise TimeoutError(f"region not ready: {info}")
            await asyncio.sleep(0.5)
        startup = time.monotonic() - t0
        sub = await nc.jetstream().subscribe(
            subjects.job_log("default"),
            stream=subjects.log_stream("default"),
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
            cb=watch.on_msg,
        )
        nodes = await client.nodes()
        cores = sum(n["capacity"]["cpu"] for n in nodes) // 1000
        fifth = cores // 5
        await client.pool_apply(
            {
                "pools": {
                    "/a": {"cpu": {"reservation": fifth}},
                    "/b": {"cpu": {"reservation": fifth}},
                }
            }
        )
        print(
            f"region: {args.nodes} hollow nodes, {cores} cores, up in {startup:.1f}s; "
            f"/a and /b reserve {fifth} cores each"
        )

        # Baseline: /a's gang on a region with room.
        baseline = []
        for i in range(args.rounds):
            t = time.perf_counter()
            job = await client.submit(gang(f"idle-{i}", "/a", args.gang, 1.0))
            baseline.append(await watch.all_running(job, args.gang, 60) - t)
            await client.wait(job, timeout=60)

        # Fill the region from /b (a slot per node-fitting task), and queue more.
        slots = sum(
            min(n["capacity"]["cpu"] // (TASK_CPU * 1000), n["capacity"]["memory"] // 2**30)
            for n in nodes
        )
        # Single-task jobs, so no slot is left over by a gang that does not fit.
        t_fill = time.monotonic()
        fill: list[str] = []
        count = int(slots * 1.1)
        for start in range(0, count, 64):
            fill += await asyncio.gather(
                *(
                    client.submit(gang(f"fill-{i}", "/b", 1, 3600.0))
                    for i in range(start, min(count, start + 64))
                )
            )
        while True:
            running = sum(len(watch.running.get(j, ())) for j in fill)
            if running >= slots or time.monotonic() - t_fill > 300:
                break
            await asyncio.sleep(0.5)
        print(f"/b holds {running} of {slots} task slots after {time.monotonic() - t_fill:.1f}s")

        # The measurement: /a's gang on a full region.
        starved = []
        for i in range(args.rounds):
            t = time.perf_counter()
            job = await client.submit(gang(f"starved-{i}", "/a", args.gang, 1.0))
            starved.append(await watch.all_running(job, args.gang, 120) - t)
            print(
                f"  round {i}: /a's {args.gang}-task gang RUNNING after {starved[-1] * 1000:.0f} ms"
            )
            await client.wait(job, timeout=120)
            await asyncio.sleep(2.0)  # /b takes the cores back before the next round
        await sub.unsubscribe()
        await close_quietly(nc)
        s, b = summary_ms(starved), summary_ms(baseline)
        print(
            f"starved pool submit -> all RUNNING: p50 {s['p50']:.0f} ms, max {s['max']:.0f} ms "
            f"(baseline with free cores: p50 {b['p50']:.0f} ms)"
        )
        return {
            "machine": machine(),
            "date": time.strftime("%Y-%m-%d"),
            "loadavg_1m": loadavg(),
            "nodes": args.nodes,
            "cores": cores,
            "gang_tasks": args.gang,
            "slots": slots,
            "startup_s": round(startup, 1),
            "starved_submit_to_running_ms": s,
            "baseline_free_region_ms": b,
            "ratio_p50_starved_over_baseline": ratio(s["p50"], b["p50"]),
            "targets": {"starved_le_2s": s["max"] <= 2000},
        }
    finally:
        for p in procs:
            stop_process(p, timeout=15)
        server.stop()


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench preemption")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gang", type=int, default=10, help="tasks in /a's gang")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="100 nodes, 2 rounds")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds = 100, 2
    with tempfile.TemporaryDirectory(prefix="mesh-bench-preempt-") as tmp:
        return asyncio.run(run(args, Path(tmp)))
