"""When a job waiting in its home is offered to another region, and to which.

A job spills only when its policy says so (``spill_after`` set), only while it is LOCAL
and queued (not running at home), only once it has waited ``spill_after`` there, and
only to a region it names, in its order of preference, skipping its home and every region
whose summary is stale, that is unreachable, that this job does not fit, or that was
already tried this round (refused, timed out, unreachable, gave it back). One nomination
at a time: a NOMINATED job is not considered until it is answered or timed out. When no
untried region is eligible and some were tried, the round is over; the next starts
``round_backoff_s`` after the last try ended, with every region eligible again.

:func:`tick` is a home's whole periodic decision for one job (time-out, loss,
unreachable nominee, spill), so the shell's loop is one call per job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .epochs import (
    HomeRecord,
    HomeStep,
    Phase,
    declare_lost,
    expire_nomination,
    nominate,
    on_unreachable,
)
from .model import FederationConfig, RegionView

__all__ = ["SpillDecision", "decide_spill", "spill", "tick"]


@dataclass(frozen=True, slots=True)
class SpillDecision:
    """``target``: the region to nominate now ("" for none). ``new_round``: the round
    before is over and forgotten (pass it to ``epochs.nominate``). ``why``: one line,
    naming every region skipped and the reason."""

    target: str = ""
    new_round: bool = False
    why: str = ""


def _views(views: Mapping[str, RegionView] | Iterable[RegionView]) -> Mapping[str, RegionView]:
    if isinstance(views, Mapping):
        return views
    return {v.region: v for v in views}


def _first_eligible(
    targets: tuple[str, ...], views: Mapping[str, RegionView], tried: tuple[str, ...]
) -> tuple[str, list[str]]:
    skipped: list[str] = []
    for region in targets:
        view = views.get(region)
        if region in tried:
            skipped.append(f"{region}: tried this round")
        elif view is None:
            skipped.append(f"{region}: no summary")
        elif not view.reachable:
            skipped.append(f"{region}: unreachable")
        elif not view.fresh:
            skipped.append(f"{region}: summary stale")
        elif not view.fits:
            skipped.append(f"{region}: does not fit")
        else:
            return region, skipped
    return "", skipped


def _with(why: str, skipped: list[str]) -> str:
    return f"{why} (skipped {'; '.join(skipped)})" if skipped else why


def decide_spill(
    rec: HomeRecord,
    views: Mapping[str, RegionView] | Iterable[RegionView],
    cfg: FederationConfig,
    now: float,
    *,
    queued: bool = True,
) -> SpillDecision:
    """Whether to nominate the job now, and where (module docstring). ``views``: the
    regions as the home sees them, by name or as a list; ``queued``: the job is waiting in
    the home's queue (false once the home placed it: it runs at home, nothing spills)."""
    after = rec.policy.spill_after
    if rec.phase is not Phase.LOCAL:
        return SpillDecision(why=f"{rec.phase}: one nomination at a time")
    if after is None:
        return SpillDecision(why="spill: never")
    if not queued:
        return SpillDecision(why="placed at home")
    waited = now - rec.queued_since
    if waited < after:
        return SpillDecision(why=f"waiting at home: {waited:g}s of {after:g}s")
    targets = rec.policy.targets(rec.home)
    if not targets:
        return SpillDecision(why="no other region named")
    by_name = _views(views)
    target, skipped = _first_eligible(targets, by_name, rec.tried)
    if target:
        return SpillDecision(target, False, _with(f"nominate {target}", skipped))
    if not rec.tried:
        return SpillDecision(why=_with("no region eligible", skipped))
    resume = (rec.last_try or 0.0) + cfg.round_backoff_s
    if now < resume:
        return SpillDecision(why=_with(f"round over, next round at {resume:g}", skipped))
    target, skipped = _first_eligible(targets, by_name, ())
    if target:
        return SpillDecision(target, True, _with(f"new round: nominate {target}", skipped))
    return SpillDecision(why=_with("new round: no region eligible", skipped))


def spill(
    rec: HomeRecord,
    views: Mapping[str, RegionView] | Iterable[RegionView],
    cfg: FederationConfig,
    now: float,
    *,
    queued: bool = True,
) -> HomeStep:
    """:func:`decide_spill` and, when it names a target, the nomination itself."""
    decision = decide_spill(rec, views, cfg, now, queued=queued)
    if not decision.target:
        return HomeStep(rec, (), decision.why)
    step = nominate(rec, decision.target, now, new_round=decision.new_round)
    return HomeStep(step.record, step.send, decision.why)


def tick(
    rec: HomeRecord,
    views: Mapping[str, RegionView] | Iterable[RegionView],
    cfg: FederationConfig,
    now: float,
    *,
    queued: bool = True,
) -> HomeStep:
    """A home's periodic decision for one job, in order: a nomination timed out or whose
    target went unreachable moves on; a holder unreachable past ``lost_after`` is declared
    lost; then a LOCAL job may spill. The first rule that changes the record decides the
    tick (its messages returned); the next tick sees the new record."""
    by_name = _views(views)
    if rec.phase is Phase.NOMINATED:
        step = expire_nomination(rec, cfg, now)
        if step.record is not rec:
            return step
        view = by_name.get(rec.region)
        if view is not None and not view.reachable:
            return on_unreachable(rec, rec.region, now)
        return HomeStep(rec, (), f"nominated {rec.region}, waiting for its answer")
    if rec.phase is Phase.HELD:
        view = by_name.get(rec.region)
        if view is None or view.reachable:
            return HomeStep(rec, (), f"held by {rec.region}")
        step = declare_lost(rec, view, now)
        return step if step.record is not rec else on_unreachable(rec, rec.region, now)
    return spill(rec, by_name, cfg, now, queued=queued)
