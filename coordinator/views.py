"""What the API shows of jobs and nodes: plain dicts, built from the state and the
cluster view. Environment values are never echoed back (they may hold secrets)."""

from __future__ import annotations

from coordinator.cluster import NodeView
from coordinator.partitions.views import node_partition
from coordinator.records import HOLDING, JobRecord
from coordinator.state import RegionState


def job_federation(state: RegionState, region: str, job_id: str) -> dict | None:
    """Where a federated job is (docs/federation.md): at its home, its phase, the region
    offered or holding it, the epoch and the outcome there; at a region holding it for
    another, its origin (home) and epoch. None for a job that never leaves its region."""
    held = state.fed_held.get(job_id)
    if held is not None:
        return {"origin": held.home, "epoch": held.epoch, "hold": held.phase, "note": held.note}
    rec = state.fed_home.get(job_id)
    if rec is not None:
        return {
            "home": rec.home,
            "phase": rec.phase,
            "region": rec.region,
            "epoch": rec.epoch,
            "outcome": rec.outcome,
            "why": rec.why,
        }
    if job_id in state.federated:
        return {"home": region, "phase": "local", "region": "", "epoch": 0, "outcome": ""}
    return None


def job_detail(job: JobRecord, pending_reason: str | None, federation: dict | None = None) -> dict:
    spec = job.spec.to_dict()
    for group in spec.get("tasks", []):
        if group.get("env"):
            group["env"] = {k: "<redacted>" for k in group["env"]}
    return {
        **job.summary(),
        "client_id": job.client_id,
        "kill_reason": job.kill_reason,
        "pending_reason": pending_reason,
        "spec": spec,
        "task_list": [t.to_dict() for t in job.tasks.values()],
        "federation": federation,
        "training": training(job),
    }


def training(job: JobRecord) -> dict | None:
    """A training job's size and budget (docs/training.md); None for any other job."""
    if not job.is_training:
        return None
    spec = job.spec
    holding = sum(1 for t in job.tasks.values() if t.state in HOLDING)
    return {
        "framework": spec.framework,
        "generation": job.generation,
        "size": holding,
        "target": (job.target or spec.workers_max or len(job.tasks)) if spec.is_elastic else None,
        "min": spec.workers_min,
        "max": spec.workers_max,
        "resizes": job.resizes,
        "restarts": job.failures,
        "max_restarts": spec.max_restarts,
        "progress_at": job.progress_at,
    }


def node_summary(view: NodeView, state: RegionState, now: float) -> dict:
    s = view.state
    return {
        "node_id": s.node_id,
        "status": view.status,
        "zone": s.zone,
        "site": s.site,  # the edge site it belongs to ("": none)
        "simulated": s.simulated,
        "labels": dict(s.labels),
        "capacity": s.capacity.to_dict(),
        "allocated": state.allocated(s.node_id).to_dict(),
        "cpu_percent": s.cpu_percent,
        "load1": s.load1,
        "memory_used": s.memory_used,
        "disk_used": s.disk_used,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_total": g.memory_total,
                "memory_used": g.memory_used,
                "utilization": g.utilization,
                "enforcement": g.enforcement,
            }
            for g in s.gpus
        ],
        "tasks": len(state.node_tasks.get(s.node_id, ())),
        "heartbeat_age_s": round(max(0.0, now - view.last_seen), 3),
        "note": s.note,
        "refusing": s.refusing,
        "verify_key": s.verify_key,  # the key it verifies assignments with ("": none)
        "barred": view.barred,  # why nothing is placed on it ("": nothing bars it)
        **node_partition(state.partitions, view),  # partition, desired, drain (docs/partitions.md)
    }
