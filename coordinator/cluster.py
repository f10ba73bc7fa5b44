"""The leader's view of the nodes, from their heartbeats.

A node that misses heartbeats is first `suspect` (no new placements), then `down`
(its tasks are declared LOST). A node that heartbeats but says it takes no tasks
(`NodeState.refusing`: a root agent without `--run-as`) is `refusing`: listed, its
tasks watched like a ready node's, but nothing is placed on it. Time comes in as an
argument so tests need no sleeps.

A node this coordinator cannot send assignments to that it would accept (it verifies
signatures, and this coordinator does not sign, or signs with another key: see
`mesh.signing.placement_bar`) is `barred`: kept and watched like any other, but left
out of `ready()`, the nodes placement uses, with the reason kept for the jobs that wait.

A node of an edge site (`NodeState.site`) that the leader judges cut off
(`set_cut_sites`, from the sites' beats: edge/sites.py) is `disconnected` instead,
whatever its heartbeats say: nothing is placed on it, and its tasks are LOST only once
its site's autonomy has passed (reconcile.py). A site's beat also counts as hearing the
nodes it lists (`heard_from_site`), so a site's nodes may heartbeat less often.

Statuses change only here (`observe`, `expect`, `sweep`), so the view can keep what
every round asks for: the ready nodes in order, the down ones, and a journal of the
nodes that heartbeat or changed status (`changes`), so a round at 5,000 nodes looks
at the few hundred that moved instead of walking them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.changes import Changes
from edge.sites import DISCONNECTED, SiteView
from mesh.schema import NodeState
from mesh.signing import placement_bar

READY, REFUSING, SUSPECT, DOWN = "ready", "refusing", "suspect", "down"
HEARD = frozenset({READY, REFUSING})  # heartbeating now: what it lists is current


@dataclass(slots=True)
class NodeView:
    state: NodeState
    last_seen: float  # receiver's monotonic clock: senders' clocks are not trusted
    status: str = READY
    barred: str = ""  # why nothing is placed here whatever its status ("" if it may be)
    state_key: str = ""  # the verify key its heartbeats named when `barred` was judged

    @property
    def node_id(self) -> str:
        return self.state.node_id

    @property
    def live_tasks(self) -> frozenset[str]:
        return frozenset(self.state.tasks)


class ClusterView:
    """`signer`: the id of the key this coordinator signs assignments with (None if it
    does not sign), against which each node's verify key is checked."""

    def __init__(
        self,
        region: str,
        suspect_after: float = 3.0,
        down_after: float = 10.0,
        signer: str | None = None,
    ) -> None:
        self.region = region
        self.signer = signer
        self.barred: dict[str, str] = {}  # node id -> why nothing is placed on it
        self.suspect_after = suspect_after
        self.down_after = down_after
        self.nodes: dict[str, NodeView] = {}  # read freely; changed only by the methods
        self.down: set[str] = set()
        self.disconnected: set[str] = set()  # nodes of cut-off sites
        self.cut_sites: frozenset[str] = frozenset()  # sites judged disconnected
        self.sites: dict[str, SiteView] = {}  # the edge sites, from their beats and the log
        # A site's nodes are heard through its beats (every 2 s) more than their own
        # heartbeats (relayed when they change): late by up to the site's silence before
        # they are suspect. The coordinator sets it to its `site_silent_s`.
        self.site_suspect_after = suspect_after
        self.site_down_after = down_after  # and down only once its site could be judged
        self.changes = Changes()  # a node id per heartbeat and per status change
        self.rejected = 0
        # Node ids, least recently heard from first (receiver time only grows), so a
        # sweep stops at the first node heard from recently.
        self._by_age: dict[str, None] = {}
        self._ready: list[NodeView] | None = None  # READY views by node id, kept
        # How far the region's task events have been handled, as the leader last checked
        # (`events_check_started`, `events_checked`): a node stops listing an ended task
        # once its outcome is in the events stream, not once the outcome is logged.
        self.events_checks = 0  # checks started
        self.events_checked = 0  # the number of the last check completed
        self.events_last = 0  # the events stream's last sequence when that check began
        self.events_floor = 0  # every event up to this sequence was handled by a leader

    def observe(self, state: NodeState, now: float) -> bool:
        """Record a heartbeat; True if the node is new or came back (worth a reconcile)."""
        if state.region != self.region:
            self.rejected += 1
            return False
        node_id = state.node_id
        status = REFUSING if state.refusing else READY
        if state.site and state.site in self.cut_sites:
            status = DISCONNECTED
        view = self.nodes.get(node_id)
        if view is None:
            view = self.nodes[node_id] = NodeView(state, now, status)
            self._ready = None
            came_back = True
        else:
            came_back = view.status != status
            view.state, view.last_seen = state, now
            if came_back:
                self._set_status(view, status)
        key = state.verify_key
        if key != view.state_key:  # a node's key changes only when its agent restarts
            view.state_key = key
            came_back = self._bar(view, placement_bar(node_id, key, self.signer)) or came_back
        self._heard(node_id)
        return came_back

    def barred_reason(self) -> str:
        """Why nodes that heartbeat are left out of placement, for the jobs that wait:
        the first barred node's reason, and how many more there are ("" if none)."""
        live = sorted(n for n in self.barred if self.nodes[n].status != DOWN)
        if not live:
            return ""
        more = f" (and {len(live) - 1} more nodes so)" if len(live) > 1 else ""
        return self.barred[live[0]] + more

    def _bar(self, view: NodeView, reason: str) -> bool:
        """Set a node's bar; True if that changed whether it may be placed on."""
        if reason == view.barred:
            return False
        was, view.barred = view.barred, reason
        if reason:
            self.barred[view.node_id] = reason
        else:
            self.barred.pop(view.node_id, None)
        if bool(was) != bool(reason) and view.status == READY:
            self._ready = None
        return True

    def expect(self, node_id: str, now: float, site: str = "") -> None:
        """A node the log says holds tasks but that was never heard from: its silence
        starts now, so it goes down (and its tasks are lost) unless it heartbeats; or,
        of an edge `site` (as the log's site records list it), disconnected with it."""
        if node_id in self.nodes:
            return
        placeholder = NodeState(node_id=node_id, region=self.region, seq=0, ts=0.0, site=site)
        self.nodes[node_id] = NodeView(placeholder, now)
        self._ready = None
        self._heard(node_id)

    def events_check_started(self) -> int:
        """A check of the events stream begins; its number, for `events_checked_at`."""
        self.events_checks += 1
        return self.events_checks

    def events_checked_at(self, check: int, last: int, floor: int) -> None:
        """Check `check` found the events stream at sequence `last` (read first) and
        every event up to `floor` acknowledged by the leaders' consumer (read after)."""
        if check > self.events_checked:
            self.events_checked, self.events_last, self.events_floor = check, last, floor

    def sweep(self, now: float) -> list[str]:
        """Update statuses from heartbeat age; returns nodes whose status changed."""
        changed = []
        for node_id in self._by_age:
            view = self.nodes[node_id]
            age = now - view.last_seen
            if age < self.suspect_after:
                break  # every node after this one was heard from later still
            status = DOWN if age >= self.down_after else SUSPECT
            if view.state.site:
                if view.state.site in self.cut_sites:
                    status = DISCONNECTED
                elif age < self.site_suspect_after:
                    continue  # a beat a little late, not a silent node
                elif age < self.site_down_after:
                    status = SUSPECT  # its site may yet be judged cut off: not down first
            if status != view.status:
                self._set_status(view, status)  # (does not reorder what is walked here)
                changed.append(node_id)
        return changed

    def set_cut_sites(self, sites: frozenset[str], now: float) -> list[str]:
        """The edge sites now judged disconnected; returns the nodes whose status changed.
        A node of a site that came back takes the status its heartbeats give it."""
        if sites == self.cut_sites:
            return []
        moved = sites ^ self.cut_sites
        self.cut_sites = sites
        changed = []
        for view in self.nodes.values():
            if view.state.site not in moved:
                continue
            status = self._heartbeat_status(view, now)
            if view.state.site in sites:
                status = DISCONNECTED
            if status != view.status:
                self._set_status(view, status)
                changed.append(view.node_id)
        return sorted(changed)

    def heard_from_site(self, site: str, node_ids: tuple[str, ...], now: float) -> list[str]:
        """A beat of `site` listing these nodes: those the view knows as the site's are
        heard from now (their last heartbeat's state stands). Returns those that came
        back (were suspect or down)."""
        back = []
        for node_id in node_ids:
            view = self.nodes.get(node_id)
            if view is None or view.state.site != site or view.state.seq == 0:
                continue  # a site speaks only for its own nodes, heard from at least once
            view.last_seen = max(view.last_seen, now)
            self._by_age.pop(node_id, None)
            self._by_age[node_id] = None
            if view.status in (SUSPECT, DOWN):
                self._set_status(view, REFUSING if view.state.refusing else READY)
                back.append(node_id)
        return back

    def _heartbeat_status(self, view: NodeView, now: float) -> str:
        age = now - view.last_seen
        if age < self.suspect_after:
            return REFUSING if view.state.refusing else READY
        return DOWN if age >= self.down_after else SUSPECT

    def ready(self) -> list[NodeView]:
        """The READY nodes that are not barred, ordered by node id. The same list until
        one comes or goes: callers must not change it."""
        if self._ready is None:
            views = (v for v in self.nodes.values() if v.status == READY and not v.barred)
            self._ready = sorted(views, key=lambda v: v.state.node_id)
        return self._ready

    def refusals(self) -> str:
        """Why heartbeating nodes take no tasks, in a few words for a waiting job's
        reason ("" when none refuses): the operator's fix is named there."""
        refusing = sorted(v.node_id for v in self.nodes.values() if v.status == REFUSING)
        if not refusing:
            return ""
        first = self.nodes[refusing[0]].state.refusing
        if len(refusing) == 1:
            return f"node {refusing[0]} takes no tasks: {first}"
        return f"{len(refusing)} nodes take no tasks ({refusing[0]}: {first})"

    def _heard(self, node_id: str) -> None:
        self._by_age.pop(node_id, None)
        self._by_age[node_id] = None
        self.changes.add(node_id)

    def _set_status(self, view: NodeView, status: str) -> None:
        if (view.status == READY) != (status == READY) and not view.barred:
            self._ready = None
        view.status = status
        if status == DOWN:
            self.down.add(view.node_id)
        else:
            self.down.discard(view.node_id)
        if status == DISCONNECTED:
            self.disconnected.add(view.node_id)
        else:
            self.disconnected.discard(view.node_id)
        self.changes.add(view.node_id)
