"""The coordinator's edge sites: beats in, site statuses to the cluster view and the log.

Every candidate hears the sites' beats (`subjects.site_beat_all`), so a follower that
takes over knows when each site was last heard; the leader sweeps them each reconcile
round, tells the cluster view which sites are cut off (their nodes are `disconnected`),
and logs a `SiteRecorded` for each status or autonomy the log does not hold yet. The
decisions are edge/sites.py's; this is the thin shell around them.
"""

from __future__ import annotations

import logging
import time

from coordinator.cluster import ClusterView
from coordinator.state import RegionState
from edge import sites
from edge.sites import DISCONNECTED
from mesh import subjects
from mesh.edgeschema import WireError, decode_beat
from mesh.schema import SiteRecorded

log = logging.getLogger("mesh.coordinator.sites")


class SiteTracker:
    """`silent_after`: seconds without a beat before a site is disconnected."""

    def __init__(self, region: str, cluster: ClusterView, silent_after: float) -> None:
        self.region = region
        self.cluster = cluster  # holds the views (`cluster.sites`): reconcile reads them
        self.silent_after = silent_after
        self.bad_beats = 0

    def on_beat(self, subject: str, data: bytes) -> bool:
        """A beat heard; True if it is worth a reconcile round now (a site came back, a
        node of it came back, or its autonomy changed: the leader logs it)."""
        try:
            beat = decode_beat(data)
        except WireError as exc:
            self.bad_beats += 1
            log.debug("bad site beat dropped: %s", exc)
            return False
        if beat.region != self.region or subjects.site_beat_site(self.region, subject) != beat.site:
            self.bad_beats += 1  # a site may only speak for itself
            return False
        c = self.cluster
        was = c.sites.get(beat.site)
        view = c.sites[beat.site] = sites.observe(was, beat, time.time())
        wake = was is None or was.status != view.status or was.autonomy_s != view.autonomy_s
        if beat.site in c.cut_sites:
            log.info("site %s is connected again", beat.site)
            c.set_cut_sites(c.cut_sites - {beat.site}, time.monotonic())
        if c.heard_from_site(beat.site, beat.nodes, time.monotonic()):
            wake = True
        return wake

    async def answer(self, msg) -> None:
        """The leader answers a beat (a request) with a few bytes: the site link's proof
        that the region is reachable, so an idle link needs no other probe. Followers
        hear beats and stay silent (one answer per beat). A heartbeat the site link
        relays is a request too, answered alike: the link's proof that it arrived."""
        if msg.reply:
            try:
                await msg.respond(b"1")
            except Exception as exc:  # the connection closing: the site beats again
                log.debug("site beat not answered: %s", exc)

    def seed(self, state: RegionState) -> None:
        """Taking over: continue from the log's records where they are newer than what
        this candidate heard, and know the nodes they list as the sites'."""
        c = self.cluster
        c.sites = sites.merged(c.sites, state.sites, time.time())
        now = time.monotonic()
        for view in c.sites.values():
            for node_id in view.nodes:
                if node_id in state.node_tasks:
                    c.expect(node_id, now, view.site)
        self._cut(now)

    def round(self, state: RegionState) -> list[SiteRecorded]:
        """One leader round: sites gone silent are disconnected; what the log lacks."""
        c = self.cluster
        now = time.time()
        for view in sites.sweep(c.sites, now, self.silent_after):
            c.sites[view.site] = view
            autonomy = "never" if view.autonomy_s < 0 else f"{view.autonomy_s:g}s"
            log.warning(
                "site %s is disconnected: unheard for %.1fs (its tasks are not lost before "
                "its autonomy: %s)",
                view.site,
                now - view.last_heard,
                autonomy,
            )
        self._cut(time.monotonic())
        return [sites.record(v, now) for v in sites.unlogged(c.sites.values(), state.sites)]

    def _cut(self, now: float) -> None:
        cut = frozenset(s for s, v in self.cluster.sites.items() if v.status == DISCONNECTED)
        self.cluster.set_cut_sites(cut, now)

    def rows(self, state: RegionState) -> list[dict]:
        """What `site.list` shows: each site as this candidate sees it."""
        now = time.time()
        out = []
        for site in sorted(self.cluster.sites):
            v = self.cluster.sites[site]
            out.append(
                {
                    "site": site,
                    "status": v.status,
                    "since": v.since,
                    "last_heard_age_s": round(max(0.0, now - v.last_heard), 3),
                    "autonomy_s": None if v.autonomy_s < 0 else v.autonomy_s,
                    "backlog": v.backlog,
                    "nodes": list(v.nodes),
                    "logged": site in state.sites,
                }
            )
        return out
