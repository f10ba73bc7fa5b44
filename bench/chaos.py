"""`python -m bench chaos --minutes N`: a region under random SIGKILLs; nothing
acknowledged may be lost, no task may run twice at once.

A 3-server NATS cluster (streams and the lease bucket with 3 replicas), `--coordinators`
coordinator processes, one hollow fleet process (`--nodes` simulated nodes). A steady
load of short simulated jobs (a share of them 4-task gangs) is submitted with client
ids and retried until acknowledged: acknowledged = the API returned a job id.

Meanwhile, one at a time, at random: SIGKILL the leader, a follower, the fleet process
or one NATS server (never two servers at once), and restart it. The fleet is restarted
after the down deadline (10 s): a hollow node keeps its tasks in memory only, so a
fleet back sooner has forgotten tasks the coordinator still holds running on it
(docs/reliability.md, "known gaps").

At the end, from the job log (read whole, by sequence) and the API:
- lost: acknowledged jobs not in the final state, or never finished; must be 0;
- ran twice: tasks with a duplicate run in the fleet's own ledger (agent/ledger.py:
  every run the hollow nodes started, each fleet process writing its own file; a killed
  process's open runs end when it was killed): run again after it succeeded, the same
  attempt run twice, or two runs at once; must be 0. Apart, as before, from the log:
  tasks whose RUNNING intervals (RUNNING -> the attempt's end, event timestamps)
  overlap across attempts or nodes (`log_overlaps`);
- failovers: leader SIGKILL -> the next LeaderElected on the log (its writer's wall
  clock; one machine, one clock): p50/p99/max.
The evidence (chaos actions, every log event, each job's outcome) is written as JSON
lines to a file whose path is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
import uuid
from collections import defaultdict
from pathlib import Path

from agent.ledger import count_duplicates, read_runs
from bench._util import (
    loadavg,
    machine,
    mesh_command,
    spawn,
    stop_process,
    summary_ms,
    survivors,
    with_state_dir,
)
from mesh import subjects
from mesh.client import MeshClient
from mesh.codec import decode, to_wire
from mesh.connect import close_quietly, connect
from mesh.lease import open_lease_bucket
from mesh.schema import ApiError, LeaderElected, LogEntry, TaskUpdated
from mesh.server import EmbeddedServer, ServerConfig, free_port
from mesh.streams import ensure_streams

REGION = "chaos"
FINISHED = {"SUCCEEDED", "FAILED", "KILLED"}
ENDS = {"SUCCEEDED", "FAILED", "KILLED", "LOST", "PREEMPTED"}
DOWN_AFTER_S = 10.0  # the coordinator's default down deadline


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench chaos", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--nodes", type=int, default=200, help="hollow nodes in the fleet process")
    p.add_argument("--coordinators", type=int, default=3)
    p.add_argument("--rate", type=float, default=8.0, help="jobs submitted per second")
    p.add_argument("--gang-share", type=float, default=0.2, help="share of jobs that are gangs")
    p.add_argument("--kill-every", type=float, default=8.0, help="mean seconds between kills")
    p.add_argument(
        "--fleet-down",
        type=float,
        default=DOWN_AFTER_S + 1.0,
        help="seconds the fleet stays dead (default: past the down deadline)",
    )
    p.add_argument(
        "--only", choices=["leader", "follower", "fleet", "nats"], help="one kind of kill only"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--drain", type=float, default=120.0, help="seconds to let jobs end")
    p.add_argument("--state-dir", help="keep state, logs and evidence here (default: temp)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 9 s, 20 nodes, a kill every 3 s, 15 s to drain",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.minutes, args.nodes, args.rate, args.kill_every, args.drain = 0.15, 20, 4.0, 3.0, 15.0
    return args


class Chaos:
    def __init__(self, d: Path, args: argparse.Namespace) -> None:
        self.dir = d
        self.args = args
        ports = [free_port() for _ in range(3)]
        self.servers = [
            EmbeddedServer(
                ServerConfig(
                    store_dir=str(d / f"nats{i}"),
                    server_name=f"n{i}",
                    cluster_name="chaos",
                    cluster_port=ports[i],
                    cluster_routes=[f"nats://127.0.0.1:{p}" for j, p in enumerate(ports) if j != i],
                )
            )
            for i in range(3)
        ]
        self.url = ""
        self.coords: dict[str, object] = {}
        self.fleet = None
        self.ledgers: list[list] = []  # [ledger file, when its fleet process was killed]
        self.actions: list[dict] = []
        self.pids: list[int] = []

    def start_servers(self) -> None:
        for s in self.servers:
            s.start()
        self.url = ",".join(s.url for s in self.servers)

    def start_coordinator(self, cid: str) -> None:
        cmd = mesh_command(self.url, REGION, "coordinator", "--id", cid, log_level="info")
        self.coords[cid] = spawn(cmd, self.dir / "logs" / f"{cid}.log")
        self.pids.append(self.coords[cid].pid)

    def start_fleet(self) -> None:
        ledger = self.dir / "ledger" / f"fleet-{len(self.ledgers) + 1}.jsonl"
        self.ledgers.append([ledger, None])
        cmd = mesh_command(
            self.url, REGION, "agent", "--simulate", str(self.args.nodes), "--cpus", "8",
            "--ledger", str(ledger),
        )  # fmt: skip
        self.fleet = spawn(cmd, self.dir / "logs" / "fleet.log")
        self.pids.append(self.fleet.pid)

    def note(self, action: str, target: str) -> float:
        t = time.time()
        self.actions.append({"kind": "chaos", "ts": t, "action": action, "target": target})
        print(f"  {time.strftime('%H:%M:%S')} {action} {target}", flush=True)
        return t

    def stop(self) -> list[int]:
        stop_process(self.fleet)
        for p in self.coords.values():
            stop_process(p)
        for s in self.servers:
            s.stop()
        return survivors(self.pids)


def main(argv: list[str]) -> dict:
    args = parse(argv)
    return with_state_dir(args.state_dir, "mesh-bench-chaos-", lambda d: _main(args, d))


def _main(args: argparse.Namespace, d: Path) -> dict:
    chaos = Chaos(d, args)
    try:
        chaos.start_servers()
        result = asyncio.run(_run(args, chaos))
    finally:
        left = chaos.stop()
    result["left_behind"] = len(left)
    return result


async def _wait_js(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(Exception):
            nc = await connect(url, name="chaos-probe")
            try:
                await nc.jetstream().account_info()
                return
            finally:
                await close_quietly(nc)
        if time.monotonic() > deadline:
            raise RuntimeError("JetStream did not come up on the cluster")
        await asyncio.sleep(0.3)


def _spec(rng: random.Random, gang_share: float) -> dict:
    dur = f"{rng.uniform(0.5, 3.0):.1f}s"
    if rng.random() < gang_share:
        return {
            "name": "gang",
            "tasks": [{"role": "w", "count": 4, "simulate": {"duration": dur}}],
            "placement": {"gang": True},
        }
    return {"name": "one", "tasks": [{"role": "w", "simulate": {"duration": dur}}]}


async def _run(args: argparse.Namespace, chaos: Chaos) -> dict:
    rng = random.Random(args.seed)
    await _wait_js(chaos.url)
    nc = await connect(chaos.url, name="chaos-client")
    js = nc.jetstream(timeout=5.0)
    # Replicas 3 for everything the region keeps, created before any process asks for 1.
    await ensure_streams(js, REGION, replicas=3)
    kv = await open_lease_bucket(js, subjects.lease_bucket(REGION), ttl=2.0, replicas=3)
    for i in range(1, args.coordinators + 1):
        chaos.start_coordinator(f"c{i}")
    chaos.start_fleet()
    client = MeshClient(nc, region=REGION, timeout=2.0)
    t_ready = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            info = await client.cluster_info()
            if info["leader"] and info["nodes"].get("ready", 0) >= args.nodes:
                break
        if time.monotonic() - t_ready > 60:
            raise RuntimeError("region did not become ready")
        await asyncio.sleep(0.3)
    print(f"chaos: {machine()}, load {loadavg()}; region ready; {args.minutes} min of chaos")

    acked: dict[str, str] = {}  # client id -> job id
    unacked = 0
    stop = asyncio.Event()

    async def submit_one(spec: dict) -> None:
        nonlocal unacked
        cid = uuid.uuid4().hex
        while not stop.is_set():
            try:
                acked[cid] = await client.submit(spec, client_id=cid, retries=0)
                return
            except ApiError:
                await asyncio.sleep(0.2)  # same client id: a retry never makes a second job
            except Exception:
                await asyncio.sleep(0.2)
        unacked += 1

    async def load() -> None:
        inflight: set[asyncio.Task] = set()
        while not stop.is_set():
            t = asyncio.create_task(submit_one(_spec(rng, args.gang_share)))
            inflight.add(t)
            t.add_done_callback(inflight.discard)
            await asyncio.sleep(rng.expovariate(args.rate))
        await asyncio.gather(*inflight, return_exceptions=True)

    async def holder() -> str | None:
        with contextlib.suppress(Exception):
            e = await kv.get(subjects.LEADER_KEY)
            if e.value and e.operation is None:
                return e.value.decode()
        return None

    leader_kills: list[float] = []

    async def monkey() -> None:
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * args.kill_every)
            if time.monotonic() >= end:
                break
            action = args.only or rng.choice(["leader", "follower", "fleet", "nats"])
            if action in ("leader", "follower"):
                lead = await holder()
                pool = [c for c in chaos.coords if (c == lead) == (action == "leader")]
                if not pool:
                    continue
                cid = rng.choice(pool)
                proc = chaos.coords[cid]
                proc.kill()
                proc.wait()
                t = chaos.note(f"kill -9 {action}", cid)
                if action == "leader":
                    leader_kills.append(t)
                await asyncio.sleep(rng.uniform(1.0, 3.0))
                chaos.start_coordinator(cid)
                chaos.note("restart", cid)
            elif action == "fleet":
                chaos.fleet.kill()
                chaos.fleet.wait()
                chaos.ledgers[-1][1] = chaos.note("kill -9", "fleet")
                await asyncio.sleep(args.fleet_down)
                chaos.start_fleet()
                chaos.note("restart", "fleet")
            else:
                s = rng.choice(chaos.servers)
                await asyncio.to_thread(s.kill)
                chaos.note("kill -9 nats", s.config.server_name)
                await asyncio.sleep(rng.uniform(2.0, 5.0))
                await asyncio.to_thread(s.start, 20.0)
                chaos.note("restart nats", s.config.server_name)

    t0 = time.time()
    load_task = asyncio.create_task(load())
    await monkey()
    stop.set()
    await load_task
    print(f"chaos over after {time.time() - t0:.0f}s; {len(acked)} jobs acknowledged; draining")

    # Drain: every acknowledged job must end.
    outcome: dict[str, str] = {}
    deadline = time.monotonic() + args.drain
    pending = set(acked.values())
    while pending and time.monotonic() < deadline:
        for job_id in list(pending):
            try:
                job = await client.job(job_id)
            except ApiError as exc:
                outcome[job_id] = f"error: {exc}"
                continue
            except Exception:
                continue
            outcome[job_id] = job["state"]
            if job["state"] in FINISHED:
                pending.discard(job_id)
        if pending:
            await asyncio.sleep(1.0)

    log = await _read_log(js)
    result = _judge(log, acked, outcome, leader_kills, chaos.actions)
    result.update(_ledger_duplicates(chaos.ledgers))
    result.update(
        minutes=args.minutes,
        nodes=args.nodes,
        coordinators=args.coordinators,
        replicas=3,
        sync_interval=chaos.servers[0].config.sync_interval,
        acknowledged=len(acked),
        never_acknowledged=unacked,
        kills=sum(1 for a in chaos.actions if a["action"].startswith("kill")),
        kills_by_kind={
            k: sum(1 for a in chaos.actions if a["action"].startswith("kill") and k in a["action"])
            for k in ("leader", "follower", "nats")
        }
        | {
            "fleet": sum(
                1 for a in chaos.actions if a["target"] == "fleet" and "kill" in a["action"]
            )
        },
        log_entries=len(log),
        machine=machine(),
    )
    evidence = chaos.dir / "chaos-events.jsonl"
    with open(evidence, "w") as f:
        for a in chaos.actions:
            f.write(json.dumps(a) + "\n")
        for seq, e in log:
            for ev in e.events:
                row = {"kind": "log", "seq": seq, "term": e.term, "writer": e.leader_id}
                row["event"] = type(ev).__name__
                wire = to_wire(ev)
                if isinstance(wire, dict):
                    wire.pop("spec", None)
                    row.update({k: v for k, v in wire.items() if k not in row})
                f.write(json.dumps(row, default=str) + "\n")
        for cid, job_id in acked.items():
            f.write(
                json.dumps(
                    {
                        "kind": "job",
                        "client_id": cid,
                        "job_id": job_id,
                        "state": outcome.get(job_id),
                    }
                )
                + "\n"
            )
        f.write(json.dumps({"kind": "result", **result}, default=str) + "\n")
    result["evidence"] = str(evidence)
    result["targets"] = {
        "lost_eq_0": result["jobs_lost"] == 0,
        "ran_twice_eq_0": result["tasks_ran_twice"] == 0,
    }
    print(f"evidence: {evidence}")
    print(
        f"acknowledged {len(acked)}, lost {result['jobs_lost']}, ran twice "
        f"{result['tasks_ran_twice']}, failovers {result['failover_ms']}"
    )
    await close_quietly(nc)
    return result


def _ledger_duplicates(ledgers: list[list]) -> dict:
    """The duplicates in the fleet processes' ledgers (agent/ledger.py)."""
    runs = []
    for path, killed_at in ledgers:
        if path.exists():
            runs.extend(read_runs(path, closed_at=killed_at))
    dups = count_duplicates(runs)
    examples = [*dups.after_success[:2], *dups.repeated[:2], *dups.overlapping[:2]]
    return {
        "ledger_runs": len(runs),
        "tasks_ran_twice": len(dups.tasks),
        "duplicates": dups.summary(),
        "ran_twice_examples": [str(e) for e in examples],
    }


