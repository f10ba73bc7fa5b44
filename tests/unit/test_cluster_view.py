"""ClusterView: node liveness from heartbeat age, with time passed in (no sleeps)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.cluster import DOWN, READY, REFUSING, SUSPECT, ClusterView, NodeView
from mesh.schema import GpuStatus, NodeState
from workloads.resources import Resources


def hb(node_id: str = "n1", seq: int = 1, region: str = "r1", **kw) -> NodeState:
    return NodeState(node_id=node_id, region=region, seq=seq, ts=0.0, **kw)


def test_a_new_node_is_ready_and_worth_a_reconcile():
    cv = ClusterView("r1")
    assert cv.observe(hb("n1"), now=100.0) is True
    view = cv.nodes["n1"]
    assert isinstance(view, NodeView)
    assert (view.status, view.last_seen, view.node_id) == (READY, 100.0, "n1")
    assert cv.ready() == [view]


def test_a_refusing_node_is_listed_but_never_ready_until_it_takes_tasks():
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    why = "tasks would run as root: use --run-as USER or --allow-root"
    assert cv.observe(hb("n1", refusing=why), now=0.0) is True
    cv.observe(hb("n2", refusing=why), now=0.0)
    assert cv.nodes["n1"].status == REFUSING and cv.ready() == []
    assert cv.refusals() == f"2 nodes take no tasks (n1: {why})"
    assert cv.observe(hb("n2", seq=2, refusing=why), now=1.0) is False  # unchanged
    assert cv.observe(hb("n2", seq=3), now=2.0) is True  # restarted with --run-as
    assert [v.node_id for v in cv.ready()] == ["n2"]
    assert cv.refusals() == f"node n1 takes no tasks: {why}"
    assert cv.sweep(10.0) == ["n1", "n2"]  # silence makes it down like any other
    assert cv.nodes["n1"].status == DOWN and cv.refusals() == ""


def test_ready_then_suspect_then_down_by_age():
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    cv.observe(hb(), now=0.0)
    assert cv.sweep(2.999) == []
    assert cv.nodes["n1"].status == READY
    assert cv.sweep(3.0) == ["n1"]
    assert cv.nodes["n1"].status == SUSPECT
    assert cv.ready() == []
    assert cv.sweep(9.9) == []  # unchanged: not reported again
    assert cv.sweep(10.0) == ["n1"]
    assert cv.nodes["n1"].status == DOWN
    assert cv.sweep(1000.0) == []
    assert cv.nodes["n1"].status == DOWN


def test_a_long_silence_goes_straight_to_down():
    cv = ClusterView("r1")
    cv.observe(hb(), now=0.0)
    assert cv.sweep(60.0) == ["n1"]
    assert cv.nodes["n1"].status == DOWN


def test_regular_heartbeats_keep_a_node_ready():
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    cv.observe(hb(seq=0), now=0.0)
    for i in range(1, 20):
        assert cv.observe(hb(seq=i), now=i * 2.0) is False  # nothing new: no reconcile
        assert cv.sweep(i * 2.0 + 2.5) == []
    assert cv.nodes["n1"].status == READY
    assert cv.nodes["n1"].state.seq == 19


@pytest.mark.parametrize("silence,status", [(5.0, SUSPECT), (15.0, DOWN)])
def test_a_heartbeat_brings_a_node_back(silence, status):
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    cv.observe(hb(seq=1), now=0.0)
    cv.sweep(silence)
    assert cv.nodes["n1"].status == status
    assert cv.observe(hb(seq=2), now=silence + 0.1) is True
    view = cv.nodes["n1"]
    assert (view.status, view.last_seen, view.state.seq) == (READY, silence + 0.1, 2)
    assert cv.sweep(silence + 0.2) == []
    assert cv.ready() == [view]


def test_a_restarted_agent_counting_from_zero_is_taken_back_after_down():
    cv = ClusterView("r1")
    cv.observe(hb(seq=500), now=0.0)
    cv.sweep(20.0)
    assert cv.observe(hb(seq=0), now=21.0) is True
    assert cv.nodes["n1"].state.seq == 0
    assert cv.observe(hb(seq=1), now=22.0) is False
    assert cv.nodes["n1"].state.seq == 1


def test_a_state_from_another_region_is_rejected():
    cv = ClusterView("r1")
    assert cv.observe(hb("n1", region="r2"), now=0.0) is False
    assert cv.nodes == {}
    assert cv.rejected == 1
    cv.observe(hb("n1", region="r1"), now=0.0)
    # nor may another region's heartbeat keep a known node alive
    assert cv.observe(hb("n1", seq=2, region="r2"), now=5.0) is False
    assert cv.nodes["n1"].last_seen == 0.0 and cv.nodes["n1"].state.region == "r1"
    assert cv.rejected == 2
    assert cv.sweep(5.0) == ["n1"]


def test_nodes_age_independently():
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    cv.observe(hb("a"), now=0.0)
    cv.observe(hb("b"), now=5.0)
    assert sorted(cv.sweep(6.0)) == ["a"]
    assert (cv.nodes["a"].status, cv.nodes["b"].status) == (SUSPECT, READY)
    assert sorted(cv.sweep(12.0)) == ["a", "b"]
    assert (cv.nodes["a"].status, cv.nodes["b"].status) == (DOWN, SUSPECT)
    assert [v.node_id for v in cv.ready()] == []


def test_thresholds_are_configurable():
    cv = ClusterView("r1", suspect_after=0.5, down_after=1.0)
    cv.observe(hb(), now=0.0)
    assert cv.sweep(0.5) == ["n1"] and cv.nodes["n1"].status == SUSPECT
    assert cv.sweep(1.0) == ["n1"] and cv.nodes["n1"].status == DOWN


def test_view_exposes_the_latest_state():
    cv = ClusterView("r1")
    cv.observe(hb(capacity=Resources(cpu=4000), tasks=("j.w.0#1", "j.w.1#2")), now=0.0)
    view = cv.nodes["n1"]
    assert view.state.capacity == Resources(cpu=4000)
    assert view.live_tasks == frozenset({"j.w.0#1", "j.w.1#2"})


def test_a_repeated_heartbeat_is_decoded_as_a_full_one_would_be():
    """The coordinator compares a heartbeat with the node's previous one and validates
    only the clock when nothing else changed: the result must be what a full decode
    gives, and a bad clock must still be refused."""
    from mesh.codec import RepeatDecoder, WireError, decode, encode, pack, unpack

    heartbeats = RepeatDecoder(NodeState)
    subject = "mesh.default.state.n1"
    first = NodeState("n1", "default", 1, 10.0, Resources(cpu=4000), labels={"a": "b"})
    again = dataclasses.replace(first, seq=2, ts=11.5)
    changed = dataclasses.replace(again, seq=3, ts=12.0, cpu_percent=50.0)
    busy = dataclasses.replace(changed, seq=4, tasks=("j.w.0#1", "j.w.1#1"))
    gpu = GpuStatus(0, "GPU-0", "L4", 24 * 2**30, 2**30, 40)
    gpus = dataclasses.replace(busy, seq=5, tasks=("j.w.1#1",), gpus=(gpu,))
    for state in (first, again, changed, again, busy, gpus, busy, first):
        data = encode(state)
        assert heartbeats.decode(subject, data) == decode(NodeState, data) == state
    raw = unpack(encode(again))
    raw["later_field"] = 1  # unknown fields are ignored, whether new or changed
    assert heartbeats.decode(subject, pack(raw)) == again
    raw["later_field"] = 2
    assert heartbeats.decode(subject, pack(raw)) == again
    for bad in (
        {"ts": "late"},
        {"seq": -1},
        {"ts": float("inf")},
        {"tasks": ["ok#1", 7]},
        {"tasks": "j.w.0#1"},
        {"gpus": [{"index": -1}]},
        {"cpu_percent": "busy"},
        {"seq": True},  # equal to the last one's 1 or 4 as Python compares, not as a type
        {"memory_used": 0.0},
        {"capacity": {"cpu": 4000.0}},
    ):
        raw = unpack(encode(busy))
        raw.update(bad)
        with pytest.raises(WireError):
            heartbeats.decode(subject, pack(raw))
        assert heartbeats.decode(subject, encode(busy)) == busy


def test_every_heartbeat_and_status_change_is_in_the_journal():
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    mark = cv.changes.mark()
    cv.observe(hb("a"), now=0.0)
    cv.observe(hb("b"), now=1.0)
    assert cv.changes.since(mark) == {"a", "b"}
    mark = cv.changes.mark()
    cv.observe(hb("b", seq=2), now=2.0)  # a heartbeat that changes nothing but the clock
    assert cv.changes.since(mark) == {"b"}
    mark = cv.changes.mark()
    assert cv.sweep(3.5) == ["a"]  # a: suspect, by age alone
    assert cv.changes.since(mark) == {"a"}
    mark = cv.changes.mark()
    assert cv.sweep(3.6) == []
    assert cv.changes.since(mark) == set()


def test_ready_is_kept_until_a_node_comes_or_goes_and_down_is_kept():
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    cv.observe(hb("b"), now=0.0)
    cv.observe(hb("a"), now=1.0)
    ready = cv.ready()
    assert [v.node_id for v in ready] == ["a", "b"]
    cv.observe(hb("a", seq=2), now=2.0)
    assert cv.ready() is ready  # heartbeats alone: the same list
    cv.sweep(10.5)  # b silent for 10.5 s: down; a for 8.5 s: suspect
    assert cv.ready() == [] and cv.down == {"b"}
    cv.observe(hb("b", seq=2), now=11.0)
    assert [v.node_id for v in cv.ready()] == ["b"] and cv.down == set()
    cv.sweep(30.0)
    assert cv.down == {"a", "b"}


def test_an_expected_node_that_stays_silent_goes_down():
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    cv.observe(hb("a"), now=0.0)
    cv.expect("ghost", now=5.0)
    cv.expect("a", now=5.0)  # heard from already: unchanged
    assert cv.nodes["a"].state.seq == 1 and cv.nodes["a"].last_seen == 0.0
    assert cv.nodes["ghost"].state.seq == 0
    cv.observe(hb("a", seq=2), now=14.0)
    assert cv.sweep(15.0) == ["ghost"] and cv.down == {"ghost"}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.sampled_from("abcde"), st.floats(0.0, 6.0), st.booleans()), max_size=40)
)
def test_a_sweep_stopping_at_the_first_recent_node_misses_none(events):
    """The sweep walks nodes least recently heard from first and stops at the first one
    heard from recently: statuses must be what the age of every node says."""
    cv = ClusterView("r1", suspect_after=3.0, down_after=10.0)
    now = 0.0
    for node, dt, heartbeat in events:
        now += dt
        if heartbeat:
            cv.observe(hb(node), now)
        cv.sweep(now)
        for v in cv.nodes.values():
            age = now - v.last_seen
            want = DOWN if age >= 10.0 else SUSPECT if age >= 3.0 else READY
            assert v.status == want
        assert cv.down == {n for n, v in cv.nodes.items() if v.status == DOWN}
        assert cv.ready() == sorted(
            (v for v in cv.nodes.values() if v.status == READY), key=lambda v: v.node_id
        )


def test_a_kept_heartbeat_leaves_only_its_state_for_the_collector():
    """What the coordinator keeps of a node's last heartbeat, to compare the next with,
    holds plain values the collector stops tracking: a heartbeat leaves its NodeState
    alive for a period, not its decoded lists and maps (8 tracked objects a heartbeat
    kept full collections coming every few seconds at 5,000 nodes)."""
    import gc

    from mesh.codec import RepeatDecoder, encode

    heartbeats = RepeatDecoder(NodeState)
    gpus = tuple(GpuStatus(i, f"GPU-{i}", "L4", 24 * 2**30, 2**30, 40) for i in range(8))
    first = NodeState(
        "n1",
        "default",
        1,
        10.0,
        Resources(cpu=4000),
        labels={"a": "b"},
        gpus=gpus,
        tasks=("j.w.0#1", "j.w.1#1"),
    )
    subject = "mesh.default.state.n1"
    for state in (first, dataclasses.replace(first, seq=2, ts=11.0, tasks=("j.w.0#1",))):
        assert heartbeats.decode(subject, encode(state)) == state
        gc.collect()
        gc.collect()  # a tuple of tuples is let go a collection after its items
        kept = [v for v in heartbeats.forms.values() if gc.is_tracked(v)]
        assert kept == [], kept


def test_a_repeat_decoder_forgets_its_senders_at_its_limit_and_still_decodes():
    from mesh.codec import RepeatDecoder, decode, encode

    heartbeats = RepeatDecoder(NodeState, limit=2)
    states = [NodeState(f"n{i}", "default", 1, 10.0, Resources(cpu=4000)) for i in range(3)]
    for st_ in states + [dataclasses.replace(s, seq=2) for s in states]:
        data = encode(st_)
        assert heartbeats.decode(st_.node_id, data) == decode(NodeState, data) == st_
        assert len(heartbeats.forms) == len(heartbeats.last) <= 2
