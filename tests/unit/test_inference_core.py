"""The router core (ours): exact behaviour on small cases, and properties under hypothesis.

Properties, for any models, GPUs, arrivals and configuration:
- no request is dispatched after its latest start (every batch ends by every deadline in it);
- no GPU is given two overlapping batches, nor one before it is free or before "now";
- every request is answered exactly once: dropped + served = arrived;
- the same inputs give the same decisions (the core is deterministic).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.decisions import Dispatch, Drop, DropReason, Gpu, ModelSpec, Request
from inference.profile import MS, SYMPHONY_HARNESS, LatencyProfile
from inference.router_core import RouterConfig, RouterCore, target_batch

P = LatencyProfile(a_ns=5 * MS, b_ns=1 * MS, max_batch=8)


def drive(core: RouterCore, requests: list[Request]) -> list[tuple[int, object]]:
    """Feed arrivals at their times and wake the core when it asks; (time, decision)."""
    out: list[tuple[int, object]] = []
    i = 0
    now = -1
    for _ in range(100_000):
        w = core.next_wakeup_ns()
        ta = requests[i].arrival_ns if i < len(requests) else None
        if ta is None and w is None:
            return out
        t = ta if w is None or (ta is not None and ta <= w) else w
        assert t >= now, "the core asked to be woken in the past"
        now = t
        while i < len(requests) and requests[i].arrival_ns == t:
            core.submit(requests[i], t)
            i += 1
        out.extend((t, d) for d in core.step(t))
    raise AssertionError("core never went idle")


def one_model(slo_ms: float = 100, gpus: int = 1, **cfg: object) -> RouterCore:
    return RouterCore([ModelSpec.single("m", int(slo_ms * MS), P)],
                      [Gpu(f"g{j}") for j in range(gpus)], RouterConfig(**cfg))


# ---------------------------------------------------------------- exact cases


def test_defers_until_one_more_request_could_no_longer_join() -> None:
    core = one_model(grant_window=0.0)
    core.submit(Request(0, "m", 0, 100 * MS), 0)
    assert core.step(0) == []
    # l(2) = 7 ms: the last moment a second request could still join is 100 - 7 = 93 ms.
    assert core.next_wakeup_ns() == 93 * MS
    (d,) = core.step(93 * MS)
    assert d == Dispatch("g0", "m", (0,), 93 * MS, 99 * MS)
    assert core.next_wakeup_ns() is None


def test_grant_window_makes_a_candidate_eligible_earlier() -> None:
    core = one_model(grant_window=0.2)  # 20 ms of a 100 ms SLO
    core.submit(Request(0, "m", 0, 100 * MS), 0)
    core.step(0)
    assert core.next_wakeup_ns() == 73 * MS


def test_full_batch_goes_at_once() -> None:
    core = one_model()
    reqs = [Request(i, "m", 0, 100 * MS) for i in range(8)]
    (d,) = core.step(0, reqs)
    assert isinstance(d, Dispatch) and len(d.request_ids) == 8 and d.start_ns == 0


def test_batch_grows_while_waiting() -> None:
    core = one_model(grant_window=0.0)
    out = drive(core, [Request(i, "m", i * MS, i * MS + 100 * MS) for i in range(5)])
    (_, d) = out[0]
    assert len(out) == 1 and isinstance(d, Dispatch) and d.request_ids == (0, 1, 2, 3, 4)
    assert d.start_ns == 100 * MS - P.latency(6)  # the 6th could no longer have joined


def test_impossible_deadline_is_dropped_with_a_clear_reason() -> None:
    core = one_model()
    (d,) = core.step(0, [Request(0, "m", 0, 3 * MS)])  # l(1) = 6 ms > 3 ms
    assert d == Drop(0, DropReason.DEADLINE_CANNOT_BE_MET)
    assert d.message == "deadline cannot be met"


def test_goes_to_the_gpu_that_frees_first() -> None:
    core = RouterCore([ModelSpec.single("m", 100 * MS, P)],
                      [Gpu("late", free_at_ns=50 * MS), Gpu("early", free_at_ns=20 * MS)])
    ((when, d),) = drive(core, [Request(i, "m", 0, 100 * MS) for i in range(8)])
    assert d.gpu_id == "early" and d.start_ns == when == 20 * MS


def test_most_urgent_candidate_gets_the_only_gpu() -> None:
    core = RouterCore([ModelSpec.single("x", 100 * MS, P), ModelSpec.single("y", 60 * MS, P)],
                      [Gpu("g", free_at_ns=10 * MS)])
    reqs = [Request(i, "x", 0, 100 * MS) for i in range(8)]
    reqs += [Request(8 + i, "y", 0, 60 * MS) for i in range(8)]
    out = drive(core, reqs)
    dispatches = [d for _, d in out if isinstance(d, Dispatch)]
    assert [d.model for d in dispatches] == ["y", "x"]


def test_gpu_types_use_their_own_profile() -> None:
    fast = LatencyProfile(a_ns=1 * MS, b_ns=MS // 2, max_batch=8)
    spec = ModelSpec("m", 100 * MS, {"slow": P, "fast": fast})
    core = RouterCore([spec], [Gpu("f", gpu_type="fast")])
    (d,) = core.step(0, [Request(i, "m", 0, 100 * MS) for i in range(8)])
    assert d.end_ns - d.start_ns == fast.latency(8)
    with pytest.raises(ValueError):
        RouterCore([ModelSpec.single("m", 100 * MS, P)], [Gpu("x", gpu_type="other")])


def test_out_of_order_deadlines_are_served_earliest_first() -> None:
    core = one_model(grant_window=0.0)
    core.submit(Request(0, "m", 0, 90 * MS), 0)
    core.submit(Request(1, "m", 0, 50 * MS), 0)
    out = drive(core, [])
    (_, d) = out[0]
    assert d.request_ids == (1, 0) and d.end_ns <= 50 * MS


def test_window_drop_sacrifices_the_head_to_keep_the_target_batch() -> None:
    # A queue of 8 where the oldest can only finish in a batch of up to 3 (l(3) = 8 ms):
    # Symphony's window drop gives it up to run the rest as one batch; strict shrinks the
    # batch to 3 instead and runs the other 5 after.
    reqs = [Request(0, "m", 0, 8 * MS)] + [Request(i, "m", 0, 100 * MS) for i in range(1, 8)]
    window = drive(one_model(drop_policy="window"), reqs)
    strict = drive(one_model(drop_policy="strict"), reqs)
    assert isinstance(window[0][1], Drop) and window[0][1].reason is DropReason.AT_TARGET_BATCH
    assert [len(d.request_ids) for _, d in window if isinstance(d, Dispatch)] == [7]
    assert [len(d.request_ids) for _, d in strict if isinstance(d, Dispatch)] == [3, 5]


def test_dispatch_lead_starts_batches_after_the_control_latency() -> None:
    core = one_model(dispatch_lead_ns=2 * MS)
    (d,) = core.step(0, [Request(i, "m", 0, 100 * MS) for i in range(8)])
    assert d.start_ns == 2 * MS


def test_target_batch_follows_the_measured_rate() -> None:
    assert target_batch(SYMPHONY_HARNESS, 100 * MS, None) == 32   # l(b) <= 50 ms, capped
    assert target_batch(SYMPHONY_HARNESS, 100 * MS, 10.0) == 1
    # l(b) + b / r <= 100 ms at 200 req/s: (100 - 5.204) / (1.082 + 5) = 15.6
    assert target_batch(SYMPHONY_HARNESS, 100 * MS, 200.0) == 15
    core = RouterCore([ModelSpec.single("m", 100 * MS, SYMPHONY_HARNESS)], [Gpu("g")])
    t = 0
    for i in range(400):  # 200 req/s for 2 s
        t = i * 5 * MS
        core.step(t, [Request(i, "m", t, t + 100 * MS)])
    assert core.target_batch_size("m") == 15


def test_rejects_bad_input() -> None:
    core = one_model()
    with pytest.raises(ValueError):
        core.submit(Request(0, "nope", 0, 1), 0)
    core.step(10)
    with pytest.raises(ValueError):
        core.step(5)
    with pytest.raises(ValueError):
        RouterConfig(drop_policy="later")


# ----------------------------------------------------------------- properties

profiles = st.builds(
    LatencyProfile,
    a_ns=st.integers(0, 20 * MS),
    b_ns=st.integers(1, 5 * MS),
    max_batch=st.integers(1, 16),
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[ModelSpec], list[Gpu], list[Request], RouterConfig]:
    types = draw(st.lists(st.sampled_from(["t4", "a100"]), min_size=1, max_size=4))
    n_models = draw(st.integers(1, 3))
    models = [ModelSpec(f"m{i}", draw(st.integers(1 * MS, 200 * MS)),
                        {t: draw(profiles) for t in set(types)}) for i in range(n_models)]
    gpus = [Gpu(f"g{j}", draw(st.integers(0, 30 * MS)), t) for j, t in enumerate(types)]
    n = draw(st.integers(0, 40))
    t = 0
    reqs = []
    for i in range(n):
        t += draw(st.integers(0, 15 * MS))
        m = draw(st.sampled_from(models))
        slack = draw(st.integers(-5 * MS, 50 * MS))  # out-of-order and past deadlines too
        reqs.append(Request(i, m.name, t, t + max(0, m.slo_ns + slack)))
    cfg = RouterConfig(drop_policy=draw(st.sampled_from(["window", "strict"])),
                       grant_window=draw(st.sampled_from([0.0, 0.2, 0.5, 0.9])),
                       dispatch_lead_ns=draw(st.sampled_from([0, 150_000, 2 * MS])),
                       rate_bucket_ns=draw(st.sampled_from([5 * MS, 50 * MS])))
    return models, gpus, reqs, cfg


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_properties(sc: tuple[list[ModelSpec], list[Gpu], list[Request], RouterConfig]) -> None:
    models, gpus, reqs, cfg = sc
    out = drive(RouterCore(models, gpus, cfg), reqs)
    by_id = {r.id: r for r in reqs}
    spec = {m.name: m for m in models}
    gtype = {g.id: g.gpu_type for g in gpus}
    free = {g.id: g.free_at_ns for g in gpus}
    answered: list[int] = []
    for now, d in out:
        if isinstance(d, Dispatch):
            assert d.request_ids
            prof = spec[d.model].profile_for(gtype[d.gpu_id])
            assert d.end_ns - d.start_ns == prof.latency(len(d.request_ids))
            # never before now (+ the control lead), never overlapping on one GPU
            assert d.start_ns >= now + cfg.dispatch_lead_ns
            assert d.start_ns >= free[d.gpu_id]
            free[d.gpu_id] = d.end_ns
            for rid in d.request_ids:
                r = by_id[rid]
                assert r.model == d.model
                assert r.arrival_ns <= now
                # no request dispatched after its latest start: it finishes in time
                assert d.start_ns <= r.deadline_ns - prof.latency(len(d.request_ids))
            answered.extend(d.request_ids)
        else:
            assert isinstance(d, Drop)
            assert by_id[d.request_id].arrival_ns <= now
            answered.append(d.request_id)
    # dropped + served = arrived, each exactly once
    assert sorted(answered) == [r.id for r in reqs]


@settings(max_examples=25, deadline=None)
@given(scenarios())
def test_deterministic(sc: tuple[list[ModelSpec], list[Gpu], list[Request], RouterConfig]) -> None:
    models, gpus, reqs, cfg = sc
    assert drive(RouterCore(models, gpus, cfg), reqs) == drive(RouterCore(models, gpus, cfg), reqs)
