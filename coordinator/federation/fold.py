"""The federation's records as the job log holds them, and back.

The home logs a `FedHomeRecorded` after every transition of a job's `HomeRecord`, the
holder a `FedHoldRecorded` after every transition of its `HolderRecord` (mesh/schema.py);
`coordinator/state.py` keeps the latest of each per job, so whoever leads next resumes
from the same records. This module converts between the log's events and the pure
core's records (epochs.py, holder.py); it holds no state of its own.
"""

from __future__ import annotations

from coordinator.federation.epochs import HomeRecord, Phase
from coordinator.federation.holder import Hold, HolderRecord
from coordinator.federation.model import FedPolicy
from mesh.schema import FedHoldRecorded, FedHomeRecorded
from workloads.spec import JobSpec

__all__ = ["away", "hold_event", "hold_of", "home_event", "home_of", "policy_of", "spills"]


def policy_of(spec: JobSpec) -> FedPolicy:
    """The core's policy from a job spec's `regions`, `spill`, `lost_after`."""
    return FedPolicy(spec.regions, spec.spill_after_s, spec.lost_after_s)


def spills(spec: JobSpec) -> bool:
    """Whether a job submitted here may ever be offered to another region."""
    return spec.spill_after_s is not None and bool(spec.regions)


def home_event(rec: HomeRecord, why: str, ts: float) -> FedHomeRecorded:
    return FedHomeRecorded(
        job_id=rec.job,
        home=rec.home,
        phase=str(rec.phase),
        epoch=rec.epoch,
        region=rec.region,
        since=rec.since,
        queued_since=rec.queued_since,
        tried=rec.tried,
        last_try=rec.last_try,
        outcome=rec.outcome,
        why=why[:1024],
        ts=ts,
    )


def home_of(ev: FedHomeRecorded, policy: FedPolicy) -> HomeRecord:
    return HomeRecord(
        job=ev.job_id,
        home=ev.home,
        policy=policy,
        phase=Phase(ev.phase),
        epoch=ev.epoch,
        region=ev.region,
        since=ev.since,
        queued_since=ev.queued_since,
        tried=ev.tried,
        last_try=ev.last_try,
        outcome=ev.outcome,
    )


def away(ev: FedHomeRecorded) -> bool:
    """Whether the job is out of its home's hands: offered to or held by another region,
    or ended there. Such a job is not in the home's placement queue."""
    return ev.phase in ("nominated", "held") or (ev.phase == "done" and bool(ev.region))


def hold_event(rec: HolderRecord, why: str, ts: float) -> FedHoldRecorded:
    return FedHoldRecorded(
        job_id=rec.job,
        home=rec.home,
        holder=rec.holder,
        epoch=rec.epoch,
        phase=str(rec.phase),
        since=rec.since,
        note=rec.note[:1024],
        why=why[:1024],
        ts=ts,
    )


def hold_of(ev: FedHoldRecorded) -> HolderRecord:
    return HolderRecord(ev.job_id, ev.home, ev.holder, ev.epoch, Hold(ev.phase), ev.since, ev.note)
