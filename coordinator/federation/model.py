"""The federation's inputs: a job's region policy, the protocol's timers, a region as seen.

These are plain, checked values. The shell builds a :class:`FedPolicy` from a job spec's
``regions``/``spill``/``lost_after`` and a :class:`RegionView` per region from the region
summaries it reads (is the summary within its age bound, is the link up, does this job fit
it now); the pure functions in ``spill.py``, ``epochs.py`` and ``holder.py`` decide from
them. Errors are :class:`workloads.quantity.SpecError` naming the field, because a
policy comes from a spec a person wrote and is shown to them verbatim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mesh.subjects import is_token
from workloads.quantity import SpecError, _show

__all__ = [
    "MAX_DURATION_S",
    "MAX_REGIONS",
    "FedPolicy",
    "FederationConfig",
    "RegionView",
    "home_region",
]

MAX_REGIONS = 32  # a preference list longer than this is a mistake, not a deployment
MAX_DURATION_S = 30 * 86400.0  # a month: a longer bound is a typo, not a policy


def _check_region(value: object, field: str) -> str:
    # Region names become NATS subject tokens (mesh.fed.<region>...): the same rule applies.
    if not is_token(value):
        raise SpecError(field, f"a region is 1-64 letters, digits, '_' or '-', got {_show(value)}")
    assert isinstance(value, str)
    return value


def _check_seconds(value: object, field: str, *, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"expected a number of seconds, got {_show(value)}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        low = "above 0" if positive else "0 or more"
        raise SpecError(field, f"must be {low} and finite, got {_show(value)}")
    if value > MAX_DURATION_S:
        raise SpecError(field, f"at most {MAX_DURATION_S:.0f} s, got {_show(value)}")


@dataclass(frozen=True, slots=True)
class FedPolicy:
    """A job's federation rule, from its spec.

    ``regions`` is the ordered preference list (may name the home; the home is never a
    spill target). ``spill_after`` is how long the job must wait queued in its home before
    it may be nominated elsewhere; ``None`` is ``spill: never`` (the default: a job stays
    where it was submitted unless it says otherwise). ``lost_after`` is how long a region
    holding the job may be unreachable before the home re-places it; ``None`` (the
    default) is never: an unreachable region keeps its jobs for as long as it is away.
    """

    regions: tuple[str, ...] = ()
    spill_after: float | None = None
    lost_after: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.regions, tuple):
            raise SpecError("regions", f"expected a list of regions, got {_show(self.regions)}")
        if len(self.regions) > MAX_REGIONS:
            raise SpecError("regions", f"at most {MAX_REGIONS} regions")
        seen: set[str] = set()
        for i, region in enumerate(self.regions):
            _check_region(region, f"regions[{i}]")
            if region in seen:
                raise SpecError(f"regions[{i}]", f"{region!r} is named twice")
            seen.add(region)
        if self.spill_after is not None:
            _check_seconds(self.spill_after, "spill.after", positive=False)
        if self.lost_after is not None:
            _check_seconds(self.lost_after, "lost_after", positive=True)

    def targets(self, home: str) -> tuple[str, ...]:
        """The regions this job may spill to, in preference order: every named one but home."""
        return tuple(r for r in self.regions if r != home)


def home_region(submitted_in: str, regions: Sequence[str]) -> str:
    """Where a job lives: the region it was submitted in when the spec names that region
    or names none; otherwise the first region the spec names (the submitting region
    forwards the submission there, so the job waits where its owner wants it first)."""
    _check_region(submitted_in, "region")
    if not regions or submitted_in in regions:
        return submitted_in
    return _check_region(regions[0], "regions[0]")


@dataclass(frozen=True, slots=True)
class FederationConfig:
    """The protocol's timers, the same for every job of a region. Checked when built.

    ``nominate_timeout_s``: a nomination not answered in this long is given up (the target
    is sent a revoke, in case it admits late) and the next region is tried. Summaries come
    every few seconds and a target answers from its own state at once, so a few seconds is
    ample; MultiKueue's incremental dispatcher waits 5 min, which is why it is slow.
    ``round_backoff_s``: once every eligible region of a round was tried, the next round
    waits this long after the last try ended. ``reserve_ttl_s``: a target that admitted
    (reserved room) but heard no confirm from the home in this long gives the job back; it
    must outlast the home's timeout, or targets would drop reservations the home would
    still confirm.
    """

    nominate_timeout_s: float = 5.0
    round_backoff_s: float = 30.0
    reserve_ttl_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("nominate_timeout_s", "round_backoff_s", "reserve_ttl_s"):
            _check_seconds(getattr(self, name), name, positive=name != "round_backoff_s")
        if self.reserve_ttl_s < self.nominate_timeout_s:
            raise SpecError(
                "reserve_ttl_s",
                f"must be at least nominate_timeout_s ({self.nominate_timeout_s}): a target "
                f"must not drop a reservation the home may still confirm, "
                f"got {self.reserve_ttl_s}",
            )


@dataclass(frozen=True, slots=True)
class RegionView:
    """One region as the home's shell sees it now, for one job.

    ``fresh``: its latest summary is within the summary age bound (a stale summary says
    nothing about room). ``reachable``: the link to it is up (it answers or its summaries
    arrive). ``fits``: this job fits the room its summary reports now. ``last_heard``:
    when the home last heard from it (the latest summary's time), which starts the job's
    ``lost_after`` clock once it is unreachable; ``None`` when unknown, and then nothing
    it holds is ever declared lost (no eviction on missing facts).
    """

    region: str
    fresh: bool
    reachable: bool
    fits: bool
    last_heard: float | None = None
