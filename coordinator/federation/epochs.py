"""The home's record of a federated job, and the rules that keep it running in one place.

The home is the job's single authority: it alone issues epochs, and it issues a new one
whenever the job's placement changes (README.md, "Epochs"). Each function takes the
record and one event and returns a :class:`HomeStep`: the record to keep (the shell logs
the event in the home's job log, so the record is a fold a new leader rebuilds), the
messages to send, and a one-line why. Nothing here reads a clock or the network.

Phases:

- ``LOCAL``: the home holds it (queued, or running in the home region) at ``epoch``.
- ``NOMINATED``: offered to ``region`` at ``epoch`` since ``since``; not runnable at home.
- ``HELD``: ``region`` admitted ``epoch`` and the home confirmed it; only that run is live.
- ``DONE``: finished (``outcome``); every later report is answered with a revoke.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from .messages import Admitted, Confirm, Finished, GaveUp, Nominate, Refused, Revoke, ToHome
from .model import FederationConfig, FedPolicy, RegionView

__all__ = [
    "HomeRecord",
    "HomeStep",
    "Phase",
    "Resolution",
    "Run",
    "cancel",
    "declare_lost",
    "expire_nomination",
    "finish_local",
    "handle",
    "new_job",
    "nominate",
    "on_admitted",
    "on_finished",
    "on_gave_up",
    "on_refused",
    "on_unreachable",
    "resend",
    "resolve",
]


class Phase(StrEnum):
    LOCAL = "local"
    NOMINATED = "nominated"
    HELD = "held"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class HomeRecord:
    """The home's record of one job (see the module docstring for the phases).

    ``queued_since``: when the job last began waiting in its home (submission, or its
    return from a holder): ``spill_after`` counts from here. ``tried``: this spill round's
    regions that refused, timed out, became unreachable or gave the job back;
    ``last_try``: when the latest of them ended (the round's back-off counts from here).
    """

    job: str
    home: str
    policy: FedPolicy
    phase: Phase = Phase.LOCAL
    epoch: int = 0
    region: str = ""
    since: float = 0.0
    queued_since: float = 0.0
    tried: tuple[str, ...] = ()
    last_try: float | None = None
    outcome: str = ""


@dataclass(frozen=True, slots=True)
class HomeStep:
    record: HomeRecord
    send: tuple[Nominate | Confirm | Revoke, ...] = ()
    why: str = ""


def new_job(job: str, home: str, policy: FedPolicy, now: float) -> HomeRecord:
    """A job submitted in (or forwarded to) its home: LOCAL at epoch 0, queued from now."""
    return HomeRecord(job=job, home=home, policy=policy, since=now, queued_since=now)


def _back_home(rec: HomeRecord, now: float, tried: tuple[str, ...], *, requeue: bool) -> HomeRecord:
    # Leaving NOMINATED or HELD always issues a new epoch: whatever the old one reserved or
    # started is recognisably stale from now on, wherever it turns up.
    return replace(
        rec,
        phase=Phase.LOCAL,
        epoch=rec.epoch + 1,
        region="",
        since=now,
        queued_since=now if requeue else rec.queued_since,
        tried=tried,
        last_try=now,
    )


def _revoke(rec: HomeRecord, holder: str, epoch: int, reason: str) -> Revoke:
    return Revoke(job=rec.job, epoch=epoch, home=rec.home, holder=holder, reason=reason)


def nominate(rec: HomeRecord, target: str, now: float, *, new_round: bool = False) -> HomeStep:
    """Offer the job to ``target`` at a new epoch (what ``spill.decide_spill`` chose).
    ``new_round`` forgets the regions tried in the round before. The job is not runnable
    at home while it is nominated: the shell's local scheduler skips it."""
    if rec.phase is not Phase.LOCAL:
        raise ValueError(f"job {rec.job}: only a LOCAL job can be nominated, it is {rec.phase}")
    if target == rec.home or target not in rec.policy.regions:
        raise ValueError(f"job {rec.job}: {target!r} is not one of its spill targets")
    epoch = rec.epoch + 1
    new = replace(
        rec,
        phase=Phase.NOMINATED,
        epoch=epoch,
        region=target,
        since=now,
        tried=() if new_round else rec.tried,
    )
    msg = Nominate(job=rec.job, epoch=epoch, home=rec.home, holder=target)
    return HomeStep(new, (msg,), f"nominated {target} at epoch {epoch}")


def _current(rec: HomeRecord, holder: str, epoch: int) -> bool:
    return (
        rec.phase in (Phase.NOMINATED, Phase.HELD) and rec.region == holder and rec.epoch == epoch
    )


def _stale_reason(rec: HomeRecord, holder: str, epoch: int) -> str:
    if rec.phase is Phase.DONE:
        return f"job already {rec.outcome or 'done'} (epoch {rec.epoch})"
    if epoch > rec.epoch:
        return f"epoch {epoch} was never issued (current {rec.epoch})"
    if epoch == rec.epoch:
        return f"epoch {epoch} belongs to {rec.region or rec.home}, not {holder}"
    where = f"{rec.phase} {rec.region}" if rec.region else f"{rec.phase} in {rec.home}"
    return f"superseded by epoch {rec.epoch} ({where})"


def on_admitted(rec: HomeRecord, msg: Admitted, now: float) -> HomeStep:
    """A holder says it holds ``msg.epoch``. The current nomination becomes HELD and is
    confirmed (a repeat is confirmed again: idempotent). Anything else (a late admission
    after a refusal, time-out or loss, a stale run reported by a region that came back, a
    job already done) is answered with a Revoke: the highest epoch wins, the loser stops."""
    if _current(rec, msg.holder, msg.epoch):
        confirm = Confirm(job=rec.job, epoch=rec.epoch, home=rec.home, holder=msg.holder)
        if rec.phase is Phase.HELD:
            return HomeStep(
                rec, (confirm,), f"{msg.holder} holds epoch {msg.epoch}: confirmed again"
            )
        return HomeStep(
            replace(rec, phase=Phase.HELD, since=now),
            (confirm,),
            f"{msg.holder} admitted epoch {msg.epoch}: held, confirmed",
        )
    reason = _stale_reason(rec, msg.holder, msg.epoch)
    what = "a run" if msg.running else "a reservation"
    return HomeStep(
        rec,
        (_revoke(rec, msg.holder, msg.epoch, reason),),
        f"duplicate: {msg.holder} holds {what} of epoch {msg.epoch}, revoked: {reason}",
    )


def on_refused(rec: HomeRecord, msg: Refused, now: float) -> HomeStep:
    """The target refused the current nomination: back home at a new epoch, the target
    tried this round. A refusal of anything else changes nothing."""
    if rec.phase is Phase.NOMINATED and _current(rec, msg.holder, msg.epoch):
        new = _back_home(rec, now, (*rec.tried, msg.holder), requeue=False)
        return HomeStep(new, (), f"{msg.holder} refused epoch {msg.epoch}: {msg.reason}")
    return HomeStep(rec, (), f"ignored: stale refusal of epoch {msg.epoch} by {msg.holder}")


def on_gave_up(rec: HomeRecord, msg: GaveUp, now: float) -> HomeStep:
    """The holder (or a target that had admitted) no longer holds the current epoch and has
    stopped what it ran: back home at a new epoch, skipping it for the rest of the round.
    A job that ran elsewhere and comes back waits ``spill_after`` at home again."""
    if not _current(rec, msg.holder, msg.epoch):
        return HomeStep(rec, (), f"ignored: {msg.holder} gave up stale epoch {msg.epoch}")
    held = rec.phase is Phase.HELD  # a new round after a run elsewhere; else this round goes on
    tried = (msg.holder,) if held else (*rec.tried, msg.holder)
    new = _back_home(rec, now, tried, requeue=held)
    return HomeStep(new, (), f"{msg.holder} gave up epoch {msg.epoch}: {msg.reason}")


def on_finished(rec: HomeRecord, msg: Finished, now: float) -> HomeStep:
    """The holder's run of the current, held epoch ended: DONE. The outcome of a superseded
    run is logged and ignored (the higher epoch's run is the job's)."""
    if rec.phase is Phase.HELD and _current(rec, msg.holder, msg.epoch):
        new = replace(rec, phase=Phase.DONE, since=now, outcome=msg.outcome)
        return HomeStep(new, (), f"{msg.holder} finished epoch {msg.epoch}: {msg.outcome}")
    reason = _stale_reason(rec, msg.holder, msg.epoch)
    return HomeStep(
        rec, (), f"ignored: outcome {msg.outcome} of epoch {msg.epoch} from {msg.holder}: {reason}"
    )


def handle(rec: HomeRecord, msg: ToHome, now: float) -> HomeStep:
    """Dispatch a holder's message to its rule."""
    if msg.job != rec.job or msg.home != rec.home:
        raise ValueError(
            f"message for {msg.home}/{msg.job} given to the record of {rec.home}/{rec.job}"
        )
    if isinstance(msg, Admitted):
        return on_admitted(rec, msg, now)
    if isinstance(msg, Refused):
        return on_refused(rec, msg, now)
    if isinstance(msg, GaveUp):
        return on_gave_up(rec, msg, now)
    return on_finished(rec, msg, now)


def expire_nomination(rec: HomeRecord, cfg: FederationConfig, now: float) -> HomeStep:
    """A nomination unanswered for ``nominate_timeout_s`` is given up: back home at a new
    epoch, the target tried this round, and a Revoke sent so that an admission the target
    makes late (or made, its answer lost) is dropped. Even unrevoked, a late admission
    never runs: it is not the current epoch, so the home answers it with a revoke."""
    if rec.phase is not Phase.NOMINATED or now - rec.since < cfg.nominate_timeout_s:
        return HomeStep(rec)
    new = _back_home(rec, now, (*rec.tried, rec.region), requeue=False)
    reason = f"nomination timed out after {cfg.nominate_timeout_s:g}s"
    return HomeStep(new, (_revoke(rec, rec.region, rec.epoch, reason),), f"{rec.region}: {reason}")


def on_unreachable(rec: HomeRecord, region: str, now: float) -> HomeStep:
    """``region`` became unreachable. A nomination to it moves on at once (as a time-out,
    revoked). A job it holds stays there: unreachable is not lost (no mass eviction)."""
    if rec.phase is Phase.NOMINATED and rec.region == region:
        new = _back_home(rec, now, (*rec.tried, region), requeue=False)
        reason = "target unreachable"
        return HomeStep(new, (_revoke(rec, region, rec.epoch, reason),), f"{region}: {reason}")
    if rec.phase is Phase.HELD and rec.region == region:
        after = rec.policy.lost_after
        when = "never" if after is None else f"after {after:g}s"
        return HomeStep(rec, (), f"kept in {region} while unreachable: lost {when}")
    return HomeStep(rec)


def declare_lost(rec: HomeRecord, view: RegionView, now: float) -> HomeStep:
    """The holder has been unreachable for the job's ``lost_after`` (counted from the later
    of when it was last heard and when the home confirmed it): the job comes back home at
    a new epoch, to be placed again. The Revoke reaches the holder when it returns (it is
    stored and forwarded), and any report of the old run is revoked again; until then the
    old run may still live in the cut-off region: that is what ``lost_after`` trades."""
    after = rec.policy.lost_after
    if (
        rec.phase is not Phase.HELD
        or view.region != rec.region
        or view.reachable
        or after is None
        or view.last_heard is None
        or now - max(view.last_heard, rec.since) < after
    ):
        return HomeStep(rec)
    new = _back_home(rec, now, (rec.region,), requeue=True)
    reason = f"declared lost: unreachable for {after:g}s (lost_after)"
    return HomeStep(new, (_revoke(rec, rec.region, rec.epoch, reason),), f"{rec.region}: {reason}")


def finish_local(rec: HomeRecord, outcome: str, now: float) -> HomeStep:
    """The job's run in its home ended with a final ``outcome``: DONE."""
    if rec.phase is not Phase.LOCAL:
        raise ValueError(f"job {rec.job}: a local outcome while {rec.phase}")
    return HomeStep(
        replace(rec, phase=Phase.DONE, since=now, outcome=outcome),
        (),
        f"finished at home: {outcome}",
    )


def cancel(rec: HomeRecord, reason: str, now: float) -> HomeStep:
    """The job is killed (by its owner): DONE, and whatever holds or was offered it is
    revoked. A job already DONE stays as it was."""
    if rec.phase is Phase.DONE:
        return HomeStep(rec, (), "already done")
    send = (_revoke(rec, rec.region, rec.epoch, reason),) if rec.region else ()
    new = replace(rec, phase=Phase.DONE, since=now, outcome="killed")
    return HomeStep(new, send, f"killed: {reason}")


def resend(rec: HomeRecord) -> tuple[Nominate, ...]:
    """What the home repeats on its resync tick: an unanswered nomination (the target
    answers a repeat as it did the first). Confirms and revokes are answers to the holder's
    own repeated reports, so they need no timer of the home's."""
    if rec.phase is Phase.NOMINATED:
        return (Nominate(job=rec.job, epoch=rec.epoch, home=rec.home, holder=rec.region),)
    return ()


@dataclass(frozen=True, slots=True)
class Run:
    """A live run of a job as some region reports it."""

    region: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Resolution:
    keep: Run | None
    stop: tuple[tuple[Run, str], ...]  # each loser with the reason to log


def resolve(runs: tuple[Run, ...] | list[Run]) -> Resolution:
    """Duplicates seen together (a global view after a partition): the highest epoch wins,
    every other run is stopped with a reason. Two runs of one epoch cannot happen (an epoch
    names one target); if they are reported anyway the region that sorts first keeps it,
    so every observer resolves them alike."""
    if not runs:
        return Resolution(None, ())
    ordered = sorted(runs, key=lambda r: (-r.epoch, r.region))
    keep = ordered[0]
    stop = tuple(
        (r, f"superseded by epoch {keep.epoch} in {keep.region}")
        if r.epoch < keep.epoch
        else (r, f"epoch {r.epoch} also held by {keep.region} (impossible: kept {keep.region})")
        for r in ordered[1:]
    )
    return Resolution(keep, stop)
