"""`python -m bench training`: how long an elastic torch job takes to train at its new
size after a resize, against restarting it from its checkpoint at that size.

On this machine, in this process: a nats-server, a coordinator (`resize_every_s`
`--resize-every`) and three agents, each offering the host's cores; a worker asks for
all of them, so the three nodes hold exactly three workers. The job is
examples/training/tiny.py under torchrun (`framework: pytorch-elastic`, workers 2..3),
its steps logged by rank 0 in train.jsonl (one clock: one machine).

1. Resize: once the job trains at 3, `job.scale` to 2 and back to 3, `--repeats` times
   each. decision = the wall clock just before `job.scale` is sent (its `JobScaled`
   entry's `ts` is taken within the request, before the reply: `scale_reply_ms` bounds
   the gap); effect = the first step line at the new world size after it. Each resize
   waits for `--settle` steps at the size before, and for `resize_every_s` since the
   last membership change (so the decision is never held by the rate limit).
2. Re-rendezvous share: per resize, the stall = first step at the new size minus the
   last step line before it; the fraction = stalls summed / the elastic run's wall time
   from its first step to its last.
3. Restart baseline: a static `framework: pytorch` job at 2 from its own checkpoint
   dir; killed (`job.kill`) and submitted again at 3, then at 2 (`--restarts` times in
   all), each from the checkpoint; time from the kill to the first step at the new size.

Where the time goes, per resize and restart (medians, seconds): Mesh (decision -> the
newcomer's PLACED and RUNNING for a grow, decision -> the stopped task's end for a
shrink; kill -> job ended -> placed -> RUNNING for a restart), then the new worker
generation's `boot` marks from tiny's start line (its module ran, torch imported, the
gloo group formed, the checkpoint agreed and loaded) and the first step.

Targets (issue 22): `resize_le_10s`: the p50 of each direction <= 10 s;
`resize_3x_faster_than_restart`: restart p50 / resize p50 (both directions) >= 3.
Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import time
from pathlib import Path

import psutil

from agent.service import Agent, AgentConfig
from bench._util import loadavg, machine, ratio, summary_ms, with_state_dir
from coordinator.service import Coordinator, CoordinatorConfig
from mesh.client import MeshClient
from mesh.connect import close_quietly, connect
from mesh.server import EmbeddedServer, ServerConfig

TINY = str(Path(__file__).resolve().parents[1] / "examples" / "training" / "tiny.py")
NODES = 3
CORES = psutil.cpu_count(logical=True) or 1  # what each agent offers (agent/probe.py)
TARGET_S = 10.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench training", description=__doc__)
    p.add_argument("--repeats", type=int, default=3, help="scale-downs and scale-ups each")
    p.add_argument("--restarts", type=int, default=3, help="restarts of the baseline")
    p.add_argument("--settle", type=int, default=20, help="steps at a size before a change")
    p.add_argument("--resize-every", type=float, default=1.0, help="resize_every_s")
    p.add_argument("--step-sleep", type=float, default=0.03, help="tiny's --step-sleep")
    p.add_argument("--timeout", type=float, default=120.0, help="per wait, seconds")
    p.add_argument("--state-dir", help="keep the run's files here")
    p.add_argument("--quick", action="store_true", help="1 of each, fewer steps (CI)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.restarts, args.settle = 1, 1, 8
    return args


def tiny_job(name: str, framework: str, workers, ckpt: Path, stop: Path, args) -> dict:
    command = ["python", TINY, "--steps", "1000000", "--stop-file", str(stop)]
    command += ["--step-sleep", str(args.step_sleep), "--save-every", "10"]
    task = {
        "role": "worker",
        "command": command,
        "env": {"MESH_CHECKPOINT_DIR": str(ckpt), "OMP_NUM_THREADS": "1"},
        "resources": {"cpu": str(CORES), "memory": "512Mi"},
    }
    return {"name": name, "framework": framework, "workers": workers, "tasks": [task]}


# ---------------------------------------------------------------- train.jsonl


def lines(ckpt: Path) -> list[dict]:
    path = ckpt / "train.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def steps(ckpt: Path) -> list[dict]:
    return [x for x in lines(ckpt) if "event" not in x]


def first_at(ckpt: Path, world: int, after: float) -> dict | None:
    return next((x for x in steps(ckpt) if x["world_size"] == world and x["ts"] > after), None)


def start_line(ckpt: Path, world: int, after: float) -> dict | None:
    """The last start line at `world` before its first step after `after` (a round
    that failed before it stepped may have started first)."""
    first = first_at(ckpt, world, after)
    starts = [
        x
        for x in lines(ckpt)
        if x.get("event") == "start" and x["world_size"] == world and x["ts"] > after
    ]
    before = [x for x in starts if first is None or x["ts"] <= first["ts"]]
    return before[-1] if before else None


def last_before(ckpt: Path, ts: float) -> dict | None:
    older = [x for x in steps(ckpt) if x["ts"] < ts]
    return older[-1] if older else None


def continuity(ckpt: Path) -> dict:
    seen = [x["step"] for x in steps(ckpt)]
    if not seen:
        return {"steps": 0, "skipped": 0, "repeated": 0, "loss_first": None, "loss_last": None}
    loss = [x["loss"] for x in steps(ckpt)]
    return {
        "steps": max(seen),
        "skipped": len(set(range(1, max(seen) + 1)) - set(seen)),
        "repeated": len(seen) - len(set(seen)),
        "loss_first": loss[0],
        "loss_last": loss[-1],
    }


# ---------------------------------------------------------------- waiting


async def until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.05)


async def settle(ckpt: Path, world: int, n: int, after: float, timeout: float) -> dict:
    """`n` steps at `world` after `after`; the last of them."""
    first = await until(lambda: first_at(ckpt, world, after), timeout, f"a step at {world}")

    def done():
        last = steps(ckpt)[-1]
        return last if last["world_size"] == world and last["step"] >= first["step"] + n else None

    return await until(done, timeout, f"{n} steps at {world}")


def entries(job: dict, index: int, state: str, after: float) -> list[float]:
    task = next(t for t in job["task_list"] if t["index"] == index)
    return [h["ts"] for h in task["history"] if h["state"] == state and h["ts"] > after]


def boot_phases(start: dict | None, first: dict, t_ready: float) -> dict:
    """Seconds from `t_ready` (the new generation's processes could start) to its
    module running, then each of its boot marks, then its first step."""
    if start is None or "boot" not in start:
        return {"first_step": first["ts"] - t_ready}
    b = start["boot"]
    return {
        "to_main": b["main"] - t_ready,
        "import_torch": b["imported"] - b["main"],
        "gloo_group": b["group"] - b["imported"],
        "checkpoint": b["state"] - b["group"],
        "to_first_step": first["ts"] - b["state"],
    }


# ---------------------------------------------------------------- phases


async def resizes(client: MeshClient, args, work: Path) -> dict:
    ckpt, stop = work / "elastic", work / "elastic.stop"
    spec = tiny_job("tiny-elastic", "pytorch-elastic", {"min": 2, "max": 3}, ckpt, stop, args)
    t0 = time.time()
    job_id = await client.submit(spec)
    await settle(ckpt, 3, args.settle, t0, args.timeout)  # placed at 2, grown to 3
    samples: list[dict] = []
    for _ in range(args.repeats):
        for size in (2, 3):
            job = await client.job(job_id)
            changed = max(h["ts"] for t in job["task_list"] for h in t["history"])
            await asyncio.sleep(max(0.0, changed + args.resize_every - time.time()))
            t = time.time()
            await client.scale(job_id, size, by="bench")
            replied = time.time()
            await settle(ckpt, size, args.settle, t, args.timeout)
            first = first_at(ckpt, size, t)
            job = await client.job(job_id)
            sample = {
                "direction": "down" if size == 2 else "up",
                "seconds": first["ts"] - t,
                "scale_reply_ms": (replied - t) * 1000.0,
                "stall": first["ts"] - last_before(ckpt, first["ts"])["ts"],
                "load1": os.getloadavg()[0],
            }
            if size == 3:
                placed = entries(job, 2, "PLACED", t)[0]
                runs = entries(job, 2, "RUNNING", t)[0]
                sample["mesh"] = {"to_placed": placed - t, "placed_to_running": runs - placed}
                sample["worker"] = boot_phases(start_line(ckpt, 3, t), first, runs)
            else:
                ended = min(
                    entries(job, 2, "PREEMPTED", t) + entries(job, 2, "KILLED", t) or [first["ts"]]
                )
                sample["mesh"] = {"to_stopped": ended - t}
                sample["worker"] = boot_phases(start_line(ckpt, 2, t), first, t)
            samples.append(sample)
            print(f"resize {sample['direction']}: {sample['seconds']:.2f} s {sample}")
    span_end = steps(ckpt)[-1]["ts"]
    span = span_end - steps(ckpt)[0]["ts"]
    stop.touch()
    job = await client.wait(job_id, timeout=args.timeout)
    return {
        "samples": samples,
        "wall_s": span,
        "state": job["state"],
        "training": job.get("training"),
        "continuity": continuity(ckpt),
    }


async def restarts(client: MeshClient, args, work: Path) -> dict:
    ckpt, stop = work / "static", work / "static.stop"
    t0 = time.time()
    job_id = await client.submit(tiny_job("tiny-static", "pytorch", 2, ckpt, stop, args))
    await settle(ckpt, 2, args.settle, t0, args.timeout)
    samples: list[dict] = []
    for i in range(args.restarts):
        size = 3 if i % 2 == 0 else 2
        t = time.time()
        await client.kill(job_id, "bench: restart at a new size")
        old = await client.wait(job_id, timeout=args.timeout)
        ended = max(tk["finished_at"] or t for tk in old["task_list"])
        job_id = await client.submit(tiny_job("tiny-static", "pytorch", size, ckpt, stop, args))
        await settle(ckpt, size, args.settle, t, args.timeout)
        first = first_at(ckpt, size, t)
        job = await client.job(job_id)
        placed = max(entries(job, k, "PLACED", t)[0] for k in range(size))
        runs = max(entries(job, k, "RUNNING", t)[0] for k in range(size))
        sample = {
            "to_size": size,
            "seconds": first["ts"] - t,
            "stall": first["ts"] - last_before(ckpt, first["ts"])["ts"],
            "mesh": {
                "kill_to_ended": ended - t,
                "ended_to_placed": placed - ended,
                "placed_to_running": runs - placed,
            },
            "worker": boot_phases(start_line(ckpt, size, t), first, runs),
            "load1": os.getloadavg()[0],
        }
        samples.append(sample)
        print(f"restart to {size}: {sample['seconds']:.2f} s {sample}")
    stop.touch()
    job = await client.wait(job_id, timeout=args.timeout)
    return {"samples": samples, "state": job["state"], "continuity": continuity(ckpt)}


# ---------------------------------------------------------------- the run


async def run(args: argparse.Namespace, root: Path) -> dict:
    server = EmbeddedServer(ServerConfig(store_dir=str(root / "nats"))).start()
    coord = Coordinator(
        CoordinatorConfig(server.url, candidate_id="bench", resize_every_s=args.resize_every)
    )
    agents = [
        Agent(
            AgentConfig(
                server.url,
                node_id=f"train-{i}",
                data_dir=str(root / f"agent-{i}"),
                limits="none",  # the rlimit fallback's address-space cap does not fit torch
                allow_root=os.geteuid() == 0,
            )
        )
        for i in range(NODES)
    ]
    nc = None
    try:
        await coord.start()
        for a in agents:
            await a.start()
        nc = await connect(server.url, name="bench-training")
        client = MeshClient(nc)

        async def ready():
            info = await client.cluster_info()
            return info["leader"] and info["nodes"].get("ready", 0) >= NODES

        await until(ready, 30, f"{NODES} ready nodes")
        elastic = await resizes(client, args, root)
        baseline = await restarts(client, args, root)
    finally:
        if nc is not None:
            await close_quietly(nc)
        for a in agents:
            await a.stop(kill_tasks=True)
        await coord.stop()
        server.stop()
    return {"elastic": elastic, "restart": baseline}


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _medians(dicts: list[dict]) -> dict:
    keys = {k for d in dicts for k in d}
    return {k: _p50([d[k] for d in dicts if k in d]) for k in sorted(keys)}


def report(args: argparse.Namespace, out: dict, load0: float) -> dict:
    el, rs = out["elastic"], out["restart"]
    up = [s for s in el["samples"] if s["direction"] == "up"]
    down = [s for s in el["samples"] if s["direction"] == "down"]
    both = [s["seconds"] for s in el["samples"]]
    restart = [s["seconds"] for s in rs["samples"]]
    up_p50, down_p50 = _p50([s["seconds"] for s in up]), _p50([s["seconds"] for s in down])
    resize_p50, restart_p50 = _p50(both), _p50(restart)
    stalls = sum(s["stall"] for s in el["samples"])
    fraction = round(stalls / el["wall_s"], 3) if el["wall_s"] > 0 else None
    speedup = ratio(restart_p50, resize_p50)
    print(f"scale up p50 {up_p50} s, down p50 {down_p50} s; restart p50 {restart_p50} s")
    print(f"restart / resize: {speedup}; re-rendezvous share of wall time {fraction}")
    targets = {
        "resize_le_10s": (
            up_p50 is not None
            and down_p50 is not None
            and up_p50 <= TARGET_S
            and down_p50 <= TARGET_S
        ),
        "resize_3x_faster_than_restart": speedup is not None and speedup >= 3.0,
    }
    return {
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": load0,
        "loadavg_end": loadavg(),
        "config": {
            "nodes": NODES,
            "cores_per_node": CORES,
            "workers": "2..3",
            "repeats": args.repeats,
            "restarts": args.restarts,
            "settle_steps": args.settle,
            "resize_every_s": args.resize_every,
            "step_sleep_s": args.step_sleep,
            "decision": "job.scale sent (JobScaled); restart: job.kill sent",
            "effect": "first train.jsonl step at the new world size",
            "in_process": True,
        },
        "scale_up_p50_s": up_p50,
        "scale_down_p50_s": down_p50,
        "resize_p50_s": resize_p50,
        "restart_p50_s": restart_p50,
        "restart_over_resize": speedup,
        "rerendezvous_fraction": fraction,
        "elastic_wall_s": round(el["wall_s"], 2),
        "scale_up_s": summary_ms([s["seconds"] for s in up]),
        "scale_down_s": summary_ms([s["seconds"] for s in down]),
        "restart_s": summary_ms(restart),
        "scale_reply_ms_max": round(
            max((s["scale_reply_ms"] for s in el["samples"]), default=0), 2
        ),
        "where_up": {
            "mesh": _medians([s["mesh"] for s in up]),
            "worker": _medians([s["worker"] for s in up]),
        },
        "where_down": {
            "mesh": _medians([s["mesh"] for s in down]),
            "worker": _medians([s["worker"] for s in down]),
        },
        "where_restart": {
            "mesh": _medians([s["mesh"] for s in rs["samples"]]),
            "worker": _medians([s["worker"] for s in rs["samples"]]),
        },
        "elastic_job": {
            "state": el["state"],
            "training": el["training"],
            **el["continuity"],
        },
        "restart_job": {"state": rs["state"], **rs["continuity"]},
        "samples": {"resize": el["samples"], "restart": rs["samples"]},
        "targets": targets,
    }


def main(argv: list[str]) -> dict:
    args = parse(argv)
    load0 = loadavg()
    out = with_state_dir(
        args.state_dir, "mesh-bench-training-", lambda p: asyncio.run(run(args, p))
    )
    return report(args, out, load0)
