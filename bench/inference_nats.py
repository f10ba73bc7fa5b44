"""`python -m bench inference_nats`: the inference router's throughput and deadline
behaviour through real NATS.

Starts an embedded nats-server, one router process (`python -m inference.router`) and
N numpy workers (`python -m inference.worker`, a seeded 2-layer MLP on CPU), then runs
the load generator (`python -m inference.loadgen`, its own process) as:

1. Saturation: a closed loop of `--concurrency` requests in flight with a generous
   deadline: answered-on-time requests per second is the router's max throughput
   through NATS. CPU of every process in that window shows who saturates. Run in
   `--pairs` alternating with the baseline (3), medians reported.
2. Sweep: open-loop Poisson at each `--rates` value with `--deadline-ms`: goodput,
   p50/p99 latency (client-measured, send to answer), bad rate.
3. Baseline in the same run: a plain nats-py echo responder in its own process, on the
   same event loop as the router (`--event-loop`), driven by the same load
   generator at the same concurrency: `ratio` = router / echo, i.e. what deadline
   batching costs over the cheapest possible Python request/reply.

CPU is reported per process and per request (router, workers, nats-server, the load
generators' own), because on a shared machine the throughput is set by the sum.

Target (issue): >= 20,000 req/s per router process. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._util import (
    CpuWindow,
    loadavg,
    machine,
    ratio,
    spawn,
    start_echo,
    stop_process,
)
from mesh.server import EmbeddedServer

REGION = "bench"
MODEL = "mlp"


def _loadgen_cmd(url: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "inference.loadgen",
        "--nats",
        url,
        "--region",
        REGION,
        "--model",
        MODEL,
        *args,
    ]


def _loadgen(url: str, *args: str, timeout: float = 120.0) -> dict:
    cmd = _loadgen_cmd(url, *args)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"loadgen failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def _loadgens(url: str, clients: int, *args: str, watch: dict[str, int] | None = None) -> dict:
    """``clients`` load generators at once (each gets 1/clients of the rate or of the
    concurrency), merged: counts and rates summed, percentiles over all latencies.
    The CPU of the ``watch`` processes (name -> pid) is measured from when every client
    is sending to when the first is done: the loaded window only, not the clients'
    start-up or their wait for stragglers (``merged["cpu"]``)."""
    args_l = list(args)
    for flag in ("--rate", "--concurrency"):
        if flag in args_l:
            i = args_l.index(flag) + 1
            share = float(args_l[i]) / clients
            args_l[i] = str(int(share)) if flag == "--concurrency" else str(share)
    with tempfile.TemporaryDirectory(prefix="lat-") as d:
        cmds = [
            _loadgen_cmd(url, "--seed", str(i + 1), "--lat-out", f"{d}/{i}.npy", "--marks", *args_l)
            for i in range(clients)
        ]
        ps = [
            subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in cmds
        ]
        early: list[list[str]] = [[] for _ in ps]  # lines read before communicate()

        def until(i: int, mark: str) -> None:
            for line in ps[i].stdout:
                early[i].append(line)
                if line.strip() == mark:
                    return

        for i in range(clients):
            until(i, "sending")
        cpu = CpuWindow(watch or {})
        cpu.start()
        until(0, "sent")
        window_cpu = cpu.stop()
        outs = []
        for i, pr in enumerate(ps):
            out, err = pr.communicate(timeout=300)
            out = "".join(early[i]) + out
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if pr.returncode != 0 or not lines:
                raise RuntimeError(f"loadgen failed ({pr.returncode}): {err[-2000:]}")
            outs.append(json.loads(lines[-1]))
        lat = np.concatenate([np.load(f"{d}/{i}.npy") for i in range(clients)])
    merged = dict(outs[0])
    for k in (
        "sent",
        "good",
        "late",
        "dropped",
        "errors",
        "lost",
        "achieved_rate",
        "goodput",
        "ok_rate",
        "cpu_s",
    ):
        merged[k] = round(sum(o[k] for o in outs), 3)
    merged["cpu_percent"] = round(100 * merged["cpu_s"] / max(o["duration_s"] for o in outs), 1)
    if merged["offered_rate"] is not None:
        merged["offered_rate"] = round(sum(o["offered_rate"] for o in outs), 1)
    merged["concurrency"] = sum(o["concurrency"] or 0 for o in outs) or None
    codes: dict[str, int] = {}
    for o in outs:
        for c, n in o["codes"].items():
            codes[c] = codes.get(c, 0) + n
    merged["codes"] = codes
    bad = merged["late"] + merged["dropped"] + merged["errors"] + merged["lost"]
    merged["bad_rate"] = round(bad / merged["sent"], 5) if merged["sent"] else None
    for q in (50, 99):
        merged[f"p{q}_ms"] = round(float(np.percentile(lat, q)), 3) if len(lat) else None
    merged["clients"] = clients
    merged["cpu"] = window_cpu
    return merged


def _wait_ready(url: str, timeout: float = 20.0) -> None:
    """Until a real request is answered ok (router up and it has heard from workers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = _loadgen(
                url, "--rate", "50", "--duration", "0.3", "--deadline-ms", "500", timeout=20
            )
            if r["good"] > 0 and r["bad_rate"] == 0:
                return
        except RuntimeError:
            pass
        time.sleep(0.3)
    raise RuntimeError("router and workers not ready")


def _us_per_req(cpu: dict, name: str, rate: float) -> float | None:
    """CPU microseconds one request cost that process: 1e6 / this is what it could
    answer per second with a whole core to itself."""
    if name not in cpu or not rate:
        return None
    return round(cpu[name]["cpu"] / 100 * 1e6 / rate, 2)


def _cost(cpu: dict, clients: dict, rate: float) -> dict:
    """CPU microseconds per request of each process kind, and their sum: what one
    request costs the machine (2 cores / this sum bounds the rate here)."""
    out: dict[str, float | None] = {}
    for name in cpu:
        kind = "worker" if name.startswith("worker") else name
        us = _us_per_req(cpu, name, rate)
        if us is not None:
            out[kind] = round(out.get(kind, 0.0) + us, 2)
    if rate:
        out["clients"] = round(clients["cpu_s"] / clients["duration_s"] * 1e6 / rate, 2)
    out["total"] = round(sum(v for v in out.values() if v is not None), 2)
    return out


def _router_stats(log_text: str) -> dict | None:
    """The stats dict the router prints when it stops."""
    for line in reversed(log_text.splitlines()):
        if "stopped: {" in line:
            try:
                return ast.literal_eval(line[line.index("{") :])
            except (ValueError, SyntaxError):
                return None
    return None


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench inference_nats")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 1 pair, 1 s per point, 1k/4k req/s"
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--clients", type=int, default=2, help="load generator processes")
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--deadline-ms", type=float, default=50.0)
    p.add_argument("--rates", default=None, help="comma-separated offered rates (req/s)")
    p.add_argument(
        "--event-loop",
        choices=("auto", "asyncio", "uvloop"),
        default="asyncio",
        help="of every process, the echo baseline's too (auto: uvloop if installed)",
    )
    p.add_argument(
        "--answers",
        choices=("direct", "router"),
        default="direct",
        help="who answers clients: the workers (direct) or the router",
    )
    p.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="saturation/echo pairs, alternated (default 3; 1 with --quick)",
    )
    a = p.parse_args(argv)
    a.pairs = a.pairs or (1 if a.quick else 3)
    loop = a.event_loop
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    el = ["--event-loop", loop]
    duration = a.duration or (1.0 if a.quick else 5.0)
    rates = [
        float(r)
        for r in (
            a.rates or ("1000,4000" if a.quick else "1000,2000,5000,10000,15000,20000")
        ).split(",")
    ]
    load_start = loadavg()
    print(
        f"machine: {machine()}, load {load_start}, event loop {loop}, answers {a.answers}",
        flush=True,
    )

    tmp = tempfile.TemporaryDirectory(prefix="bench-infer-")
    logs = Path(tmp.name)
    server = EmbeddedServer()
    server.config.store_dir = str(logs / "nats")
    procs: dict[str, subprocess.Popen] = {}
    echo = None
    try:
        server.start()
        url = server.url
        procs["router"] = spawn(
            [
                sys.executable,
                "-m",
                "inference.router",
                "--nats",
                url,
                "--region",
                REGION,
                "--answers",
                a.answers,
                *el,
            ],
            logs / "router.log",
        )
        for i in range(a.workers):
            procs[f"worker{i}"] = spawn(
                [
                    sys.executable,
                    "-m",
                    "inference.worker",
                    "--nats",
                    url,
                    "--region",
                    REGION,
                    "--model",
                    MODEL,
                    "--runtime",
                    "numpy",
                    "--worker-id",
                    f"w{i}",
                    "--max-batch",
                    "128",
                    *el,
                ],
                logs / f"worker{i}.log",
            )
        _wait_ready(url)

        # 1. saturation (closed loop) and 3. its baseline, in alternating pairs: on a
        # shared machine the load from others changes within a run, and a pair taken
        # back to back sees about the same. The medians are reported.
        echo = start_echo(url, "bench.echo", loop)  # the baseline, on the router's loop
        watched = {**{n: pr.pid for n, pr in procs.items()}, "nats-server": server.proc.pid}
        closed = [
            "--concurrency",
            str(a.concurrency),
            "--duration",
            str(duration),
            "--deadline-ms",
            "1000",
            *el,
        ]
        pairs = []
        for k in range(a.pairs):
            sat = _loadgens(url, a.clients, *closed, watch=watched)
            sat_cost = _cost(sat["cpu"], sat, sat["goodput"])
            print(
                f"[{k + 1}/{a.pairs}] saturation c={a.concurrency}: on time "
                f"{sat['goodput']:.0f}/s p50={sat['p50_ms']} p99={sat['p99_ms']} ms "
                f"bad={sat['bad_rate']}  cpu%={sat['cpu']} clients {sat['cpu_percent']}%  "
                f"us/req={sat_cost}",
                flush=True,
            )
            base = _loadgens(
                url,
                a.clients,
                "--subject",
                "bench.echo",
                "--echo",
                *closed,
                watch={"echo": echo.pid, "nats-server": server.proc.pid},
            )
            base_cost = _cost(base["cpu"], base, base["goodput"])
            print(
                f"[{k + 1}/{a.pairs}] baseline echo c={a.concurrency}: "
                f"{base['goodput']:.0f}/s p50={base['p50_ms']} p99={base['p99_ms']} ms "
                f"cpu%={base['cpu']} clients {base['cpu_percent']}%  us/req={base_cost}  "
                f"load {loadavg()}",
                flush=True,
            )
            pairs.append((sat, sat_cost, base, base_cost))

        # 2. open-loop sweep
        sweep = []
        for rate in rates:
            r = _loadgens(
                url,
                a.clients,
                "--rate",
                str(rate),
                "--duration",
                str(duration),
                "--deadline-ms",
                str(a.deadline_ms),
                *el,
            )
            sweep.append(r)
            print(
                f"rate {rate:>7.0f}/s: achieved {r['achieved_rate']:.0f}/s "
                f"goodput {r['goodput']:.0f}/s p50={r['p50_ms']} p99={r['p99_ms']} ms "
                f"bad={r['bad_rate']} {r['codes']}",
                flush=True,
            )
    finally:
        stop_process(echo)
        for pr in procs.values():
            stop_process(pr)
        server.stop()
        rlog = logs / "router.log"
        router_log = rlog.read_text()[-3000:] if rlog.exists() else ""
        tmp.cleanup()
    if router_log:
        print("router:", router_log.strip().splitlines()[-1], flush=True)
    load_end = loadavg()

    best = max(sweep, key=lambda r: r["goodput"])
    # the pair whose router figure is the median stands for the run
    sat, sat_cost, base, base_cost = sorted(pairs, key=lambda q: q[0]["goodput"])[len(pairs) // 2]
    ratios = [ratio(q[0]["goodput"], q[2]["goodput"]) for q in pairs]
    router_max = float(np.median([q[0]["goodput"] for q in pairs]))
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "workers": a.workers,
        "clients": a.clients,
        "event_loop": loop,
        "answers": a.answers,
        "load_avg": [load_start, load_end],
        "router_cpu_us_per_request": _us_per_req(sat["cpu"], "router", sat["goodput"]),
        "echo_cpu_us_per_request": _us_per_req(base["cpu"], "echo", base["goodput"]),
        "cpu_us_per_request": {"router_run": sat_cost, "echo_run": base_cost},
        "router_stats": _router_stats(router_log),
        "concurrency": a.concurrency,
        "duration_s": duration,
        "router_max_throughput": router_max,
        "router_saturation": {k: sat[k] for k in ("goodput", "p50_ms", "p99_ms", "bad_rate")},
        "router_cpu_percent": sat["cpu"],
        "baseline_echo_throughput": float(np.median([q[2]["goodput"] for q in pairs])),
        "baseline_cpu_percent": base["cpu"],
        "ratio": float(np.median(ratios)),
        "pairs": [
            {
                "router": q[0]["goodput"],
                "echo": q[2]["goodput"],
                "ratio": r,
                "router_us_per_request": q[1],
                "echo_us_per_request": q[3],
            }
            for q, r in zip(pairs, ratios, strict=True)
        ],
        "deadline_ms": a.deadline_ms,
        "sweep": [
            {
                k: r[k]
                for k in (
                    "offered_rate",
                    "achieved_rate",
                    "goodput",
                    "p50_ms",
                    "p99_ms",
                    "bad_rate",
                    "late",
                    "dropped",
                    "errors",
                    "lost",
                )
            }
            for r in sweep
        ],
        "best_open_loop_goodput": best["goodput"],
        "target_req_s": 20000,
        "targets": {"router_ge_20k_req_s": router_max >= 20000},
    }
