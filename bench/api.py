"""`python -m bench api`: submit latency and submit throughput of the request API.

A whole local region (LocalMesh: an embedded nats-server, 2 coordinator candidates and
this machine's real agent, on a free port with a temp state dir) and a client in this
process. Three measurements:

1. Latency, sequential, on the idle mesh: single-task jobs running a real command
   (`sleep 0.2`, no shell), one at a time, each waited to its end before the next.
   submit->RUNNING = from just before the `job.submit` request is sent to the moment
   this process observes, on the job log (an ordered push consumer on the stream
   MESH_LOG_<region>), the entry holding the task's `TaskUpdated(RUNNING)`: the moment
   the RUNNING state is durable and visible to every reader. Nothing is polled. The
   same watcher notes when the JobSubmitted, TaskPlaced and STARTING entries appear,
   which splits the latency into stages.
2. Throughput: concurrent submits (16 and 64 in flight) of simulated jobs onto a few
   hollow nodes, for a fixed window each; acknowledged submits per second and the ack
   latency under load; CPU of every process in the window shows who saturates.
3. Baseline in the same run: a plain NATS request/reply to a trivial echo responder (a
   bare nats-py process on the same server), sequential and at the same concurrency, so
   `ratio` says how many plain round trips one submit costs.

The region is secure, as `mesh up` runs it (TLS, client certificates, per-identity
permissions, signed assignments), and so is the baseline: the bench submits as the
region's user, the echo responder answers as the router identity on an inference
subject the user may send to (no router runs here), both over the same TLS server; the
log watcher reads the job log as the coordinator identity, the one that may.
`--insecure` runs both without TLS or permissions, as the first recorded runs did.

Targets (issue): submit->RUNNING p50 <= 50 ms, p99 <= 200 ms. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import time
import uuid
from pathlib import Path

from bench._util import (
    CpuWindow,
    LogWatcher,
    fmt_ms,
    loadavg,
    machine,
    ratio,
    start_echo,
    stop_process,
    summary_ms,
    survivors,
    with_state_dir,
)
from mesh import subjects
from mesh.cli.launcher import ROUTER_NAME, LocalMesh, LocalMeshConfig
from mesh.client import MeshClient
from mesh.codec import encode
from mesh.connect import close_quietly, connect
from mesh.schema import ApiError, SubmitRequest
from mesh.security.identity import Identity

REGION = "bench"
ENDED = ("SUCCEEDED", "FAILED", "KILLED", "LOST")
ECHO = subjects.infer(REGION, "bench-echo")  # the user may request, the router answer


def latency_spec(command: list[str]) -> str:
    args = ", ".join(f'"{a}"' for a in command)
    return (
        "name: lat\ntasks:\n  - role: main\n"
        f"    command: [{args}]\n    resources: {{cpu: 100m, memory: 64Mi}}\n"
    )


def sim_spec(duration: float) -> str:
    return (
        "name: tput\ntasks:\n  - role: main\n"
        f"    simulate: {{duration: {duration}s}}\n"
        "    resources: {cpu: 100m, memory: 64Mi}\n"
    )


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench api", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=200, help="measured sequential jobs")
    p.add_argument("--warmup", type=int, default=10, help="sequential jobs not measured")
    p.add_argument(
        "--command", default="sleep 0.2", help="the latency jobs' argv (split on spaces)"
    )
    p.add_argument("--echo", type=int, default=1000, help="sequential echo round trips")
    p.add_argument("--concurrency", default="1,16,64", help="in-flight submits, comma separated")
    p.add_argument("--window", type=float, default=10.0, help="seconds per throughput window")
    p.add_argument("--sim-nodes", type=int, default=4, help="hollow nodes for the throughput jobs")
    p.add_argument("--sim-duration", type=float, default=0.5, help="simulated job length, s")
    p.add_argument("--quick", action="store_true", help="10 jobs, 1 s windows, 100 echoes")
    p.add_argument("--state-dir", help="keep state and logs here (default: a temp dir)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="the region and the echo baseline without TLS or permissions (`mesh up --insecure`; "
        "how the figures before the secure default were taken)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.jobs, args.warmup, args.echo, args.window = 10, 2, 100, 1.0
    args.levels = [int(x) for x in args.concurrency.split(",") if x]
    return args


def main(argv: list[str]) -> dict:
    args = parse(argv)
    return with_state_dir(args.state_dir, "mesh-bench-api-", lambda d: _main(args, d))


def _main(args: argparse.Namespace, state_dir: Path) -> dict:
    mesh = LocalMesh(
        LocalMeshConfig(
            state_dir=state_dir,
            region=REGION,
            candidates=2,
            real_agent=True,
            port=0,
            sim_nodes=args.sim_nodes,  # admitted now, started after the latency phase
            start_sim_nodes=False,
            secure=not args.insecure,
        )
    )
    echo = None
    pids: list[int] = []
    try:
        mesh.start()
        pids = [mesh.server.proc.pid, *(p.pid for p in mesh.children.values())]
        echo = start_echo(mesh.url, ECHO, tls=mesh.tls(Identity.router(ROUTER_NAME)))
        pids.append(echo.pid)
        result = asyncio.run(_run(args, mesh, pids))
    finally:
        stop_process(echo)
        pids += [p.pid for p in mesh.children.values()]
        mesh.stop()
    left = survivors(pids)
    print(f"stopped everything; processes left behind: {left or 'none'}")
    result["left_behind"] = len(left)
    return result


async def _run(args: argparse.Namespace, mesh: LocalMesh, pids: list[int]) -> dict:
    t0 = time.monotonic()
    load_start = loadavg()
    info = await mesh.wait_ready()
    print(
        f"{machine()}, load {load_start}; mesh ready in {time.monotonic() - t0:.1f}s: "
        f"{mesh.url}, leader {info['leader']}, nodes {info['nodes']}; {_security(mesh)}"
    )
    nc = await connect(mesh.url, name="bench-api", **mesh.client_options())
    client = MeshClient(nc, REGION, timeout=10.0)
    log_nc = await connect(mesh.url, name="bench-api-log", tls=mesh.tls(Identity.coordinator()))
    watcher = LogWatcher(log_nc.jetstream(timeout=5.0), REGION)
    await watcher.start()
    try:
        spec = latency_spec(args.command.split())
        payload = encode(SubmitRequest(uuid.uuid4().hex, spec))
        echo_seq = await _echo_sequential(nc, payload, args.echo)
        print(f"baseline echo round trip ({len(payload)} B): {fmt_ms(echo_seq)}")

        lat = await _latency(client, watcher, spec, args)
        run, ack = lat["submit_to_running_ms"], lat["submit_ack_ms"]
        print(f"submit->RUNNING: {fmt_ms(run)}")
        print(f"submit ack     : {fmt_ms(ack)}")
        for name, s in lat["stages_ms"].items():
            print(f"  {name:50} p50={s['p50']:7.2f} p99={s['p99']:7.2f} ms")
        if lat["timeouts"]:
            print(f"  {lat['timeouts']} jobs did not reach RUNNING in time")

        tput = await _throughput(args, mesh, client, nc, watcher, payload, pids)
        info = await client.cluster_info()
    finally:
        await watcher.stop()
        await close_quietly(log_nc)
        await close_quietly(nc)

    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "loadavg_1m": {"start": load_start, "end": loadavg()},
        "params": {
            "jobs": args.jobs,
            "warmup": args.warmup,
            "command": args.command,
            "echo": args.echo,
            "levels": args.levels,
            "window_s": args.window,
            "sim_nodes": args.sim_nodes,
            "sim_duration_s": args.sim_duration,
            "candidates": 2,
            "secure": mesh.certs_dir is not None,
        },
        "submit_to_running_ms": run,
        "submit_ack_ms": ack,
        "stages_ms": lat["stages_ms"],
        "latency_timeouts": lat["timeouts"],
        "baseline_echo_rtt_ms": echo_seq,
        "ratio_running_p50_over_echo_p50": ratio(run.get("p50"), echo_seq.get("p50")),
        "ratio_ack_p50_over_echo_p50": ratio(ack.get("p50"), echo_seq.get("p50")),
        "throughput": tput,
        "log_entries_seen": watcher.entries,
        "jobs_in_region": sum(info.get("jobs", {}).values()),
        "targets": {
            "running_p50_le_50ms": bool(run.get("p50", 1e9) <= 50.0),
            "running_p99_le_200ms": bool(run.get("p99", 1e9) <= 200.0),
        },
    }


def _security(mesh: LocalMesh) -> str:
    if mesh.certs_dir is None:
        return "INSECURE region (--insecure): no TLS, no permissions, echo baseline alike"
    return "secure region (TLS, certificates, permissions), echo baseline over the same TLS"


async def _echo_sequential(nc, payload: bytes, n: int) -> dict:
    for _ in range(max(20, n // 10)):  # warm-up
        await nc.request(ECHO, payload, timeout=5.0)
    rtts = []
    for _ in range(n):
        t = time.perf_counter()
        await nc.request(ECHO, payload, timeout=5.0)
        rtts.append(time.perf_counter() - t)
    return summary_ms(rtts, 3)


# The path of one submit, as points in wall-clock time: (name, "event"|"observed", stage).
# "event" is the `ts` its writer put in the log event, "observed" when this process saw
# the log entry holding it. Consecutive points give the segments of submit->RUNNING.
POINTS = (
    ("leader handled request", "event", "SUBMITTED"),
    ("JobSubmitted on log", "observed", "SUBMITTED"),
    ("placement decided", "event", "PLACED"),
    ("TaskPlaced on log", "observed", "PLACED"),
    ("agent STARTING", "event", "STARTING"),
    ("agent RUNNING", "event", "RUNNING"),
    ("RUNNING on log", "observed", "RUNNING"),
)


async def _latency(
    client: MeshClient, watcher: LogWatcher, spec: str, args: argparse.Namespace
) -> dict:
    runs, acks, timeouts = [], [], 0
    segments: dict[str, list[float]] = {}
    for i in range(args.warmup + args.jobs):
        t0w, t0 = time.time(), time.perf_counter()
        job_id = await client.submit(spec, client_id=uuid.uuid4().hex)
        t_ack = time.perf_counter()
        try:
            t_run = await watcher.wait(job_id, "RUNNING", 10.0)
            await watcher.wait_any(job_id, ENDED, 10.0)
        except TimeoutError:
            timeouts += 1
            continue
        if i < args.warmup:
            continue
        runs.append(t_run - t0)
        acks.append(t_ack - t0)
        clocks = {"event": watcher.event_ts[job_id], "observed": watcher.observed_wall[job_id]}
        prev, prev_t = "client sent submit", t0w
        for name, kind, stage in POINTS:
            t = clocks[kind].get(stage)
            if t is None:
                continue
            segments.setdefault(f"{prev} -> {name}", []).append(t - prev_t)
            prev, prev_t = name, t
    return {
        "submit_to_running_ms": summary_ms(runs),
        "submit_ack_ms": summary_ms(acks),
        "stages_ms": {k: summary_ms(v) for k, v in segments.items()},
        "timeouts": timeouts,
    }


async def _wait_nodes(client: MeshClient, want: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = await client.cluster_info()
        if info["nodes"].get("ready", 0) >= want:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"fewer than {want} nodes ready after {timeout}s")


async def _throughput(
    args,
    mesh: LocalMesh,
    client: MeshClient,
    nc,
    watcher: LogWatcher,
    payload: bytes,
    pids: list[int],
) -> list[dict]:
    if not args.levels:
        return []
    # Hollow nodes only now, so the latency phase ran on the plain region; LocalMesh
    # admitted them at start and `mesh.stop()` stops them too.
    hollow = mesh.start_hollow()
    pids.append(hollow.pid)
    await _wait_nodes(client, 1 + args.sim_nodes)
    leader = (await client.cluster_info())["leader"]
    procs = {
        "bench": os.getpid(),
        "nats-server": mesh.server.proc.pid,
        **{
            ("leader" if n == leader else "follower" if n.startswith("coord") else n): p.pid
            for n, p in mesh.children.items()
        },
    }
    spec = sim_spec(args.sim_duration)
    out = []
    for level in args.levels:
        cpu = CpuWindow(procs)
        entries, events = watcher.submit_entries, watcher.submit_events
        cpu.start()
        r = await _submit_window(client, spec, level, args.window)
        r["cpu_percent"] = cpu.stop()
        r["loadavg_1m"] = loadavg()
        drained = await _drain(watcher, r.pop("job_ids"), 30.0)
        n = watcher.submit_entries - entries
        r["submits_per_log_entry"] = round((watcher.submit_events - events) / n, 2) if n else None
        echo = await _echo_window(nc, payload, level, args.window / 2)
        r.update(
            {
                "concurrency": level,
                "baseline_echo_per_s": echo["per_s"],
                "baseline_echo_ms": echo["latency_ms"],
                "ratio_echo_per_s_over_acks_per_s": ratio(echo["per_s"], r["acks_per_s"]),
                **drained,
            }
        )
        out.append(r)
        print(
            f"throughput @{level:3} in flight: {r['acks_per_s']:8.1f} acks/s "
            f"(echo {echo['per_s']:8.1f}/s, x{r['ratio_echo_per_s_over_acks_per_s']}); "
            f"ack {fmt_ms(r['ack_latency_ms'])}; errors {r['errors']}"
        )
        print(
            "   % of one core in the window, CPU / waiting for a CPU: "
            + ", ".join(f"{n} {c['cpu']}/{c['runq_wait']}" for n, c in r["cpu_percent"].items())
            + f"; load {r['loadavg_1m']}; submits per log entry {r['submits_per_log_entry']}"
        )
        print(
            f"   all {r['acked']} acked jobs ended {drained['drain_s']}s after the window "
            f"(not ended: {drained['not_ended']}, not in log: {drained['not_in_log']})"
        )
    return out


async def _submit_window(client: MeshClient, spec: str, level: int, window: float) -> dict:
    ids: list[str] = []
    lat: list[float] = []
    errors = 0
    t_start = time.perf_counter()
    stop_at = t_start + window

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            try:
                ids.append(await client.submit(spec, client_id=uuid.uuid4().hex))
            except (ApiError, TimeoutError):
                errors += 1
                continue
            lat.append(time.perf_counter() - t)

    await asyncio.gather(*(worker() for _ in range(level)))
    elapsed = time.perf_counter() - t_start
    return {
        "acked": len(ids),
        "errors": errors,
        "elapsed_s": round(elapsed, 2),
        "acks_per_s": round(len(ids) / elapsed, 1),
        "ack_latency_ms": summary_ms(lat),
        "job_ids": ids,
    }


async def _drain(watcher: LogWatcher, ids: list[str], timeout: float) -> dict:
    """Wait until every acked job ended on the log; how long that took after the window."""
    t0 = time.perf_counter()
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        if all(any(s in watcher.stages.get(j, ()) for s in ENDED) for j in ids):
            break
        await asyncio.sleep(0.1)
    not_ended = sum(1 for j in ids if not any(s in watcher.stages.get(j, ()) for s in ENDED))
    return {
        "drain_s": round(time.perf_counter() - t0, 2),
        "not_ended": not_ended,
        "not_in_log": sum(1 for j in ids if "SUBMITTED" not in watcher.stages.get(j, ())),
    }


async def _echo_window(nc, payload: bytes, level: int, window: float) -> dict:
    lat: list[float] = []
    t_start = time.perf_counter()
    stop_at = t_start + window

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            await nc.request(ECHO, payload, timeout=5.0)
            lat.append(time.perf_counter() - t)

    await asyncio.gather(*(worker() for _ in range(level)))
    elapsed = time.perf_counter() - t_start
    return {"per_s": round(len(lat) / elapsed, 1), "latency_ms": summary_ms(lat)}
