"""Human output: aligned tables and short units. `-o json|yaml` bypasses all of this.

No cell is ever cut: a long last column (a reason, a message) is wrapped at word
boundaries under its own column when a terminal width is given, and printed whole
otherwise. `wide` variants add columns and show exact quantities.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Sequence
from typing import Any

from workloads.quantity import SpecError, format_cpu, format_gpu, parse_bytes

MIN_WRAP = 24  # narrower than this, the last column is printed whole instead


def human_bytes(n: int) -> str:
    """Short, rounded sizes for tables (specs use exact quantities elsewhere)."""
    value = float(n)
    for unit in ("B", "Ki", "Mi", "Gi", "Ti"):
        if value < 1024 or unit == "Ti":
            return f"{value:.0f}{unit}" if value >= 100 or unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], width: int | None = None) -> str:
    """Aligned columns. With `width`, a last column that would run past it is wrapped
    onto continuation lines starting under that column; never truncated."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lead = sum(w + 2 for w in widths[:-1])
    room = None if width is None else width - lead
    lines = []
    for r in cells:
        head = "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths[:-1], strict=False))
        last = r[-1] if r else ""
        if room is None or room < MIN_WRAP or len(last) <= room:
            parts = [last]
        else:
            parts = textwrap.wrap(last, room, break_long_words=False, break_on_hyphens=False)
        first = f"{head}  {parts[0]}" if len(r) > 1 else parts[0]
        lines.append(first.rstrip())
        lines += [(" " * lead + part).rstrip() for part in parts[1:]]
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


