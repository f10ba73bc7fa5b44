"""`python -m bench inference_nats`: the inference router's throughput and deadline
behaviour through real NATS.

Starts an embedded nats-server, one router process (`python -m inference.router`) and
N numpy workers (`python -m inference.worker`, a seeded 2-layer MLP on CPU), then runs
the load generator (`python -m inference.loadgen`, its own process) as:

1. Saturation: a closed loop of `--concurrency` requests in flight with a generous
   deadline: answered-on-time requests per second is the router's max throughput
   through NATS. CPU of every process in that window shows who saturates.
2. Sweep: open-loop Poisson at each `--rates` value with `--deadline-ms`: goodput,
   p50/p99 latency (client-measured, send to answer), bad rate.
3. Baseline in the same run: a plain nats-py echo responder in its own process, driven
   by the same load generator at the same concurrency: `ratio` = router / echo, i.e.
   what deadline batching costs over the cheapest possible Python request/reply.

Target (issue): >= 20,000 req/s per router process. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
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


def _loadgen(url: str, *args: str, timeout: float = 120.0) -> dict:
    cmd = [sys.executable, "-m", "inference.loadgen", "--nats", url, "--region", REGION,
           "--model", MODEL, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"loadgen failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def _loadgens(url: str, clients: int, *args: str) -> dict:
    """``clients`` load generators at once (each gets 1/clients of the rate or of the
    concurrency), merged: counts and rates summed, percentiles over all latencies."""
    args_l = list(args)
    for flag in ("--rate", "--concurrency"):
        if flag in args_l:
            i = args_l.index(flag) + 1
            share = float(args_l[i]) / clients
            args_l[i] = str(int(share)) if flag == "--concurrency" else str(share)
    with tempfile.TemporaryDirectory(prefix="lat-") as d:
        cmds = [[sys.executable, "-m", "inference.loadgen", "--nats", url, "--region", REGION,
                 "--model", MODEL, "--seed", str(i + 1), "--lat-out", f"{d}/{i}.npy", *args_l]
                for i in range(clients)]
        ps = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for c in cmds]
        outs = []
        for pr in ps:
            out, err = pr.communicate(timeout=300)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if pr.returncode != 0 or not lines:
                raise RuntimeError(f"loadgen failed ({pr.returncode}): {err[-2000:]}")
            outs.append(json.loads(lines[-1]))
        lat = np.concatenate([np.load(f"{d}/{i}.npy") for i in range(clients)])
    merged = dict(outs[0])
    for k in ("sent", "good", "late", "dropped", "errors", "lost", "achieved_rate",
              "goodput", "ok_rate"):
        merged[k] = round(sum(o[k] for o in outs), 1)
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
    return merged


def _wait_ready(url: str, timeout: float = 20.0) -> None:
    """Until a real request is answered ok (router up and it has heard from workers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = _loadgen(url, "--rate", "50", "--duration", "0.3", "--deadline-ms", "500",
                         timeout=20)
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


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench inference_nats")
    p.add_argument("--quick", action="store_true", help="short run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--clients", type=int, default=2, help="load generator processes")
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--deadline-ms", type=float, default=50.0)
    p.add_argument("--rates", default=None, help="comma-separated offered rates (req/s)")
    a = p.parse_args(argv)
    duration = a.duration or (2.0 if a.quick else 5.0)
    rates = [float(r) for r in (a.rates or ("1000,4000,8000" if a.quick else
                                            "1000,2000,5000,10000,15000,20000")).split(",")]
    print(f"machine: {machine()}, load {loadavg()}", flush=True)

    tmp = tempfile.TemporaryDirectory(prefix="bench-infer-")
    logs = Path(tmp.name)
    server = EmbeddedServer()
    server.config.store_dir = str(logs / "nats")
    procs: dict[str, subprocess.Popen] = {}
    echo = None
    try:
        server.start()
        url = server.url
        procs["router"] = spawn([sys.executable, "-m", "inference.router", "--nats", url,
                                 "--region", REGION], logs / "router.log")
        for i in range(a.workers):
            procs[f"worker{i}"] = spawn(
                [sys.executable, "-m", "inference.worker", "--nats", url, "--region", REGION,
                 "--model", MODEL, "--runtime", "numpy", "--worker-id", f"w{i}",
                 "--max-batch", "128"], logs / f"worker{i}.log")
        _wait_ready(url)

        # 1. saturation (closed loop), with CPU per process
        watched = {**{n: pr.pid for n, pr in procs.items()}, "nats-server": server.proc.pid}
        cpu = CpuWindow(watched)
        cpu.start()
        sat = _loadgens(url, a.clients, "--concurrency", str(a.concurrency),
                        "--duration", str(duration), "--deadline-ms", "1000")
        sat_cpu = cpu.stop()
        print(f"saturation c={a.concurrency}: on time {sat['goodput']:.0f}/s "
              f"p50={sat['p50_ms']} p99={sat['p99_ms']} ms bad={sat['bad_rate']}  "
              f"cpu%={sat_cpu}", flush=True)

        # 2. open-loop sweep
        sweep = []
        for rate in rates:
            r = _loadgens(url, a.clients, "--rate", str(rate), "--duration", str(duration),
                         "--deadline-ms", str(a.deadline_ms))
            sweep.append(r)
            print(f"rate {rate:>7.0f}/s: achieved {r['achieved_rate']:.0f}/s "
                  f"goodput {r['goodput']:.0f}/s p50={r['p50_ms']} p99={r['p99_ms']} ms "
                  f"bad={r['bad_rate']} {r['codes']}", flush=True)

        # 3. baseline: plain echo responder, same client, same concurrency
        echo = start_echo(url, "bench.echo")
        cpu = CpuWindow({"echo": echo.pid, "nats-server": server.proc.pid})
        cpu.start()
        base = _loadgens(url, a.clients, "--subject", "bench.echo", "--echo", "--concurrency",
                        str(a.concurrency), "--duration", str(duration),
                        "--deadline-ms", "1000")
        base_cpu = cpu.stop()
        print(f"baseline echo c={a.concurrency}: {base['goodput']:.0f}/s "
              f"p50={base['p50_ms']} p99={base['p99_ms']} ms cpu%={base_cpu}", flush=True)
    finally:
        stop_process(echo)
        for pr in procs.values():
            stop_process(pr)
        server.stop()
        rlog = logs / "router.log"
        router_log = rlog.read_text()[-1500:] if rlog.exists() else ""
        tmp.cleanup()
    if router_log:
        print("router:", router_log.strip().splitlines()[-1], flush=True)

    best = max(sweep, key=lambda r: r["goodput"])
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "workers": a.workers,
        "clients": a.clients,
        "router_cpu_us_per_request": _us_per_req(sat_cpu, "router", sat["goodput"]),
        "echo_cpu_us_per_request": _us_per_req(base_cpu, "echo", base["goodput"]),
        "concurrency": a.concurrency,
        "duration_s": duration,
        "router_max_throughput": sat["goodput"],
        "router_saturation": {k: sat[k] for k in ("goodput", "p50_ms", "p99_ms", "bad_rate")},
        "router_cpu_percent": sat_cpu,
        "baseline_echo_throughput": base["goodput"],
        "baseline_cpu_percent": base_cpu,
        "ratio": ratio(sat["goodput"], base["goodput"]),
        "deadline_ms": a.deadline_ms,
        "sweep": [{k: r[k] for k in ("offered_rate", "achieved_rate", "goodput", "p50_ms",
                                     "p99_ms", "bad_rate", "late", "dropped", "errors", "lost")}
                  for r in sweep],
        "best_open_loop_goodput": best["goodput"],
        "target_req_s": 20000,
    }