async def _read_log(js) -> list[tuple[int, LogEntry]]:
    stream = subjects.log_stream(REGION)
    last = (await js.stream_info(stream)).state.last_seq
    out = []
    for seq in range(1, last + 1):
        for _ in range(5):
            try:
                msg = await js.get_msg(stream, seq)
                out.append((seq, decode(LogEntry, msg.data, max_size=8 * 1024 * 1024)))
                break
            except Exception:
                await asyncio.sleep(0.2)
    return out


def _judge(log, acked: dict, outcome: dict, leader_kills: list[float], actions: list) -> dict:
    submitted = {
        ev.job_id for _, e in log for ev in e.events if type(ev).__name__ == "JobSubmitted"
    }
    lost = [j for j in acked.values() if j not in submitted or outcome.get(j) not in FINISHED]
    # RUNNING intervals per task: (attempt, node, start, end) from event timestamps,
    # entries by deposed terms ignored as every reader ignores them.
    term = 0
    start: dict[tuple[str, int, str], float] = {}
    intervals: dict[str, list[tuple[int, str, float, float]]] = defaultdict(list)
    elected: list[tuple[float, str, int]] = []
    ended: dict[tuple[str, int], dict[str, float]] = {}  # (task, attempt) -> node -> start
    end_ts: dict[tuple[str, int], float] = {}  # (task, attempt) -> its end
    redelivered = 0
    stale_entries = 0
    for _, e in log:
        if e.term < term:
            stale_entries += 1
            continue
        for ev in e.events:
            if isinstance(ev, LeaderElected):
                term = max(term, ev.term)
                elected.append((ev.ts, ev.leader_id, ev.term))
            elif isinstance(ev, TaskUpdated):
                key = (ev.task_id, ev.attempt, ev.node_id)
                if str(ev.state) == "RUNNING":
                    if ended.get(key[:2], {}).get(ev.node_id) == ev.ts:
                        # The same report again (an event redelivered to a new leader
                        # after the attempt ended): the fold ignores it; a copy that
                        # really ran again would report a new start time.
                        redelivered += 1
                        continue
                    if key[:2] in end_ts and ev.node_id not in ended.get(key[:2], {}):
                        # A late start (lifecycle.is_late_start): logged after its end.
                        ended.setdefault(key[:2], {})[ev.node_id] = ev.ts
                        intervals[ev.task_id].append((key[1], ev.node_id, ev.ts, end_ts[key[:2]]))
                        continue
                    start.setdefault(key, ev.ts)
                elif str(ev.state) in ENDS:
                    end_ts.setdefault((ev.task_id, ev.attempt), ev.ts)
                    for k in [k for k in start if k[:2] == (ev.task_id, ev.attempt)]:
                        t0 = start.pop(k)
                        ended.setdefault(k[:2], {})[k[2]] = t0
                        intervals[ev.task_id].append((k[1], k[2], t0, ev.ts))
    now = time.time()
    for (tid, attempt, node), t in start.items():
        intervals[tid].append((attempt, node, t, now))
    twice = []
    for tid, iv in intervals.items():
        iv.sort(key=lambda x: x[2])
        for a, b in zip(iv, iv[1:], strict=False):
            if b[2] < a[3]:
                twice.append({"task": tid, "first": a, "second": b})
    failovers, matched = [], set()
    for t in leader_kills:
        nxt = [ts for ts, _, _ in elected if ts > t]
        if nxt:
            failovers.append(min(nxt) - t)
            matched.add(min(nxt))
    # Elections no leader kill explains: after what, and how long after it.
    other = []
    for ts, leader_id, _ in elected[1:]:
        before = [a for a in actions if a["ts"] < ts and a["action"].startswith("kill")]
        if ts not in matched and before:
            other.append(
                {
                    "leader": leader_id,
                    "after": f"{before[-1]['action']} {before[-1]['target']}",
                    "s": round(ts - before[-1]["ts"], 2),
                }
            )
    s = summary_ms(failovers)
    return {
        "jobs_lost": len(lost),
        "lost_job_ids": lost[:20],
        "jobs_by_state": {
            st: sum(1 for j in acked.values() if outcome.get(j) == st)
            for st in sorted({str(v) for v in outcome.values()})
        },
        "log_overlaps": len(twice),
        "log_overlap_examples": twice[:5],
        "stale_term_entries": stale_entries,
        "running_redelivered_after_end": redelivered,
        "leader_failovers": len(failovers),
        "failover_ms": {k: s.get(k) for k in ("n", "p50", "p99", "max")},
        "elections": len(elected),
        "other_elections": other,
    }
