"""coordinator/elastic.py: an elastic job's grow, shrink and watchdog decisions, by
example and as properties (never below min nor above max, task 0 never the victim,
at most one resize per resize_every_s)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.elastic import Facts, hung, offer, stalled, stops
from coordinator.records import HOLDING
from workloads.lifecycle import TaskState

S = TaskState


def facts(states, *, lo=2, hi=4, target=None, changed_at=0.0, now=100.0, every=10.0, **kw):
    return Facts(
        lo,
        hi,
        hi if target is None else target,
        dict(enumerate(states)),
        frozenset(kw.pop("stopping", ())),
        changed_at,
        now,
        every,
        **kw,
    )


def test_first_admission_offers_a_gang_of_min_lowest_indexes_first():
    o = offer(facts([S.PENDING] * 4, changed_at=None))
    assert o.indexes == (0, 1) and o.gang == 2


def test_below_min_after_a_loss_the_missing_tasks_are_offered_as_a_gang_at_once():
    o = offer(facts([S.RUNNING, S.PENDING, S.PENDING, S.PENDING], changed_at=99.0))
    assert o.indexes == (1,) and o.gang == 1  # (not rate-limited: the job cannot run)


def test_grow_waits_resize_every_s_after_the_last_change_then_takes_all_below_target():
    states = [S.RUNNING, S.RUNNING, S.PENDING, S.PENDING]
    early = offer(facts(states, changed_at=95.0))
    assert early.indexes == () and "next resize" in early.why
    o = offer(facts(states, changed_at=90.0))
    assert o.indexes == (2, 3) and o.gang == 0
    assert offer(facts(states, changed_at=90.0, target=3)).indexes == (2,)


def test_no_grow_at_target_or_while_tasks_are_being_stopped():
    states = [S.RUNNING, S.RUNNING, S.RUNNING, S.PENDING]
    assert offer(facts(states, target=3)).indexes == ()
    assert offer(facts(states, stopping={2})).indexes == ()


def test_shrink_stops_highest_index_first_never_task_0_never_below_min():
    states = [S.RUNNING] * 4
    assert stops(facts(states, target=2)) == (3, 2)
    assert stops(facts(states, target=3)) == (3,)
    assert stops(facts(states, target=4)) == ()
    # Holding 0, 5, 6 at target 2, min 2: only one may go, the highest.
    states = [S.RUNNING, S.PENDING, S.PENDING, S.PENDING, S.PENDING, S.RUNNING, S.RUNNING]
    assert stops(facts(states, hi=7, target=2)) == (6,)
    # Min 1, target 1: everything but task 0.
    assert stops(facts([S.RUNNING] * 3, lo=1, hi=3, target=1)) == (2, 1)


def test_shrink_is_rate_limited_and_one_at_a_time():
    states = [S.RUNNING] * 4
    assert stops(facts(states, target=2, changed_at=95.0)) == ()
    assert stops(facts(states, target=2, stopping={3})) == ()


def test_watchdog_requeues_only_a_job_that_reported_progress_and_stalled_after_a_change():
    running = [S.RUNNING] * 2
    assert stalled(facts(running, changed_at=0.0, now=500.0), 120.0) is None  # never reported
    past = facts(running, changed_at=10.0, now=500.0, progress_at=130.0)
    assert stalled(past, 120.0) is None  # progress moved timeout_s past the change
    moving = facts(running, changed_at=10.0, now=139.0, progress_at=20.0)
    assert stalled(moving, 120.0) is None  # it moved within timeout_s: not yet
    young = facts(running, changed_at=10.0, now=100.0, progress_at=5.0)
    assert stalled(young, 120.0) is None  # not yet timeout_s after the change
    why = stalled(facts(running, changed_at=10.0, now=200.0, progress_at=5.0), 120.0)
    assert why is not None and "no progress in 190s" in why
    placed = facts([S.PLACED] * 2, changed_at=10.0, now=200.0, progress_at=5.0)
    assert stalled(placed, 120.0) is None  # none running: nothing could report
    being_stopped = facts(running, changed_at=10.0, now=200.0, progress_at=5.0, stopping={1})
    assert stalled(being_stopped, 120.0) is None


def test_watchdog_requeues_a_job_whose_progress_moved_after_the_change_then_stopped():
    """The steps made until the workers noticed the change, reported after it (the
    agent's 1-3 s lag), are no sign the job got past it: found end to end
    (tests/integration/test_training_watchdog.py), where such a job was never requeued."""
    running = [S.RUNNING] * 3
    late = facts(running, changed_at=10.0, now=131.0, progress_at=12.0)
    assert stalled(late, 120.0) is None  # 119 s without progress
    why = stalled(facts(running, changed_at=10.0, now=132.0, progress_at=12.0), 120.0)
    assert why == (
        "requeued by the watchdog: no progress in 120s (its last membership change "
        "122s ago; progress_timeout_s 120)"
    )
    # Once progress moves timeout_s past the change, the job got past it: left alone.
    assert stalled(facts(running, changed_at=10.0, now=900.0, progress_at=130.0), 120.0) is None
    assert stalled(facts(running, changed_at=10.0, now=900.0, progress_at=129.0), 120.0)


# ------------------------------------------------------------ properties

STATES = [S.PENDING, S.PLACED, S.STARTING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.PREEMPTED]


@st.composite
def any_facts(draw):
    lo = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, 8))
    target = draw(st.integers(lo, hi))
    states = draw(st.lists(st.sampled_from(STATES), min_size=hi, max_size=hi))
    holding = [i for i, s in enumerate(states) if s in HOLDING]
    stopping = draw(st.sets(st.sampled_from(holding))) if holding and draw(st.booleans()) else ()
    changed = draw(st.none() | st.floats(0, 100))
    now = draw(st.floats(0, 200))
    every = draw(st.sampled_from([0.0, 5.0, 10.0, 60.0]))
    progress = draw(st.none() | st.floats(0, 200))
    return Facts(
        lo, hi, target, dict(enumerate(states)), frozenset(stopping), changed, now, every, progress
    )


def _holding(f: Facts) -> list[int]:
    return [i for i, s in f.tasks.items() if s in HOLDING]


@settings(max_examples=400, deadline=None)
@given(any_facts())
def test_offer_stays_within_bounds_and_is_rate_limited(f):
    o = offer(f)
    holding = _holding(f)
    assert all(f.tasks[i] == S.PENDING for i in o.indexes)
    assert len(set(o.indexes)) == len(o.indexes)
    assert len(holding) + len(o.indexes) <= f.max
    if len(holding) < f.min:
        assert o.gang == f.min - len(holding) and len(o.indexes) <= o.gang
        waiting = sorted(i for i, s in f.tasks.items() if s == S.PENDING)
        assert list(o.indexes) == waiting[: o.gang]
    else:
        assert o.gang == 0
        assert not o.indexes or len(holding) + len(o.indexes) <= f.target
        assert all(i < f.target for i in o.indexes)
        if o.indexes:  # a grow: only when due, and not during a shrink
            assert not f.stopping
            assert f.changed_at is None or f.now >= f.changed_at + f.resize_every_s


@settings(max_examples=400, deadline=None)
@given(any_facts())
def test_stops_never_take_task_0_nor_go_below_min_and_are_rate_limited(f):
    out = stops(f)
    holding = _holding(f)
    assert 0 not in out
    assert all(i in holding and i >= f.target for i in out)
    assert len(holding) - len(out) >= min(f.min, len(holding))
    assert list(out) == sorted(out, reverse=True)
    if out:
        assert not f.stopping
        assert f.changed_at is None or f.now >= f.changed_at + f.resize_every_s
        # The highest holding candidates: none left behind is above one taken.
        left = [i for i in holding if i not in out and i >= f.target and i != 0]
        assert not left or max(left) < min(out)


@settings(max_examples=400, deadline=None)
@given(
    changed=st.floats(0, 100),
    timeout=st.sampled_from([1.0, 5.0, 120.0]),
    gaps=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=30),
    stop_after=st.floats(0, 3.0),
)
def test_the_watchdog_spares_a_job_that_keeps_moving_and_requeues_one_that_stops(
    changed, timeout, gaps, stop_after
):
    """Progress moving after the change with every gap under timeout_s: never requeued,
    at any moment. Progress that stops at s, less than timeout_s after the change:
    requeued from max(s, change) + timeout_s on, not a moment sooner."""
    running = [S.RUNNING] * 2
    at, moved = changed, None
    for gap in gaps:  # each gap a fraction of timeout_s
        for now in (at + gap * timeout * 0.5, at + gap * timeout * 0.99):
            f = facts(running, changed_at=changed, now=now, progress_at=moved)
            assert stalled(f, timeout) is None
        at += gap * timeout * 0.99
        moved = at
    stop = changed + stop_after * timeout
    kind = facts(running, changed_at=changed, progress_at=stop, now=0.0)
    if stop >= changed + timeout:
        for k in (1.0, 2.0, 10.0):
            assert stalled(dataclasses.replace(kind, now=stop + k * timeout), timeout) is None
        return
    due = max(stop, changed) + timeout
    assert stalled(dataclasses.replace(kind, now=due), timeout) is not None
    assert stalled(dataclasses.replace(kind, now=due + timeout), timeout) is not None
    assert stalled(dataclasses.replace(kind, now=due - timeout * 0.01), timeout) is None


@settings(max_examples=150, deadline=None)
@given(
    lo=st.integers(1, 3),
    extra=st.integers(0, 4),
    every=st.sampled_from([1.0, 5.0, 10.0]),
    steps=st.lists(
        st.tuples(
            st.floats(0.1, 8.0),  # time passing
            st.integers(0, 8),  # free slots this round
            st.none() | st.integers(1, 7),  # a scale request
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_a_simulated_job_stays_in_bounds_keeps_task_0_and_resizes_at_most_every_s(
    lo, extra, every, steps
):
    """Placement placing some of what is offered (a gang all or nothing), stops taking
    effect at once, scale requests within bounds: the job never holds more than max,
    never fewer than min once placed, holds task 0 whenever it holds any, and its
    resizes (membership changes once placed) are resize_every_s apart."""
    hi = lo + extra
    states = {i: S.PENDING for i in range(hi)}
    target, changed, now, placed_once = hi, None, 0.0, False
    resizes: list[float] = []
    for dt, free, scale in steps:
        now += dt
        if scale is not None and lo <= scale <= hi:
            target = scale
        f = Facts(lo, hi, target, dict(states), frozenset(), changed, now, every)
        o = offer(f)
        take = list(o.indexes[:free])
        if o.gang and len(take) < o.gang:
            take = []
        gone = stops(f)
        assert not (take and gone)  # one direction at a time
        for i in take:
            states[i] = S.RUNNING
        for i in gone:
            states[i] = S.PENDING
        if take or gone:
            if placed_once:
                resizes.append(now)
            placed_once = True
            changed = now
        holding = [i for i, s in states.items() if s in HOLDING]
        assert len(holding) <= hi
        if placed_once:
            assert len(holding) >= lo
            assert 0 in holding
    assert all(b - a >= every for a, b in zip(resizes, resizes[1:], strict=False))


def test_hung_ends_a_stalled_job_only_once_its_restarts_are_spent():
    why = "requeued by the watchdog: no progress in 61s (x)"
    assert hung(None, 5, 3) is None  # not stalled
    assert hung(why, 2, 3) is None  # a restart left: requeued
    assert hung(why, 3, 3) == "stalled: no progress in 61s (x); restarts 3 of 3 used: the job ends"