def nodes_table(nodes: list[dict], *, wide: bool = False, width: int | None = None) -> str:
    rows = []
    for n in nodes:
        gpus = n["gpus"]
        gpu = f"{len(gpus)}x {gpus[0]['model']}" if gpus else "-"
        row = [
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
        if wide:
            alloc = n.get("allocated") or {}
            row += [
                format_cpu(alloc.get("cpu", 0)),
                human_bytes(alloc.get("memory", 0)),
                f"{n.get('heartbeat_age_s', 0):.1f}s",
                ",".join(f"{k}={v}" for k, v in sorted((n.get("labels") or {}).items())) or "-",
                n.get("note") or "",
            ]
        rows.append(row)
    headers = ["NODE", "STATUS", "KIND", "ZONE", "CPU", "MEMORY", "GPUS", "CPU%", "MEM USED"]
    headers.append("TASKS")
    if wide:
        headers += ["CPU ALLOC", "MEM ALLOC", "HEARTBEAT", "LABELS", "NOTE"]
    return table(rows, headers, width)


def jobs_table(jobs: list[dict], *, wide: bool = False, width: int | None = None) -> str:
    rows = []
    for j in jobs:
        row = [
            j["job_id"],
            j["state"] + (" (killing)" if j.get("kill_requested") and wide else ""),
            j["pool"],
            j["priority"],
            j["tasks"],
            ", ".join(f"{k.lower()} {v}" for k, v in sorted(j["task_states"].items())),
            ago(j["submitted_at"]),
            duration(j["submitted_at"], j["finished_at"]),
        ]
        if wide:
            row.insert(1, j["name"])
        rows.append(row)
    headers = ["JOB", "STATE", "POOL", "PRIO", "TASKS", "TASK STATES", "SUBMITTED", "TOOK"]
    if wide:
        headers.insert(1, "NAME")
    return table(rows, headers, width)


ACTIVE_TASK = frozenset({"PENDING", "PLACED", "STARTING"})


def waiting_reason(job: dict) -> str:
    """Why an unfinished job is not done yet, in the job's own words: the scheduler's
    pending reason, else what its tasks that have not started say, else that its
    tasks are running."""
    if job.get("pending_reason"):
        return job["pending_reason"]
    tasks = job.get("task_list") or []
    waiting = [t for t in tasks if t["state"] in ACTIVE_TASK]
    if waiting:
        t = waiting[0]
        where = f" on node {t['node_id']}" if t.get("node_id") else ""
        since = f" since {ago(t['placed_at'])}" if t.get("placed_at") is not None else ""
        said = t.get("message") or (
            "no word from its agent yet" if t["state"] != "PENDING" else "no reason given"
        )
        more = f" (and {len(waiting) - 1} more not started)" if len(waiting) > 1 else ""
        return f"task {t['task_id']} {t['state']}{where}{since}: {said}{more}"
    running = sum(t["state"] == "RUNNING" for t in tasks)
    if running:
        return f"{running} of {len(tasks)} tasks RUNNING (not finished yet)"
    return f"job is {job['state']}"


def preemptions(job: dict) -> list[str]:
    """Per task, its last preemption and why (a pool reclaiming, a partition move:
    `preempted: node X moves from batch to stateless: REASON`)."""
    lines = []
    for t in job["task_list"]:
        last = [h for h in t.get("history") or [] if h["state"] == "PREEMPTED"]
        if last:
            h = last[-1]
            lines.append(
                f"preempted {t['task_id']} attempt {h['attempt']} {ago(h['ts'])}: {h['message']}"
            )
    return lines


def federation(fed: dict | None) -> list[str]:
    """Where a federated job is: held for another region (its origin), or, at its home,
    offered to / held by / ended in another region (docs/federation.md)."""
    if not fed:
        return []
    if fed.get("origin"):
        return [f"origin   {fed['origin']} (epoch {fed['epoch']}, {fed.get('hold', '')})"]
    where, epoch = fed.get("region") or "", fed.get("epoch", 0)
    phase = fed.get("phase")
    if phase == "nominated":
        return [f"offered  to {where} (epoch {epoch})"]
    if phase == "held":
        return [f"held by  {where} (epoch {epoch})"]
    if phase == "done" and where:
        return [f"ran in   {where} (epoch {epoch}): {fed.get('outcome', '')}"]
    return [f"home     {fed.get('home', '')} (epoch {epoch})"]


def job_detail(job: dict, *, wide: bool = False, width: int | None = None) -> str:
    lines = [
        f"job      {job['job_id']}  ({job['name']})",
        f"state    {job['state']}" + ("  (kill requested)" if job["kill_requested"] else ""),
        f"pool     {job['pool']}   priority {job['priority']}",
        f"submitted {ago(job['submitted_at'])}   "
        f"took {duration(job['submitted_at'], job['finished_at'])}",
    ]
    service = job.get("kind") == "service"
    if service:
        lines.append(f"kind     service   generation {job.get('generation', 0)}")
    training = job.get("training")
    if training:
        lines.append(training_line(training))
    if job.get("kill_reason") and job["kill_requested"]:
        lines.append(f"killed   {job['kill_reason']}")
    if job.get("pending_reason"):
        lines.append(f"pending  {job['pending_reason']}")
    lines += federation(job.get("federation"))
    lines += preemptions(job)
    rows = []
    for t in job["task_list"]:
        row = [
            t["task_id"],
            t["state"],
            t["attempt"],
            t["node_id"] or "-",
            "-" if t["exit_code"] is None else t["exit_code"],
            duration(t["started_at"], t["finished_at"]),
            t["message"],
        ]
        if wide:
            row[6:6] = [ago(t.get("placed_at")), ",".join(t.get("gpu_uuids") or []) or "-"]
        if service:  # a replica's health check verdict ("-": none, or none yet)
            row[2:2] = [t.get("health") or "-"]
        if training:  # the step count it last wrote ("-": none yet)
            row[2:2] = ["-" if t.get("progress", -1) < 0 else t["progress"]]
        rows.append(row)
    headers = ["TASK", "STATE", "ATTEMPT", "NODE", "EXIT", "RAN", "MESSAGE"]
    if wide:
        headers[6:6] = ["PLACED", "GPUS"]
    if service:
        headers[2:2] = ["HEALTH"]
    if training:
        headers[2:2] = ["PROGRESS"]
    lines += ["", table(rows, headers, width)]
    if wide:
        for t in job["task_list"]:
            if t.get("history"):
                lines += ["", f"{t['task_id']} history:"]
                hist = [
                    [ago(h["ts"]), h["attempt"], h["state"], h["node_id"] or "-", h["message"]]
                    for h in t["history"]
                ]
                lines.append(table(hist, ["  AT", "ATTEMPT", "STATE", "NODE", "MESSAGE"], width))
    for t in job["task_list"]:
        if t["state"] == "FAILED" and t["log_tail"]:
            tail = t["log_tail"].rstrip().splitlines()[-5:]
            lines += ["", f"{t['task_id']} log tail:"] + [f"  | {ln}" for ln in tail]
    return "\n".join(lines)


def training_line(t: dict) -> str:
    """A training job's framework, size and budget (docs/training.md): size is its tasks
    holding now; an elastic job's target and bounds follow."""
    parts = [f"training {t['framework']}", f"generation {t['generation']}", f"size {t['size']}"]
    if t.get("target") is not None:
        parts.append(f"target {t['target']} (min {t['min']}, max {t['max']})")
    parts += [f"resizes {t['resizes']}", f"restarts {t['restarts']}/{t['max_restarts']}"]
    return "   ".join(parts)


def pool_amount(kind: str, value: Any, *, exact: bool = False) -> str:
    """A pool figure as the table shows it: memory in rounded binary units
    (`479.5Gi`, not `502834240Ki`), the others (and `wide`) as the server wrote them."""
    if exact or kind != "memory" or not isinstance(value, str):
        return str(value)
    try:
        n = parse_bytes(value)
        return "0" if n == 0 else human_bytes(n)
    except SpecError:
        return value  # "-" (no limit) and anything else not a quantity


POOL_FIELDS = ("reservation", "limit", "share", "type", "demand", "allocation", "entitlement")
_SHOWN = ("reservation", "limit", "demand", "allocation")


def pools_table(pools: list[dict], *, wide: bool = False, width: int | None = None) -> str:
    rows = []
    for p in pools:
        for kind, k in p["kinds"].items():
            used = any(k[f] not in ("0", "-") for f in _SHOWN)
            if kind in ("cpu", "memory") or used or wide:
                rows.append(
                    [p["path"], kind] + [pool_amount(kind, k[f], exact=wide) for f in POOL_FIELDS]
                )
    return table(rows, ["POOL", "KIND"] + [f.upper() for f in POOL_FIELDS], width)


def cluster_lines(info: dict) -> str:
    """`cluster info` as readable lines: counts as `ready 3, down 1`, not dicts."""

    def counts(d: Any) -> str:
        if not isinstance(d, dict):
            return str(d)
        return ", ".join(f"{k.lower()} {v}" for k, v in sorted(d.items())) or "none"

    lines = [
        f"region      {info.get('region', '-')}",
        f"leader      {info.get('leader') or '- (none elected)'}   term {info.get('term', '-')}",
        f"answered by {info.get('answered_by', '-')}",
        f"log seq     {info.get('log_seq', '-')}",
        f"nodes       {counts(info.get('nodes', {}))}",
        f"jobs        {counts(info.get('jobs', {}))}",
    ]
    if info.get("version"):
        lines.append(f"version     {info['version']}")
    known = {"ok", "region", "leader", "term", "answered_by", "log_seq", "nodes", "jobs"}
    known.add("version")
    lines += [f"{k:11} {counts(v)}" for k, v in info.items() if k not in known]
    return "\n".join(lines)
