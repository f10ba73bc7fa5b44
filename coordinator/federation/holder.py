"""The holder's side: a region that was offered another region's job.

Per job it keeps the highest epoch it has seen (from a nomination, confirm or revoke) and
what it did with it. The rules that make "exactly one run" hold on this side:

- it admits a nomination only with an epoch higher than any it has seen for the job, and
  answers a repeat of the same ``(job, epoch)`` with the answer it gave (idempotent);
- admitting only *reserves*: the run starts on the home's :class:`Confirm` of that epoch;
- anything with a higher epoch supersedes what it holds: a lower run is stopped.

Each function returns a :class:`HolderStep`: the record to keep (the shell logs it in the
holder region's own log), the messages to send home, and at most one start and one stop
for the shell to carry out (a stop always comes with the reason to log).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from .messages import Admitted, Confirm, Finished, GaveUp, Nominate, Refused, Revoke, ToHome
from .model import FederationConfig

__all__ = [
    "Hold",
    "HolderRecord",
    "HolderStep",
    "Stop",
    "expire_reservation",
    "finish",
    "give_up",
    "on_confirm",
    "on_nominate",
    "on_revoke",
    "receive",
    "report",
]


class Hold(StrEnum):
    RESERVED = "reserved"  # admitted, room set aside, waiting for the home's confirm
    RUNNING = "running"  # confirmed: the run is live here
    REFUSED = "refused"  # this epoch was refused
    RELEASED = "released"  # given up, revoked or superseded: nothing live here
    FINISHED = "finished"  # the run ended (``note`` is its outcome)


@dataclass(frozen=True, slots=True)
class HolderRecord:
    """What ``holder`` knows of another region's job: the highest ``epoch`` seen and what
    became of it (``note``: the refusal or release reason, or the outcome)."""

    job: str
    home: str
    holder: str
    epoch: int
    phase: Hold
    since: float
    note: str = ""

    @property
    def live(self) -> bool:
        """Whether a run of this job is live here (as far as this region knows)."""
        return self.phase is Hold.RUNNING


@dataclass(frozen=True, slots=True)
class Stop:
    job: str
    epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class HolderStep:
    record: HolderRecord
    send: tuple[ToHome, ...] = ()
    start: int | None = None  # start the run of this epoch
    stop: Stop | None = None  # stop the run of this epoch
    why: str = ""


def report(rec: HolderRecord) -> ToHome:
    """What this region says about the job: sent as the answer to a repeat, and on every
    resync (and when the region comes back), so the home can confirm or revoke it."""
    args = {"job": rec.job, "epoch": rec.epoch, "home": rec.home, "holder": rec.holder}
    if rec.phase in (Hold.RESERVED, Hold.RUNNING):
        return Admitted(**args, running=rec.phase is Hold.RUNNING)
    if rec.phase is Hold.REFUSED:
        return Refused(**args, reason=rec.note)
    if rec.phase is Hold.FINISHED:
        return Finished(**args, outcome=rec.note)
    return GaveUp(**args, reason=rec.note)


def _superseded(rec: HolderRecord | None, epoch: int) -> Stop | None:
    if rec is not None and rec.live:
        return Stop(rec.job, rec.epoch, f"superseded by epoch {epoch} from {rec.home}")
    return None


def on_nominate(rec: HolderRecord | None, msg: Nominate, fits: bool, now: float) -> HolderStep:
    """A nomination. Higher than anything seen: reserve it when the job ``fits`` here now
    (the shell's admission check), refuse otherwise; a live lower run is stopped either
    way. The same epoch again: the same answer. Lower: refused, changing nothing."""
    if rec is not None and msg.epoch == rec.epoch:
        return HolderStep(rec, (report(rec),), why=f"repeat of epoch {msg.epoch}: same answer")
    if rec is not None and msg.epoch < rec.epoch:
        reason = f"epoch {msg.epoch} is not above epoch {rec.epoch} already seen"
        refusal = Refused(
            job=msg.job, epoch=msg.epoch, home=msg.home, holder=msg.holder, reason=reason
        )
        return HolderStep(rec, (refusal,), why=f"refused: {reason}")
    stop = _superseded(rec, msg.epoch)
    if fits:
        new = HolderRecord(msg.job, msg.home, msg.holder, msg.epoch, Hold.RESERVED, now)
        why = f"admitted epoch {msg.epoch}: reserved until confirmed"
    else:
        new = HolderRecord(msg.job, msg.home, msg.holder, msg.epoch, Hold.REFUSED, now, "no room")
        why = f"refused epoch {msg.epoch}: no room"
    return HolderStep(new, (report(new),), stop=stop, why=why)


def _released(
    rec: HolderRecord | None, msg: Confirm | Revoke, note: str, now: float
) -> HolderRecord:
    return HolderRecord(msg.job, msg.home, msg.holder, msg.epoch, Hold.RELEASED, now, note)


def on_confirm(rec: HolderRecord | None, msg: Confirm, now: float) -> HolderStep:
    """The home confirmed ``msg.epoch``: a reservation of it starts running (once; a repeat
    starts nothing). A confirm of an epoch not reserved here is answered with GaveUp, so
    the home places the job again instead of believing it runs here."""
    if rec is not None and msg.epoch < rec.epoch:
        return HolderStep(rec, why=f"ignored: confirm of stale epoch {msg.epoch}")
    if rec is not None and msg.epoch == rec.epoch:
        if rec.phase is Hold.RESERVED:
            new = replace(rec, phase=Hold.RUNNING, since=now)
            return HolderStep(new, start=rec.epoch, why=f"confirmed epoch {rec.epoch}: started")
        if rec.phase is Hold.RUNNING:
            return HolderStep(rec, why=f"repeat confirm of epoch {rec.epoch}: already running")
        if rec.phase is Hold.FINISHED:
            return HolderStep(rec, (report(rec),), why=f"confirm of finished epoch {rec.epoch}")
        new = replace(rec, phase=Hold.RELEASED, note=rec.note or "not reserved")
        return HolderStep(
            new, (report(new),), why=f"confirm of epoch {rec.epoch}, which is {rec.phase}: gave up"
        )
    stop = _superseded(rec, msg.epoch)
    new = _released(rec, msg, "confirmed but never reserved here", now)
    return HolderStep(
        new, (report(new),), stop=stop, why=f"confirm of unknown epoch {msg.epoch}: gave up"
    )


def on_revoke(rec: HolderRecord | None, msg: Revoke, now: float) -> HolderStep:
    """The home revoked ``msg.epoch``: drop its reservation or stop its run. A revoke of a
    higher epoch than held also stops what is held (the home has moved past it); one of
    a lower epoch is stale. The record keeps the revoked epoch, so a nomination of it
    arriving late is answered with GaveUp, never admitted."""
    if rec is not None and msg.epoch < rec.epoch:
        return HolderStep(rec, why=f"ignored: revoke of stale epoch {msg.epoch}")
    if rec is not None and msg.epoch == rec.epoch:
        if rec.phase in (Hold.RESERVED, Hold.RUNNING):
            stop = Stop(rec.job, rec.epoch, f"revoked: {msg.reason}") if rec.live else None
            new = replace(rec, phase=Hold.RELEASED, since=now, note=f"revoked: {msg.reason}")
            return HolderStep(new, stop=stop, why=f"epoch {rec.epoch} revoked: {msg.reason}")
        return HolderStep(rec, why=f"revoke of epoch {rec.epoch}, already {rec.phase}")
    stop = _superseded(rec, msg.epoch)
    new = _released(rec, msg, f"revoked: {msg.reason}", now)
    return HolderStep(
        new, stop=stop, why=f"epoch {msg.epoch} revoked before it arrived: {msg.reason}"
    )


def receive(
    rec: HolderRecord | None, msg: Nominate | Confirm | Revoke, fits: bool, now: float
) -> HolderStep:
    """Dispatch a home's message to its rule (``fits`` matters to nominations only)."""
    if rec is not None and (msg.job, msg.home, msg.holder) != (rec.job, rec.home, rec.holder):
        raise ValueError(
            f"message for {msg.holder}:{msg.home}/{msg.job} "
            f"given to the record of {rec.holder}:{rec.home}/{rec.job}"
        )
    if isinstance(msg, Nominate):
        return on_nominate(rec, msg, fits, now)
    if isinstance(msg, Confirm):
        return on_confirm(rec, msg, now)
    return on_revoke(rec, msg, now)


def give_up(rec: HolderRecord, reason: str, now: float) -> HolderStep:
    """This region gives the job back (it cannot keep it: its nodes went, it was preempted
    for good, an operator drained it): the run is stopped first, then the home is told,
    so the home never re-places a job still live here."""
    if rec.phase not in (Hold.RESERVED, Hold.RUNNING):
        return HolderStep(rec, why=f"nothing to give up: {rec.phase}")
    stop = Stop(rec.job, rec.epoch, f"given up: {reason}") if rec.live else None
    new = replace(rec, phase=Hold.RELEASED, since=now, note=reason)
    return HolderStep(new, (report(new),), stop=stop, why=f"gave up epoch {rec.epoch}: {reason}")


def expire_reservation(rec: HolderRecord, cfg: FederationConfig, now: float) -> HolderStep:
    """A reservation with no confirm for ``reserve_ttl_s`` is given up (the home is away or
    moved on): the room is freed and a late confirm is answered with GaveUp."""
    if rec.phase is Hold.RESERVED and now - rec.since >= cfg.reserve_ttl_s:
        return give_up(rec, f"no confirm in {cfg.reserve_ttl_s:g}s", now)
    return HolderStep(rec)


def finish(rec: HolderRecord, outcome: str, now: float) -> HolderStep:
    """The live run ended with its final ``outcome``: tell the home. A run that ends after
    it was stopped (released) reports nothing new."""
    if rec.phase is not Hold.RUNNING:
        return HolderStep(rec, why=f"outcome {outcome} while {rec.phase}: nothing to report")
    new = replace(rec, phase=Hold.FINISHED, since=now, note=outcome)
    return HolderStep(new, (report(new),), why=f"epoch {rec.epoch} finished: {outcome}")
