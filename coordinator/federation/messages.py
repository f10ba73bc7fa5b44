"""What crosses between a job's home and the region that may hold it.

Every message names the job, the epoch it is about, the home and the holder (the target of
a nomination). Epochs are issued only by the home, one per placement, strictly
increasing per job, so ``(job, epoch)`` names one placement everywhere. The wire encoding
is the shell's (``mesh/fedschema.py``); these are the values the pure functions take and
return. A nomination carries the job's spec on the wire; here it is only its identity.

Home → holder: :class:`Nominate`, :class:`Confirm`, :class:`Revoke`.
Holder → home: :class:`Admitted`, :class:`Refused`, :class:`GaveUp`, :class:`Finished`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Admitted",
    "Confirm",
    "Finished",
    "GaveUp",
    "Message",
    "Nominate",
    "Refused",
    "Revoke",
    "ToHolder",
    "ToHome",
    "dedup_id",
]


@dataclass(frozen=True, slots=True)
class Nominate:
    """Home → target: will you take this job at this epoch? Re-sent until answered; the
    target answers a repeat with the answer it gave the first time."""

    job: str
    epoch: int
    home: str
    holder: str


@dataclass(frozen=True, slots=True)
class Confirm:
    """Home → holder: the home recorded you as the job's holder at this epoch; start it.
    Nothing runs before this: an admission only reserves room."""

    job: str
    epoch: int
    home: str
    holder: str


@dataclass(frozen=True, slots=True)
class Revoke:
    """Home → holder: this epoch is not (or no longer) the job's current placement; drop the
    reservation or stop the run. ``reason`` is logged on both sides."""

    job: str
    epoch: int
    home: str
    holder: str
    reason: str


@dataclass(frozen=True, slots=True)
class Admitted:
    """Holder → home: I hold the job at this epoch, reserved (``running`` false) or started
    (``running`` true). Sent on admission, and again on every resync (and when a region comes
    back), so a returning region's stale run reaches the home as an old-epoch Admitted and is
    answered with a Revoke."""

    job: str
    epoch: int
    home: str
    holder: str
    running: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """Holder → target's answer: no room, or an epoch not higher than one it has seen."""

    job: str
    epoch: int
    home: str
    holder: str
    reason: str


@dataclass(frozen=True, slots=True)
class GaveUp:
    """Holder → home: I no longer hold the job at this epoch (the run is stopped, or was
    never started); the home may place it again."""

    job: str
    epoch: int
    home: str
    holder: str
    reason: str


@dataclass(frozen=True, slots=True)
class Finished:
    """Holder → home: the run of this epoch ended with ``outcome`` (the job's final state,
    e.g. "succeeded", "failed")."""

    job: str
    epoch: int
    home: str
    holder: str
    outcome: str


ToHolder = Nominate | Confirm | Revoke
ToHome = Admitted | Refused | GaveUp | Finished
Message = ToHolder | ToHome


def dedup_id(msg: Message) -> str:
    """A stable id for the stream's ``Nats-Msg-Id``: a message re-sent is the same message,
    so JetStream drops the copy within its window; past the window the epoch rules make
    the copy harmless anyway (README.md, "Idempotence")."""
    kind = type(msg).__name__.lower()
    if isinstance(msg, Admitted) and msg.running:
        kind = "running"
    return f"{kind}:{msg.job}:{msg.epoch}"
