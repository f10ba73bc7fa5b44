"""Edge sites at the hub (edge/sites.py, and the cluster view and reconcile that use it):
a cut-off site's tasks are never declared LOST within its autonomy, whatever the
interleaving of beats, silences and leader changes; a silent node of a beating site is
down as today; a beat's new autonomy applies from then on."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.cluster import DOWN, READY, SUSPECT, ClusterView
from coordinator.reconcile import FORGOTTEN_AFTER_S
from coordinator.reports import Kill
from coordinator.state import RegionState
from edge import sites
from edge.sites import CONNECTED, DISCONNECTED, NEVER
from mesh.edgeschema import SiteBeat
from mesh.schema import DuplicateStopped, LogEntry, NodeState, SiteRecorded, TaskUpdated
from tests.unit.test_reconcile import Log
from workloads.resources import Resources

SILENT = sites.SITE_SILENT_S


def beat(autonomy: float = NEVER, site: str = "s1", nodes=("s1-a",)) -> SiteBeat:
    return SiteBeat(site=site, region="r", seq=1, ts=1.0, autonomy_s=autonomy, nodes=nodes)


# --------------------------------------------------------------------------- the core


def test_a_site_is_connected_while_beats_come_and_disconnected_after_silence():
    v = sites.observe(None, beat(), 100.0)
    assert (v.status, v.since, v.last_heard) == (CONNECTED, 100.0, 100.0)
    assert sites.sweep({"s1": v}, 100.0 + SILENT - 0.01) == []
    (gone,) = sites.sweep({"s1": v}, 100.0 + SILENT)
    assert (gone.status, gone.since, gone.last_heard) == (DISCONNECTED, 100.0 + SILENT, 100.0)
    back = sites.observe(gone, beat(), 200.0)
    assert (back.status, back.since, back.last_heard) == (CONNECTED, 200.0, 200.0)


def test_never_is_never_lost_and_a_finite_autonomy_counts_from_last_heard():
    v = sites.observe(None, beat(NEVER), 0.0)
    (cut,) = sites.sweep({"s1": v}, 10.0)
    assert not sites.may_declare_lost(cut, 1e12)
    v = sites.observe(None, beat(60.0), 0.0)
    (cut,) = sites.sweep({"s1": v}, 10.0)
    assert not sites.may_declare_lost(cut, 59.9)
    assert sites.may_declare_lost(cut, 60.0)
    assert not sites.may_declare_lost(v, 1e9)  # a connected site: its nodes as any node
    assert not sites.may_declare_lost(None, 1e9)


def test_a_beat_with_a_new_autonomy_applies_from_then_on():
    v = sites.observe(None, beat(100.0), 0.0)
    v = sites.observe(v, beat(2.0), 5.0)
    (cut,) = sites.sweep({"s1": v}, 8.0)
    assert not sites.may_declare_lost(cut, 6.9)
    assert sites.may_declare_lost(cut, 7.0)  # 5 + 2, not 0 + 100
    v = sites.observe(v, beat(NEVER), 9.0)
    (cut,) = sites.sweep({"s1": v}, 20.0)
    assert not sites.may_declare_lost(cut, 1e9)


def test_node_status_is_disconnected_only_while_its_site_is():
    v = sites.observe(None, beat(), 0.0)
    (cut,) = sites.sweep({"s1": v}, 5.0)
    assert sites.node_status(DOWN, cut) == DISCONNECTED
    assert sites.node_status(READY, cut) == DISCONNECTED
    assert sites.node_status(DOWN, v) == DOWN
    assert sites.node_status(SUSPECT, None) == SUSPECT


def test_the_log_holds_transitions_autonomy_changes_and_new_nodes_only():
    v = sites.observe(None, beat(30.0), 0.0)
    assert sites.unlogged([v], {}) == [v]
    logged = {"s1": sites.record(v, 0.0)}
    assert sites.unlogged([sites.observe(v, beat(30.0), 1.0)], logged) == []
    assert sites.unlogged([sites.observe(v, beat(30.0, nodes=()), 1.0)], logged) == []
    joined = sites.observe(v, beat(30.0, nodes=("s1-a", "s1-b")), 1.0)
    assert sites.unlogged([joined], logged) == [joined]  # a new leader must know s1-b
    changed = sites.observe(v, beat(10.0), 1.0)
    assert sites.unlogged([changed], logged) == [changed]
    (cut,) = sites.sweep({"s1": v}, 5.0)
    assert sites.unlogged([cut], logged) == [cut]
    rec = sites.record(cut, 5.0)
    assert (rec.site, rec.status, rec.since, rec.autonomy_s, rec.last_heard, rec.nodes) == (
        "s1",
        DISCONNECTED,
        SILENT,
        30.0,
        0.0,
        ("s1-a",),
    )


def test_a_new_leader_continues_a_cut_sites_clock_from_the_log():
    v = sites.observe(None, beat(30.0), 0.0)
    (cut,) = sites.sweep({"s1": v}, 5.0)
    logged = {"s1": sites.record(cut, 5.0)}
    fresh = sites.merged({}, logged, now=20.0)["s1"]  # never heard the site itself
    assert (fresh.status, fresh.last_heard, fresh.nodes) == (DISCONNECTED, 0.0, ("s1-a",))
    assert sites.may_declare_lost(fresh, 30.0)  # 0 + 30, not 20 + 30
    # A connected record's last_heard is as of its transition: the silence starts now.
    logged = {"s1": sites.record(v, 0.0)}
    fresh = sites.merged({}, logged, now=500.0)["s1"]
    assert (fresh.status, fresh.last_heard) == (CONNECTED, 500.0)
    # What this process heard later than the log wins.
    mine = sites.observe(None, beat(30.0), 600.0)
    assert sites.merged({"s1": mine}, logged, now=601.0)["s1"] == mine


# --------------------------------------------------------------------------- property

op = st.one_of(
    st.tuples(st.just("beat"), st.sampled_from([NEVER, 0.5, 2.0, 7.0]), st.floats(0.0, 3.0)),
    st.tuples(st.just("silence"), st.just(0.0), st.floats(0.0, 12.0)),
    st.tuples(st.just("leader"), st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_within_autonomy_a_cut_sites_tasks_are_never_declared_lost(ops):
    """Beats, silences and leader changes in any order: the leader of the moment (a
    follower that heard every beat, or a fresh process that heard none) declares the
    site's tasks lost only once the newest beat's autonomy passed since the last beat."""
    now = 0.0
    log: dict[str, SiteRecorded] = {}
    leader: dict = {}
    follower: dict = {}
    last_beat: float | None = None
    autonomy = NEVER
    for kind, arg, dt in ops:
        now += dt
        if kind == "beat":
            last_beat, autonomy = now, arg
            leader["s1"] = sites.observe(leader.get("s1"), beat(arg), now)
            follower["s1"] = sites.observe(follower.get("s1"), beat(arg), now)
        elif kind == "leader":
            heard = follower if arg else {}
            leader = sites.merged(heard, log, now)
            follower = dict(heard)
        for v in sites.sweep(leader, now, SILENT):
            leader[v.site] = v
        for v in sites.unlogged(leader.values(), log):  # the fold of what it logged
            log[v.site] = sites.record(v, now)
        view = leader.get("s1")
        if sites.may_declare_lost(view, now):
            assert last_beat is not None and autonomy != NEVER
            assert now - last_beat >= autonomy
        if view is not None and last_beat is not None and now - last_beat >= SILENT:
            assert view.status == DISCONNECTED or view.last_heard > last_beat


# --------------------------------------------------------------------------- cluster


def state(node: str, site: str = "s1", tasks=()) -> NodeState:
    big = Resources(cpu=8000, memory=16 * 2**30)
    return NodeState(node_id=node, region="r", seq=1, ts=0.0, site=site, tasks=tasks, capacity=big)


def test_a_cut_sites_nodes_are_disconnected_not_down_and_come_back():
    cv = ClusterView("r", suspect_after=3.0, down_after=10.0)
    cv.observe(state("s1-a"), 0.0)
    cv.observe(state("dc-1", site=""), 0.0)
    assert cv.set_cut_sites(frozenset({"s1"}), 4.0) == ["s1-a"]
    cv.sweep(20.0)
    assert cv.nodes["s1-a"].status == sites.DISCONNECTED and cv.disconnected == {"s1-a"}
    assert cv.nodes["dc-1"].status == DOWN and cv.down == {"dc-1"}
    assert "s1-a" not in {v.node_id for v in cv.ready()}
    cv.observe(state("s1-a"), 21.0)  # a heartbeat while its site is cut: still so
    assert cv.nodes["s1-a"].status == sites.DISCONNECTED
    assert cv.set_cut_sites(frozenset(), 22.0) == ["s1-a"]
    assert cv.nodes["s1-a"].status == READY and not cv.disconnected


def test_a_beat_hears_its_own_sites_known_nodes_only():
    cv = ClusterView("r", suspect_after=3.0, down_after=10.0)
    cv.observe(state("s1-a"), 0.0)
    cv.observe(state("s2-a", site="s2"), 0.0)
    cv.sweep(12.0)
    assert cv.down == {"s1-a", "s2-a"}
    assert cv.heard_from_site("s1", ("s1-a", "s2-a", "nobody"), 12.0) == ["s1-a"]
    assert cv.nodes["s1-a"].status == READY and cv.down == {"s2-a"}
    cv.sweep(14.0)
    assert cv.nodes["s1-a"].status == READY  # heard at 12


def test_a_silent_node_of_a_beating_site_is_down_as_today():
    cv = ClusterView("r", suspect_after=3.0, down_after=10.0)
    cv.observe(state("s1-a"), 0.0)
    cv.observe(state("s1-b"), 0.0)
    for t in range(1, 13):
        cv.heard_from_site("s1", ("s1-a",), float(t))  # the beat lists only s1-a
        cv.sweep(float(t))
    assert cv.nodes["s1-a"].status == READY
    assert cv.nodes["s1-b"].status == DOWN


# --------------------------------------------------------------------------- reconcile


def site_log() -> tuple[Log, ClusterView]:
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "s1-a")
    cv = ClusterView("r", suspect_after=3.0, down_after=10.0)
    cv.observe(state("s1-a", tasks=("j.w.0#1",)), 0.0)
    cv.observe(state("dc-1", site=""), 0.0)
    return log, cv


def cut(cv: ClusterView, autonomy: float, last_heard: float, now: float) -> None:
    v = sites.observe(None, beat(autonomy), last_heard)
    (gone,) = sites.sweep({"s1": v}, now)
    cv.sites["s1"] = gone
    cv.set_cut_sites(frozenset({"s1"}), now)


def lost(d) -> list[str]:
    return [e.task_id for e in d.events if isinstance(e, TaskUpdated) and e.state == "LOST"]


def test_a_disconnected_nodes_tasks_wait_out_the_autonomy():
    log, cv = site_log()
    cut(cv, 30.0, last_heard=1000.0, now=1004.0)
    cv.sweep(1100.0)
    assert lost(log.decide(cv, now=1029.9)) == []
    d = log.decide(cv, now=1030.0)
    assert lost(d) == ["j.w.0"] and "autonomy of 30s" in d.events[0].message


def test_never_means_a_disconnected_nodes_tasks_are_never_lost():
    log, cv = site_log()
    cut(cv, NEVER, last_heard=1000.0, now=1004.0)
    cv.sweep(5000.0)
    assert lost(log.decide(cv, now=1e9)) == []


def test_the_site_back_kills_the_stale_copy_and_logs_the_duplicate_once():
    log, cv = site_log()
    cut(cv, 3.0, last_heard=1000.0, now=1004.0)
    log.step(cv, now=1010.0)  # LOST
    cv.observe(state("dc-1", site=""), 1010.0)
    for _ in range(3):
        log.step(cv, now=1011.0)  # back to PENDING, then placed on dc-1
    t = log.state.tasks["j.w.0"]
    assert (t.attempt, t.node_id) == (2, "dc-1")
    cv.set_cut_sites(frozenset(), 1020.0)  # the site is back, its node still runs #1
    cv.observe(state("s1-a", tasks=("j.w.0#1",)), 1020.0)
    d = log.step(cv, now=1020.0)
    assert (
        Kill("s1-a", "j", "j.w.0", 1, "stale copy: this attempt is no longer assigned to this node")
        in d.kills
    )
    (dup,) = [e for e in d.events if isinstance(e, DuplicateStopped)]
    assert dup.message == (
        "duplicate run of attempt 1 stopped: attempt 2 ran after the site's autonomy"
    )
    assert (1020.0, 1, "KILLED", "s1-a", dup.message) in log.state.tasks["j.w.0"].history
    again = log.step(cv, now=1021.0)
    assert again.kills and not [e for e in again.events if isinstance(e, DuplicateStopped)]


def test_the_fold_keeps_each_sites_latest_record():
    rs = RegionState()
    a = SiteRecorded("s1", CONNECTED, 1.0, 30.0, 1.0, 1.0)
    b = SiteRecorded("s1", DISCONNECTED, 5.0, 30.0, 2.0, 5.0)
    rs.apply(1, LogEntry(1, "c1", (a,)))
    rs.apply(2, LogEntry(1, "c1", (b,)))
    assert rs.sites == {"s1": b}


# --------------------------------------------------------------------------- back from a cut


def test_forwarded_since_waits_for_a_beat_sent_after_the_miss_then_for_the_backlog():
    v = sites.observe(None, dataclasses.replace(beat(), backlog=50, forwarded=10), 0.0)
    gate = [v.beats, -1]
    v = sites.observe(v, dataclasses.replace(beat(), backlog=0, forwarded=60), 1.0)
    assert not sites.forwarded_since(gate, v)  # the first beat after may predate the miss
    v = sites.observe(v, dataclasses.replace(beat(), backlog=30, forwarded=60), 2.0)
    assert not sites.forwarded_since(gate, v) and gate[1] == 90
    v = sites.observe(v, dataclasses.replace(beat(), backlog=20, forwarded=89), 3.0)
    assert not sites.forwarded_since(gate, v)
    v = sites.observe(v, dataclasses.replace(beat(), backlog=5, forwarded=90), 4.0)
    assert sites.forwarded_since(gate, v)  # all it held then is in the region
    restarted = sites.observe(v, dataclasses.replace(beat(), backlog=0, forwarded=0), 5.0)
    assert sites.forwarded_since([v.beats - 2, 500], restarted)  # a new link, nothing left


def test_a_task_a_site_node_stopped_listing_waits_for_the_sites_backlog():
    """Back from a cut, a site's node no longer lists a task that ended while it was
    away: its outcome is stored on the site, still in the backlog the link forwards.
    The task is not LOST while the site still holds what it held then (seen in the
    bench: declared LOST, run again, its SUCCEEDED then ignored as stale); once that is
    forwarded and nobody logged an end, it is LOST as on any node."""
    log = Log()
    log.submit("j", count=1)
    log.run("j.w.0", "s1-a")  # RUNNING since the agent's ts 3.0
    cv = ClusterView("r", suspect_after=1e6, down_after=1e6)
    seq = iter(range(1, 1000))

    def heartbeat(ts: float, tasks=()) -> None:
        n = next(seq)
        cv.observe(dataclasses.replace(state("s1-a", tasks=tasks), seq=n, ts=ts), 100.0 + ts)
        cv.events_checks = cv.events_checked = n  # the events stream: all handled
        cv.events_last = cv.events_floor = 0

    def site_beat(backlog: int, forwarded: int) -> None:
        b = dataclasses.replace(beat(), backlog=backlog, forwarded=forwarded)
        cv.sites["s1"] = sites.observe(cv.sites.get("s1"), b, 100.0)

    site_beat(0, 0)
    heartbeat(4.0, ("j.w.0#1",))
    assert lost(log.step(cv, now=104.0)) == []
    heartbeat(5.0)  # back from a cut: no longer listed, its outcome 900 messages back
    assert lost(log.step(cv, now=105.0)) == []
    for i, ts in enumerate((6.0, 10.0, 20.0, 30.0, 40.0)):
        site_beat(900 - 100 * i, 100 + 100 * i)  # forwarding, never down to 1000
        heartbeat(ts)
        assert lost(log.step(cv, now=100.0 + ts)) == [], ts
    site_beat(0, 1000)  # all it held when the task was missed is forwarded
    heartbeat(41.0)
    assert lost(log.step(cv, now=141.0)) == []  # from here, the usual wait
    heartbeat(41.0 + FORGOTTEN_AFTER_S)
    assert lost(log.step(cv, now=141.0 + FORGOTTEN_AFTER_S)) == ["j.w.0"]


def test_a_site_node_heard_through_late_beats_is_not_suspect_within_the_sites_silence():
    cv = ClusterView("r", suspect_after=3.0, down_after=10.0)
    cv.site_suspect_after = 5.0
    cv.observe(state("s1-a"), 0.0)
    cv.observe(state("dc-1", site=""), 0.0)
    cv.sweep(4.0)  # a beat 2 s late: the site's node waits, the datacenter node does not
    assert cv.nodes["s1-a"].status == READY and cv.nodes["dc-1"].status == SUSPECT
    cv.sweep(5.0)
    assert cv.nodes["s1-a"].status == SUSPECT
    cv.sweep(10.0)
    assert cv.nodes["s1-a"].status == DOWN


def test_a_site_node_is_not_down_before_its_site_could_be_judged_cut_off():
    """With a node deadline shorter than twice the site's silence, a cut site's node
    would be down (its tasks lost) before the site was seen to be disconnected."""
    cv = ClusterView("r", suspect_after=1.0, down_after=3.0)
    cv.site_suspect_after, cv.site_down_after = 5.0, 10.0
    cv.observe(state("s1-a"), 0.0)
    cv.observe(state("dc-1", site=""), 0.0)
    cv.sweep(6.0)
    assert cv.nodes["s1-a"].status == SUSPECT and cv.nodes["dc-1"].status == DOWN
    cv.set_cut_sites(frozenset({"s1"}), 6.5)
    cv.sweep(20.0)
    assert cv.nodes["s1-a"].status == sites.DISCONNECTED and cv.down == {"dc-1"}
