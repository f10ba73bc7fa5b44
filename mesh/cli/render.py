"""Human output: aligned tables and short units. `--json` bypasses all of this."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from workloads.quantity import format_cpu, format_gpu


def human_bytes(n: int) -> str:
    """Short, rounded sizes for tables (specs use exact quantities elsewhere)."""
    value = float(n)
    for unit in ("B", "Ki", "Mi", "Gi", "Ti"):
        if value < 1024 or unit == "Ti":
            return f"{value:.0f}{unit}" if value >= 100 or unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    return "\n".join(lines)


def resources(d: dict) -> str:
    parts = [f"cpu {format_cpu(d.get('cpu', 0))}", f"mem {human_bytes(d.get('memory', 0))}"]
    if d.get("gpu"):
        parts.append(f"gpu {format_gpu(d['gpu'])}")
    return ", ".join(parts)


def ago(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ts))


def duration(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return "-"
    d = max(0.0, end - start)
    return f"{d * 1000:.0f}ms" if d < 1 else f"{d:.1f}s"


def nodes_table(nodes: list[dict]) -> str:
    rows = []
    for n in nodes:
        gpus = n["gpus"]
        gpu = f"{len(gpus)}x {gpus[0]['model']}" if gpus else "-"
        rows.append(
            [
                n["node_id"],
                n["status"],
                "sim" if n["simulated"] else "real",
                n["zone"] or "-",
                format_cpu(n["capacity"]["cpu"]),
                human_bytes(n["capacity"]["memory"]),
                gpu,
                f"{n['cpu_percent']:.0f}%",
                human_bytes(n["memory_used"]),
                n["tasks"],
            ]
        )
    return table(
        rows,
        ["NODE", "STATUS", "KIND", "ZONE", "CPU", "MEMORY", "GPUS", "CPU%", "MEM USED", "TASKS"],
    )


def jobs_table(jobs: list[dict]) -> str:
    rows = [
        [
            j["job_id"],
            j["state"],
            j["pool"],
            j["priority"],
            j["tasks"],
            ", ".join(f"{k.lower()} {v}" for k, v in sorted(j["task_states"].items())),
            ago(j["submitted_at"]),
            duration(j["submitted_at"], j["finished_at"]),
        ]
        for j in jobs
    ]
    return table(
        rows, ["JOB", "STATE", "POOL", "PRIO", "TASKS", "TASK STATES", "SUBMITTED", "TOOK"]
    )


def job_detail(job: dict) -> str:
    lines = [
        f"job      {job['job_id']}  ({job['name']})",
        f"state    {job['state']}" + ("  (kill requested)" if job["kill_requested"] else ""),
        f"pool     {job['pool']}   priority {job['priority']}",
        f"submitted {ago(job['submitted_at'])}   "
        f"took {duration(job['submitted_at'], job['finished_at'])}",
    ]
    if job.get("pending_reason"):
        lines.append(f"pending  {job['pending_reason']}")
    rows = [
        [
            t["task_id"],
            t["state"],
            t["attempt"],
            t["node_id"] or "-",
            "-" if t["exit_code"] is None else t["exit_code"],
            duration(t["started_at"], t["finished_at"]),
            t["message"][:60],
        ]
        for t in job["task_list"]
    ]
    lines += ["", table(rows, ["TASK", "STATE", "ATTEMPT", "NODE", "EXIT", "RAN", "MESSAGE"])]
    for t in job["task_list"]:
        if t["state"] == "FAILED" and t["log_tail"]:
            tail = t["log_tail"].rstrip().splitlines()[-5:]
            lines += ["", f"{t['task_id']} log tail:"] + [f"  | {ln}" for ln in tail]
    return "\n".join(lines)


def pools_table(pools: list[dict]) -> str:
    rows = []
    for p in pools:
        for kind, k in p["kinds"].items():
            used = any(
                k[f] not in ("0", "-") for f in ("reservation", "limit", "demand", "allocation")
            )
            if kind in ("cpu", "memory") or used:
                rows.append(
                    [
                        p["path"],
                        kind,
                        k["reservation"],
                        k["limit"],
                        k["share"],
                        k["type"],
                        k["demand"],
                        k["allocation"],
                        k["entitlement"],
                    ]
                )
    return table(
        rows,
        [
            "POOL",
            "KIND",
            "RESERVATION",
            "LIMIT",
            "SHARE",
            "TYPE",
            "DEMAND",
            "ALLOCATION",
            "ENTITLEMENT",
        ],
    )
