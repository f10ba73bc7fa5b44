"""The region's view of its edge sites, from their beats. Pure: no NATS, no clock.

A site link beats every second (`mesh.edgeschema.SiteBeat`). While beats come the site
is `connected`; once none came for `silent_after` seconds it is `disconnected`: its
nodes are shown `disconnected`, not `down`, and their tasks are not declared LOST until
the site's `autonomy_s` (from its newest beat; NEVER by default) has passed since it
was last heard. A site that is cut off keeps running its tasks, so running them again
elsewhere before then would only make duplicates.

Times are the region's wall clock (`time.time()` of the receiving coordinator), not the
sender's and not a monotonic clock: `last_heard` is written to the job log
(`SiteRecorded`), and a new leader continues the autonomy clock from it, so the clock
must mean the same thing in every coordinator process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from mesh.edgeschema import NEVER, SiteBeat
from mesh.schema import SiteRecorded

__all__ = [
    "CONNECTED",
    "DISCONNECTED",
    "NEVER",
    "SITE_SILENT_S",
    "SiteView",
    "lost_why",
    "may_declare_lost",
    "merged",
    "node_status",
    "observe",
    "record",
    "sweep",
    "unlogged",
    "view_of",
]

CONNECTED, DISCONNECTED = "connected", "disconnected"
SITE_SILENT_S = 3.0  # no beat for this long: the site is disconnected


@dataclass(frozen=True, slots=True)
class SiteView:
    """One site as the region sees it. `since`: when it took its status (for a
    disconnected site, `last_heard + silent_after`: the same in every candidate that
    heard the same beat). `nodes`, `backlog`: from the newest beat (empty when the view
    came from the log alone)."""

    site: str
    last_heard: float
    autonomy_s: float = NEVER
    status: str = CONNECTED
    since: float = 0.0
    nodes: tuple[str, ...] = ()
    backlog: int = 0
    beats: int = 0  # beats heard by this process
    forwarded: int = 0  # from the newest beat: what its link forwarded since it started


def observe(view: SiteView | None, beat: SiteBeat, now: float) -> SiteView:
    """A beat heard at `now`: the site is connected (since now, if it was not), and the
    beat's autonomy applies from now on."""
    if view is None:
        return SiteView(
            beat.site,
            now,
            beat.autonomy_s,
            CONNECTED,
            now,
            beat.nodes,
            beat.backlog,
            1,
            beat.forwarded,
        )
    since = view.since if view.status == CONNECTED else now
    return replace(
        view,
        last_heard=max(view.last_heard, now),
        autonomy_s=beat.autonomy_s,
        status=CONNECTED,
        since=since,
        nodes=beat.nodes,
        backlog=beat.backlog,
        beats=view.beats + 1,
        forwarded=beat.forwarded,
    )


def sweep(
    views: Mapping[str, SiteView], now: float, silent_after: float = SITE_SILENT_S
) -> list[SiteView]:
    """The sites that go disconnected at `now` (unheard for `silent_after`), as their
    new views, in site order: the caller stores them and logs each transition."""
    out = []
    for site in sorted(views):
        v = views[site]
        if v.status == CONNECTED and now - v.last_heard >= silent_after:
            out.append(replace(v, status=DISCONNECTED, since=v.last_heard + silent_after))
    return out


def may_declare_lost(view: SiteView | None, now: float) -> bool:
    """Whether the tasks of a disconnected site's nodes may be declared LOST at `now`:
    only once `autonomy_s` has passed since the site was last heard, and never when its
    autonomy is NEVER. A connected site's nodes follow their heartbeats as any node."""
    if view is None or view.status != DISCONNECTED or view.autonomy_s < 0:
        return False
    return now - view.last_heard >= view.autonomy_s


def lost_why(view: SiteView, now: float) -> str:
    """Why a disconnected site's tasks are LOST, for the task's message."""
    return (
        f"its site {view.site} was unheard for {now - view.last_heard:.1f}s, "
        f"past its autonomy of {view.autonomy_s:g}s"
    )


def node_status(heartbeat_status: str, site: SiteView | None) -> str:
    """A node's status: `disconnected` while its site is (whatever its heartbeats say:
    a site cut off is reached neither by assignments nor by their reports, so nothing is
    placed there and its tasks wait out the autonomy); otherwise what its heartbeats
    make it (ready, suspect, down, ...), as for any node."""
    if site is not None and site.status == DISCONNECTED:
        return DISCONNECTED
    return heartbeat_status


# ---------------------------------------------------------------- the job log


def record(view: SiteView, ts: float) -> SiteRecorded:
    return SiteRecorded(
        site=view.site,
        status=view.status,
        since=view.since,
        autonomy_s=view.autonomy_s,
        last_heard=view.last_heard,
        ts=ts,
        nodes=view.nodes,
    )


def view_of(rec: SiteRecorded) -> SiteView:
    return SiteView(rec.site, rec.last_heard, rec.autonomy_s, rec.status, rec.since, rec.nodes)


def merged(
    views: Mapping[str, SiteView], logged: Mapping[str, SiteRecorded], now: float
) -> dict[str, SiteView]:
    """This process's views joined with the log's records (what a new leader starts
    from): per site, whichever heard the site last, the log's on a tie. A disconnected
    site this process has not heard since continues its autonomy clock from the log.
    The log holds when a connected site was last heard only as of its last transition,
    so a connected site this process never heard is taken as heard `now`: its silence
    starts now (as `ClusterView.expect` does for a node), never earlier."""
    out = dict(views)
    for site, rec in logged.items():
        v = out.get(site)
        if v is not None and v.last_heard > rec.last_heard:
            continue
        mine = view_of(rec)
        if v is None and rec.status == CONNECTED:
            mine = replace(mine, last_heard=max(rec.last_heard, now))
        if v is not None:
            mine = replace(mine, nodes=v.nodes or mine.nodes, backlog=v.backlog)
        out[site] = mine
    return out


def unlogged(views: Iterable[SiteView], logged: Mapping[str, SiteRecorded]) -> list[SiteView]:
    """The views whose status, autonomy or nodes the log does not hold yet (a
    transition, an autonomy change, a node its beats name that the log's record does not,
    a site never logged): the leader logs each. Asked again after a leader died before its
    append landed, the next leader logs them. The nodes matter to a new leader that never
    heard the site: a node the record lacks would be judged as a datacenter node, down
    after its silence, its tasks lost inside the site's autonomy."""
    out = []
    for v in views:
        rec = logged.get(v.site)
        if (
            rec is None
            or rec.status != v.status
            or rec.autonomy_s != v.autonomy_s
            or not set(v.nodes) <= set(rec.nodes)
        ):
            out.append(v)
    return sorted(out, key=lambda v: v.site)


def forwarded_since(gate: list[int], view: SiteView) -> bool:
    """Whether everything a site had stored when a gate was opened has reached the
    region: `gate` is [beats heard when it opened, the target or -1], updated in place.
    The target is taken from the second beat heard after opening (the first may have
    been sent before: a beat and a node's heartbeat travel apart): what that link had
    forwarded plus what it still held. It is reached when a beat says nothing is left,
    or that the link forwarded that much (a restarted link counts from zero again, and
    then only the empty backlog opens the gate: later, never early)."""
    if gate[1] < 0:
        if view.beats < gate[0] + 2:
            return False
        gate[1] = view.forwarded + view.backlog
    return view.backlog == 0 or view.forwarded >= gate[1]
